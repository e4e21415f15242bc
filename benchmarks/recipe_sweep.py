"""Recipe sweep for the main job: each setting trains Multi30k en-de for a budget of optimizer
steps (the same work on every machine), with one or several seeds, then decodes the first 500
val sentences greedily with its final weights and with the average of its last checkpoints.
Settings are ranked on val only (test2016 is never read here).

    python benchmarks/recipe_sweep.py --steps 1200 --seeds 3 --only 'quick*'  # the quick recipe
    python benchmarks/recipe_sweep.py --steps 1200 --only quick,quick-cosine --seeds 3
    python benchmarks/recipe_sweep.py --list

Runs go to OUTPUT/<setting>-<steps>[-seed<S>]/ (their checkpoints deleted once scored, unless
--keep-checkpoints) and results to OUTPUT/results.jsonl (one line per setting, budget and seed;
the default seed's run keeps the name without a suffix). A
setting with a result for that seed is skipped, so the same command resumes the sweep; a run
cut short resumes from its last checkpoint at its saved data position (the same batches an
uninterrupted run would see). The sweep goes seed by seed: every setting once, then every
setting with the next seed. Between runs the sweep waits while the file OUTPUT/PAUSE exists (so
a quiet measurement can take the cores). Prints one JSON line per run as it finishes and a last
one with, per setting, the mean and the spread (max - min) over its seeds.

Each line: the date, the commit, the CPU (model, class, cores, TF_ENABLE_ONEDNN_OPTS), the
setting and its changes, the seed, steps, warmup, params, GFLOP per step (matmul FLOPs, forward
and backward: 6 x weights x tokens of each side, the output projection included), training and
wall minutes, tokens/s, val perplexity, and val BLEU (sacreBLEU, greedy, first 500) of the
final weights and of the average of the last checkpoints.

The settings of the quick recipe (`quick-*`: `keras-transformer demo`'s 2 layers, P_drop 0,
the paper's schedule with warmup 2/3 of the steps) change one thing each: the learning-rate
schedule (a short warmup, then a decay to 0 at the last step), pre-norm with a higher peak and
gradient clipping, a moving average of the weights or an average of closer checkpoints, half
the tokens per batch for twice the steps, the vocabulary, width, label smoothing, dropout.
A `peak` of 1 is the peak today's recipe reaches at this budget (the paper's schedule at warmup
2/3 of the steps), so that a new schedule changes the shape and not the height.

Like the other benchmarks it takes TensorFlow's kernels as the environment says: the command's
CPU defaults (keras_transformer/hardware.py) are not applied, so on the AVX2 class run it with
TF_ENABLE_ONEDNN_OPTS=1 to time it as `keras-transformer train` trains (the BLEU does not
depend on it; the minutes do).
"""

import argparse
import fnmatch
import json
import os
import pathlib
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tf_common  # noqa: E402,F401  (first: sets Keras' backend, quiets TensorFlow)
from common import _commit, append_result, emit  # noqa: E402
from flops import matmul_params  # noqa: E402

from keras_transformer.hardware import describe_cpu  # noqa: E402
from keras_transformer.models.presets import get_preset  # noqa: E402
from keras_transformer.runs.sections import OptimizationSettings  # noqa: E402
from keras_transformer.tasks.main_job import QUICK, RECIPE, VAL_SENTENCES  # noqa: E402
from keras_transformer.training.schedule import paper_peak  # noqa: E402

# Every setting starts from the main job's recipe (the `multi30k` preset: 3 layers, d_model 256,
# d_ff 1024, dropout 0.2; 8000 pieces, 4096 tokens per batch, label smoothing 0.1) with its
# warmup as a fraction of the budget (the demo's 800 of 1200 steps), and changes what its name
# says.
BASE = dict(preset=RECIPE["preset"], vocab_size=RECIPE["vocab_size"],
            tokens_per_batch=RECIPE["tokens_per_batch"], warmup_fraction=2 / 3)
