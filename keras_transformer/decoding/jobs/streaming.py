"""Decoding inputs of any size: line-aligned input files read in windows, each window decoded
(the decoder sorts it by length into batches), its output lines written in input order before
the next window is read. Memory stays that of one window, whatever the input's length.

    lines = stream_lines(decode_rows, ["in.txt"], "out.txt", window=1024,
                         identity={"beam": 4, ...})

An output file is resumable (`resumable.ResumableOutput`): a job killed half-way and run again
with the same inputs and options goes on after the lines already done; without an output file
the lines go to standard output, flushed after each window. Input lines follow the UTF-8 line
policy of `textio.BadLines`. No TensorFlow here.
"""

import itertools
import json
import sys

from keras_transformer.decoding.engines.engine import in_order
from keras_transformer.decoding.jobs import textio
from keras_transformer.errors import InputError
from keras_transformer.decoding.jobs.resumable import ResumableOutput, file_identity
from keras_transformer.decoding.jobs.terminology import Glossary, merged, split_line
from pipelines.files import atomic_path

# Sentences per window, in batches: the decoder sorts a window by length, so that a batch
# holds sentences of similar length (little padding), and the window bounds the memory.
WINDOW_BATCHES = 16


def window_size(batch_size, engine=None):
    """Sentences per window: `WINDOW_BATCHES` batches, or the engine's `window_batches`."""
    return batch_size * (getattr(engine, "window_batches", None) or WINDOW_BATCHES)


def aligned_counts(paths):
    """The line count of each file, after checking that they have the same: InputError naming
    both files and their counts otherwise."""
    counts = [textio.count_lines(path) for path in paths]
    for path, count in zip(paths[1:], counts[1:]):
        if count != counts[0]:
            raise InputError(f"{path} has {count} lines but {paths[0]} has {counts[0]}: the "
                             "files must be line-aligned (one line each per sentence; an empty "
                             "line where there is nothing).")
    return counts


def _rows(paths, names, bad, skip):
    """(line index, tuple of texts) of the aligned inputs, the first `skip` rows left out
    (their bad lines still counted, quietly). A text is None where its line is not UTF-8."""
    sources = [textio.raw_lines(path) for path in paths]
    for index, lines in enumerate(itertools.zip_longest(*sources)):
        if any(line is None for line in lines):
            short = names[[line is None for line in lines].index(True)]
            raise InputError(f"{short} ended at line {index} while the other input goes on: "
                             "the inputs must be line-aligned.")
        texts = tuple(b.decode(*line, quiet=index < skip) for b, line in zip(bad, lines))
        if index >= skip:
            yield index, texts


def stream_lines(decode_rows, inputs, output=None, *, window, identity=None, empty=("",),
                 progress_desc=None, windows_in_flight=1):
    """Runs `decode_rows` over line-aligned inputs, window by window, and writes its lines.

    Args:
        decode_rows: (rows, line indices, progress bar or None) -> per row a list of output
            lines; a row is a tuple of texts, one per input. Rows with a line that is not
            UTF-8 are not passed: they give `empty`.
        inputs: paths of line-aligned files; the first may be None (standard input, read a
            line at a time at a terminal).
        output: the output file (resumable), or None: standard output.
        window: rows per `decode_rows` call.
        identity: the options that decide the output (a resumed output must have the same;
            the inputs' identities are added here).
        empty: the output lines of a row that could not be decoded.
        progress_desc: the label of the progress bar shown on standard error while an output
            file is written.
        windows_in_flight: windows decoded at once (2: the next window's decoding starts
            before the last one's ends, so that an engine's workers never wait on the end of
            a window); their lines are still written in input order, a window at a time.

    Returns:
        The number of input lines.

    Raises:
        InputError: inputs of different lengths (before anything is decoded for files), or
            input lines that were not UTF-8 (after the output is complete, naming them).
    """
    from pipelines.progress import progress_bar

    names = [path or "standard input" for path in inputs]
    if inputs[0] is None:
        total = None
        window = 1 if sys.stdin.isatty() else window
    else:
        total = aligned_counts(inputs)[0]
    files = [path for path in inputs if path is not None]
    if output is not None and len(files) == len(inputs):
        writer = ResumableOutput(output, {"inputs": [file_identity(p) for p in files],
                                          **(identity or {})})
    else:
        writer = _Printer(output)
    if writer.resumed:
        print(f"keras-transformer: {writer.resumed}", file=sys.stderr, flush=True)
    bad = [textio.BadLines(name) for name in names]
    done = writer.done
    try:
        with progress_bar(total=total, initial=done, unit=" sentences", desc=progress_desc,
                          disable=output is None) as bar:
            def decode(chunk):
                good = [(index, texts) for index, texts in chunk if None not in texts]
                found = iter(decode_rows([texts for _, texts in good],
                                         [index for index, _ in good],
                                         None if bar.disable else bar) if good else [])
                lines = []
                for _, texts in chunk:
                    lines.extend(empty if None in texts else next(found))
                return chunk, lines

            chunks = textio.windows(_rows(inputs, names, bad, writer.done), window)
            for chunk, lines in in_order(decode, ([c] for c in chunks), windows_in_flight):
                writer.write(len(chunk), lines)
                done += len(chunk)
                if done > bar.n:  # the decoder may not count rows it did not search
                    bar.update(done - bar.n)
        writer.finish()
    finally:
        writer.close()
    for b in bad:
        b.check()
    return done


