"""Random sampling: the next token drawn from the model's distribution, narrowed by top-k,
top-p (nucleus) and a temperature, as used for back-translation and diverse outputs.

Sampling shares greedy search's loop (`search.pick_search`): only how the next token is
picked differs. `RandomSampler` is that rule. It draws with the Gumbel-max trick,

    token = argmax(log p'(y) + g),   g = -log(-log(u)),   u ~ Uniform(0, 1) per row and token

where p' is the narrowed, temperature-scaled distribution: the argmax of log-probabilities
plus Gumbel noise is a sample of their softmax. With top_k=1 only the most likely token is
left, so sampling gives greedy search's output exactly.

The noise is stateless: step `index` of a search seeded with `seed` draws from the key
(seed, index), so the same seed gives the same samples for the same inputs and batch on one
backend (TensorFlow's and JAX's generators differ). The scores returned are the model's own
log-probabilities of the tokens drawn (not the narrowed distribution's).

`translate_sample` is this mode's one body on a model; `Translator` (through
`compiled_sample_search`) and the SavedModel's `sample` signature run it.
"""

import keras
from keras import ops

from keras_transformer.decoding.search.compiling import compile_search
from keras_transformer.decoding.request import DEFAULTS, check
from keras_transformer.decoding.search.rules import NEG_INF, finish
from keras_transformer.decoding.search.greedy import pick_search
from keras_transformer.decoding.search.step import EXTRA_LENGTH


class RandomSampler:
    """Picks the next token at random from the narrowed distribution (see the module doc).

    Args:
        top_k: keep the k most likely tokens (0: all). A Python int, or a scalar tensor on
            TensorFlow (an exported signature's input).
        top_p: keep the smallest set of most likely tokens whose probability reaches top_p
            (1.0: all).
        temperature: divides the log-probabilities before the cuts (<1 sharper, >1 flatter).
        seed: a scalar int (Python or tensor): the noise of step i comes from (seed, i).
    """

    def __init__(self, top_k=DEFAULTS["top_k"], top_p=DEFAULTS["top_p"],
                 temperature=DEFAULTS["temperature"], seed=DEFAULTS["seed"]):
        self.top_k, self.top_p, self.temperature, self.seed = top_k, top_p, temperature, seed

    def __call__(self, log_probs, index):
        scaled = log_probs / ops.cast(self.temperature, "float32")
        scaled = self._top_k(scaled)
        scaled = self._top_p(scaled)
        noise = gumbel_noise(ops.shape(scaled), self.seed, index)
        return ops.cast(ops.argmax(scaled + noise, axis=-1), "int32")

    def _top_k(self, scaled):
        k = self.top_k
        if isinstance(k, int):
            if k <= 0 or k >= scaled.shape[-1]:
                return scaled
            kth = ops.top_k(scaled, k=k)[0][:, -1:]
        else:  # a tensor (TensorFlow): 0 keeps everything
            vocab = ops.shape(scaled)[-1]
            k = ops.where(k > 0, ops.minimum(k, vocab), vocab)
            kth = ops.min(ops.top_k(scaled, k=k)[0], axis=-1, keepdims=True)
        return ops.where(scaled < kth, NEG_INF, scaled)

    def _top_p(self, scaled):
        p = self.top_p
        if isinstance(p, (int, float)) and p >= 1.0:
            return scaled
        ordered = ops.top_k(scaled, k=ops.shape(scaled)[-1])[0]  # descending
        probs = ops.softmax(ordered, axis=-1)
        before = ops.cumsum(probs, axis=-1) - probs  # the mass of the more likely tokens
        keep = before < ops.cast(p, "float32")  # always keeps the most likely one
        smallest = ops.min(ops.where(keep, ordered, -NEG_INF), axis=-1, keepdims=True)
        return ops.where(scaled < smallest, NEG_INF, scaled)


def gumbel_noise(shape, seed, index):
    """Gumbel(0, 1) noise of `shape` from the key (seed, index), stateless."""
    tiny = 1e-20
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        key = tf.stack([tf.cast(seed, tf.int32), tf.cast(index, tf.int32)])
        uniform = tf.random.stateless_uniform(shape, seed=key, minval=tiny, maxval=1.0)
    else:
        import jax

        key = jax.random.fold_in(jax.random.PRNGKey(seed), index)
        uniform = jax.random.uniform(key, tuple(shape), minval=tiny, maxval=1.0)
    return -ops.log(-ops.log(uniform))


def translate_sample(model, source_ids, num_samples, top_k, top_p, temperature, seed, *,
                     prefix=None, empty_rows=None, static=False, extra_length=EXTRA_LENGTH):
    """Random sampling of `model`: the one body of this mode (see `search`'s module doc).

    Args:
        model: a `Transformer` or an `Ensemble`.
        source_ids: (B, S) int32, EOS-terminated, 0-padded.
        num_samples: rows drawn per sentence, each independently.
        top_k, top_p, temperature, seed: as for `RandomSampler`. Every option is a Python
            value, or a scalar tensor on TensorFlow (a signature's inputs); the ranges are
            the caller's to check (`decoding.request.check`).
        prefix: (B, P) int32 target tokens each sample starts with (0-padded).
        empty_rows: (B,) bool, rows whose samples are empty (the first EOS alone), every
            score 0.
        static: keep every shape static (XLA, JAX): the ids are left untrimmed.
        extra_length: maximum output length = source length + extra_length.

    Returns:
        {"ids": (B, num_samples, T), "scores": (B, num_samples) log P(Y | X)}.
    """
    ids, scores = pick_search(model, source_ids, num_samples,
                              RandomSampler(top_k, top_p, temperature, seed), prefix=prefix,
                              static=static, extra_length=extra_length)
    result = finish({"ids": ids, "scores": scores}, empty_rows,
                    trim_ids=not static and empty_rows is not None)
    if empty_rows is not None:
        result["scores"] = ops.where(empty_rows[:, None], 0.0, result["scores"])
    return result


def compiled_sample_search(model, num_samples=DEFAULTS["num_samples"], top_k=DEFAULTS["top_k"],
                           top_p=DEFAULTS["top_p"], temperature=DEFAULTS["temperature"],
                           extra_length=EXTRA_LENGTH, jit_compile=False, with_prefix=False):
    """`translate_sample` compiled once (see `compiling.compile_search` for each backend).

    Returns a function: source_ids (B, S) int32, seed () int32 [, prefix (B, P) int32 with
    with_prefix] -> {"ids": (B, num_samples, T), "scores": (B, num_samples) log P(Y | X)}.
    """
    check(dict(num_samples=num_samples, top_k=top_k, top_p=top_p, temperature=temperature))

    def search(source_ids, static, seed, prefix=None):
        return translate_sample(model, source_ids, num_samples, top_k, top_p, temperature,
                                seed, prefix=prefix, static=static, extra_length=extra_length)

    extra = (((), "int32"),) + ((((None, None), "int32"),) if with_prefix else ())
    return compile_search(model, search, finish, jit_compile, extra)
