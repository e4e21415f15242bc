"""Training-step speed and model FLOPs utilization (MFU) of a preset on fixed-shape batches.

    python benchmarks/train_step.py --preset base [--batch 128 --length 32 --vocab-size 37000]
    python benchmarks/train_step.py --preset base --batch 780 --grad-accum-steps 6   # 25k tokens
    python benchmarks/train_step.py --preset base --profile /tmp/profile             # top ops

Measures the machine's fp32 matmul peak in the same run, compiles the preset as `keras-transformer
train` does (`training.trainer.compile_model`), trains it with `model.fit` on random ids (source
and target both (batch, length)) after a warm-up, and prints one JSON line.

Model FLOPs per step (`flops.train_step_flops`, benchmarks/gpu.py's count too) are the matrix
multiplications the model must do, forward and backward (x3 the forward): 2 x (encoder matmul parameters) x source tokens + 2 x (decoder matmul
parameters + output projection) x target tokens, plus the attention score and weighted-sum
matmuls (full T x S matrices). Embedding look-ups, softmax, LayerNorm and the optimizer are
not counted, so MFU is the share of the measured matmul peak doing useful matrix work.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# tf_common first: it sets Keras' backend (TensorFlow) and quiets TensorFlow before they load.
from tf_common import measure_matmul_peak, op_time_table  # noqa: E402
from common import PAPER_VOCAB_SIZE, add_record_flag, append_result, emit  # noqa: E402
from flops import train_step_flops  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer import Transformer  # noqa: E402
from keras_transformer.training.loss import LabelSmoothedCrossEntropy  # noqa: E402
from keras_transformer.training.optimizer import paper_optimizer  # noqa: E402
from keras_transformer.training.trainer import compile_model  # noqa: E402
from keras_transformer.runs import make_config  # noqa: E402


class StepTimer(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self._start)

    def on_train_begin(self, logs=None):
        self.times = []


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batch", type=int, default=128, help="sentences per batch")
    parser.add_argument("--length", type=int, default=32, help="source and target length")
    parser.add_argument("--vocab-size", type=int, default=PAPER_VOCAB_SIZE)
    parser.add_argument("--warmup-steps", type=int, default=2, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=5, help="timed steps")
    parser.add_argument("--xla", action="store_true", help="compile the step with XLA")
    parser.add_argument("--precision", default="float32",
                        choices=("float32", "mixed_bfloat16", "mixed_float16"),
                        help="Keras dtype policy of the step (float32; the FLOP count and the "
                        "float32 matmul peak stay the same, so the MFU of a mixed policy can "
                        "pass 1)")
    parser.add_argument("--grad-accum-steps", type=int, default=1,
                        help="split each batch into K micro-batches whose gradients are summed "
                             "before one update (what makes 25000-token batches fit in memory)")
    parser.add_argument("--keras-adam", action="store_true",
                        help="Keras' unfused Adam instead of the library's FusedAdam")
    parser.add_argument("--inter-op-threads", type=int, default=None,
                        help="TensorFlow inter-op threads (default: TensorFlow's choice)")
    parser.add_argument("--intra-op-threads", type=int, default=None,
                        help="TensorFlow intra-op threads (default: TensorFlow's choice)")
    parser.add_argument("--profile", metavar="DIR",
                        help="also trace the timed steps with the TensorFlow profiler into DIR "
                             "(view with TensorBoard) and add the top op types to the JSON")
    add_record_flag(parser, "train_step")
    args = parser.parse_args(argv)
    accum = args.grad_accum_steps
    if accum < 1 or args.batch % accum:
        parser.error(f"--batch {args.batch} must be a multiple of --grad-accum-steps {accum}")
    if args.inter_op_threads is not None:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
    if args.intra_op_threads is not None:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)

    peak = measure_matmul_peak()
    keras.mixed_precision.set_global_policy(args.precision)
    keras.utils.set_random_seed(0)
    model = Transformer.from_preset(args.preset, vocab_size=args.vocab_size)
    model.build()
    if args.keras_adam:
        model.compile(optimizer=paper_optimizer(model.d_model, grad_accum_steps=accum,
                                                fused=False),
                      loss=LabelSmoothedCrossEntropy(0.1), jit_compile=args.xla)
    else:  # exactly what `keras-transformer train` compiles (loss, optimizer, metrics if any)
        compile_model(model, make_config(preset=args.preset, grad_accum_steps=accum,
                                         xla=args.xla, precision=args.precision).resolved())
    shape = (args.batch // accum, args.length)  # one micro-batch
    rng = np.random.default_rng(0)
    src, tgt_in, labels = (rng.integers(1, args.vocab_size, shape).astype("int32")
                           for _ in range(3))
    dataset = tf.data.Dataset.from_tensors(((src, tgt_in), labels)).repeat()

    model.fit(dataset, steps_per_epoch=args.warmup_steps * accum, epochs=1, verbose=0,
              shuffle=False)
    timer = StepTimer()
    start = time.perf_counter()
    model.fit(dataset, steps_per_epoch=args.steps * accum, epochs=1, verbose=0,
              callbacks=[timer], shuffle=False)
    wall = time.perf_counter() - start
    # One optimizer step = `accum` micro-batches.
    timer.times = [sum(timer.times[i:i + accum]) for i in range(0, len(timer.times), accum)]

    top_ops = None
    if args.profile:  # a separate, traced run: tracing slows the steps a little
        tf.profiler.experimental.start(args.profile)
        model.fit(dataset, steps_per_epoch=args.steps * accum, epochs=1, verbose=0,
                  shuffle=False)
        tf.profiler.experimental.stop()
        top_ops = [{"op": op, "ms_per_step": round(ms / args.steps, 1)}
                   for op, ms, _ in op_time_table(args.profile)]

    step_s = statistics.median(timer.times)
    flops = train_step_flops(model.architecture, model.target_vocab_size or model.vocab_size,
                             args.batch, args.length, args.length)
    line = emit({
        "benchmark": "train_step",
        "preset": args.preset,
        "params": model.count_params(),
        "batch": args.batch,
        "length": args.length,
        "grad_accum_steps": accum,
        "vocab_size": args.vocab_size,
        "xla": args.xla,
        "precision": args.precision,
        "optimizer": "keras_adam" if args.keras_adam else "fused_adam",
        "threads": {"inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
                    "intra_op": tf.config.threading.get_intra_op_parallelism_threads()},
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default"),
        "steps": args.steps,
        "step_s": round(step_s, 4),
        "wall_s": round(wall, 2),
        "tokens_per_s": round(2 * args.batch * args.length / step_s, 1),
        "model_flops_per_step": flops,
        "achieved_gflops": round(flops / step_s / 1e9, 1),
        "peak_gflops": round(peak, 1),
        "mfu": round(flops / step_s / 1e9 / peak, 3),
        **({"top_ops": top_ops} if top_ops else {}),
    })
    if args.record:
        append_result("train_step", line)


if __name__ == "__main__":
    main()
