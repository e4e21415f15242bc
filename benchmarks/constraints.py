"""Terminology constraints on Multi30k: coverage, BLEU, stutter and time, with and without.

    python benchmarks/constraints.py --run-dir runs/multi30k-en-de-quick
    python benchmarks/constraints.py --run-dir runs/multi30k-en-de-quick --set val-nouns
    python benchmarks/constraints.py --run-dir RUN --saved-model saved_models/NAME/1 --jax

Two constraint sets (seeded). `--set reference-phrases` (test2016 by default) draws them from
the references as Post and Vilar (2018) do: per sentence 1 to 3 phrases of 1 to 3 consecutive
reference words (phrases do not overlap; a sentence with fewer words gets fewer). `--set
val-nouns` (Multi30k val) is what a user's glossary resembles: per sentence 1 or 2 nouns of
the German reference (its capitalized words other than the first, punctuation stripped),
those the translation without constraints misses first.

The run's saved choice decodes (its weights, beam and alpha; --beam overrides the beam),
in-process through the decoder, once without and once with the constraints, each timed as a
whole (one untimed warm-up batch first, so that both exclude the tracing of their search;
--repeats N: N alternating runs of each, the medians).
Coverage is counted on the detokenized output: a phrase is met when its text appears in the
sentence's translation. sacreBLEU is against the raw references. An output stutters when one
subword piece of the run's vocabulary comes 4 or more times in a row (`keras_transformer.evaluation.stutter`).
Where the output without constraints already holds every phrase as whole words
("plain_met"), the
constrained search should return it, or one of a higher score: both searches run again on
those sentences with n-best scores, and "plain_met_kept" counts the sentences whose
constrained best is the same text or scores at least as high.

--saved-model also sends every sentence with its constraints through `serving_default` of the
export loaded in a TF1 Session (as TensorFlow Serving runs it; the signature's other inputs from
its defaults) and counts coverage there; --jax translates the constrained set under JAX (Keras
on the JAX backend, in a child process) and counts it too. Prints one JSON line.
"""

