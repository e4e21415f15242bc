"""Beam search as in the paper (Section 6.1): beam 4, length penalty alpha 0.6, maximum output
length = input length + 50, early termination.

Length penalty from GNMT (Wu et al., 2016, "Google's Neural Machine Translation System"):

    score(Y) = log P(Y | X) / lp(Y),    lp(Y) = ((5 + |Y|) / 6) ** alpha

with |Y| counting the output tokens including EOS.

The search keeps, per sentence, `beam_size` alive hypotheses and a pool of `beam_size` finished
ones. Each step expands the alive beams, takes the 2 x beam_size best continuations (so that
beam_size of them are not EOS), moves the EOS ones into the finished pool (kept sorted by
score) and the others into the alive beams, and reorders the decoder state (the self-attention
caches) to follow their parents. A sentence is done when its best alive hypothesis, even given
the largest length penalty it could still reach, cannot beat the lowest finished score in its
pool, or when it reaches its maximum length (EOS is forced there). The loop ends when every
sentence is done.

"Could still reach" looks `stop_horizon` steps ahead (3 by default): the penalty of ending
within 3 more steps, as if no token cost anything more. With 0 it is the penalty at the
sentence's limit (input + 50), the exact rule (tensor2tensor's): nothing found later could
have entered the pool, but a sentence then searches on long after its best hypothesis ended
(about twice the steps its output needs on Multi30k, alpha 1.0), since every alive
hypothesis keeps a chance under the largest penalty. The horizon stops there; on the Multi30k
val set (1,014 sentences, the demo run, alpha 1.0) horizons of 2, 3, 5 and 10 give every
output of the exact rule (1 gives 1,013), in about 0.77x the time (docs/performance.md).

With constraints (phrases every output must contain; `constraints`, after Post and Vilar,
2018), each step also considers each beam's best continuation and those that advance its
phrases, a hypothesis may end only once it has met them all, and the alive beams are chosen by
dynamic beam allocation across groups (phrases met) rather than by score alone.
`translate_beam` runs the plain search first and that one only where the plain output lacks
a phrase, within the plain output's length and the phrases' (`search.plain_first`).

The step is one body for every mode (`BeamStep`); what a mode does differently (a prefix's
forced tokens, the constraints' tracking and allocation, the loop's shape: every sentence to
the end, or the compact loop) is a small object whose hooks the step calls (`search.modes`;
`beam_modes` composes them from the options).

`translate_beam` is this mode's one body on a model (prefix, n-best and empty-row rules
inside); `Translator` (through `compiled_beam_search`), the SavedModel signatures and the TFLite
graph all run it.
"""

import keras
import numpy as np
from keras import ops

from keras_transformer.decoding.search.compact import default_shape
from keras_transformer.decoding.search.compiling import compile_search, dynamic_shapes
from keras_transformer.decoding.search.constraints import ConstraintBanks
from keras_transformer.decoding.search.modes import LoopShape, Modes, Selection, Step
from keras_transformer.decoding.search.plain_first import plain_first
from keras_transformer.decoding.search.prefix import PrefixForcing
from keras_transformer.decoding.search.repetition import (
    NGRAM_OFF, PENALTY_OFF, RepetitionControl, repetition)
from keras_transformer.decoding.search.rules import (
    NEG_INF, finish, prefix_forcing, special_tokens_banned, with_optional_prefix)
from keras_transformer.decoding.search.step import (
    EXTRA_LENGTH, encode, output_limits, prefixed_step)
from keras_transformer.decoding.search.top_k import gather_beams
from keras_transformer.decoding.request import DEFAULTS
from keras_transformer.errors import InputError
from pipelines.special_ids import BOS_ID, EOS_ID


def length_penalty(length, alpha):
    """GNMT length penalty ((5 + length) / 6) ** alpha."""
    return ops.power((5.0 + ops.cast(length, "float32")) / 6.0, alpha)