class _Printer:
    """Output lines to standard output, flushed after each window; or, for standard input, to
    a file written under a temporary name as they come and renamed when complete."""

    done, resumed = 0, None

    def __init__(self, output):
        self._handle = self._target = None
        if output is not None:
            self._target = atomic_path(output)
            self._handle = open(self._target.__enter__(), "w", encoding="utf-8")

    def write(self, input_lines, lines):
        handle = self._handle or sys.stdout
        for line in lines:
            handle.write(line + "\n")
        handle.flush()

    def finish(self):
        if self._handle is not None:
            self._handle.close()
            self._target.__exit__(None, None, None)
            self._target = None

    def close(self):
        if self._target is not None:  # stopped early: the temporary file goes
            self._handle.close()
            error = InputError("stopped")
            self._target.__exit__(type(error), error, None)


# -- the file-level jobs of the commands -----------------------------------------------------
def translate_file(decoder, input=None, output=None, log=None):
    """Translates (or samples, `request.sample`) `input` (None: standard input) into `output`
    (None: standard output; a file is resumable) with the engine `decoder` (a
    `decoding.decoder.Decoder` of a run) builds; says on `log` what decodes. With
    `request.prefixes` (a file line-aligned with the input) each output starts with its
    line's prefix. With n-best or several samples, each hypothesis is a line `line<TAB>score
    <TAB>text` (`nbest_lines`). With `request.alignments` each translation (or hypothesis) is
    followed by a tab and its word alignment in Pharaoh format ("" for an empty line). With
    `request.constraints` each input line is `source<TAB>phrase...` and every phrase appears
    in its translation; with `request.glossary` the target terms of the glossary's source
    terms found in a line are its constraints too (`jobs.terminology`).
    Returns the input lines done."""
    request = decoder.request
    inputs = [input, request.prefixes] if request.prefixes else [input]
    if request.prefixes and input:
        aligned_counts(inputs)  # before the model loads
    glossary = (Glossary.read(request.glossary, request.glossary_ignore_case)
                if request.glossary else None)
    constrained = request.constraints or glossary is not None
    engine = decoder.engine()
    print(decoder.describe(), file=log or sys.stderr)
    listed = request.nbest or (request.sample and request.num_samples > 1)

    def decode_rows(rows, numbers, progress):
        texts = [row[0] for row in rows]
        prefixes = [row[1] for row in rows] if request.prefixes else None
        constraints = None
        if constrained:
            texts, constraints = terminology(texts, numbers)
        if request.sample:
            sampling = {**request.sampling(), "seed": window_seed(request.seed, numbers[0])}
            results = engine.sample(texts, prefixes=prefixes, progress=progress, **sampling)
        else:
            results = engine.translate(texts, nbest=request.nbest, progress=progress,
                                       prefixes=prefixes, alignments=request.alignments,
                                       **({"constraints": constraints} if constrained else {}))
        if listed:
            return nbest_lines(results, numbers)
        if request.alignments:
            return [[f"{text}\t{links}"] for text, links in results]
        return [[r[0][0]] for r in results] if request.sample else [[t] for t in results]

    def terminology(lines, numbers):
        """The sources of the lines and their constraints: the line's phrases, then the
        glossary's target terms."""
        sources, constraints = [], []
        for line, number in zip(lines, numbers):
            source, phrases = (split_line(line, f"{input or 'standard input'} line {number + 1}")
                               if request.constraints else (line, []))
            sources.append(source)
            constraints.append(merged(phrases, glossary.targets(source) if glossary else []))
        return sources, constraints

    # A pipe is read a batch at a time: a program that writes a line and waits for its
    # translation is answered after batch_size lines, not after a window's. A file, named or
    # redirected to standard input (`< input.txt`), is read in windows, the engine's number
    # of them in flight: the same batches, so the same lines, either way.
    whole = bool(input) or textio.stdin_is_a_file()
    window = window_size(request.batch_size, engine) if whole else request.batch_size
    return stream_lines(decode_rows, inputs, output, window=window,
                        # (samples: one window at a time, each drawn from its own seed)
                        windows_in_flight=1 if request.sample or not whole
                        else engine.windows_in_flight,
                        identity=job_identity(decoder, **({"glossary_file": file_identity(
                            request.glossary)} if glossary else {})),
                        empty=[] if listed else ["\t" if request.alignments else ""])


