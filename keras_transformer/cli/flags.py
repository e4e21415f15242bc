"""Flags that several commands share, and the rule for TensorFlow-only commands. No heavy
imports at module level: building the parser stays fast."""

from keras_transformer.defaults import EXPORT_DIR, TRANSLATION


def add_run_flags(parser):
    parser.add_argument("--run-dir", required=True, help="training output directory")
    parser.add_argument("--model", help="model file (default: the one chosen for the run, "
                        "saved in RUN_DIR/decoding.json by the main job or `average`; else "
                        "RUN_DIR/averaged.keras if it exists, else RUN_DIR/model.keras)")


def add_decoding_flags(parser, beam_help=None, alpha_help=None):
    """--beam and --alpha for the commands that decode with the run's saved choice (default
    None: the choice, else `defaults.TRANSLATION`)."""
    parser.add_argument("--beam", type=int, default=None,
                        help=beam_help or "beam size (default: the run's saved choice, else "
                        f"{TRANSLATION.beam_size}; 1 = greedy)")
    parser.add_argument("--alpha", type=float, default=None,
                        help=alpha_help or "length penalty (default: the run's saved choice, "
                        f"else {TRANSLATION.alpha})")


def add_model_flags(parser, search=None, alpha_hint=""):
    """--run-dir, --model, --beam, --alpha, --batch-size. With `search` (e.g.
    `defaults.PARSING`) --beam and --alpha default to its values instead of the run's
    choice."""
    add_run_flags(parser)
    if search is None:
        add_decoding_flags(parser)
        search = TRANSLATION
    else:
        parser.add_argument("--beam", type=int, default=search.beam_size,
                            help=f"beam size ({search.beam_size}; 1 = greedy)")
        parser.add_argument("--alpha", type=float, default=search.alpha,
                            help=f"length penalty ({search.alpha}{alpha_hint})")
    parser.add_argument("--batch-size", type=int, default=search.batch_size,
                        help=f"sentences per batch ({search.batch_size})")


def add_precision_flag(parser):
    parser.add_argument("--precision", default="auto", choices=("auto", "float32", "bfloat16"),
                        help="what the search computes in: auto (default) is bfloat16 on CPUs "
                        "with bf16 units (AMX, AVX-512 BF16: faster there, the same output on "
                        "most sentences) and float32 elsewhere; the exports stay float32")


def add_engine_flags(parser, search=True):
    """--engine and --ctranslate2-model [and --xla, for the commands that search]."""
    engine_help = ("tensorflow: the run's Keras model (default); ctranslate2: the run's "
                   "CTranslate2 export (keras-transformer export --format ctranslate2)")
    if search:
        engine_help += ", whose --alpha divides scores by length^alpha instead of the GNMT penalty"
    parser.add_argument("--engine", default="tensorflow", choices=("tensorflow", "ctranslate2"),
                        help=engine_help)
    if search:
        parser.add_argument("--xla", action="store_true",
                            help="tensorflow engine: compile the search with XLA (1.3-1.4x "
                            "faster per batch on CPU, after a compilation of seconds for each "
                            "batch shape; worth it for large inputs)")
    parser.add_argument("--ctranslate2-model", help="CTranslate2 export folder for --engine "
                        f"ctranslate2 (default {EXPORT_DIR}/RUN_NAME/ctranslate2; e.g. "
                        f"{EXPORT_DIR}/RUN_NAME/ctranslate2-int8 for the int8 one)")

def add_io_flags(parser):
    parser.add_argument("--input", help="input file (default: standard input)")
    parser.add_argument("--output", help="output file (default: standard output)")


def tensorflow_only(what, instead):
    """Refuses a TensorFlow-only command or option under another backend, saying what to do."""
    import keras

    from keras_transformer.errors import ConfigError

    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ConfigError(f"{what} runs under TensorFlow only (this process runs Keras on "
                          f"{backend}): {instead}.")
