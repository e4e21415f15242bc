"""Sequence-level distillation on Multi30k en-de, measured end to end (docs/results.md,
"Distillation"): a teacher, a student trained on the teacher's translations with the demo's
recipe and steps, and the demo itself (the same recipe on the references) as the baseline.

    python benchmarks/distillation.py --work runs/distillation            # everything
    python benchmarks/distillation.py --work runs/distillation --stages timing,ctranslate2

Stages, in order; each one that finished is skipped, so the same command resumes after a stop:

    teacher      `keras-transformer demo --train-steps N` (the quick recipe trained longer; the
                 job chooses weights and alpha on val and decodes test2016 once)
    student      `keras-transformer distill --teacher TEACHER` with the quick recipe's settings
                 (the demo's model, steps and schedule), then the demo's choices on val
                 (weights, alpha) and test2016 decoded once
    baseline     `keras-transformer demo` (the quick recipe on the references)
    timing       `keras-transformer translate` on test2016, the whole command, for each
    ctranslate2  the student exported to CTranslate2 int8, timed the same way and scored
    val          whole-val sacreBLEU and literature BLEU of the three, each with its saved
                 choice (val may be decoded again; test2016 is not)

Every choice is made on val; test2016 is decoded once per model (teacher and baseline by their
demo job, the student by its stage). Results go to WORK/results.json (rewritten after each
stage) and the last line printed is that JSON.
"""

import argparse
import gzip
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
STAGES = ("teacher", "student", "baseline", "timing", "ctranslate2", "val")
# The command line tool installed beside this interpreter (the venv's), else the one on PATH.
CLI = [str(pathlib.Path(sys.executable).with_name("keras-transformer"))
       if pathlib.Path(sys.executable).with_name("keras-transformer").exists()
       else "keras-transformer"]
SCORE_KEYS = ("sacrebleu", "chrf", "literature_bleu", "sacrebleu_signature")


def command(*args, log=None):
    """Runs the command line tool; its output goes to `log` (appended)."""
    with open(log, "a") if log else open(os.devnull, "w") as out:
        started = time.monotonic()
        subprocess.run([*CLI, *map(str, args)], cwd=ROOT, check=True, stdout=out,
                       stderr=subprocess.STDOUT)
    return time.monotonic() - started


def multi30k_text(split, lang):
    from pipelines import sources

    stem = {"dev": "val", "test": "test_2016_flickr"}[split]
    path = pathlib.Path(sources.default_multi30k_dir()) / f"{stem}.{lang}.gz"
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def scores(run_dir, split, output):
    """Decodes a Multi30k split with the run's saved choice; returns its scores."""
    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.evaluation.evaluate import evaluate_split
    from keras_transformer.runs import open_run
    from pipelines import datasets

    decoder = Decoder.resolve(open_run(run_dir))
    request, translator = decoder.request, decoder.engine()
    official = datasets.official_tokenized_references("multi30k", split, "de")
    result = evaluate_split(translator, multi30k_text(split, "en"), multi30k_text(split, "de"),
                            lang="de", official_references=official, output=output,
                            progress=False)
    return {key: result[key] for key in SCORE_KEYS} | {"beam": request.beam_size,
                                                       "alpha": float(request.alpha)}


def student_choice(student_dir):
    """The demo's choices for the distilled student, on Multi30k val: weights, then alpha."""
    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.decoding.request import DEFAULTS
    from keras_transformer.runs import Run
    from keras_transformer.tasks.tuning import VAL_SENTENCES, choose_alpha, choose_weights

    run = Run(student_dir)
    sources = multi30k_text("dev", "en")[:VAL_SENTENCES]
    references = multi30k_text("dev", "de")[:VAL_SENTENCES]
    model, weights, by_weights = choose_weights(run, sources, references)
    run.save_model(model, averaged=True)
    alpha, by_alpha = choose_alpha(model, run.vocabulary(), run.config.max_length, sources,
                                   references, DEFAULTS["beam_size"])
    Decoder.save_choice(run, beam_size=DEFAULTS["beam_size"], alpha=alpha, weights=weights,
                        model=run.averaged_path.name,
                        chosen_by=f"benchmarks/distillation.py on val (first {VAL_SENTENCES} sentences)")
    return {"weights": weights, "val_greedy_sacrebleu": by_weights, "alpha": alpha,
            "val_beam_sacrebleu_by_alpha": {str(a): v for a, v in by_alpha.items()}}


