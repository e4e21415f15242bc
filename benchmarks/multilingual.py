"""One model for three languages against three bilingual ones: the multilingual demo
(`keras-transformer demo --tgt-lang de fr cs`: the quick recipe, three times its optimizer
steps) and the three bilingual quick demos (`demo --tgt-lang de`, `fr`, `cs`), each decoding
Multi30k test2016 once at the end with its weights and alpha chosen on val.

    python benchmarks/multilingual.py                          # four trainings (hours on CPU)
    python benchmarks/multilingual.py --output runs/ml-bench   # the runs' folder; run again to
                                                               # reuse finished runs
    python benchmarks/multilingual.py --targets de fr --train-steps 50 --settings \\
        '{"preset": "tiny", "vocab_size": 1000}'                # a smoke run

Runs go to OUTPUT/multilingual and OUTPUT/en-LANG; a run that holds a trained model is not
trained again (the jobs' own rule), so the same command resumes or re-reads the benchmark
(`--reuse` says so and refuses to train: only finished runs are read). Exports go to
OUTPUT/exports.

Prints one JSON line per model and pair (sacreBLEU, chrF, the Multi30k literature BLEU, the
share of outputs in another language by py3langid, training minutes) and a last line with the
acceptance figures: the mean sacreBLEU of each side, the largest drop of a pair below its
bilingual model, the largest wrong-language share, then a Markdown table for docs/results.md.
Then the CTranslate2 export of the multilingual run against the Keras engine on the first
`--agreement-sentences` val sentences of each pair (float32 both; greedy, where the export's
documented tolerance is the same output, and the run's beam and alpha, where CTranslate2's
length penalty may end beams differently): one JSON line per pair. `--agreement` does only
that, on a finished run.
"""

import argparse
import json
import os
import pathlib
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tf_common  # noqa: E402,F401  (first: sets Keras' backend, quiets TensorFlow)
from common import emit  # noqa: E402

from keras_transformer.hardware import describe_cpu  # noqa: E402


def arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", nargs="+", default=["de", "fr", "cs"],
                        choices=("de", "fr", "cs"), help="target languages (de fr cs)")
    parser.add_argument("--output", default="runs/multilingual-benchmark",
                        help="folder of the runs and exports")
    parser.add_argument("--reuse", action="store_true",
                        help="only read runs already trained there (refuse to train)")
    parser.add_argument("--train-steps", type=int,
                        help="bilingual steps (the multilingual run: times the pairs); default "
                        "the quick recipe's")
    parser.add_argument("--agreement-sentences", type=int, default=200,
                        help="val sentences per pair for the CTranslate2 agreement (0: skip)")
    parser.add_argument("--agreement", action="store_true",
                        help="only the CTranslate2 agreement of the finished multilingual run")
    parser.add_argument("--settings", default="{}",
                        help="JSON of more training settings for every run (a smoke run's "
                        "preset, source_dir, ...)")
    return parser.parse_args(argv)


def bilingual(target, folder, args, settings):
    """The bilingual quick demo into `target`: {pair result}, training minutes."""
    from keras_transformer.evaluation.language_id import wrong_language_share
    from keras_transformer.tasks import main_job

    run_dir = folder / f"en-{target}"
    summary = main_job.run(src_lang="en", tgt_lang=target, output_dir=run_dir,
                           export_dir=folder / "exports", train_steps=args.train_steps,
                           settings=settings)
    from keras_transformer.runs import open_run

    run = open_run(run_dir)
    hypotheses = run.hypotheses_path("test2016", 4).read_text(encoding="utf-8").splitlines()
    share, found = wrong_language_share(hypotheses, target, {"en", *args.targets})
    result = dict(summary["test2016"], wrong_language=round(share, 4), languages_found=found)
    return result, summary.get("training", {}).get("seconds", 0) / 60


def multilingual(folder, args, settings):
    from keras_transformer.tasks import main_job

    steps = args.train_steps * len(args.targets) if args.train_steps else None
    summary = main_job.run(tgt_lang=list(args.targets), output_dir=folder / "multilingual",
                           export_dir=folder / "exports", train_steps=steps, settings=settings)
    return summary["test2016"], summary.get("training", {}).get("seconds", 0) / 60


