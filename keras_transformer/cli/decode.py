"""`translate`, `evaluate`, `attention` and `parse`: decoding with a trained run.

`translate`, `evaluate` and `attention` decode with the choice saved in the run (model, beam,
alpha: `decoding.choice`) unless a flag says otherwise, in the precision `--precision` resolves
for this machine (`decoding.precision`), and say on standard error which they used; `parse`
uses the paper's parsing search (`defaults.PARSING`). `translate` and `evaluate` read their
input a window at a time (`keras_transformer.decoding.streaming`), and `translate --output` continues a
killed run's partial output; `translate --prefix` and `--sample` use `Translator.translate`'s
prefixes and `Translator.sample`.
"""

import sys

from keras_transformer.cli.flags import (
    add_engine_flags, add_io_flags, add_model_flags, add_precision_flag, tensorflow_only)


def decoder(args, search=True):
    """(translator, the run, the choice) for the command's flags; what it decodes with is said
    on standard error (without `search`, e.g. for `score` or `--sample`, the model and the
    precision only). The CTranslate2 engine reads the run's CTranslate2 export."""
    from keras_transformer.decoding.choice import decoding_choice
    from keras_transformer.runs import open_run

    run = open_run(args.run_dir)  # an ensemble's directory too
    ctranslate2 = getattr(args, "engine", "tensorflow") == "ctranslate2"
    if ctranslate2 and args.precision != "auto":
        from keras_transformer.errors import InputError

        raise InputError(f"--precision {args.precision} is for --engine tensorflow: the "
                         "CTranslate2 export computes in the type it was exported with.")
    choice = decoding_choice(run, model=args.model, beam_size=args.beam, alpha=args.alpha,
                             precision=None if ctranslate2 else args.precision)
    if ctranslate2:
        translator, label = ctranslate2_translator(args, choice)
    else:
        from keras_transformer.decoding.translate import Translator

        translator = Translator.from_run(run, choice.model_file, beam_size=choice.beam_size,
                                         alpha=choice.alpha, batch_size=args.batch_size,
                                         jit_compile=getattr(args, "xla", False),
                                         precision=choice.precision)
        label = None
    if search:
        print(choice.describe(label), file=sys.stderr)
    else:
        reason = f"; {choice.precision_reason}" if choice.precision_reason else ""
        print(f"{args.command} with {label or choice.model_label}{reason}", file=sys.stderr)
    return translator, run, choice


def require(translator, what, engine, method, option=None):
    """Refuses `what` (e.g. "--prefix") in one line when the engine's translator lacks
    `method` or its argument `option`."""
    import inspect

    from keras_transformer.errors import InputError

    function = getattr(translator, method, None)
    if function is None or (option and option not in inspect.signature(function).parameters):
        raise InputError(f"--engine {engine} does not support {what} yet: use --engine "
                         "tensorflow.")


def ctranslate2_translator(args, choice):
    import pathlib

    from keras_transformer.errors import InputError
    from keras_transformer.export import ctranslate2_folder
    from keras_transformer.export.ct2 import CTranslate2Translator

    folder = args.ctranslate2_model or ctranslate2_folder(args.run_dir)
    if not pathlib.Path(folder).is_dir():
        raise InputError(f"No CTranslate2 export at {folder}: run keras-transformer export "
                         f"--run-dir {args.run_dir} --format ctranslate2 first (or give "
                         "--ctranslate2-model).")
    translator = CTranslate2Translator(folder, beam_size=choice.beam_size, alpha=choice.alpha,
                                       batch_size=args.batch_size)
    return translator, f"the CTranslate2 export {folder}"


def _nbest_lines(results, numbers):
    """`line<TAB>score<TAB>text` for each hypothesis, `line` the input line's index from 0."""
    return [[f"{i}\t{score:.4f}\t{text}" for text, score in hyps]
            for i, hyps in zip(numbers, results)]


def job_identity(args, choice):
    """What decides a command's output lines, beside its inputs: a partial output written with
    anything else is started over (`streaming.stream_lines`)."""
    import pathlib

    import keras

    from keras_transformer.decoding.resumable import file_identity

    options = {key: value for key, value in sorted(vars(args).items())
               if key not in ("run", "input", "output", "verbose", "debug")}
    options["run_dir"] = str(pathlib.Path(args.run_dir).resolve())
    weights = choice.model_file
    if getattr(args, "engine", "tensorflow") == "ctranslate2":
        from keras_transformer.export import ctranslate2_folder

        weights = pathlib.Path(args.ctranslate2_model or ctranslate2_folder(args.run_dir))
        weights = weights / "model.bin"
    return {"command": args.command, "backend": keras.backend.backend(), "options": options,
            "beam": choice.beam_size, "alpha": choice.alpha, "precision": choice.precision,
            "weights": file_identity(weights) if weights and weights.is_file() else None}


SAMPLING = {"top_k": 0, "top_p": 1.0, "temperature": 1.0, "seed": 0, "num_samples": 1}