def timed_translate(run_dir, source, output, log, *extra):
    seconds = command("translate", "--run-dir", run_dir, "--input", source, "--output", output,
                      *extra, log=log)
    return round(seconds, 1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=pathlib.Path, required=True,
                        help="folder of the three runs and the results")
    parser.add_argument("--teacher-steps", type=int, default=3000,
                        help="optimizer steps of the teacher (the quick recipe's model)")
    parser.add_argument("--teacher-beam", type=int, default=None,
                        help="the teacher's beam for the distilled corpus (default: its saved "
                             "choice, made on val by its demo job)")
    parser.add_argument("--stages", default=",".join(STAGES),
                        help=f"comma-separated, among {', '.join(STAGES)}")
    args = parser.parse_args(argv)
    stages = [stage for stage in args.stages.split(",") if stage]
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        parser.error(f"--stages: unknown {', '.join(unknown)}; choose among {', '.join(STAGES)}")
    sys.path[:0] = [str(ROOT)]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # the commands' own logs stay quiet too
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "distillation.log"
    results_path = work / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    teacher, student, baseline = work / "teacher", work / "student", work / "baseline"
    runs = {"teacher": teacher, "student": student, "baseline": baseline}

    from keras_transformer.tasks.main_job import QUICK
    from pipelines.files import write_text

    def save(stage, value):
        results[stage] = value
        write_text(results_path, json.dumps(results, indent=1, default=str) + "\n")
        print(f"{stage}: {json.dumps(value, default=str)}", flush=True)

    def demo_summary(run_dir):
        summary = json.loads((run_dir / "summary.json").read_text())
        return {"training": summary["training"], "weights": summary["weights"],
                "alpha": summary["alpha"], "val_greedy_sacrebleu": summary["val_greedy_sacrebleu"],
                "val_beam_sacrebleu_by_alpha": summary["val_beam_sacrebleu_by_alpha"],
                "test2016": {key: summary["test2016"][key] for key in SCORE_KEYS},
                "job_minutes": summary["job_minutes"]}

    exports = work / "saved_models"
    if "teacher" in stages and "teacher" not in results:
        if not (teacher / "summary.json").exists():  # a finished demo job is not run again
            command("demo", "--train-steps", args.teacher_steps, "--output-dir", teacher,
                    "--export-dir", exports, log=log)
        save("teacher", demo_summary(teacher))
    if "student" in stages and "student" not in results:
        started = time.monotonic()
        settings = ["--preset", QUICK["preset"], "--num-layers", QUICK["num_layers"],
                    "--dropout", QUICK["dropout"], "--train-steps", QUICK["train_steps"],
                    "--warmup-steps", QUICK["warmup_steps"],
                    "--tokens-per-batch", QUICK["tokens_per_batch"],
                    "--vocab-size", QUICK["vocab_size"], "--max-length", QUICK["max_length"],
                    "--eval-steps", QUICK["eval_steps"],
                    "--checkpoint-steps", QUICK["checkpoint_steps"],
                    "--checkpoint-minutes", QUICK["checkpoint_minutes"],
                    "--keep-checkpoints", QUICK["keep_checkpoints"]]
        beam = [] if args.teacher_beam is None else ["--beam", args.teacher_beam]
        # (--no-tune: the student's choices are the demo's, made below as the docs record)
        command("distill", "--teacher", teacher, "--output-dir", student, *beam, *settings,
                "--no-tune", log=log)
        distill_minutes = (time.monotonic() - started) / 60
        choice = student_choice(student)
        test = scores(student, "test", student / "hyp.test2016.beam4.txt")
        config = json.loads((student / "config.json").read_text())
        save("student", {"distill_minutes": round(distill_minutes, 1), **choice,
                         "test2016": test, "distill": config.get("distill")})
    if "baseline" in stages and "baseline" not in results:
        if not (baseline / "summary.json").exists():
            command("demo", "--output-dir", baseline, "--export-dir", exports, log=log)
        save("baseline", demo_summary(baseline))
    source = work / "test2016.en"
    if not source.exists():
        write_text(source, "\n".join(multi30k_text("test", "en")) + "\n")
    if "timing" in stages and "timing" not in results:
        load = os.getloadavg()[0]
        save("timing", {"load_before": load, "sentences": 1000, **{
            name: timed_translate(run_dir, source, work / f"{name}.test2016.txt", log)
            for name, run_dir in runs.items()}})
    if "ctranslate2" in stages and "ctranslate2" not in results:
        import sacrebleu

        folder = work / "ct2-student-int8"
        command("export", "--run-dir", student, "--format", "ctranslate2", "--quantize",
                "int8", "--output-dir", folder, "--overwrite", log=log)
        models = sorted(path.parent for path in folder.rglob("model.bin"))
        output = work / "student.ct2.test2016.txt"
        seconds = timed_translate(student, source, output, log, "--engine", "ctranslate2",
                                  "--ctranslate2-model", models[-1])
        hypotheses = output.read_text(encoding="utf-8").splitlines()
        bleu = sacrebleu.corpus_bleu(hypotheses, [multi30k_text("test", "de")])
        size = sum(path.stat().st_size for path in models[-1].iterdir())
        save("ctranslate2", {"model": str(models[-1]), "mib": round(size / 2**20, 2),
                             "translate_seconds": seconds,
                             "test2016_sacrebleu": round(bleu.score, 2)})
    if "val" in stages and "val" not in results:
        save("val", {name: scores(run_dir, "dev", run_dir / "hyp.val.whole.txt")
                     for name, run_dir in runs.items()})
    print(json.dumps(results, default=str))


if __name__ == "__main__":
    main()