def beam_search(step_fn, state, limits, beam_size=DEFAULTS["beam_size"], alpha=DEFAULTS["alpha"],
                max_length=None, min_length=None, prefix=None, constraints=None, shape=LoopShape,
                stop_horizon=DEFAULTS["stop_horizon"], no_repeat_ngram_size=NGRAM_OFF,
                repetition_penalty=PENALTY_OFF, done=None):
    """Batched beam search over a step function.

    Args:
        step_fn: (tokens (B*K, 1), state, index) -> (logits (B*K, 1, V), state).
        state: nested tensors with B*K rows (row b*K + k: sentence b, beam k), reordered along
            their first axis as beams are chosen.
        limits: (B,) int32 maximum output lengths (EOS included).
        beam_size: K (a Python int keeps the beam dimension static; a scalar tensor is
            accepted on TensorFlow).
        alpha: length-penalty exponent (scalar, may be a tensor).
        max_length: steps at most (default max(limits); required where shapes are static,
            e.g. under JAX).
        min_length: if set, EOS is not allowed before this many tokens.
        prefix: (B, P) int32 target tokens every hypothesis of sentence b starts with
            (0-padded; a row of zeros is no prefix): while it lasts, only its token may follow,
            and its log-probabilities count in the scores. `limits` must leave room for it
            (`rules.prefix_limits`).
        constraints: (B, C, L) int32 phrases every hypothesis of sentence b must contain
            (0-padded; a row of zeros is no phrase; `search.constraints`): a hypothesis may
            end only once it has met them all; each step also considers the continuations
            that advance each beam's phrases, and the alive beams are chosen by dynamic beam
            allocation across banks. A hypothesis forced to end at its limit without them
            ranks behind every one that met them. `limits` must leave room for them
            (`constraints.constraint_limits`). None: the search without constraints.
        shape: the loop's shape, a `modes.LoopShape` class: every sentence to its end, or
            `compact.CompactLoop`, which drops each sentence from the loop once it is done, so
            that a step computes only the sentences still searching (where shapes may follow
            values: TensorFlow's graphs; no prefix). `state` is then a pair (rows, sentences):
            `rows` as above, `sentences` a nest of (B, ...) tensors the step reads once per
            sentence (the cross-attention's keys and values), which the loop shrinks with
            the sentences. A done sentence's finished pool is written to the output as it
            leaves: the same outputs as without.
        stop_horizon: a sentence stops once no alive hypothesis, ending within this many
            more steps and losing no more log-probability, could beat its lowest finished
            one; 0: ending anywhere up to its limit (exact: nothing found later could enter
            the pool). A Python int (see the module docstring).
        no_repeat_ngram_size: a token that would repeat an n-gram of this size in its
            hypothesis (the prefix included) is banned, except where the prefix forces it
            and where it advances one of the hypothesis' unmet phrases; 0: off.
        repetition_penalty: the sign-aware penalty on the logits of the tokens each
            hypothesis has generated, before the softmax (`search.repetition`); 1: off.
            Both Python numbers or scalar tensors (a signature's inputs: then a cond per
            step and rule); at their Python defaults nothing is built for them.
        done: None, or (B,) bool: sentences not to search (their pool stays empty; a compact
            loop leaves them out from the start).

    Returns:
        dict with
          "ids": (B, K, T) int32 hypotheses, best first (with constraints: those that met
            them all first), each ending with EOS, padded with 0;
          "scores": (B, K) length-normalized scores (NEG_INF where the pool was not filled);
          "log_probs": (B, K) log P(Y | X).
    """
    batch = ops.shape(limits)[0]
    k = int(beam_size) if isinstance(beam_size, (int, np.integer)) else ops.cast(beam_size,
                                                                                "int32")
    steps = ops.max(limits, initial=1) if max_length is None else max_length
    modes = beam_modes(batch, limits, k, prefix=prefix, constraints=constraints, shape=shape,
                       controls=repetition(no_repeat_ngram_size, repetition_penalty),
                       started=done is not None)
    loop = _first_loop(batch, k, steps, state, done)
    for mode in modes.all:
        loop = mode.start(loop)
    step = BeamStep(step_fn, modes, k, alpha, steps, min_length, stop_horizon)

    def cond(loop):
        return ops.logical_and(loop["index"] < steps, ops.logical_not(ops.all(loop["done"])))

    final = modes.shape.results(ops.while_loop(cond, step, loop))
    return {"ids": final["finished_seq"], "scores": final["finished_scores"],
            "log_probs": final["finished_log_probs"]}


