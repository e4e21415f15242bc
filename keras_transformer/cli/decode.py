"""`translate`, `evaluate`, `attention` and `parse`: decoding with a trained run.

Each command parses its flags (generated from the decoding request, `decoding.request`),
makes its decoder (`decoding.decoder.Decoder`: a flag, else the run's saved choice, else the
default), calls one library function and writes. `translate` is the file-level job
`decoding.jobs.streaming.translate_file` (windows, resumable output, prefixes, sampling,
n-best); `parse` uses the paper's parsing search (`decoding.request.PARSING`).
"""

import sys

from keras_transformer.cli.flags import add_flags, add_io_flags, add_run_flags, tensorflow_only
from keras_transformer.decoding.request import ATTENTION, EVALUATE, PARSE, TRANSLATE


def engine_for(args, command):
    """(engine, decoder) of a command's flags; what decodes is said on standard error."""
    from keras_transformer.decoding.decoder import Decoder

    decoder = Decoder.from_flags(args, command)
    engine = decoder.engine()
    print(decoder.describe(), file=sys.stderr)
    return engine, decoder


def translate(args):
    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.decoding.jobs.streaming import translate_file

    count = translate_file(Decoder.from_flags(args, TRANSLATE), args.input, args.output)
    if args.output:
        print(f"wrote {count} translations to {args.output}", file=sys.stderr)


def evaluate(args):
    from keras_transformer.tasks.evaluate_job import check_files, evaluate_run

    if args.src:
        check_files(args.src, args.ref)  # before the model loads
    engine, decoder = engine_for(args, EVALUATE)
    evaluate_run(engine, decoder, split=args.split, src=args.src, ref=args.ref,
                 output=args.output)


def attention(args):
    tensorflow_only("attention", "run it with KERAS_BACKEND=tensorflow")
    from keras_transformer.evaluation.attention_maps import KINDS, draw_sentence
    from keras_transformer.runs import open_single_run

    open_single_run(args.run_dir, "an attention picture")  # refuses an ensemble
    engine, decoder = engine_for(args, ATTENTION)
    translation, paths = draw_sentence(  # the tag of a run of several targets is drawn too
        engine, decoder.run.tokenizer(), engine.tagged([args.sentence])[0], args.output_dir,
        kinds=KINDS if args.kind == "all" else (args.kind,), layer=args.layer, head=args.head)
    print("translation: " + translation)
    for path in paths:
        print(f"wrote {path}")


def parse(args):
    import json

    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.decoding.jobs import textio
    from keras_transformer.tasks.parsing import Parser, evaluate_run
    from pipelines.progress import progress_bar
    from pipelines.treebank import to_string

    decoder = Decoder.from_flags(args, PARSE)
    print(decoder.describe(), file=sys.stderr)
    request = decoder.request
    if args.evaluate:
        with progress_bar(unit=" sentences", desc=f"parsing {args.evaluate}") as bar:
            scores, trees = evaluate_run(decoder.run, args.evaluate, progress=bar,
                                         parser=Parser(decoder.engine()))
        if args.output:
            textio.write_lines(args.output, [to_string(tree) for tree in trees])
        print(f"PTB sample {args.evaluate}: labeled precision {scores['precision']:.2f}, recall "
              f"{scores['recall']:.2f}, F1 {scores['f1']:.2f}, exact match "
              f"{scores['exact_match']:.2f} ({scores['sentences']} sentences; EVALB convention: "
              "punctuation and the root ignored)")
        print(json.dumps({"split": args.evaluate, "beam": request.beam_size,
                          "alpha": request.alpha, **scores}))
        return
    bad = textio.BadLines(args.input or "standard input")
    lines = [bad.decode(*line) for line in textio.raw_lines(args.input)]
    parser = Parser(decoder.engine())
    trees = textio.run_on(lambda texts: parser.parse([" ".join(text.split()) for text in texts]),
                          lines, None)
    output = [to_string(tree) if line and line.strip() else ""
              for line, tree in zip(lines, trees)]
    if args.output:
        textio.write_lines(args.output, output)
    else:
        print("\n".join(output))
    bad.check()