def score_file(decoder, sources, targets, output=None, as_json=False, log=None):
    """Scores each (source, target) pair of two line-aligned files with the engine `decoder`
    builds (`score_lines` writes them), with the request's `alignments` also the pair's word
    alignment (teacher-forced); resumable as `translate_file`. Returns the pairs done."""
    aligned_counts([sources, targets])  # before the model loads
    request = decoder.request
    engine = decoder.engine()
    print(decoder.describe(), file=log or sys.stderr)

    def decode_rows(rows, numbers, progress):
        results = engine.score([s for s, _ in rows], [t for _, t in rows], progress=progress,
                               alignments=request.alignments)
        return score_lines(results, as_json)

    return stream_lines(decode_rows, [sources, targets], output,
                        window=window_size(request.batch_size),
                        identity=job_identity(decoder, json=as_json), empty=[""],
                        progress_desc="scoring")


def nbest_lines(results, numbers):
    """`line<TAB>score<TAB>text` for each hypothesis, `line` the input line's index from 0
    (and `<TAB>alignment` for hypotheses that carry one)."""
    return [["\t".join([str(i), f"{hypothesis[1]:.4f}", hypothesis[0], *hypothesis[2:]])
             for hypothesis in hypotheses]
            for i, hypotheses in zip(numbers, results)]


def score_lines(results, as_json):
    """One line per pair: `log_prob<TAB>tokens<TAB>mean[<TAB>alignment]`, or a JSON object
    (with an "alignment" key where the results carry one)."""
    if as_json:
        return [[json.dumps({"log_prob": round(r["log_prob"], 6), "tokens": r["tokens"],
                             "mean": round(r["mean"], 6),
                             **({"alignment": r["alignment"]} if "alignment" in r else {})})]
                for r in results]
    return [["\t".join([f"{r['log_prob']:.4f}", str(r["tokens"]), f"{r['mean']:.4f}",
                        *([r["alignment"]] if "alignment" in r else [])])] for r in results]


def window_seed(seed, first_line):
    """The seed of the window starting at input line `first_line` (from 0): the same
    samples for the same command, whether a run was resumed or not."""
    import numpy as np

    return int(np.random.SeedSequence([seed, first_line]).generate_state(1)[0] % 2 ** 31)


def keras_backend():
    """Keras' backend, read without importing Keras where it is not loaded (the CTranslate2
    engine): KERAS_BACKEND, else Keras' config file, else its default, as Keras reads them."""
    if sys.modules.get("keras") is not None:
        return sys.modules["keras"].backend.backend()
    import os
    import pathlib

    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = pathlib.Path(os.environ.get("KERAS_HOME") or pathlib.Path.home() / ".keras")
    try:
        return json.loads((home / "keras.json").read_text()).get("backend", "tensorflow")
    except (OSError, ValueError):
        return "tensorflow"


def job_identity(decoder, **extra):
    """What decides a job's output lines, beside its inputs: the request's values, the run,
    the backend, the resolved precision and the weights' file identity (an ensemble's: each
    member's; `extra`: more, such as an output format). A partial output written with
    anything else is started over."""
    request = decoder.request
    weights = (decoder.ctranslate2_folder() / "model.bin" if request.engine == "ctranslate2"
               else decoder.model_file()[0])
    identity = {"command": decoder.command, "backend": keras_backend(),
                "options": {**request.recorded(), **extra},
                "run_dir": str(decoder.run.directory.resolve()),
                "precision": decoder.precision[0],
                "weights": file_identity(weights) if weights and weights.is_file() else None}
    if weights is None and hasattr(decoder.run, "members"):  # an ensemble: its members' weights
        identity["member_weights"] = [file_identity(member.model_file())
                                      for member in decoder.run.members]
    return identity