import argparse
import gzip
import json
import os
import pathlib
import random
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tf_common  # noqa: E402,F401  (first: sets Keras' backend, quiets TensorFlow)
from common import add_record_flag, append_result, emit  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def read(split, lang, limit=None):
    with gzip.open(MULTI30K / f"{split}.{lang}.gz", "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle][:limit]


def draw_constraints(references, seed, most=3, longest=3):
    """Per reference, 1..most phrases of 1..longest consecutive words, not overlapping."""
    rng = random.Random(seed)
    drawn = []
    for reference in references:
        words = reference.split()
        wanted, taken, phrases = rng.randint(1, most), set(), []
        for _ in range(20 * most):  # tries
            if len(phrases) == wanted or not words:
                break
            length = rng.randint(1, min(longest, len(words)))
            start = rng.randrange(len(words) - length + 1)
            span = set(range(start, start + length))
            if span & taken:
                continue
            taken |= span
            phrases.append((start, " ".join(words[start:start + length])))
        drawn.append([phrase for _, phrase in sorted(phrases)])
    return drawn


def holds_word(text, phrase):
    """Whether `phrase` appears in `text` as whole words ("Stühle" is not in "Stühlen")."""
    return re.search(r"(?<!\w)" + re.escape(phrase) + r"(?!\w)", text) is not None


def draw_nouns(references, outputs, seed, most=2):
    """Per German reference, 1..most of its nouns (capitalized words but the first, without
    punctuation, each once), those its `outputs` (the translations without constraints)
    miss first."""
    rng = random.Random(seed)
    drawn = []
    for reference, output in zip(references, outputs):
        nouns = []
        for word in reference.split()[1:]:
            word = word.strip(".,;:!?\"'()")
            if word[:1].isupper() and word not in nouns:
                nouns.append(word)
        rng.shuffle(nouns)
        nouns.sort(key=lambda noun: holds_word(output, noun))  # stable: missed ones first
        drawn.append(nouns[:rng.randint(1, most)])
    return drawn


def timed(function):
    """([seconds], what `function()` returned)."""
    start = time.perf_counter()
    result = function()
    return [time.perf_counter() - start], result


def plain_met_kept(engine, sources, plain, constraints):
    """(sentences whose output without constraints holds every phrase as whole words, how many
    of them the constrained search returns unchanged or with a score at least as high)."""
    met = [i for i, (output, phrases) in enumerate(zip(plain, constraints))
           if phrases and all(holds_word(output, phrase) for phrase in phrases)]
    subset = [sources[i] for i in met]
    without = engine.translate(subset, nbest=True)
    given = engine.translate(subset, nbest=True, constraints=[constraints[i] for i in met])
    kept = sum(a[0][0] == b[0][0] or b[0][1] >= a[0][1] - 1e-4 for a, b in zip(without, given))
    return len(met), kept


def coverage(outputs, constraints, words=False):
    """Share of the phrases found in their sentence's output (as whole words: `words`), and of
    the sentences with all."""
    phrases = met = whole = 0
    for output, wanted in zip(outputs, constraints):
        found = [holds_word(output, phrase) if words else phrase in output for phrase in wanted]
        phrases, met, whole = phrases + len(found), met + sum(found), whole + all(found)
    return met / max(phrases, 1), whole / max(len(outputs), 1)


def session_outputs(saved_model, sources, constraints, batch):
    from tf_serving import PredictHandler

    handler = PredictHandler(saved_model)
    outputs = []
    for start in range(0, len(sources), batch):
        result = handler.predict({
            "sentences": sources[start:start + batch],
            "constraints": ["\t".join(c) for c in constraints[start:start + batch]]},
            output_filter=("translations",))
        outputs += [t.decode("utf-8") for t in result["translations"]]
    return outputs


JAX_CHILD = """
import json, sys
from keras_transformer.decoding.decoder import Decoder
from keras_transformer.runs import open_run
run_dir, beam, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
data = json.load(open(path, encoding="utf-8"))
engine = Decoder.resolve(open_run(run_dir), {"beam_size": beam} if beam else {}).engine()
print(json.dumps(engine.translate(data["sources"], constraints=data["constraints"])))
"""


def jax_outputs(run_dir, beam, sources, constraints, folder):
    path = pathlib.Path(folder) / "constrained.json"
    path.write_text(json.dumps({"sources": sources, "constraints": constraints}),
                    encoding="utf-8")
    env = dict(os.environ, KERAS_BACKEND="jax")
    # From the repository root, so that the child imports this checkout's package.
    result = subprocess.run([sys.executable, "-c", JAX_CHILD, str(pathlib.Path(run_dir).resolve()),
                             str(beam or 0), str(path)], capture_output=True, text=True, env=env,
                            cwd=ROOT)
    if result.returncode:
        raise RuntimeError(f"the JAX child failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, help="the demo's run (or any en-de run)")
    parser.add_argument("--set", default="reference-phrases", dest="draw",
                        choices=("reference-phrases", "val-nouns"),
                        help="the constraints: reference phrases (Post and Vilar), or 1-2 "
                             "reference nouns per val sentence, missed ones first")
    parser.add_argument("--split", help="Multi30k file prefix (test_2016_flickr; val with "
                                        "--set val-nouns)")
    parser.add_argument("--sentences", type=int, help="the first N sentences only")
    parser.add_argument("--seed", type=int, default=1, help="the constraints' draw (1)")
    parser.add_argument("--beam", type=int, help="beam size (default: the run's choice)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="time each search this many times, alternating (the median)")
    parser.add_argument("--saved-model", help="also count through this export's TF1 Session")
    parser.add_argument("--jax", action="store_true", help="also count under JAX")
    add_record_flag(parser, "constraints")
    args = parser.parse_args(argv)

    import sacrebleu

    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.evaluation.stutter import stutter_count
    from keras_transformer.hardware import describe_cpu
    from keras_transformer.runs import open_run

    split = args.split or ("val" if args.draw == "val-nouns" else "test_2016_flickr")
    sources, references = read(split, "en", args.sentences), read(split, "de", args.sentences)
    run = open_run(args.run_dir)
    decoder = Decoder.resolve(run, {"beam_size": args.beam} if args.beam else {})
    engine = decoder.engine()
    engine.translate(sources[:8])  # the unconstrained search traced
    plain_s, plain = timed(lambda: engine.translate(sources))
    constraints = (draw_nouns(references, plain, args.seed) if args.draw == "val-nouns"
                   else draw_constraints(references, args.seed))
    engine.translate(sources[:8], constraints=constraints[:8])  # the constrained one traced
    constrained_s, constrained = timed(lambda: engine.translate(sources,
                                                                constraints=constraints))
    for _ in range(args.repeats - 1):  # alternating, so that both see the same load
        plain_s += timed(lambda: engine.translate(sources))[0]
        constrained_s += timed(lambda: engine.translate(sources, constraints=constraints))[0]
    plain_s, constrained_s = (statistics.median(t) for t in (plain_s, constrained_s))
    phrases = sum(len(c) for c in constraints)
    record = {
        "benchmark": "constraints", "run_dir": str(args.run_dir), "split": split,
        "set": args.draw,
        "sentences": len(sources), "phrases": phrases, "seed": args.seed,
        "beam": decoder.request.beam_size, "alpha": decoder.request.alpha,
        "precision": decoder.precision[0], "cpu": describe_cpu(),
        "coverage_without": round(coverage(plain, constraints)[0], 4),
        "coverage": round(coverage(constrained, constraints)[0], 4),
        "coverage_words": round(coverage(constrained, constraints, words=True)[0], 4),
        "coverage_words_without": round(coverage(plain, constraints, words=True)[0], 4),
        "repeats": args.repeats,
        "sentences_all_met": round(coverage(constrained, constraints)[1], 4),
        "sacrebleu_without": round(sacrebleu.corpus_bleu(plain, [references]).score, 2),
        "sacrebleu_constrained": round(sacrebleu.corpus_bleu(constrained, [references]).score,
                                       2),
        "seconds_without": round(plain_s, 2), "seconds_constrained": round(constrained_s, 2),
        "time_ratio": round(constrained_s / plain_s, 3),
        "stutter_without": stutter_count(plain, run.vocabulary()),
        "stutter_constrained": stutter_count(constrained, run.vocabulary()),
        "words_without": sum(len(t.split()) for t in plain),
        "words_constrained": sum(len(t.split()) for t in constrained),
        "words_references": sum(len(t.split()) for t in references),
    }
    record["plain_met"], record["plain_met_kept"] = plain_met_kept(engine, sources, plain,
                                                                   constraints)
    if args.saved_model:
        outputs = session_outputs(args.saved_model, sources, constraints,
                                  decoder.request.batch_size)
        record["coverage_saved_model_session"] = round(coverage(outputs, constraints)[0], 4)
        record["saved_model_equals_in_process"] = round(
            sum(a == b for a, b in zip(outputs, constrained)) / len(outputs), 4)
    if args.jax:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            outputs = jax_outputs(args.run_dir, args.beam, sources, constraints, folder)
        record["coverage_jax"] = round(coverage(outputs, constraints)[0], 4)
    line = emit(record)
    if args.record:
        append_result("constraints", line)


if __name__ == "__main__":
    main()