def sampling_options(args):
    """The sampling flags' values, checked before anything is loaded; {} without --sample."""
    from keras_transformer.errors import InputError

    given = [name for name in SAMPLING if getattr(args, name) is not None]
    if not args.sample:
        if given:
            raise InputError(f"--{given[0].replace('_', '-')} is for --sample (sampling "
                             "instead of beam search): add --sample or leave it out.")
        return {}
    for flag, value in (("--nbest", args.nbest or None), ("--beam", args.beam),
                        ("--alpha", args.alpha), ("--xla", args.xla or None)):
        if value is not None:
            raise InputError(f"{flag} is for beam search, not --sample (which draws each "
                             "token): leave it out, or use --num-samples N for several "
                             "outputs per line.")
    options = {name: SAMPLING[name] if getattr(args, name) is None else getattr(args, name)
               for name in SAMPLING}
    for name, ok, rule in (("top_k", options["top_k"] >= 0, "0 (no limit) or more"),
                           ("top_p", 0 < options["top_p"] <= 1, "in (0, 1]"),
                           ("temperature", options["temperature"] > 0, "above 0"),
                           ("seed", 0 <= options["seed"] < 2 ** 31, "in [0, 2**31)"),
                           ("num_samples", options["num_samples"] >= 1, "at least 1")):
        if not ok:
            raise InputError(f"--{name.replace('_', '-')} {options[name]} must be {rule}.")
    return options


def window_seed(seed, first_line):
    """The seed of the window starting at input line `first_line` (from 0): the same
    samples for the same command, whether a run was resumed or not."""
    import numpy as np

    return int(np.random.SeedSequence([seed, first_line]).generate_state(1)[0] % 2 ** 31)


def translate(args):
    from keras_transformer.decoding.streaming import aligned_counts, stream_lines, window_size

    sampling = sampling_options(args)
    if args.prefix and args.input:
        aligned_counts([args.input, args.prefix])  # before the model loads
    translator, _, choice = decoder(args, search=not sampling)
    if args.prefix:
        require(translator, "--prefix", args.engine, "sample" if sampling else "translate",
                "prefixes")
    if sampling:
        require(translator, "--sample", args.engine, "sample")
        print("sampling instead of beam search: " + ", ".join(
            f"{name.replace('_', ' ')} {value}" for name, value in sampling.items()),
            file=sys.stderr)
    listed = args.nbest or sampling.get("num_samples", 1) > 1

    def decode_rows(rows, numbers, progress):
        texts = [row[0] for row in rows]
        extra = {"prefixes": [row[1] for row in rows]} if args.prefix else {}
        if sampling:
            results = translator.sample(texts, **{**sampling, "seed": window_seed(
                sampling["seed"], numbers[0])}, progress=progress, **extra)
        else:
            results = translator.translate(texts, nbest=args.nbest, progress=progress,
                                           **extra)
        if listed:
            return _nbest_lines(results, numbers)
        return [[result[0][0]] for result in results] if sampling else [[t] for t in results]

    inputs = [args.input, args.prefix] if args.prefix else [args.input]
    # A pipe is read a batch at a time, as before: a program that writes a line and waits for
    # its translation is answered after --batch-size lines, not after a window's.
    window = window_size(args.batch_size) if args.input else args.batch_size
    count = stream_lines(decode_rows, inputs, args.output, window=window,
                         identity=job_identity(args, choice), empty=[] if listed else [""])
    if args.output:
        print(f"wrote {count} translations to {args.output}", file=sys.stderr)


def evaluate(args):
    import json
    import pathlib

    from keras_transformer.errors import InputError
    from keras_transformer.evaluation.evaluate import evaluate_split
    from keras_transformer.decoding.textio import checked_lines, read_lines
    from pipelines import datasets

    official = None  # the official tokenized references (Multi30k val / test2016)
    if args.src:
        if not args.ref:
            raise InputError("--src needs --ref (the reference translations).")
        count = sum(1 for _ in checked_lines(args.src))  # all UTF-8 before anything is decoded
        references = read_lines(args.ref)
        if count != len(references):
            raise InputError(f"{args.src} has {count} lines but {args.ref} has "
                             f"{len(references)}.")
        sources = checked_lines(args.src)  # read again, a window at a time
    translator, run, choice = decoder(args)
    config = run.config
    if args.src:
        name = pathlib.Path(args.src).name
    else:
        sources, references = datasets.split_texts(config.dataset, args.split,
                                                   **config.data_arguments())
        name = f"{config.dataset} {args.split} {config.src_lang}-{config.tgt_lang}"
        official = datasets.official_tokenized_references(config.dataset, args.split,
                                                          config.tgt_lang, config.source_dir)
    output = args.output or run.hypotheses_path(args.split, choice.beam_size)
    result = evaluate_split(translator, sources, references, lang=config.tgt_lang,
                            official_references=official, output=output)
    print(f"{name}: {len(references)} sentences, beam {choice.beam_size}, alpha {choice.alpha}; "
          f"hypotheses in {output}")
    for line in result.pop("lines"):
        print(line)
    print(json.dumps({"set": name, "beam": choice.beam_size, "alpha": choice.alpha, **result}))