DEFAULT_SEED = OptimizationSettings.seed  # the runs' own default: a run of it has no suffix
AVERAGE_LAST = 5  # checkpoints averaged for the second score (10 kept)
SHORT_WARMUP = 1 / 12  # of the steps: 100 of 1200


def quick(**changes):
    """A setting of the quick recipe (the demo's: tasks/main_job.QUICK, its checkpoints as
    often: 100 of 1200 steps) with `changes`."""
    return {"num_layers": QUICK["num_layers"], "dropout": QUICK["dropout"],
            "checkpoint_fraction": QUICK["checkpoint_steps"] / QUICK["train_steps"], **changes}


def decaying(schedule, peak=1.0, **changes):
    """The quick recipe with a short warmup and `schedule` decaying to 0 at the last step."""
    return quick(lr_schedule=schedule, warmup_fraction=SHORT_WARMUP, peak=peak, **changes)


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
    # The quick recipe as the demo trains it, and one change each.
    "quick": quick(),
    # The schedule: a short warmup, then a decay to 0 by the last step, at today's peak.
    "quick-linear": decaying("linear"),
    "quick-cosine": decaying("cosine"),
    "quick-wsd": decaying("wsd", cooldown_fraction=0.25),
    "quick-cosine-peak1.5": decaying("cosine", peak=1.5),
    # Pre-norm (final LayerNorms) with twice the peak and gradient clipping.
    "quick-prenorm-lr2-clip1": quick(norm_first=True, lr_scale=2.0, clip_norm=1.0),
    "quick-prenorm-cosine-peak2-clip1": decaying("cosine", peak=2.0, norm_first=True,
                                                 clip_norm=1.0),
    # The weights: a moving average, or the mean of checkpoints 50 steps apart.
    "quick-ema0.99": quick(ema_momentum=0.99),
    "quick-ema0.998": quick(ema_momentum=0.998),
    "quick-avg8-every50": quick(checkpoint_fraction=1 / 24, average_last=8),
    # Half the tokens per batch for twice the steps (the same tokens).
    "quick-tokens2048-steps2x": quick(tokens_per_batch=2048, steps_factor=2),
    # Vocabulary, width, feed-forward size, label smoothing, dropout.
    "quick-vocab4000": quick(vocab_size=4000),
    "quick-vocab6000": quick(vocab_size=6000),
    "quick-d384-ff1536": quick(d_model=384, d_ff=1536, num_heads=6),
    "quick-ff512": quick(d_ff=512),
    "quick-ff2048": quick(d_ff=2048),
    "quick-ls0.0": quick(label_smoothing=0.0),
    "quick-ls0.2": quick(label_smoothing=0.2),
    "quick-dropout0.05": quick(dropout=0.05),
    "quick-dropout0.1": quick(dropout=0.1),
}
# Keys of a setting that the sweep reads itself (fractions are of the setting's steps); the
# others are `keras-transformer train` settings (runs/sections.py).
SWEEP_KEYS = ("warmup_fraction", "peak", "steps_factor", "checkpoint_fraction", "average_last")


def gflop_per_step(model, source_tokens, target_tokens):
    """Matmul GFLOP of one training step (forward + backward = 6 x weights x tokens)."""
    vocab = model.target_vocab_size or model.vocab_size
    decoder = matmul_params(model.decoder) + vocab * model.architecture["d_model"]
    return 6 * (matmul_params(model.encoder) * source_tokens + decoder * target_tokens) / 1e9