def beam_modes(batch, limits, beam_size, prefix=None, constraints=None, shape=LoopShape,
               controls=None, started=False):
    """The modes a beam search composes (`search.modes`): a new mode is one line here.
    `shape`: the loop's shape (a `modes.LoopShape` class); `controls`: a
    `repetition.Repetition`, or None (off); `started`: some sentences may be done before the
    first step."""
    others = () if prefix is None else (PrefixForcing(prefix),)
    selection = Selection(beam_size) if constraints is None else ConstraintBanks(constraints,
                                                                                 beam_size)
    if controls is not None:
        others += (RepetitionControl(controls, prefix_forcing(prefix)),)
    per_sentence = sum((mode.per_sentence for mode in others + (selection,)),
                       PER_SENTENCE + POOL)
    return Modes(selection, shape(batch, limits, beam_size, per_sentence, POOL, prefix=prefix,
                                  started=started), others)


# The loop values of one row per sentence (besides the modes'), the finished pool among them,
# which the search returns.
PER_SENTENCE = ("alive_seq", "alive_log_probs", "done")  # and POOL
POOL = ("finished_seq", "finished_scores", "finished_log_probs")


def _first_loop(batch, k, steps, state, done=None):
    """The loop's first values, before the modes add theirs: every sentence's pool empty and
    one alive hypothesis (BOS) per sentence; `done`: (B,) bool, or None (none done)."""
    zeros_seq = ops.zeros((batch, k, steps), "int32")
    return dict(
        index=ops.convert_to_tensor(0, "int32"),
        tokens=ops.full((batch * k,), BOS_ID, "int32"),
        state=state,
        alive_seq=zeros_seq,
        # Only the first beam is alive at the start (the others would repeat it).
        alive_log_probs=ops.where(ops.equal(ops.arange(k), 0)[None, :], 0.0,
                                  ops.full((batch, k), NEG_INF, "float32")),
        finished_seq=zeros_seq,
        finished_scores=ops.full((batch, k), NEG_INF, "float32"),
        finished_log_probs=ops.full((batch, k), NEG_INF, "float32"),
        done=ops.zeros((batch,), "bool") if done is None else ops.cast(done, "bool"),
    )