def register(commands):
    from keras_transformer.decoding.request import DEFAULTS, PARSING

    parser = commands.add_parser(
        "translate",
        help="translate text with a trained run (stdin to stdout, or files)",
        description="Translates one sentence per line with beam search: the model, beam and "
        "alpha chosen for the run (saved in RUN_DIR/decoding.json by the main job or "
        f"`average`), else beam {DEFAULTS['beam_size']}, alpha {DEFAULTS['alpha']}; maximum "
        f"length input + {DEFAULTS['extra_length']}. Says on standard error which values it "
        "used and where each came from. Empty lines give empty lines (an empty input, an empty "
        "output); inputs longer than the run's max_length (subword tokens) are truncated with "
        "a warning. A killed run with --output goes on after the lines already done.",
    )
    add_run_flags(parser)
    add_io_flags(parser)
    add_flags(parser, TRANSLATE)
    parser.set_defaults(run=translate)

    parser = commands.add_parser(
        "evaluate",
        help="translate a test set and print sacreBLEU, chrF, tokenized and literature BLEU",
        description="Decodes a test set (the run's dataset split, or --src/--ref files) with "
        "the run's chosen model, beam and alpha (as translate), writes "
        "the hypotheses and prints sacreBLEU with its signature, chrF, the paper-style "
        "tokenized BLEU with compound splitting, and BLEU in the Multi30k literature "
        "convention (lowercased, Moses-normalized and -tokenized text against the official "
        "*.lc.norm.tok.* references when the split has them, else the references normalized "
        "the same way). Only sacreBLEU is comparable across papers and tools. An empty test set "
        "is refused (exit status 2) before anything is decoded: BLEU of no sentences is "
        "undefined.",
    )
    add_run_flags(parser)
    add_flags(parser, EVALUATE)
    parser.add_argument("--split", default="test", choices=("dev", "test"),
                        help="which split of the run's dataset (test)")
    parser.add_argument("--src", help="source file instead of the run's dataset")
    parser.add_argument("--ref", help="reference file for --src")
    parser.add_argument("--output",
                        help="hypotheses file (default RUN_DIR/hyp.SPLIT.beamK.txt)")
    parser.set_defaults(run=evaluate)

    parser = commands.add_parser(
        "attention",
        help="draw attention heat maps for a sentence (like the paper's Figures 3-5)",
        description="Translates the sentence, then writes PNG heat maps of one head's attention "
        "weights: encoder self-attention, decoder self-attention and encoder-decoder attention.",
    )
    add_run_flags(parser)
    add_flags(parser, ATTENTION)
    parser.add_argument("sentence", help="source sentence")
    parser.add_argument("--layer", type=int, help="layer, from 1 (default: the last)")
    parser.add_argument("--head", type=int, default=1, help="head, from 1 (1)")
    parser.add_argument("--kind", default="all", choices=("all", "encoder", "decoder", "cross"))
    parser.add_argument("--output-dir", default=".", help="where the PNG files go")
    parser.set_defaults(run=attention)

    parser = commands.add_parser(
        "parse",
        help="constituency parsing with a run trained on --dataset ptb (sentences -> trees)",
        description="Parses one whitespace-tokenized sentence per line (PTB style: 'The dog "
        f"runs .') into a bracketed tree, with the paper's parsing search: beam "
        f"{PARSING['beam_size']}, alpha {PARSING['alpha']} (the paper's; larger values give more "
        "brackets: pick it with --evaluate dev, e.g. 1.0-1.5 on the PTB sample), maximum "
        f"output length input + {PARSING['extra_length']}. Malformed model output is repaired "
        "deterministically. --evaluate SPLIT parses the PTB sample's dev or test files instead "
        "and prints labeled bracketing precision, recall, F1 and exact match (EVALB convention).",
    )
    add_run_flags(parser)
    add_flags(parser, PARSE)
    add_io_flags(parser)
    parser.add_argument("--evaluate", choices=("dev", "test"),
                        help="score the PTB sample's dev or test split instead of reading input")
    parser.set_defaults(run=parse)
