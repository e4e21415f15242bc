"""The three parts of the GPU check (benchmarks/gpu_check.py), each run in its own process:
a, the training-step speed (benchmarks/gpu.py: ours, torch.compile, KerasHub); b, the quick
recipe under JAX from the kit's data; c, the full recipe and a sweep on val. Each part writes
its results as JSON lines on standard output (`emit`), which the parent collects. The parent,
its time limits and the command line stay in gpu_check.py."""

import json
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent

A_FIRST = 165  # seconds of part a for ours and torch.compile; KerasHub has the rest
A_LEAST = 60  # KerasHub is not started with less left
C_RESERVE = 0.4  # the share of part c's time kept for choosing on val and decoding test2016

# Changes to the full recipe (tasks/main_job.py FULL), tried in this order while time allows.
SWEEP = (("full", {}),
         ("steps-8250", dict(train_steps=8250)),
         ("dropout-0.2", dict(dropout=0.2)),
         ("d512", dict(d_model=512, d_ff=2048, num_heads=8)),
         ("label-smoothing-0.2", dict(label_smoothing=0.2)))
# --tiny: a model and a schedule a CPU trains in seconds (the kit's data, cut to few steps).
# Two steps: a first one (its compilation) and a later one, each evaluated and checkpointed;
# under JAX every new batch shape is one more compilation, the bulk of a tiny run's time.
TINY_MODEL = dict(num_layers=1, d_model=32, num_heads=2, d_ff=64, tokens_per_batch=256,
                  warmup_steps=4, train_steps=2, eval_steps=1, checkpoint_steps=1,
                  keep_checkpoints=4, precision="float32")
TINY_SWEEP = (("full", {}), ("dropout-0.2", dict(dropout=0.2)))
BLOCKED = ("tensorflow", "tensorflow_text", "tensorflow_datasets")


def emit(record):
    """A result line on standard output (the parent process collects it)."""
    print(json.dumps(record, default=str), flush=True)


def block_tensorflow():
    """`import tensorflow` (and its text and datasets packages) fails from here on, as on the
    GPU machine, unless it was imported already."""
    for name in BLOCKED:
        sys.modules.setdefault(name, None)


def tensorflow_imported():
    return any(sys.modules.get(name) is not None for name in BLOCKED)

def run_capped(command, seconds):
    """Runs `command` for at most `seconds`; returns its exit status, or None when it was
    stopped at the limit. It stays in the part's process group, so the part's own limit stops
    it too (and PyTorch's compile workers, which end with their parent)."""
    child = subprocess.Popen(command, cwd=ROOT)
    try:
        return child.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        return None


def part_a(args):
    """benchmarks/gpu.py in two processes, in bf16: ours then torch.compile on base and big
    (at most A_FIRST seconds), then KerasHub on base and big with what is left of the part."""
    started, limit = time.monotonic(), args.limits["a"]
    gpu = [sys.executable, str(HERE / "gpu.py"), "--dtypes", "bf16", "--no-search"]
    if args.tiny:
        return status(run_capped([*gpu, "--tiny", "--engines", "ours", "--steps", "2",
                                  "--warmup", "1", "--attention", args.attention], limit))
    steps = ["--steps", "10", "--warmup", "2"]
    first = run_capped([*gpu, "--shapes", "base,big", "--engines", "ours,torch", *steps,
                        "--attention", args.attention], min(A_FIRST, limit))
    if first is None:
        emit({"check": "cut", "what": "gpu.py ours,torch", "limit_s": min(A_FIRST, limit)})
    left = limit - (time.monotonic() - started) - 5  # 5 s for this process to end
    if left < A_LEAST:
        emit({"check": "cut", "what": "gpu.py keras-hub", "left_s": round(left),
              "reason": f"fewer than {A_LEAST} s of part a left"})
        return status(first)
    second = run_capped([*gpu, "--shapes", "base,big", "--engines", "keras-hub", *steps], left)
    if second is None:
        emit({"check": "cut", "what": "gpu.py keras-hub", "limit_s": round(left)})
    return status(first) or status(second)


def status(code):
    """A process's exit status for the part's own: 1 for one stopped at its limit."""
    return 1 if code is None else code


def data_settings(args):
    """Where the kit's data is, and the run's numerics (--tiny: a tiny model, float32)."""
    settings = dict(prepared_data=str(args.kit / "data" / "prepared"),
                    source_dir=str(args.kit / "data" / "multi30k"), verbose=1)
    if args.tiny:
        settings.update(TINY_MODEL)
    return settings


def text_result(result):
    return {key: result.get(key) for key in ("sacrebleu", "chrf", "literature_bleu",
                                            "literature_references", "sacrebleu_signature")}


def speed(training):
    """The training's first step (its compilation included), and its steps per second: over
    the whole training, and after the first step (still counting the compilations of the
    other batch shapes, the dev evaluations and the checkpoints)."""
    steps = (training.get("step") or 0) - (training.get("start_step") or 0)
    seconds, first = training.get("seconds") or 0, training.get("first_step_seconds")
    result = {"first_step_s": first,
              "steps_per_s": round(steps / seconds, 2) if seconds else None}
    if first is not None and steps > 1 and seconds > first:
        result["steps_per_s_after_first"] = round((steps - 1) / (seconds - first), 2)
    return result


