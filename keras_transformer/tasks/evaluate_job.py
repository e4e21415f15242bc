"""The `evaluate` job: a run's test set decoded and scored, every pair of a run of several.

    rows = evaluate_run(engine, decoder, split="test")             # the run's dataset split
    rows = evaluate_run(engine, decoder, src="t.en", ref="t.de")   # given files

Each pair's hypotheses go to a file (the run's `hypotheses_path`, or the given output, one per
pair for several), and its sacreBLEU, chrF, tokenized and literature BLEU are printed with a
JSON row; a run of several pairs ends with one table (`pair_table`). With the CTranslate2
engine nothing here imports TensorFlow or Keras.
"""

import dataclasses
import json
import pathlib

from keras_transformer.errors import InputError


def check_files(src, ref):
    """Refuses, before any model loads, a source without references, files of different
    lengths and an empty test set; every source line is read as UTF-8 first."""
    from keras_transformer.decoding.jobs.textio import checked_lines, read_lines

    if not ref:
        raise InputError("--src needs --ref (the reference translations).")
    count = sum(1 for _ in checked_lines(src))  # all UTF-8 before anything is decoded
    references = read_lines(ref)
    if count != len(references):
        raise InputError(f"{src} has {count} lines but {ref} has {len(references)}.")
    if not count:  # named here, before the model loads (evaluate_split refuses it too)
        raise InputError(f"{src} and {ref} are empty: BLEU of no sentences is undefined. Give "
                         "a test set of at least one line (one sentence per line).")


def evaluate_run(engine, decoder, split="test", src=None, ref=None, output=None):
    """Decodes and scores the run's `split` (or the `src`/`ref` files) into each target of
    the engine's languages (every pair of a run of several without a target language);
    prints each pair's lines and JSON row, and the pairs' table. Returns the rows."""
    request, languages = decoder.request, engine.languages
    targets = [None]  # one pair
    if languages.several and request.target_language is not None:
        targets = [request.target_language]
    elif languages.several:
        if src:
            languages.tags(0)  # a file of one language pair: which target is it?
        targets = list(languages.targets)  # every pair, one table
    rows = []
    for target in targets:
        if target is not None:
            engine.set_languages(dataclasses.replace(languages, default=target))
        rows.append(_evaluate_pair(engine, decoder, target, split, src, ref, output,
                                   len(targets) > 1))
    if len(rows) > 1:  # every pair of a run of several: one table
        print(pair_table(rows))
    return rows


def _evaluate_pair(engine, decoder, target, split, src, ref, output, several_outputs):
    """One pair's evaluation (`target`: its language in a run of several, else None)."""
    from keras_transformer.decoding.jobs.textio import checked_lines, read_lines
    from keras_transformer.evaluation.evaluate import alignments_path, evaluate_split
    from pipelines import datasets

    request, config = decoder.request, decoder.run.config
    lang = target or config.tgt_lang
    official = None  # the official tokenized references (Multi30k val / test2016)
    if src:
        name = pathlib.Path(src).name
        sources, references = checked_lines(src), read_lines(ref)  # a window at a time
    else:
        where = config.data_arguments(target)
        sources, references = datasets.split_texts(config.dataset, split, **where)
        name = f"{config.dataset} {split} {where['src_lang']}-{where['tgt_lang']}"
        official = datasets.official_tokenized_references(config.dataset, split, lang,
                                                          config.source_dir)
    path = output or decoder.run.hypotheses_path(split, request.beam_size, target)
    if output and several_outputs:
        path = pathlib.Path(output).with_suffix(f".{target}" + pathlib.Path(output).suffix)
    aligned = alignments_path(path) if request.alignments else None
    result = evaluate_split(engine, sources, references, lang=lang,
                            official_references=official, output=path, alignments=aligned)
    print(f"{name}: {len(references)} sentences, beam {request.beam_size}, alpha "
          f"{request.alpha}; hypotheses in {path}"
          + (f", word alignments in {aligned}" if aligned else ""))
    for line in result.pop("lines"):
        print(line)
    row = {"set": name, "beam": request.beam_size, "alpha": request.alpha, **result}
    print(json.dumps(row))
    return row


def pair_table(rows):
    """One line per pair: sacreBLEU, chrF and the literature BLEU of each evaluated set."""
    lines = [f"{'set':<32} {'sacreBLEU':>9} {'chrF':>6} {'lit. BLEU':>9}"]
    for row in rows:
        lines.append(f"{row['set']:<32} {row.get('sacrebleu', float('nan')):>9.2f} "
                     f"{row.get('chrf', float('nan')):>6.2f} "
                     f"{row.get('literature_bleu', float('nan')):>9.2f}")
    return "\n".join(lines)
