"""Recipe sweep for the main job: each setting trains Multi30k en-de for a budget of optimizer
steps (the same work on every machine), its warmup a fixed fraction of that budget, then decodes
the first 500 val sentences greedily with its final weights and with the average of its last 5
checkpoints. Settings are ranked on val only (test2016 is never read here).

    python benchmarks/recipe_sweep.py --steps 600                  # every setting, 600 steps
    python benchmarks/recipe_sweep.py --steps 1200 --only base,layers2
    python benchmarks/recipe_sweep.py --list

Runs go to OUTPUT/<setting>-<steps>/ and results to OUTPUT/results.jsonl (one line per setting
and budget). A setting with a result is skipped, so the same command resumes the sweep; a
setting cut short resumes from its last checkpoint at its saved data position (the same batches
an uninterrupted run would see). Between settings the sweep waits while the file OUTPUT/PAUSE
exists (so a quiet measurement can take the cores). Prints one JSON line per setting as it
finishes and a last one with every result of this budget.

Each line: the setting and its changes, steps, warmup, params, GFLOP per step (matmul FLOPs,
forward and backward: 6 x weights x tokens of each side, the output projection included),
training minutes, tokens/s, the CPU (model, class, cores, TF_ENABLE_ONEDNN_OPTS), val
perplexity, and val BLEU (sacreBLEU, greedy, first 500) of the final weights and of the
average of the last 5 checkpoints.

Like the other benchmarks it takes TensorFlow's kernels as the environment says: the command's
CPU defaults (keras_transformer/hardware.py) are not applied, so on the AVX2 class run it with
TF_ENABLE_ONEDNN_OPTS=1 to time it as `keras-transformer train` trains (the BLEU does not
depend on it; the minutes do).
"""

import argparse
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tf_common  # noqa: E402,F401  (first: sets Keras' backend, quiets TensorFlow)
from common import emit  # noqa: E402
from flops import matmul_params  # noqa: E402

from keras_transformer.hardware import describe_cpu  # noqa: E402
from keras_transformer.tasks.main_job import RECIPE, VAL_SENTENCES  # noqa: E402

# Every setting starts from the main job's recipe (the `multi30k` preset: 3 layers, d_model 256,
# d_ff 1024, dropout 0.2; 8000 pieces, 4096 tokens per batch, label smoothing 0.1) with its
# warmup as a fraction of the budget (the demo's 800 of 1200 steps), and changes what its name
# says.
BASE = dict(preset=RECIPE["preset"], vocab_size=RECIPE["vocab_size"],
            tokens_per_batch=RECIPE["tokens_per_batch"], warmup_fraction=2 / 3)
SETTINGS = {
    "base": {},
    # Depth.
    "layers2": dict(num_layers=2),
    # The learning rate: warmup length (the peak comes at the end of it, and is lower the
    # longer it is) and a scale on the whole schedule (--lr-scale).
    "layers2-warmup1.33": dict(num_layers=2, warmup_fraction=4 / 3),  # still rising at the end
    "layers2-warmup0.33": dict(num_layers=2, warmup_fraction=1 / 3),
    "layers2-warmup0.33-lr0.5": dict(num_layers=2, warmup_fraction=1 / 3, lr_scale=0.5),
    "layers2-lr0.5": dict(num_layers=2, lr_scale=0.5),
    "layers2-lr0.7": dict(num_layers=2, lr_scale=0.7),
    # Vocabulary, batch, width, regularization, on the 2-layer model.
    "layers2-vocab4000": dict(num_layers=2, vocab_size=4000),
    "layers2-vocab6000": dict(num_layers=2, vocab_size=6000),
    "layers2-vocab10000": dict(num_layers=2, vocab_size=10000),
    "layers2-tokens2048": dict(num_layers=2, tokens_per_batch=2048),
    "layers2-tokens6144": dict(num_layers=2, tokens_per_batch=6144),
    "layers2-dropout0.1": dict(num_layers=2, dropout=0.1),
    "layers2-dropout0.3": dict(num_layers=2, dropout=0.3),
    "layers2-ls0.0": dict(num_layers=2, label_smoothing=0.0),
    "layers2-ls0.2": dict(num_layers=2, label_smoothing=0.2),
    "layers2-d384-ff1536": dict(num_layers=2, d_model=384, d_ff=1536, num_heads=6),
    "layers2-ff512": dict(num_layers=2, d_ff=512),
    # Less dropout, and P_drop 0.1 combined with the vocabulary and the learning rate.
    "layers2-dropout0.0": dict(num_layers=2, dropout=0.0),
    "layers2-dropout0.1-vocab10000": dict(num_layers=2, dropout=0.1, vocab_size=10000),
    "layers2-dropout0.1-lr0.7": dict(num_layers=2, dropout=0.1, lr_scale=0.7),
}
AVERAGE_LAST = 5  # checkpoints averaged for the second score (10 are taken per budget)


