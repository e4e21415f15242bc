"""`score`: how likely a run finds given translations (forced decoding), one line per pair.

    keras-transformer score --run-dir RUN --src test.en --tgt test.de
    keras-transformer score --run-dir RUN --src test.en --tgt test.de --json --output scores.jsonl

The pairs are read and scored a window at a time and the output is resumable, as `translate`'s
(`keras_transformer.decoding.streaming`).
"""

import sys

from keras_transformer.cli.flags import add_engine_flags, add_precision_flag, add_run_flags

EXPLAINED = ("For each pair it prints the target's total log-probability under the model "
             "(natural log: a sum over the target's tokens of log p(token | source, the tokens "
             "before it)), the number of tokens scored (subword tokens of the target, its "
             "end-of-sentence token included) and their mean (total / tokens: the per-token "
             "log-probability; exp(-mean) is the pair's perplexity), tab-separated, or as a "
             "JSON line {\"log_prob\": ..., \"tokens\": ..., \"mean\": ...} with --json. No "
             "length penalty, no search. A pair whose line is not valid UTF-8 gives an empty "
             "line (one output line per pair) and the command fails at the end naming it.")


def score_lines(results, as_json):
    import json

    if as_json:
        return [[json.dumps({"log_prob": round(r["log_prob"], 6), "tokens": r["tokens"],
                             "mean": round(r["mean"], 6)})] for r in results]
    return [[f"{r['log_prob']:.4f}\t{r['tokens']}\t{r['mean']:.4f}"] for r in results]


def score(args):
    from keras_transformer.cli.decode import decoder, job_identity, require
    from keras_transformer.decoding.streaming import aligned_counts, stream_lines, window_size

    if args.batch_size < 1:
        from keras_transformer.errors import InputError

        raise InputError(f"--batch-size {args.batch_size} must be at least 1.")
    aligned_counts([args.src, args.tgt])  # before the model loads
    translator, _, choice = decoder(args, search=False)
    require(translator, "scoring", args.engine, "score")

    def decode_rows(rows, numbers, progress):
        results = translator.score([s for s, _ in rows], [t for _, t in rows],
                                   progress=progress)
        return score_lines(results, args.json)

    count = stream_lines(decode_rows, [args.src, args.tgt], args.output,
                         window=window_size(args.batch_size),
                         identity=job_identity(args, choice), empty=[""],
                         progress_desc="scoring")
    if args.output:
        print(f"wrote the scores of {count} pairs to {args.output}", file=sys.stderr)


def register(commands):
    from keras_transformer.defaults import TRANSLATION

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
    parser.add_argument("--batch-size", type=int, default=TRANSLATION.batch_size,
                        help=f"pairs per batch ({TRANSLATION.batch_size})")
    add_precision_flag(parser)
    add_engine_flags(parser, search=False)
    parser.set_defaults(run=score, beam=None, alpha=None, xla=False)