def attention(args):
    tensorflow_only("attention", "run it with KERAS_BACKEND=tensorflow")
    from keras_transformer.evaluation.attention_maps import KINDS, draw_sentence
    from keras_transformer.runs import open_single_run

    open_single_run(args.run_dir, "an attention picture")  # refuses an ensemble
    translator, run, _ = decoder(args)
    translation, paths = draw_sentence(
        translator, run.tokenizer(), args.sentence, args.output_dir,
        kinds=KINDS if args.kind == "all" else (args.kind,), layer=args.layer, head=args.head)
    print("translation: " + translation)
    for path in paths:
        print(f"wrote {path}")


def parse(args):
    import json

    from keras_transformer.decoding import textio
    from keras_transformer.tasks.parsing import Parser, evaluate_run
    from pipelines.progress import progress_bar
    from pipelines.treebank import to_string

    options = dict(model_file=args.model, beam_size=args.beam, alpha=args.alpha,
                   batch_size=args.batch_size)
    if args.evaluate:
        with progress_bar(unit=" sentences", desc=f"parsing {args.evaluate}") as bar:
            scores, trees = evaluate_run(args.run_dir, args.evaluate, progress=bar, **options)
        if args.output:
            textio.write_lines(args.output, [to_string(tree) for tree in trees])
        print(f"PTB sample {args.evaluate}: labeled precision {scores['precision']:.2f}, recall "
              f"{scores['recall']:.2f}, F1 {scores['f1']:.2f}, exact match "
              f"{scores['exact_match']:.2f} ({scores['sentences']} sentences; EVALB convention: "
              "punctuation and the root ignored)")
        print(json.dumps({"split": args.evaluate, "beam": args.beam, "alpha": args.alpha,
                          **scores}))
        return
    bad = textio.BadLines(args.input or "standard input")
    lines = [bad.decode(*line) for line in textio.raw_lines(args.input)]
    parser = Parser.from_run(args.run_dir, **options)
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
    from keras_transformer.defaults import PARSING, TRANSLATION

    parser = commands.add_parser(
        "translate",
        help="translate text with a trained run (stdin to stdout, or files)",
        description="Translates one sentence per line with beam search: the model, beam and "
        "alpha chosen for the run (saved in RUN_DIR/decoding.json by the main job or "
        f"`average`), else beam {TRANSLATION.beam_size}, alpha {TRANSLATION.alpha}; maximum "
        f"length input + {TRANSLATION.extra_length}. Says on standard error which it used. "
        "Empty lines give empty lines; inputs longer than the run's max_length (subword "
        "tokens) are truncated with a warning.",
    )
    add_model_flags(parser)
    add_precision_flag(parser)
    add_engine_flags(parser)
    add_io_flags(parser)
    parser.add_argument("--nbest", action="store_true",
                        help="print every beam hypothesis as: line, score, text (line: the "
                        "input line's number from 0; score: the hypothesis' score, "
                        "length-penalized log-probability), tab-separated")
    parser.add_argument("--prefix", metavar="FILE",
                        help="target prefixes, line-aligned with the input: each translation "
                        "starts with its line's prefix and the search goes on after it (an "
                        "empty line: no prefix)")
    sample = parser.add_argument_group(
        "sampling", "--sample draws each token from the model's distribution instead of "
        "searching (beam, alpha and --nbest do not apply); the same command and --seed give "
        "the same output, resumed or not")
    sample.add_argument("--sample", action="store_true", help="sample instead of beam search")
    sample.add_argument("--top-k", type=int,
                        help="draw among the k most likely tokens only (0, default: all)")
    sample.add_argument("--top-p", type=float, help="draw among the most likely tokens whose "
                        "probabilities add up to p (nucleus sampling; 1.0, default: all)")
    sample.add_argument("--temperature", type=float,
                        help="divide the logits by this (1.0; lower: closer to greedy)")
    sample.add_argument("--seed", type=int, help="random seed (0)")
    sample.add_argument("--num-samples", type=int, help="samples per input line (1); more "
                        "than 1 prints line, log-probability, text per sample, as --nbest")
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
        "the same way). Only sacreBLEU is comparable across papers and tools.",
    )
    add_model_flags(parser)
    add_precision_flag(parser)
    add_engine_flags(parser)
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
    add_model_flags(parser)
    add_precision_flag(parser)
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
        f"{PARSING.beam_size}, alpha {PARSING.alpha}, maximum output length input + "
        f"{PARSING.extra_length}. Malformed model output is repaired "
        "deterministically. --evaluate SPLIT parses the PTB sample's dev or test files instead "
        "and prints labeled bracketing precision, recall, F1 and exact match (EVALB convention).",
    )
    add_model_flags(parser, PARSING,
                    alpha_hint=", the paper's; larger values give more brackets: pick it with "
                    "--evaluate dev, e.g. 1.0-1.5 on the PTB sample")
    add_io_flags(parser)
    parser.add_argument("--evaluate", choices=("dev", "test"),
                        help="score the PTB sample's dev or test split instead of reading input")
    parser.set_defaults(run=parse)