class BeamStep:
    """One step of beam search, the loop's body: the same for every mode, which it calls at
    its hooks (`search.modes`; the picture in docs/design.md)."""

    def __init__(self, step_fn, modes, beam_size, alpha, steps, min_length, stop_horizon):
        self.step_fn, self.modes, self.k = step_fn, modes, beam_size
        self.alpha = ops.cast(alpha, "float32")
        self.steps, self.min_length, self.stop_horizon = steps, min_length, stop_horizon

    def __call__(self, loop):
        """The next loop state from `loop`: the model's step and its log-probabilities, the
        candidates, then the finished pool and the alive beams (`select`)."""
        index, modes = loop["index"], self.modes
        rows, limits = modes.shape.searching(loop)
        # The name scopes group the step's ops in profiles (benchmarks/decode.py --profile).
        with keras.name_scope("decode_step"):
            logits, state = self.step_fn(ops.expand_dims(loop["tokens"], 1), loop["state"],
                                         index)
        with keras.name_scope("scores"):
            logits = ops.cast(logits[:, -1], "float32")
            vocab = ops.shape(logits)[-1]
            step = Step(index, rows, vocab, limits, at_limit=(index + 1 >= limits)[:, None, None],
                        advancing=modes.selection.advancing(loop))
            for mode in modes.all:
                logits = mode.adjust_logits(loop, step, logits)
            log_probs = ops.reshape(ops.log_softmax(logits, axis=-1), (rows, self.k, vocab))
            # Special tokens never; at the last allowed position only EOS. One select over the
            # (B, K, V) log-probabilities (each pass over them costs as much as a matmul).
            is_eos_column = ops.equal(ops.arange(vocab), EOS_ID)[None, None, :]
            banned = ops.logical_or(
                special_tokens_banned(vocab, index, self.min_length)[None, None, :],
                ops.logical_and(step.at_limit, ops.logical_not(is_eos_column)))
            log_probs = ops.where(banned, NEG_INF, log_probs)  # banned: (B, 1, V)
            for mode in modes.all:
                log_probs = mode.adjust(loop, step, log_probs)
            candidates = modes.selection.expand(loop, step, log_probs)
        with keras.name_scope("select_beams"):
            return self.select(loop, step, state, candidates)

    def select(self, loop, step, state, candidates):
        """The next loop state: the finished pool, the alive beams and their decoder state."""
        index, modes = step.index, self.modes
        scores, parents, tokens = (candidates[name] for name in ("scores", "parents", "tokens"))
        write_here = ops.equal(ops.arange(self.steps), index)[None, None, :]
        sequences = ops.where(write_here, tokens[:, :, None],
                              gather_beams(loop["alive_seq"], parents))  # (B, M, T)
        is_eos = ops.equal(tokens, EOS_ID)
        candidates["real"] = ops.logical_and(scores > NEG_INF / 2,
                                             ops.logical_not(loop["done"])[:, None])
        for mode in modes.all:
            candidates = mode.track(loop, step, candidates)

        # Finished pool: the K best of (pool + new EOS hypotheses).
        new_scores = ops.where(ops.logical_and(is_eos, candidates["real"]),
                               scores / length_penalty(index + 1, self.alpha), NEG_INF)
        new, keep = modes.selection.finish(loop, step, candidates, new_scores)
        new.update(
            index=index + 1,
            finished_seq=gather_beams(ops.concatenate([loop["finished_seq"], sequences], 1),
                                      keep),
            finished_log_probs=gather_beams(
                ops.concatenate([loop["finished_log_probs"], scores], 1), keep))

        # Alive beams: K continuations other than EOS; the state follows their parents.
        alive_log_probs, keep = modes.selection.keep_alive(loop, step, candidates, is_eos)
        new.update(alive_seq=gather_beams(sequences, keep), alive_log_probs=alive_log_probs)
        parent_rows = gather_beams(parents, keep) + ops.arange(step.rows)[:, None] * self.k
        next_tokens = gather_beams(tokens, keep)  # (B, K) each
        for mode in modes.all:
            new = mode.advance(loop, step, new, candidates, keep)

        # Early termination: nothing alive can still beat the lowest finished score, even
        # under the largest penalty it could reach (at its limit, or within the horizon).
        pool_keys = new[modes.selection.pool_key]
        filled = pool_keys > NEG_INF / 2
        lowest_finished = ops.min(ops.where(filled, pool_keys, -NEG_INF), axis=1)
        lowest_finished = ops.where(filled[:, 0], lowest_finished, NEG_INF)
        reach = step.limits if not self.stop_horizon else ops.minimum(
            step.limits, index + 1 + self.stop_horizon)
        best_alive = modes.selection.best_alive(new, step) / length_penalty(
            reach, self.alpha)
        new["done"] = modes.shape.done_after(
            loop, ops.logical_or(lowest_finished >= best_alive, index + 1 >= step.limits))
        return modes.shape.next(loop, step, new, state, parent_rows, next_tokens)


