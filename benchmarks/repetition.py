"""The repetition controls on Multi30k: sacreBLEU, stuttering outputs and time, off and on.

    python benchmarks/repetition.py --run-dir runs/multi30k-en-de-quick          # test2016
    python benchmarks/repetition.py --run-dir RUN --split val --sentences 500    # the demo's val
    python benchmarks/repetition.py --run-dir RUN --no-repeat-ngram-size 3 --repetition-penalty 1.0

The run's saved choice decodes (its weights, beam and alpha), in-process through the decoder,
twice: with the repetition controls off, and at the setting asked for: the flags given, else
the run's own (decoding.json, where the demo records what it chose on val), else STATED (a
run from before the controls were chosen). Each is timed as a whole, after one untimed batch
of 8 sentences (each setting's search is traced on its own). A stuttering output holds one
sentencepiece piece 4 or more times in a row (`keras_transformer.evaluation.stutter`), counted on the output encoded
again with the run's vocabulary. sacreBLEU is against the raw references. The splits are the
run's dataset's, as `evaluate` and the demo read them (val: the demo's choice reads its first
500 sentences). Prints one JSON line.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tf_common  # noqa: E402,F401  (first: sets Keras' backend, quiets TensorFlow)
from common import add_record_flag, append_result, emit  # noqa: E402

CONTROLS = ("no_repeat_ngram_size", "repetition_penalty")
OFF = {"no_repeat_ngram_size": 0, "repetition_penalty": 1.0}
# The setting measured on a run that records none: the n-gram ban fairseq's users reach for.
STATED = {"no_repeat_ngram_size": 3, "repetition_penalty": 1.0}
SPLITS = {"test2016": "test", "val": "dev"}  # --split -> the dataset's split


def setting(args, saved):
    """({control: value}, where it came from): each flag given, else the run's, else STATED."""
    given = {name: getattr(args, name) for name in CONTROLS if getattr(args, name) is not None}
    if any(name in saved for name in CONTROLS):
        base, source = {name: saved.get(name, OFF[name]) for name in CONTROLS}, "run"
    else:
        base, source = dict(STATED), "stated"
    return {**base, **given}, ("flags" if given else source)


def decode(engine, sources):
    """(translations, seconds) of `sources`, after an untimed batch traces the search."""
    engine.translate(sources[:8])
    start = time.perf_counter()
    translations = engine.translate(sources)
    return translations, time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, help="the demo's run (or any Multi30k run)")
    parser.add_argument("--split", default="test2016", choices=sorted(SPLITS),
                        help="test2016 (default) or val")
    parser.add_argument("--sentences", type=int, help="the first N sentences only")
    parser.add_argument("--no-repeat-ngram-size", type=int,
                        help="default: the run's decoding.json, else 3")
    parser.add_argument("--repetition-penalty", type=float,
                        help="default: the run's decoding.json, else 1.0")
    add_record_flag(parser, "repetition")
    args = parser.parse_args(argv)

    import sacrebleu

    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.evaluation.stutter import stutter_count
    from keras_transformer.hardware import describe_cpu
    from keras_transformer.runs import open_run
    from pipelines import datasets

    run = open_run(args.run_dir)
    config = run.config
    sources, references = datasets.split_texts(config.dataset, SPLITS[args.split],
                                               **config.data_arguments())
    sources, references = sources[:args.sentences], references[:args.sentences]
    values, source = setting(args, run.decoding())
    off = Decoder.resolve(run, OFF)  # a given value wins over the run's
    on = Decoder.resolve(run, values)
    model = off.load_model()
    vocabulary = run.vocabulary()
    record = {"benchmark": "repetition", "run_dir": str(args.run_dir), "split": args.split,
              "sentences": len(sources), "beam": off.request.beam_size,
              "alpha": off.request.alpha, "precision": off.precision[0],
              "chosen_by": off.chosen_by, "setting": values, "setting_from": source,
              **describe_cpu()}
    outputs = {}
    for name, decoder in (("off", off), ("on", on)):
        translations, seconds = decode(decoder.engine(model), sources)
        outputs[name] = translations
        record[f"sacrebleu_{name}"] = round(
            sacrebleu.corpus_bleu(translations, [references]).score, 2)
        record[f"stutters_{name}"] = stutter_count(translations, vocabulary)
        record[f"seconds_{name}"] = round(seconds, 2)
    record["outputs_changed"] = sum(a != b for a, b in zip(outputs["off"], outputs["on"]))
    record["time_ratio"] = round(record["seconds_on"] / record["seconds_off"], 3)
    line = emit(record)
    if args.record:
        append_result("repetition", line)


if __name__ == "__main__":
    main()