def check_reusable(folder, targets):
    """--reuse: every run must hold a trained model already."""
    from keras_transformer.runs import Run

    missing = [str(folder / name) for name in ["multilingual"] + [f"en-{t}" for t in targets]
               if not Run(folder / name).has_model()]
    if missing:
        raise SystemExit(f"--reuse: no trained model in {', '.join(missing)}")


def export_agreement(folder, targets, sentences, cpu):
    """The multilingual run's CTranslate2 export (float32) against our engine in float32 on
    the first `sentences` val sentences of each pair: the share of identical outputs, greedy
    and with the run's beam and alpha."""
    from keras_transformer import export
    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.decoding.request import EXPORT
    from keras_transformer.runs import open_run
    from pipelines import datasets

    run = open_run(folder / "multilingual")
    ct2 = export.export_run(Decoder.resolve(run, command=EXPORT), format="ctranslate2",
                            quantize="none", output_dir=folder / "exports",  # float32, as ours
                            name="multilingual", overwrite=True)
    config = run.config
    for target in targets:
        sources = datasets.split_texts(config.dataset, "dev",
                                       **config.data_arguments(target))[0][:sentences]
        line = dict(benchmark="multilingual", agreement=True, pair=f"en-{target}", cpu=cpu,
                    sentences=len(sources))
        for search, given in (("greedy", {"beam_size": 1}), ("beam", {})):
            outputs = {}
            for engine, extra in (("tensorflow", {"precision": "float32"}),
                                  ("ctranslate2", {"ctranslate2_model": str(ct2)})):
                decoder = Decoder.resolve(run, dict(given, engine=engine, target_language=target,
                                                    **extra))
                outputs[engine] = decoder.engine().translate(sources)
            same = sum(a == b for a, b in zip(outputs["tensorflow"], outputs["ctranslate2"]))
            line[f"{search}_identical"] = round(same / len(sources), 4)
        emit(line)


def table(rows):
    lines = ["| pair | model | sacreBLEU | chrF | lit. BLEU | wrong language | training min |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['pair']} | {row['model']} | {row['sacrebleu']:.2f} | "
                     f"{row['chrf']:.2f} | {row['literature_bleu']:.2f} | "
                     f"{100 * row['wrong_language']:.2f}% | {row['training_minutes']:.1f} |")
    return "\n".join(lines)


def main(argv=None):
    args = arguments(argv)
    folder = pathlib.Path(args.output)
    settings = json.loads(args.settings)
    if args.reuse:
        check_reusable(folder, args.targets)
    cpu = describe_cpu()
    if args.agreement:
        return export_agreement(folder, args.targets, args.agreement_sentences, cpu)
    rows = []
    for target in args.targets:
        result, minutes = bilingual(target, folder, args, settings)
        rows.append(dict(model="bilingual", pair=f"en-{target}",
                         training_minutes=round(minutes, 2),
                         **{k: v for k, v in result.items() if k != "sacrebleu_signature"}))
    results, minutes = multilingual(folder, args, settings)
    for target in args.targets:
        rows.append(dict(model="multilingual", pair=f"en-{target}",
                         training_minutes=round(minutes, 2),
                         **{k: v for k, v in results[target].items()
                            if k != "sacrebleu_signature"}))
    for row in rows:
        emit(dict(row, benchmark="multilingual", cpu=cpu))
    by = {(row["model"], row["pair"]): row for row in rows}
    pairs = [f"en-{t}" for t in args.targets]
    means = {model: sum(by[model, p]["sacrebleu"] for p in pairs) / len(pairs)
             for model in ("bilingual", "multilingual")}
    emit({"benchmark": "multilingual", "summary": True, "cpu": cpu,
          "mean_sacrebleu": {k: round(v, 2) for k, v in means.items()},
          "largest_drop": round(max(by["bilingual", p]["sacrebleu"]
                                    - by["multilingual", p]["sacrebleu"] for p in pairs), 2),
          "largest_wrong_language": max(row["wrong_language"] for row in rows
                                        if row["model"] == "multilingual"),
          "training_minutes": {"bilingual": round(sum(by["bilingual", p]["training_minutes"]
                                                      for p in pairs), 1),
                               "multilingual": round(minutes, 1)}})
    print(table(rows))
    if args.agreement_sentences:
        export_agreement(folder, args.targets, args.agreement_sentences, cpu)


if __name__ == "__main__":
    main()
