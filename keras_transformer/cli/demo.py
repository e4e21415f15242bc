"""`demo`: the main job (tasks/main_job.py: the stages of tasks/stages.py in a row), for one
pair or several."""

from keras_transformer.decoding.request import DEFAULTS
from keras_transformer.defaults import EXPORT_DIR


def demo(args):
    from keras_transformer.errors import ConfigError
    from keras_transformer.tasks.main_job import run

    targets = list(dict.fromkeys(args.tgt_lang))
    if len(targets) != len(args.tgt_lang):
        raise ConfigError(f"--tgt-lang {' '.join(args.tgt_lang)}: a language is given twice; "
                          "give each target once.")
    run(full=args.full, src_lang=args.src_lang, tgt_lang=targets if len(targets) > 1 else
        targets[0], output_dir=args.output_dir, export_dir=args.export_dir,
        train_steps=args.train_steps)


def register(commands):
    from keras_transformer.tasks.main_job import FULL, QUICK, members, recipe  # no TensorFlow

    parser = commands.add_parser(
        "demo",
        help="the main job: Multi30k vocabulary, training, averaging, test2016 BLEU, export",
        description="Runs the whole main job on Multi30k (../shared/data/multi30k if present, "
        "else downloaded): builds the vocabulary, trains for a fixed number of optimizer steps "
        f"(quick: {QUICK['train_steps']} steps of the {QUICK['preset']} preset with "
        f"{QUICK['num_layers']} layers and P_drop {QUICK['dropout']}, about 25 minutes of "
        f"training on 2 cores of an AVX2 AMD EPYC; --full: {FULL['train_steps']} steps of the "
        "3-layer preset, for en-de an ensemble of three models), "
        "chooses the weights (final, best or an average of checkpoints), the length penalty "
        "and the repetition controls on val as `keras-transformer tune` does (decoding.json, "
        f"with every try), evaluates test2016 (--full: val too) with beam "
        f"{DEFAULTS['beam_size']} (sacreBLEU, "
        f"chrF and the Multi30k literature's BLEU), exports a SavedModel and a CTranslate2 int8 "
        f"folder under {EXPORT_DIR}/ (the latter where the ctranslate2 package is installed), "
        "translates example sentences through the SavedModel and prints a summary. Running it "
        "again on a finished run skips the training; on a killed one, resumes it.",
    )
    ensemble = ", ".join(name for name, _ in members(True, "de"))
    parser.add_argument("--full", action="store_true",
                        help=f"the full recipe: {FULL['train_steps']} steps of the 3-layer "
                        f"preset with P_drop {FULL['dropout']}, about 150 minutes of training "
                        f"on 2 AVX2 AMD EPYC cores; for en-de an ensemble of three such runs "
                        f"({ensemble}: layers and P_drop) trained one after the other into "
                        f"RUN_DIR/members/, about 420 minutes; en-fr one model with P_drop "
                        f"{recipe(True, 'fr')['dropout']}. Resumable pieces if need be")
    parser.add_argument("--src-lang", default="en", help="source language (en)")
    parser.add_argument("--tgt-lang", default=["de"], nargs="+", choices=("de", "fr", "cs"),
                        help="target language (de); several (--tgt-lang de fr cs) train one "
                        "model for every pair with that many times the quick recipe's steps "
                        "and print a table per pair, with the share of outputs in the wrong "
                        "language (docs/training.md)")
    parser.add_argument("--train-steps", type=int,
                        help="override the recipe's optimizer steps (quick "
                        f"{QUICK['train_steps']}, full {FULL['train_steps']})")
    parser.add_argument("--output-dir", help="run directory (default "
                        "runs/multi30k-SRC-TGT-quick or -full; several targets: "
                        "runs/multi30k-SRC-de+fr+cs-quick)")
    parser.add_argument("--export-dir", default=EXPORT_DIR,
                        help=f"base directory of the exports ({EXPORT_DIR})")
    parser.set_defaults(run=demo)
