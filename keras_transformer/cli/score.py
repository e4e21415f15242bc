"""`score`: how likely a run finds given translations (forced decoding), one line per pair.

    keras-transformer score --run-dir RUN --src test.en --tgt test.de
    keras-transformer score --run-dir RUN --src test.en --tgt test.de --json --output scores.jsonl

The pairs are read and scored a window at a time and the output is resumable, as `translate`'s
(`decoding.jobs.streaming.score_file`).
"""

import sys

from keras_transformer.cli.flags import add_flags, add_run_flags
from keras_transformer.decoding.request import SCORE

EXPLAINED = ("For each pair it prints the target's total log-probability under the model "
             "(natural log: a sum over the target's tokens of log p(token | source, the tokens "
             "before it)), the number of tokens scored (subword tokens of the target, its "
             "end-of-sentence token included) and their mean (total / tokens: the per-token "
             "log-probability; exp(-mean) is the pair's perplexity), tab-separated, or as a "
             "JSON line {\"log_prob\": ..., \"tokens\": ..., \"mean\": ...} with --json. No "
             "length penalty, no search. A pair whose line is not valid UTF-8 gives an empty "
             "line (one output line per pair) and the command fails at the end naming it. Empty "
             "files give an empty output (0 pairs).")


def score(args):
    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.decoding.jobs.streaming import score_file

    count = score_file(Decoder.from_flags(args, SCORE), args.src, args.tgt, args.output,
                       as_json=args.json)
    if args.output:
        print(f"wrote the scores of {count} pairs to {args.output}", file=sys.stderr)


def register(commands):
    parser = commands.add_parser(
        "score",
        help="score given translations with a trained run: log-probability per pair",
        description="Scores each (source, target) pair of two line-aligned files with the "
        "run's model (forced decoding): how likely the model finds the target as a "
        "translation of the source. " + EXPLAINED,
    )
    add_run_flags(parser)
    parser.add_argument("--src", required=True, help="source sentences, one per line")
    parser.add_argument("--tgt", required=True,
                        help="target sentences, line-aligned with --src (same line count)")
    parser.add_argument("--output", help="output file (default: standard output); a killed "
                        "run started again goes on after the pairs already scored")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per line instead of tab-separated numbers")
    add_flags(parser, SCORE)
    parser.set_defaults(run=score)