def part_b(args):
    """The quick recipe as the demo runs it (tasks/main_job.py), from the kit's data."""
    import keras

    from keras_transformer.runs import Run
    from keras_transformer.tasks import main_job

    settings = data_settings(args)
    summary = main_job.run(full=False, output_dir=str(args.work / "quick"), settings=settings)
    training = summary.get("training") or {}
    print(f"quick recipe: first step {training.get('first_step_seconds')} s (its compilation "
          f"included), {speed(training)}", flush=True)
    emit({"check": "quick_recipe", "backend": keras.backend.backend(),
          "recipe": {**main_job.QUICK, **settings},
          "train_minutes": round(training.get("seconds", 0) / 60, 2),
          "steps": training.get("step"), "stopped": training.get("stopped"),
          **speed(training), "tokens_per_s": training.get("tokens_per_s"),
          "pad_to_bucket": Run(args.work / "quick").config.pad_to_bucket,
          "precision": training.get("precision"),
          "val_perplexity": training.get("val_perplexity"),
          "weights": summary.get("weights"), "alpha": summary.get("alpha"),
          "val_greedy_sacrebleu": summary.get("val_greedy_sacrebleu"),
          "val_beam_sacrebleu_by_alpha": summary.get("val_beam_sacrebleu_by_alpha"),
          "test2016": summary.get("test2016"), "job_minutes": summary.get("job_minutes"),
          "tensorflow_imported": tensorflow_imported()})
    return 0


def part_c(args):
    """The full recipe and SWEEP, chosen on val; the best one's test2016 decoded once."""
    import keras

    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.decoding.request import DEFAULTS, Request
    from keras_transformer.evaluation.evaluate import evaluate_split
    from keras_transformer.runs import Run, make_config
    from keras_transformer.tasks import main_job
    from keras_transformer.tasks.tuning import VAL_SENTENCES, choose_alpha, choose_weights
    from keras_transformer.training.trainer import train
    from pipelines import datasets

    started = time.monotonic()
    limit = args.limits["c"]
    settings = data_settings(args)
    base = {**main_job.recipe(full=True), **settings}
    sweep = TINY_SWEEP if args.tiny else SWEEP
    where = dict(source_dir=settings["source_dir"])
    val_sources, val_references = datasets.split_texts("multi30k", "dev", **where)
    val_sources, val_references = val_sources[:VAL_SENTENCES], val_references[:VAL_SENTENCES]
    best, last_minutes, left_out = None, None, []
    for name, changes in sweep:
        spent = (time.monotonic() - started) / 60
        # Keep C_RESERVE of the part's time for the settings' choices on val, the best one's
        # alpha and test2016.
        training_minutes = (1 - C_RESERVE) * limit / 60 - spent
        if last_minutes is not None and 1.1 * last_minutes > training_minutes:
            left_out.append(name)
            continue
        setting_started = time.monotonic()
        directory = args.work / "sweep" / name
        config = make_config(None, origin="recipe", output_dir=str(directory),
                             time_limit_minutes=max(training_minutes, 0.1),
                             **{**base, **changes})
        training = train(config)
        run = Run(directory)
        model, weights, scores = choose_weights(run, val_sources, val_references)
        val = max(scores.values())
        last_minutes = (time.monotonic() - setting_started) / 60
        emit({"check": "sweep", "setting": name, "changes": changes,
              "train_minutes": round(training.get("seconds", 0) / 60, 2),
              "setting_minutes": round(last_minutes, 2), "steps": training.get("step"),
              "stopped": training.get("stopped"), **speed(training),
              "pad_to_bucket": run.config.pad_to_bucket,
              "tokens_per_s": training.get("tokens_per_s"),
              "precision": training.get("precision"),
              "val_perplexity": training.get("val_perplexity"), "weights": weights,
              "val_greedy_sacrebleu": val, "val_by_weights": scores})
        if best is None or val > best[2]:
            best = (name, model, val, run, changes)
        model = None
        keras.backend.clear_session()  # the chosen model stays referenced in `best`
    if left_out:
        emit({"check": "sweep_left_out", "settings": left_out, "limit_s": limit,
              "reason": "the part's time would not have held another setting"})
    name, model, val, run, changes = best
    tokenizer = run.vocabulary()
    config = run.config
    beam = DEFAULTS["beam_size"]
    alpha, by_alpha = choose_alpha(model, tokenizer, config.max_length, val_sources,
                                   val_references, beam)
    translator = Decoder(Request(beam_size=beam, alpha=alpha)).engine(model, tokenizer,
                                                                     config.max_length)
    sources, references = datasets.split_texts("multi30k", "test", **where)
    official = datasets.official_tokenized_references("multi30k", "test", config.tgt_lang,
                                                      settings["source_dir"])
    result = evaluate_split(translator, sources, references, lang=config.tgt_lang,
                            official_references=official, progress=False)
    emit({"check": "full_recipe_best", "setting": name, "changes": changes,
          "val_greedy_sacrebleu": val, "beam": beam, "alpha": alpha,
          "val_beam_sacrebleu_by_alpha": {str(a): v for a, v in by_alpha.items()},
          "test2016": text_result(result), "backend": keras.backend.backend(),
          "minutes": round((time.monotonic() - started) / 60, 2),
          "tensorflow_imported": tensorflow_imported()})
    return 0
