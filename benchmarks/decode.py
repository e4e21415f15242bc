"""Decoding speed: beam search (or greedy with --beam 1) of a preset with random weights, ours
and, with --engine ctranslate2, CTranslate2's on the same weights in the same run.

    python benchmarks/decode.py --preset base [--batch 32 --src-len 30 --out-len 30 --beam 4]
    python benchmarks/decode.py --preset base --engine ctranslate2            # both engines
    python benchmarks/decode.py --preset base --engine ctranslate2 --quantize int8
    python benchmarks/decode.py --preset base --batch 1 --src-len 15 --out-len 15 \
        --engine ctranslate2
    python benchmarks/decode.py --preset base --profile /tmp/decode-profile    # top ops
    python benchmarks/decode.py --preset base --precision bfloat16            # bf16 search
    python benchmarks/decode.py --preset base --compare    # float32, bf16, CTranslate2 float32

Every hypothesis is forced to exactly `out-len` tokens (EOS is masked before and forced at the
last position; CTranslate2: minimum and maximum decoding length), so runs are comparable
whatever the weights. Prints one JSON line; target_tokens_per_s counts the batch x out-len
output tokens (the returned translations), not the beam x batch x out-len tokens scored along
the way. With --engine ctranslate2 the model is exported through `keras-transformer export
--format ctranslate2`'s code (`keras_transformer.export.ct2`) and CTranslate2 is timed at each
of its threading settings (`ct2_reference.threading_grid`: workers x threads up to the core
count, the batch split among the workers, and its defaults; `ctranslate2_settings`), and
at its best (`ctranslate2_best`, `ctranslate2_seconds`); our search uses --threads intra-op
threads; `ratio_vs_ctranslate2` is our tokens/s over CTranslate2's best (> 1: ours is
faster).

`search_gflop` counts the matrix multiplications any engine must do for these shapes
(`flops.search_flops`: encoder, cross-attention keys and values, then per row and step the
decoder and the output projection); `achieved_gflops` divides it by each engine's time, to be
read against `matmul_peak_gflops`, TensorFlow's best large square matmul measured in the same
run (`benchmarks/gemm.py` gives the rates of the search's own matmul shapes).

--precision bfloat16 searches the model as `Translator(precision="bfloat16")` does: a copy with
Keras' "bfloat16" policy, its weights cast once (`decoding.engines.precision.cast_model`). --compare
times, in one process on the same weights, our search in float32 (the record's own keys), in
bfloat16 (`bf16_*`, and `bf16_speedup`: float32 seconds over bf16 seconds) and CTranslate2 (its
keys as with --engine ctranslate2, float32 unless --quantize; `bf16_ratio_vs_ctranslate2`:
CTranslate2's seconds over bf16's, > 1: ours in bf16 is faster) and the search `translate` runs
by default on this CPU (`default_*`: the decoder's "auto" precision and XLA choices, with their
reason; timed once more unless it is one of the two above; `default_ratio_vs_ctranslate2`);
the fastest of ours is `ours_best_setting`, its ratio `ours_best_ratio_vs_ctranslate2`. Every
ratio is against CTranslate2's best setting. Run it at --batch 32 and at --batch 1 (and with
--threads 1: TensorFlow's pools are sized once per process) for the ratios.

--profile LOGDIR profiles one more run of our search and prints the top op types and, for beam
search, `step_groups`: ops and milliseconds per search step by group (self-attention with its
cache, cross-attention, feed-forward, output projection, log-softmax and masks, top-k, beam
reordering of the caches, loop bookkeeping; `tf_common.step_group_table`, by op names). Ops
overlap when the executor runs them in parallel, so the groups can sum to more than `step_ms`.
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# tf_common first: it sets Keras' backend (TensorFlow) and quiets TensorFlow before they load.
from tf_common import measure_matmul_peak, op_time_table, step_group_table  # noqa: E402
from common import PAPER_VOCAB_SIZE, add_record_flag, append_result, emit, timed  # noqa: E402
from flops import search_flops  # noqa: E402
from ct2_reference import DEFAULTS, label, threading_grid  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer import Transformer  # noqa: E402
from keras_transformer.decoding.search.beam_search import translate_beam  # noqa: E402
from keras_transformer.decoding.engines.precision import cast_model  # noqa: E402
from keras_transformer.decoding.search.greedy import translate_greedy  # noqa: E402
from pipelines.special_ids import EOS_ID  # noqa: E402


def ctranslate2_sweep(model, source, args):
    """Exports `model` with our CTranslate2 export and times its translate_batch at each
    threading setting (`ct2_reference.threading_grid`: workers x threads, products up to the
    core count, and CTranslate2's defaults), the batch split among the workers
    (max_batch_size), as CTranslate2's users spread one call over its workers. Returns
    {setting label: median seconds}."""
    import ctranslate2

    from keras_transformer.export.ct2 import build_spec

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    pieces = specials + [f"p{i}" for i in range(len(specials), args.vocab_size)]
    spec = build_spec(model, pieces, max_input_length=args.src_len)
    spec.optimize(quantization=None if args.quantize == "none" else args.quantize)
    tokens = [[pieces[i] for i in row[:-1]] for row in source]  # CTranslate2 adds EOS
    found = {}
    with tempfile.TemporaryDirectory() as folder:
        spec.save(folder)
        for workers, threads in threading_grid():
            translator = ctranslate2.Translator(folder, device="cpu", compute_type="default",
                                                intra_threads=threads, inter_threads=workers)

            def run():
                return translator.translate_batch(
                    tokens, beam_size=args.beam, length_penalty=0.6,
                    max_batch_size=-(-args.batch // workers),
                    min_decoding_length=args.out_len, max_decoding_length=args.out_len,
                    return_end_token=True)

            outputs = run()
            lengths = {len(output.hypotheses[0]) for output in outputs}
            assert lengths == {args.out_len}, f"CTranslate2 output lengths {lengths}"
            found[label((workers, threads))] = timed(run, args.repeats)[0]
            del translator
    return found


def search_function(model, args, xla=None):
    """Our search of `model` as one tf.function, every hypothesis forced to out-len tokens;
    compiled by XLA with `xla` (default: --xla)."""

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)],
                 jit_compile=(args.xla if xla is None else xla) or None)
    def search(source_ids):
        # Every output exactly out-len tokens; static shapes under XLA (as translate's), the
        # caches growing without (as translate's).
        lengths = dict(max_output_length=args.out_len, min_length=args.out_len,
                       static=bool(args.xla if xla is None else xla))
        if args.beam == 1:
            return translate_greedy(model, source_ids, **lengths)["ids"][:, 0]
        return translate_beam(model, source_ids, args.beam, 0.6, **lengths)["ids"][:, 0]

    return search


def search_seconds(search, source, args):
    """Median seconds of `search` on `source` (traced and warmed up first)."""
    ids = search(source).numpy()
    assert ids.shape[1] == args.out_len and np.all(ids[:, -1] == EOS_ID), "length not forced"
    return timed(lambda: search(source).numpy(), args.repeats)[0]


def default_search(model, source, args, timed_already):
    """The `default_*` keys: the search `translate` runs by default on this CPU (the
    decoder's precision and XLA choices for "auto"), timed unless `timed_already`
    ({(precision, xla): seconds}) holds it."""
    from keras_transformer.decoding.engines.precision import resolve_precision
    from keras_transformer.decoding.engines.xla import resolve_xla

    precision, precision_reason = resolve_precision("auto")
    xla, xla_reason = resolve_xla(None, precision)
    seconds = timed_already.get((precision, xla))
    if seconds is None:
        seconds = search_seconds(search_function(cast_model(model, precision), args, xla),
                                 source, args)
    return {"default_precision": precision, "default_xla": xla,
            "default_reason": f"{precision_reason}; xla {xla_reason}",
            "default_seconds": round(seconds, 4),
            "default_target_tokens_per_s": round(args.batch * args.out_len / seconds, 1)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--src-len", type=int, default=30)
    parser.add_argument("--out-len", type=int, default=30)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=PAPER_VOCAB_SIZE)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs (median reported)")
    parser.add_argument("--xla", action="store_true", help="compile our search with XLA")
    parser.add_argument("--engine", default="tensorflow", choices=("tensorflow", "ctranslate2"),
                        help="ctranslate2: also time CTranslate2 on the same weights")
    parser.add_argument("--quantize", default="none", choices=("none", "int8", "int8_float32"),
                        help="CTranslate2 weights (none: float32)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="our search's intra-op threads (default: every core; "
                        "CTranslate2's settings are swept)")
    parser.add_argument("--precision", default="float32", choices=("float32", "bfloat16"),
                        help="what our search computes in (bfloat16: weights cast once)")
    parser.add_argument("--compare", action="store_true",
                        help="time our search in float32 and in bfloat16 and CTranslate2 (float32 "
                        "unless --quantize) in one run; one JSON line with the three")
    parser.add_argument("--profile", metavar="LOGDIR",
                        help="profile one timed run of our search; prints the top op types")
    add_record_flag(parser, "decode")
    args = parser.parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)

    keras.utils.set_random_seed(0)
    model = Transformer.from_preset(args.preset, vocab_size=args.vocab_size)
    model.build()
    rng = np.random.default_rng(0)
    source = rng.integers(4, args.vocab_size, (args.batch, args.src_len)).astype("int32")
    source[:, -1] = EOS_ID

    precision = "float32" if args.compare else args.precision
    searched = cast_model(model, precision)
    search = search_function(searched, args)
    seconds = search_seconds(search, source, args)
    tokens = args.batch * args.out_len
    flops = search_flops(model, args.batch, args.beam, args.src_len, args.out_len)
    peak = measure_matmul_peak()
    record = {
        "benchmark": "decode", "preset": args.preset,
        "search": "greedy" if args.beam == 1 else "beam", "beam": args.beam,
        "batch": args.batch, "src_len": args.src_len, "out_len": args.out_len,
        "vocab_size": args.vocab_size, "xla": args.xla, "threads": args.threads,
        "precision": precision,
        "seconds": round(seconds, 4),
        "target_tokens_per_s": round(tokens / seconds, 1),
        "sentences_per_s": round(args.batch / seconds, 2),
        "search_gflop": round(flops / 1e9, 1),
        "achieved_gflops": round(flops / seconds / 1e9, 1),
        "matmul_peak_gflops": round(peak, 1),
    }
    if args.profile:
        tf.profiler.experimental.start(args.profile)
        search(source).numpy()
        tf.profiler.experimental.stop()
        record["top_ops_ms"] = op_time_table(args.profile, top=15)
        if args.beam > 1:  # every search runs exactly out-len steps
            record["step_ms"] = round(seconds / args.out_len * 1e3, 3)
            record["step_groups"] = step_group_table(args.profile, args.out_len)
    if args.compare:
        bf16 = search_seconds(search_function(cast_model(model, "bfloat16"), args), source, args)
        record.update({
            "bf16_seconds": round(bf16, 4),
            "bf16_target_tokens_per_s": round(tokens / bf16, 1),
            "bf16_achieved_gflops": round(flops / bf16 / 1e9, 1),
            "bf16_speedup": round(seconds / bf16, 3),
        })
        record.update(default_search(model, source, args, {("float32", args.xla): seconds,
                                                           ("bfloat16", args.xla): bf16}))
    if args.engine == "ctranslate2" or args.compare:
        import ctranslate2

        settings = ctranslate2_sweep(model, source, args)
        best = min((name for name in settings if name != label(DEFAULTS)), key=settings.get)
        ct2 = settings[best]
        record.update({
            "ctranslate2_version": ctranslate2.__version__,
            "ctranslate2_quantize": args.quantize,
            "ctranslate2_settings": {name: round(value, 4) for name, value in settings.items()},
            "ctranslate2_best": best,
            "ctranslate2_seconds": round(ct2, 4),
            "ctranslate2_defaults_seconds": round(settings[label(DEFAULTS)], 4),
            "ctranslate2_target_tokens_per_s": round(tokens / ct2, 1),
            "ctranslate2_achieved_gflops": round(flops / ct2 / 1e9, 1),
            "ratio_vs_ctranslate2": round(ct2 / seconds, 3),
        })
        if args.compare:
            record["bf16_ratio_vs_ctranslate2"] = round(ct2 / record["bf16_seconds"], 3)
            record["default_ratio_vs_ctranslate2"] = round(ct2 / record["default_seconds"], 3)
            ours = {"float32": seconds, "bfloat16": record["bf16_seconds"],
                    "default": record["default_seconds"]}
            winner = min(ours, key=ours.get)
            record.update(ours_best_setting=winner, ours_best_seconds=round(ours[winner], 4),
                          ours_best_ratio_vs_ctranslate2=round(ct2 / ours[winner], 3))
    line = emit(record)
    if args.record:
        append_result("decode", line)


if __name__ == "__main__":
    main()
