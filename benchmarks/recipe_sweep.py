"""Recipe sweep for the main job (issue 17): each setting trains Multi30k en-de for the same
short budget of training time, then decodes the first 500 val sentences greedily with its final
weights. Quality per CPU-minute, compared on val only (test2016 is never read here).

    python benchmarks/recipe_sweep.py                        # every setting, 12 minutes each
    python benchmarks/recipe_sweep.py --minutes 15 --only base,warmup200
    python benchmarks/recipe_sweep.py --list

Runs go to OUTPUT/<setting>/; a setting whose result is in OUTPUT/results.jsonl is skipped, so
running the command again resumes the sweep. A setting cut short is trained again from the
start (the time limit counts from each start, so resuming it would give it more than the
budget). Between settings the sweep waits
while the file OUTPUT/PAUSE exists (so a quiet measurement can take the cores). Prints one JSON
line per setting as it finishes and a last one with every result.
"""

import argparse
import json
import os
import pathlib
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit  # noqa: E402

from keras_transformer.tasks.main_job import VAL_SENTENCES  # noqa: E402  (the job's val slice)

# Every setting starts from the main job's recipe (the `multi30k` preset, 8000 pieces, 4096
# tokens per batch, warmup 800) and changes what its name says.
BASE = dict(preset="multi30k", vocab_size=8000, tokens_per_batch=4096, warmup_steps=800)
SETTINGS = {
    "base": {},
    "warmup200": dict(warmup_steps=200),
    "warmup200-tokens2048": dict(warmup_steps=200, tokens_per_batch=2048),
    "warmup200-lr2": dict(warmup_steps=200, lr_scale=2.0),
    "warmup200-dropout0.1": dict(warmup_steps=200, dropout=0.1),
    "warmup200-vocab4000": dict(warmup_steps=200, vocab_size=4000),
    "warmup200-layers2": dict(warmup_steps=200, num_layers=2),
    "tiny-d128-warmup200": dict(preset="multi30k-tiny", warmup_steps=200),
}


def run_setting(name, minutes, output):
    from keras_transformer.decoding.translate import Translator
    from keras_transformer.evaluation.bleu import score
    from keras_transformer.runs import Run, make_config
    from keras_transformer.training.trainer import train
    from pipelines import datasets

    settings = dict(BASE, **SETTINGS[name])
    run_dir = output / name
    shutil.rmtree(run_dir, ignore_errors=True)  # a setting cut short starts over (see above)
    config = make_config(None, dataset="multi30k", output_dir=str(run_dir), train_steps=1_000_000,
                         time_limit_minutes=minutes, checkpoint_minutes=10_000,
                         checkpoint_steps=100, keep_checkpoints=3, eval_steps=1_000_000,
                         verbose=0, **settings)
    summary = train(config)
    run = Run(run_dir)
    sources, references = datasets.split_texts("multi30k", "dev", **run.config.data_arguments())
    translator = Translator(run.load_model(prefer_averaged=False), run.tokenizer(), beam_size=1,
                            max_input_length=run.config.max_length)
    bleu = score(translator.translate(sources[:VAL_SENTENCES]), references[:VAL_SENTENCES])
    return {"setting": name, **SETTINGS[name], "steps": summary["step"],
            "train_minutes": round(summary["seconds"] / 60, 1),
            "tokens_per_s": summary["tokens_per_s"],
            "val_perplexity": round(summary.get("val_perplexity", float("nan")), 2),
            "val500_greedy_sacrebleu": round(bleu["sacrebleu"], 2)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=12.0,
                        help="training time of each setting (default 12)")
    parser.add_argument("--only", help="comma-separated setting names (default: all)")
    parser.add_argument("--output", default="runs/sweep", help="runs and results.jsonl")
    parser.add_argument("--list", action="store_true", help="print the settings and stop")
    args = parser.parse_args(argv)
    if args.list:
        for name, change in SETTINGS.items():
            print(f"{name}: {dict(BASE, **change)}")
        return
    names = args.only.split(",") if args.only else list(SETTINGS)
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        parser.error(f"unknown setting(s) {unknown}; --list shows them")
    output = pathlib.Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    results_path = output / "results.jsonl"
    done = {}
    if results_path.exists():
        for line in results_path.read_text().splitlines():
            record = json.loads(line)
            done[record["setting"]] = record
    for name in names:
        if name in done:
            continue
        while (output / "PAUSE").exists():
            time.sleep(5)
        record = run_setting(name, args.minutes, output)
        done[name] = record
        with results_path.open("a") as f:  # one complete line per finished setting
            f.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)
    emit({"benchmark": "recipe_sweep", "minutes": args.minutes,
          "results": [done[n] for n in names]})


if __name__ == "__main__":
    main()