def gflop_per_step(model, source_tokens, target_tokens):
    """Matmul GFLOP of one training step (forward + backward = 6 x weights x tokens)."""
    vocab = model.target_vocab_size or model.vocab_size
    decoder = matmul_params(model.decoder) + vocab * model.architecture["d_model"]
    return 6 * (matmul_params(model.encoder) * source_tokens + decoder * target_tokens) / 1e9


def run_setting(name, steps, output):
    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.decoding.request import Request
    from keras_transformer.evaluation.bleu import score
    from keras_transformer.runs import Run, make_config
    from keras_transformer.training.trainer import train
    from pipelines import datasets

    settings = dict(BASE, **SETTINGS[name])
    warmup = max(1, round(settings.pop("warmup_fraction") * steps))
    run_dir = output / f"{name}-{steps}"
    config = make_config(None, dataset="multi30k", output_dir=str(run_dir), train_steps=steps,
                         warmup_steps=warmup, checkpoint_minutes=10_000,
                         checkpoint_steps=max(1, steps // 10), keep_checkpoints=10,
                         eval_steps=steps, verbose=0, **settings)
    started = time.monotonic()
    summary = train(config)
    run = Run(run_dir)
    sources, references = datasets.split_texts("multi30k", "dev", **run.config.data_arguments())
    sources, references = sources[:VAL_SENTENCES], references[:VAL_SENTENCES]

    def val_bleu(model):
        translator = Decoder(Request(beam_size=1), run).engine(model)
        return round(score(translator.translate(sources), references)["sacrebleu"], 2)

    model = run.load_model(prefer_averaged=False)
    final = val_bleu(model)
    averaged, paths = run.average(AVERAGE_LAST)
    trained = summary["step"] - summary.get("start_step", 0)  # steps this process trained
    side_tokens = summary.get("tokens", 0) / max(trained, 1) / 2  # source + target, ~half each
    return {"setting": name, **SETTINGS[name], "steps": summary["step"], "warmup_steps": warmup,
            "params": model.count_params(),
            "gflop_per_step": round(gflop_per_step(model, side_tokens, side_tokens), 1),
            "train_minutes": round(summary.get("seconds", 0) / 60, 1),
            "trained_steps_now": trained,
            "tokens_per_s": summary.get("tokens_per_s"),
            **describe_cpu(), "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default"),
            "val_perplexity": round(summary.get("val_perplexity", float("nan")), 2),
            "val500_greedy_sacrebleu": final,
            f"val500_greedy_sacrebleu_avg{len(paths)}": val_bleu(averaged),
            "wall_minutes": round((time.monotonic() - started) / 60, 1)}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Settings (--list shows each one's values): " + ", ".join(SETTINGS))
    parser.add_argument("--steps", type=int, default=600,
                        help="optimizer steps of each setting (default 600); warmup is the "
                             "setting's fraction of it")
    parser.add_argument("--only", help="comma-separated setting names, run in that order "
                                       "(default: all)")
    parser.add_argument("--output", default="runs/sweep", help="runs and results.jsonl "
                                                               "(default runs/sweep)")
    parser.add_argument("--list", action="store_true", help="print the settings and stop")
    args = parser.parse_args(argv)
    if args.list:
        for name, change in SETTINGS.items():
            print(f"{name}: {dict(BASE, **change)}")
        return
    if args.steps < 10:
        parser.error(f"--steps must be at least 10; got {args.steps}")
    names = args.only.split(",") if args.only else list(SETTINGS)
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        parser.error(f"unknown setting(s) {unknown}; --list shows them")
    output = pathlib.Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    results_path = output / "results.jsonl"
    done = {}
    if results_path.exists():
        for number, line in enumerate(results_path.read_text().splitlines(), 1):
            try:
                record = json.loads(line)
                done[(record["setting"], record["steps"])] = record
            except (ValueError, KeyError):
                sys.exit(f"{results_path}:{number}: not a result line ({line[:60]!r}); remove "
                         "it and run again")
    for name in names:
        if (name, args.steps) in done:
            continue
        while (output / "PAUSE").exists():
            time.sleep(5)
        record = run_setting(name, args.steps, output)
        done[(name, args.steps)] = record
        with results_path.open("a") as f:  # one complete line per finished setting
            f.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)
    emit({"benchmark": "recipe_sweep", "steps": args.steps,
          "results": [done[(n, args.steps)] for n in names]})


if __name__ == "__main__":
    main()
