"""`tune`: a trained run's weights, length penalty and repetition controls chosen on dev
sentences and saved in the run (the `tune` stage, tasks/stages.py).

    keras-transformer tune --run-dir RUN                                # the run's dev set
    keras-transformer tune --run-dir RUN --src dev.en --ref dev.de      # given sentences
    keras-transformer tune --run-dir RUN --src dev.en --ref dev.fr --tgt-lang fr  # several
"""

from keras_transformer.cli.flags import add_run_flags
from keras_transformer.decoding.request import DEFAULTS
from keras_transformer.tasks.tuning import (ALPHAS, AVERAGE_CANDIDATES, NEAR_TIE,
                                           VAL_SENTENCES, beam_searches)

ABOUT = (
    "Chooses how a trained run decodes, on dev sentences: first its weights with greedy "
    "search (the final weights, the averages of the last 5, 10 or 20 checkpoints, of every "
    "one or every other, as many as the run kept, and best.keras, the best dev evaluation's, "
    "when it is not the final weights), then with the beam (--beam-size) the length penalty "
    f"(alpha {', '.join(map(str, ALPHAS))}), then the repetition controls with it (off, "
    "no_repeat_ngram_size 3 or 4, repetition_penalty 1.1 or 1.2), each by sacreBLEU on the "
    f"given sentences. Among the repetition settings within {NEAR_TIE} sacreBLEU of the best, "
    "the one with the fewest stuttering outputs (a subword piece 4 or more times in a row) "
    "wins, then off. The chosen weights go to RUN_DIR/averaged.keras and the choice to "
    "RUN_DIR/decoding.json with every try and its dev BLEU: translate, evaluate and export "
    "then decode with it (a flag still wins). Without --src and --ref it uses the run's own "
    "dev set; `train` runs it at its end (unless --no-tune).")


def tune(args):
    import logging

    from keras_transformer.tasks import stages

    # TensorFlow warns of every search traced for a new alpha or control; they are meant.
    logging.getLogger("tensorflow").setLevel(logging.ERROR)

    stages.tune(args.run_dir, args.src, args.ref, target_language=args.tgt_lang,
                max_sentences=args.max_sentences, beam_size=args.beam_size)


def register(commands):
    parser = commands.add_parser(
        "tune", help="choose a run's weights, alpha and repetition controls on dev sentences",
        description=ABOUT)
    add_run_flags(parser)
    parser.add_argument("--src", help="dev source sentences, one per line (default: the run's "
                        "dev set)")
    parser.add_argument("--ref", help="their reference translations, line-aligned with --src")
    parser.add_argument("--tgt-lang", help="a run of several target languages: the language of "
                        "--ref (default with the run's own dev set: every pair's sentences, "
                        "one choice for the model)")
    parser.add_argument("--max-sentences", type=_sentences, default=VAL_SENTENCES,
                        help=f"decode at most the first N dev sentences (of each pair; "
                        f"{VAL_SENTENCES}; 0: all): every try decodes them, "
                        f"{len(AVERAGE_CANDIDATES) + 1 + beam_searches()} searches at most")
    parser.add_argument("--beam-size", type=_beam, default=DEFAULTS["beam_size"],
                        help="the beam the length penalty and the repetition controls are "
                        f"chosen for, saved with them ({DEFAULTS['beam_size']})")
    parser.set_defaults(run=tune)


def _sentences(text):
    import argparse

    value = int(text) if text.isdigit() else -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of sentences (0: all)")
    return value


def _beam(text):
    import argparse

    value = int(text) if text.isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a beam size (1 or more)")
    return value