def translate_beam(model, source_ids, beam_size=DEFAULTS["beam_size"], alpha=DEFAULTS["alpha"],
                   *, prefix=None, num_hypotheses=None, empty_rows=None, static=False,
                   optional_prefix=False, cached=True, extra_length=EXTRA_LENGTH,
                   max_output_length=None, min_length=None, constraints=None, shape=None,
                   stop_horizon=DEFAULTS["stop_horizon"], no_repeat_ngram_size=NGRAM_OFF,
                   repetition_penalty=PENALTY_OFF):
    """Beam search of `model`: the one body of this mode (see `search`'s module docstring).

    Args:
        model: a `Transformer` or an `Ensemble`.
        source_ids: (B, S) int32, EOS-terminated, 0-padded.
        beam_size, alpha: Python values, or scalar tensors on TensorFlow (a signature's
            inputs).
        prefix: (B, P) int32 target tokens every hypothesis of sentence b starts with
            (0-padded; a row of zeros is no prefix).
        num_hypotheses: keep the best num_hypotheses (<= beam_size) of each beam (default:
            the whole beam).
        empty_rows: (B,) bool, rows whose first hypothesis is EOS alone with score 0 and whose
            others are empty with score NEG_INF (`rules.eos_for_empty_rows`).
        static: keep every shape static (XLA, JAX): the ids are left untrimmed.
        optional_prefix: the prefix may hold no token at all (a request without prefixes):
            the search then runs without the per-step prefix masking (a cond; not in static
            searches).
        cached, extra_length, max_output_length, min_length: as for `search.pick_search`.
        constraints: (B, C, L) int32 phrases every output of sentence b must contain
            (0-padded; a row of zeros is no phrase; see `beam_search`). The plain search
            runs first; a sentence whose plain best holds every phrase keeps the plain
            hypotheses that do, the others are searched with constraints, their output
            limit the plain best's length + their phrases' (`search.plain_first`). Needs a
            beam of 2 or more.
        shape: the loop's shape (`beam_search`); default: the compact loop where it can, a
            cached search without prefix where shapes may follow values (TensorFlow's graphs
            without XLA; `compact.default_shape`).
        stop_horizon: when a sentence stops searching (`beam_search`; 0: exact).
        no_repeat_ngram_size, repetition_penalty: the repetition controls (`beam_search`;
            off by default).

    Returns:
        the `beam_search` dict ("ids" (B, H, T) best first, "scores", "log_probs" (B, H)),
        ids trimmed unless static.
    """
    if constraints is not None and isinstance(beam_size, (int, np.integer)) and beam_size < 2:
        raise InputError("constraints need beam search: use a beam of 2 or more.")

    branches = optional_prefix and prefix is not None and not static
    # The encoder runs once, before the prefix branch and the passes of a constrained search
    # (not once in each).
    encoded = encode(model, source_ids) if branches or constraints is not None else None

    def run(prefix, phrases, done=None, limits=None):
        loop_shape = shape or default_shape(static, cached, prefix)
        step_fn, state, own_limits, max_length = prefixed_step(
            model, source_ids, beam_size, static, prefix, cached=cached,
            extra_length=extra_length, max_output_length=max_output_length,
            constraints=phrases, shape=loop_shape, encoded=encoded)
        if limits is not None:
            own_limits = limits(own_limits)
            if dynamic_shapes() and not static and max_output_length is None:
                max_length = ops.max(own_limits, initial=1)  # the buffers: no longer
        return beam_search(step_fn, state, own_limits, beam_size, alpha, max_length,
                           min_length, prefix=prefix, constraints=phrases, shape=loop_shape,
                           stop_horizon=stop_horizon,
                           no_repeat_ngram_size=no_repeat_ngram_size,
                           repetition_penalty=repetition_penalty, done=done)

    def search(prefix):
        if constraints is None:
            return run(prefix, None)
        # The plain search first; the constrained one where its best lacks a phrase.
        return plain_first(lambda phrases, **given: run(prefix, phrases, **given),
                           constraints, output_limits(source_ids, 0))

    result = with_optional_prefix(search, prefix) if branches else search(prefix)
    if num_hypotheses is not None:
        result = {key: value[:, :num_hypotheses] for key, value in result.items()}
    return finish(result, empty_rows, trim_ids=not static)


def compiled_beam_search(model, beam_size=DEFAULTS["beam_size"], alpha=DEFAULTS["alpha"],
                         cached=True, extra_length=EXTRA_LENGTH, jit_compile=False,
                         with_prefix=False, with_constraints=False,
                         stop_horizon=DEFAULTS["stop_horizon"], no_repeat_ngram_size=NGRAM_OFF,
                         repetition_penalty=PENALTY_OFF):
    """`translate_beam` compiled once (see `compiling.compile_search` for each backend).

    With jit_compile (always under JAX), the search loop is compiled by XLA once per input
    shape (pad inputs to a few widths to bound the compilations): on CPU it runs the whole
    loop without TensorFlow's per-op overhead and updates the caches in place.

    Returns a function: source_ids (B, S) int32 [, constraints (B, C, L) int32 with
    with_constraints] [, prefix (B, P) int32 with with_prefix] -> the `beam_search` dict,
    ids trimmed (TensorFlow: tensors; JAX: numpy arrays).
    """
    if with_constraints and isinstance(beam_size, (int, np.integer)) and beam_size < 2:
        raise InputError("constraints need beam search: use a beam of 2 or more.")

    def search(source_ids, static, *extra):
        constraints = extra[0] if with_constraints else None
        prefix = extra[-1] if with_prefix else None
        return translate_beam(model, source_ids, beam_size, alpha, prefix=prefix,
                              static=static, cached=cached, extra_length=extra_length,
                              constraints=constraints, stop_horizon=stop_horizon,
                              no_repeat_ngram_size=no_repeat_ngram_size,
                              repetition_penalty=repetition_penalty)

    extra = ((((None, None, None), "int32"),) if with_constraints else ()) + (
        (((None, None), "int32"),) if with_prefix else ())
    return compile_search(model, search, finish, jit_compile, extra)