def run_config(name, steps, seed, output):
    """(config, plan) of one run: the train settings, and the sweep's own (steps, warmup,
    checkpoints averaged)."""
    from keras_transformer.runs import make_config

    settings = dict(BASE, **SETTINGS[name])
    sweep = {key: settings.pop(key) for key in SWEEP_KEYS if key in settings}
    train_steps = steps * sweep.get("steps_factor", 1)
    warmup = max(1, round(sweep["warmup_fraction"] * train_steps))
    if "peak" in sweep:  # relative to the peak of today's recipe at this budget
        d_model = get_preset(BASE["preset"])["model"]["d_model"]
        settings["peak_lr"] = sweep["peak"] * paper_peak(d_model, round(2 / 3 * steps))
    average = sweep.get("average_last", AVERAGE_LAST)
    every = max(1, round(sweep.get("checkpoint_fraction", 1 / 10) * train_steps))
    suffix = "" if seed == DEFAULT_SEED else f"-seed{seed}"
    config = make_config(None, dataset="multi30k", output_dir=str(output / f"{name}-{steps}"
                                                                  f"{suffix}"),
                         train_steps=train_steps, warmup_steps=warmup, seed=seed,
                         checkpoint_minutes=10_000, checkpoint_steps=every,
                         keep_checkpoints=max(10, average), eval_steps=train_steps, verbose=0,
                         **settings)
    return config, dict(warmup_steps=warmup, train_steps=train_steps, average_last=average,
                        checkpoint_every=every)


def run_setting(name, steps, seed, output, val_sentences=VAL_SENTENCES):
    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.decoding.request import Request
    from keras_transformer.evaluation.bleu import score
    from keras_transformer.runs import Run
    from keras_transformer.training.trainer import train
    from pipelines import datasets

    config, plan = run_config(name, steps, seed, output)
    started = time.monotonic()
    summary = train(config)
    run = Run(config.output_dir)
    sources, references = datasets.split_texts("multi30k", "dev", **run.config.data_arguments())
    sources, references = sources[:val_sentences], references[:val_sentences]

    def val_bleu(model):
        translator = Decoder(Request(beam_size=1), run).engine(model)
        return round(score(translator.translate(sources), references)["sacrebleu"], 2)

    model = run.load_model(prefer_averaged=False)  # model.keras: the moving average if kept
    final = val_bleu(model)
    averaged, paths = run.average(plan["average_last"])
    trained = summary["step"] - summary.get("start_step", 0)  # steps this process trained
    side_tokens = summary.get("tokens", 0) / max(trained, 1) / 2  # source + target, ~half each
    val = f"val{len(sources)}_greedy_sacrebleu"
    return {"benchmark": "recipe_sweep", "setting": name, "changes": SETTINGS[name],
            "run_dir": str(run.directory),
            "steps": steps, "seed": seed, **plan, "trained_to": summary["step"],
            "params": model.count_params(),
            "gflop_per_step": round(gflop_per_step(model, side_tokens, side_tokens), 1),
            "train_minutes": round(summary.get("seconds", 0) / 60, 1),
            "trained_steps_now": trained,
            "tokens_per_s": summary.get("tokens_per_s"),
            **describe_cpu(), "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default"),
            "val_perplexity": round(summary.get("val_perplexity", float("nan")), 2),
            val: final, f"{val}_avg{len(paths)}": val_bleu(averaged),
            "wall_minutes": round((time.monotonic() - started) / 60, 1)}


def drop_checkpoints(run_dir):
    """Deletes a scored run's checkpoints (about 0.7 GB a run of the quick recipe: 10 of weights
    and Adam's moments); its config, model.keras and logs stay."""
    from keras_transformer.runs import Run

    shutil.rmtree(Run(run_dir).checkpoint_dir, ignore_errors=True)


def read_results(path):
    """{(setting, steps, seed): record} of a results file (a line without a seed is of the
    default seed); exits naming a line that is not a result."""
    done = {}
    if not path.exists():
        return done
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            record = json.loads(line)
            done[(record["setting"], record["steps"], record.get("seed", DEFAULT_SEED))] = record
        except (ValueError, KeyError):
            sys.exit(f"{path}:{number}: not a result line ({line[:60]!r}); remove it and run "
                     "again")
    return done


