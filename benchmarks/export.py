"""Exported artifacts of a trained run: size, agreement with the SavedModel, BLEU, latency.

    python benchmarks/export.py --run-dir runs/multi30k-en-de [--sentences 100]

Exports the run (SavedModel; TFLite float32, dynamic-range int8 and float16; CTranslate2
float32 and int8) into a temporary folder, translates the first N Multi30k test2016 sentences
one at a time with each artifact (beam 4, alpha 0.6) and prints one JSON line: file sizes in
MB, the fraction of sentences whose ids equal the SavedModel's, sacreBLEU of each against the
references, and milliseconds per sentence. The SavedModel is timed through `translate_ids` and
through `translate_ids_xla` (the XLA-compiled search; its compilations, one per width bucket,
happen in an untimed first pass). The SavedModel is also compared with in-process beam search
(`Translator`). CTranslate2's length penalty is score / length^alpha, not GNMT's, so its beams
may differ a little; it is skipped when the ctranslate2 package is missing. The TFLite files
run on LiteRT's interpreter (ai-edge-litert, in the dev extra).
"""

import argparse
import gzip
import importlib.util
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tf_common  # noqa: E402,F401  (first: sets Keras' backend, quiets TensorFlow)
from common import emit  # noqa: E402

import numpy as np  # noqa: E402
import sacrebleu  # noqa: E402
import tensorflow as tf  # noqa: E402
from ai_edge_litert.interpreter import Interpreter  # noqa: E402  (tf.lite's is deprecated)

from keras_transformer import export  # noqa: E402
from keras_transformer.decoding.decoder import Decoder  # noqa: E402
from keras_transformer.decoding.request import EXPORT, Request  # noqa: E402
from keras_transformer.runs import open_run  # noqa: E402
from pipelines.sources import default_multi30k_dir  # noqa: E402


def run_decoder(run_dir):
    """The export command's decoder of the run: its saved choice, else the defaults."""
    return Decoder.resolve(open_run(run_dir), command=EXPORT)


def _size_mb(path):
    path = pathlib.Path(path)
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return round(sum(p.stat().st_size for p in files) / 1e6, 2)


def _upto_eos(ids):
    ids = np.asarray(ids).tolist()
    return ids[: ids.index(2) + 1] if 2 in ids else ids


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument("--src-lang", default="en")
    parser.add_argument("--tgt-lang", default="de")
    args = parser.parse_args(argv)

    folder = pathlib.Path(default_multi30k_dir())

    def read(lang):
        with gzip.open(folder / f"test_2016_flickr.{lang}.gz", "rt", encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f][: args.sentences]

    sources, references = read(args.src_lang), read(args.tgt_lang)
    # The model the export takes (the run's saved choice), beam 4 and alpha 0.6 as before.
    translator = Decoder(Request(batch_size=len(sources)), open_run(args.run_dir)).engine()
    rows = translator.encode(sources)
    def texts(id_lists):
        return translator.vocabulary.decode(tf.ragged.constant(id_lists).to_tensor().numpy())

    def bleu(hypotheses):
        return round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 2)

    record = {"run_dir": str(args.run_dir), "sentences": len(sources)}
    in_process = translator.translate(sources)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        saved = export.export_run(run_decoder(args.run_dir), output_dir=tmp, name="model")
        record["savedmodel_export_s"] = round(time.perf_counter() - start, 1)
        record["savedmodel_mb"] = _size_mb(saved)
        loaded = tf.saved_model.load(str(saved))
        served = [t.decode("utf-8") for t in loaded.serve(tf.constant(sources))["translations"].numpy()]
        record["savedmodel_equals_in_process"] = float(np.mean(
            [a == b for a, b in zip(served, in_process)]))
        record["bleu_in_process"] = bleu(in_process)
        record["bleu_savedmodel"] = bleu(served)
        start = time.perf_counter()
        reference_ids = [_upto_eos(loaded.translate_ids(tf.constant([row]))["ids"].numpy()[0])
                         for row in rows]
        record["savedmodel_ms_per_sentence"] = round(
            1000 * (time.perf_counter() - start) / len(rows), 1)
        xla = loaded.translate_ids_xla  # the restored function has the default alpha
        for row in rows:  # untimed: compiles each width bucket once
            xla(tf.constant([row]))
        _one_at_a_time(record, "savedmodel_xla", rows, reference_ids, texts, bleu, lambda row:
                       _upto_eos(xla(tf.constant([row]))["ids"].numpy()[0]))
        for quantize in export.QUANTIZATIONS:
            key = "tflite_" + ("float32" if quantize == "none" else quantize)
            path = export.export_run(run_decoder(args.run_dir), format="tflite",
                                     quantize=quantize, output_dir=tmp, name="model")
            record[key + "_mb"] = _size_mb(path)
            runner = Interpreter(model_path=str(path)).get_signature_runner()
            _one_at_a_time(record, key, rows, reference_ids, texts, bleu, lambda row: _upto_eos(
                runner(source_ids=np.array([row], np.int32))["ids"][0]))
        if importlib.util.find_spec("ctranslate2") is not None:
            _ctranslate2(args.run_dir, tmp, rows, reference_ids, record, texts, bleu)
    emit(record)


def _one_at_a_time(record, key, rows, reference_ids, texts, bleu, best_ids):
    """Times `best_ids(row)` over the rows one at a time; records ms per sentence, agreement
    with the SavedModel's ids and sacreBLEU under `key`."""
    start = time.perf_counter()
    ids = [best_ids(row) for row in rows]
    record[key + "_ms_per_sentence"] = round(1000 * (time.perf_counter() - start) / len(rows), 1)
    record[key + "_agreement"] = float(np.mean([a == b for a, b in zip(ids, reference_ids)]))
    record[key + "_bleu"] = bleu(texts(ids))


def _ctranslate2(run_dir, tmp, rows, reference_ids, record, texts, bleu):
    from keras_transformer.decoding.search.greedy import compiled_greedy_search
    from keras_transformer.runs import Run
    from pipelines.special_ids import EOS_ID

    for quantize in ("none", "int8"):
        key = "ctranslate2_" + ("float32" if quantize == "none" else quantize)
        path = export.export_run(run_decoder(run_dir), format="ctranslate2",
                                 quantize=quantize, output_dir=tmp, name="model")
        record[key + "_mb"] = _size_mb(path)
        translator = Decoder(Request(engine="ctranslate2", ctranslate2_model=str(path),
                                     beam_size=4, alpha=0.6)).engine()
        processor = translator.processor
        pieces = [[processor.id_to_piece(int(i)) for i in row[:-1]] for row in rows]
        translator.translate_pieces(pieces[:5])  # warm-up

        def best_ids(row):
            output = translator.translate_pieces([[processor.id_to_piece(int(i))
                                                   for i in row[:-1]]])[0][0][0]
            return [processor.piece_to_id(p) for p in output] + [EOS_ID]

        _one_at_a_time(record, key, rows, reference_ids, texts, bleu, best_ids)
        if quantize == "none":  # greedy: the same ids as our greedy search, barring near-ties
            greedy = compiled_greedy_search(Run(run_dir).load_model())
            our_ids = [_upto_eos(greedy(tf.constant([row]))[0].numpy()[0]) for row in rows]
            translator.beam_size = 1
            theirs = [[processor.piece_to_id(p) for p in output[0][0]] + [EOS_ID]
                      for output in translator.translate_pieces(pieces)]
            record["ctranslate2_greedy_agreement"] = float(np.mean(
                [a == b for a, b in zip(theirs, our_ids)]))


if __name__ == "__main__":
    main()