def seed_spread(records):
    """Per setting: the seeds, and the mean and spread (max - min) of each val BLEU figure."""
    by_setting = {}
    for record in records:
        by_setting.setdefault(record["setting"], []).append(record)
    table = {}
    for name, runs in by_setting.items():
        row = {"seeds": [r.get("seed", DEFAULT_SEED) for r in runs]}
        for key in sorted({k for r in runs for k in r if "sacrebleu" in k}):
            values = [r[key] for r in runs if key in r]
            row[key] = {"mean": round(statistics.fmean(values), 2),
                        "spread": round(max(values) - min(values), 2)}
        table[name] = row
    return table


def chosen(only):
    """(setting names in the order `only` gives them, patterns that match none)."""
    if not only:
        return list(SETTINGS), []
    names, unknown = [], []
    for pattern in only.split(","):
        matched = [n for n in SETTINGS if fnmatch.fnmatchcase(n, pattern)]
        unknown += [] if matched else [pattern]
        names += [n for n in matched if n not in names]
    return names, unknown


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Settings (--list shows each one's values): " + ", ".join(SETTINGS))
    parser.add_argument("--steps", type=int, default=600,
                        help="optimizer steps of each setting (default 600; the demo's quick "
                             "recipe: 1200); warmup is the setting's fraction of it")
    parser.add_argument("--seeds", type=int, default=1,
                        help=f"runs per setting, with seeds {DEFAULT_SEED}, {DEFAULT_SEED + 1}, "
                             "... (default 1)")
    parser.add_argument("--only", help="comma-separated setting names or shell patterns "
                                       "('quick*'), run in that order (default: all)")
    parser.add_argument("--output", default="runs/sweep", help="runs and results.jsonl "
                                                               "(default runs/sweep)")
    parser.add_argument("--val-sentences", type=int, default=VAL_SENTENCES,
                        help=f"val sentences decoded (default {VAL_SENTENCES}; fewer for a "
                             "smoke run)")
    parser.add_argument("--keep-checkpoints", action="store_true",
                        help="keep each run's checkpoints once it is scored (default: deleted; "
                             "about 0.7 GB a run)")
    parser.add_argument("--list", action="store_true", help="print the settings and stop")
    args = parser.parse_args(argv)
    if args.list:
        for name, change in SETTINGS.items():
            print(f"{name}: {dict(BASE, **change)}")
        return
    if args.steps < 10:
        parser.error(f"--steps must be at least 10; got {args.steps}")
    if args.seeds < 1 or args.val_sentences < 1:
        parser.error("--seeds and --val-sentences must be at least 1")
    names, unknown = chosen(args.only)
    if unknown:
        parser.error(f"unknown setting(s) {unknown}; --list shows them")
    sweep(names, args)


def sweep(names, args):
    output = pathlib.Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    results_path = output / "results.jsonl"
    done = read_results(results_path)
    seeds = [DEFAULT_SEED + i for i in range(args.seeds)]
    commit = _commit()  # of the code this process runs, whatever is committed meanwhile
    for seed in seeds:
        for name in names:
            if (name, args.steps, seed) in done:
                continue
            while (output / "PAUSE").exists():
                time.sleep(5)
            record = dict(run_setting(name, args.steps, seed, output, args.val_sentences),
                          commit=commit)
            # One complete line per finished run, with the date, commit and CPU class; the
            # file is rewritten whole through the project's atomic writer.
            done[(name, args.steps, seed)] = append_result("results", json.dumps(record),
                                                           results_dir=output)
            print(json.dumps(done[(name, args.steps, seed)]), flush=True)
            if not args.keep_checkpoints:
                drop_checkpoints(record["run_dir"])
    records = [done[(n, args.steps, s)] for s in seeds for n in names]
    emit({"benchmark": "recipe_sweep", "steps": args.steps, "seeds": seeds,
          "by_setting": seed_spread(records)})


if __name__ == "__main__":
    main()
