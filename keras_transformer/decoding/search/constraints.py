"""Lexical constraints for beam search: phrases every output must contain, tracked per
hypothesis, and the dynamic beam allocation that keeps room for the hypotheses meeting them.

References:
    Post and Vilar, 2018, "Fast Lexically Constrained Decoding with Dynamic Beam Allocation
    for Neural Machine Translation" (the rules: tracking, candidates, banks, allocation).
    Hu et al., 2019, "Improved Lexically Constrained Decoding for Translation and
    Monolingual Rewriting" (the vectorized allocation: rank within a bank, then round-robin).

The constraints of a batch are an int32 tensor (B, C, L): per sentence up to C phrases, each a
row of up to L target ids (no EOS), 0-padded; an all-zero row is no phrase. The phrases are
unordered: each must appear somewhere as a contiguous run of tokens.

Per hypothesis and phrase the search keeps `met` (the phrase has appeared) and `progress` (how
many of its tokens the hypothesis ends with, while it is being matched). After a token, each
unmet phrase

    advances (progress + 1)  if the token is the phrase's next one,
    starts   (progress = 1)  else if it is the phrase's first one,
    is abandoned (0)         otherwise (Post and Vilar's rule: no backtracking),

and is met once its progress reaches its length. A hypothesis's bank is the number of
constraint tokens it has met: the lengths of its met phrases plus its longest progress (what
it still misses: whether it can fit them before its limit). The beam is shared among groups
of fewer banks: the number of phrases a hypothesis has met or is matching (`allocate`).

A repeated phrase is met by one occurrence (the phrases are tracked independently).

`ConstraintBanks` is beam search's mode for them (`search.modes`): it tracks the phrases of each
hypothesis and chooses the beams by groups. `beam_search.translate_beam` runs it after the
plain search, only where the plain output lacks a phrase (`search.plain_first`).

Everything is written in `keras.ops` with fixed shapes, as the search body is (tf.function,
XLA, JAX).
"""

from keras import ops

from keras_transformer.decoding.search.modes import Selection
from keras_transformer.decoding.search.rules import NEG_INF
from keras_transformer.decoding.search.top_k import best_continuations_without, gather_beams
from pipelines.special_ids import EOS_ID, PAD_ID

# Added to the score of a finished hypothesis that lacks phrases (forced to end at its length
# limit): it ranks behind every hypothesis that met them all, yet still counts as found (its
# key stays far above NEG_INF / 2).
INCOMPLETE = -1e6


def phrase_lengths(constraints):
    """(B, C, L) phrase ids -> (B, C) int32 numbers of tokens."""
    return ops.sum(ops.cast(ops.not_equal(constraints, PAD_ID), "int32"), axis=2)


def constraint_limits(limits, constraints):
    """Output limits that leave room for the phrases: limit + their total length."""
    if constraints is None:
        return limits
    return limits + ops.sum(phrase_lengths(ops.cast(constraints, "int32")), axis=1)


def candidate_ranks(scores, groups, valid):
    """The rank of each candidate by score among the valid candidates of its group (0: the
    best; equal scores: the first first): (B, M) scores, (B, M) groups, (B, M) bool ->
    (B, M) int32."""
    m = ops.shape(scores)[1]
    index = ops.arange(m)
    score_i, score_j = scores[:, :, None], scores[:, None, :]  # (B, M_i, M_j)
    ahead = ops.logical_or(score_j > score_i, ops.logical_and(
        ops.equal(score_j, score_i), (index[None, :] < index[:, None])[None]))
    counted = ops.logical_and(ops.logical_and(ahead, valid[:, None, :]),
                              ops.equal(groups[:, :, None], groups[:, None, :]))
    return ops.sum(ops.cast(counted, "int32"), axis=2)


def first_occurrences(parents, tokens, valid):
    """(B, M) bool: no earlier valid candidate has the same (parent, token). (B, M) parents,
    tokens; (B, M) bool valid (a masked candidate, e.g. an EOS of NEG_INF among the 2K best
    at a limit, does not hide the valid one after it)."""
    m = ops.shape(tokens)[1]
    index = ops.arange(m)
    same = ops.logical_and(ops.equal(parents[:, :, None], parents[:, None, :]),
                           ops.equal(tokens[:, :, None], tokens[:, None, :]))
    earlier = ops.logical_and((index[None, :] < index[:, None])[None],
                              valid[:, None, :])  # j < i, j valid
    return ops.logical_not(ops.any(ops.logical_and(same, earlier), axis=2))


class PhraseConstraints:
    """The phrases of a batch and the rules on them that beam search applies each step.

    Args:
        phrases: (B, C, L + 1) int32 phrase ids, 0-padded, with a column of padding at the end
            (`padded`).
        lengths: (B, C) int32 their numbers of tokens (`phrase_lengths`).
    """

    def __init__(self, phrases, lengths):
        self.phrases, self.lengths = phrases, lengths
        shape = ops.shape(phrases)
        self.num_phrases, self.width = shape[1], shape[2]

    @staticmethod
    def padded(constraints):
        """(B, C, L) phrase ids (see the module docstring) -> (B, C, L + 1) int32: a column of
        padding at the end, so that phrases of width 0 still have a first token to read, and
        a phrase's progress (at most its length) indexes a column."""
        return ops.pad(ops.cast(constraints, "int32"), [[0, 0], [0, 0], [0, 1]])

    def initial(self, beam_size):
        """(met (B, K, C) bool, progress (B, K, C) int32) before the first token; a row of
        zeros (no phrase) is met from the start."""
        met = ops.repeat(ops.expand_dims(ops.equal(self.lengths, 0), 1), beam_size, axis=1)
        return met, ops.zeros(ops.shape(met), "int32")

    def next_tokens(self, met, progress):
        """(B, K, C) int32: the token that advances each phrase of each hypothesis (the next
        of one in progress, the first of one not started), PAD for a met phrase."""
        position = ops.equal(ops.arange(self.width), progress[..., None])  # (B, K, C, L)
        tokens = ops.sum(ops.where(position, self.phrases[:, None], 0), axis=3)
        return ops.where(met, PAD_ID, tokens)

    def candidates(self, met, progress, alive, log_probs, best, eos, at_limit):
        """Per sentence, the continuations beyond the 2K best other than EOS that each beam
        adds (Post and Vilar's Algorithm 1): its best one other than EOS, those that advance
        its phrases, and EOS where the beam has met every phrase or must end here (its
        limit: EOS forced). EOS comes only from here, so that a hypothesis may end only once
        it has met every phrase, and one that met them can always end (it keeps a
        continuation).

        Args:
            met, progress: (B, K, C) the beams' phrases' state.
            alive: (B, K) the beams' log P.
            log_probs: (B, K, V) the step's (a met phrase's PAD token scores NEG_INF: never
                chosen; EOS is read from `eos` only).
            best: (B, K) int32 each beam's best token other than EOS.
            eos: (B, K) the beams' EOS log-probabilities.
            at_limit: (B, 1, 1) bool.

        Returns:
            (parents, tokens, scores), each (B, K * (2 + C)).
        """
        shape = ops.shape(log_probs)
        batch, beams, vocab = shape[0], shape[1], shape[2]
        tokens = ops.reshape(ops.concatenate([best[:, :, None], self.next_tokens(met, progress)],
                                             axis=2), (batch, -1))  # (B, K * (1 + C))
        parents = ops.repeat(ops.arange(beams, dtype="int32"), self.num_phrases + 1)
        parents = ops.zeros_like(tokens) + parents[None, :]
        scores = ops.where(ops.equal(tokens, EOS_ID), NEG_INF,  # a phrase may not end one
                           gather_beams(ops.reshape(log_probs, (batch, -1)),
                                        parents * vocab + tokens)) + gather_beams(alive, parents)
        ends = ops.logical_or(ops.all(met, axis=2), at_limit[:, :, 0])  # (B, K)
        eos_parents = ops.zeros_like(ends, "int32") + ops.arange(beams, dtype="int32")[None]
        return (ops.concatenate([parents, eos_parents], axis=1),
                ops.concatenate([tokens, ops.where(ends, EOS_ID, PAD_ID)], axis=1),
                ops.concatenate([scores, ops.where(ends, alive + eos, NEG_INF)], axis=1))

    def advance(self, met, progress, tokens):
        """The phrases' state after each candidate's token: (B, M, C) met and progress of
        its parent, (B, M) tokens -> (met, progress), each (B, M, C)."""
        expected = self.next_tokens(met, progress)
        first = self.phrases[:, None, :, 0]  # (B, 1, C)
        token = tokens[:, :, None]
        unmet = ops.logical_not(met)
        advances = ops.logical_and(unmet, ops.equal(token, expected))
        starts = ops.logical_and(unmet, ops.equal(token, first))
        progress = ops.where(advances, progress + 1, ops.where(starts, 1, 0))
        completed = ops.logical_and(progress > 0, ops.equal(progress, self.lengths[:, None, :]))
        return ops.logical_or(met, completed), ops.where(completed, 0, progress)

    def banks(self, met, progress):
        """(B, M, C) met and progress -> (B, M) int32 constraint tokens met."""
        met_tokens = ops.sum(ops.where(met, self.lengths[:, None, :], 0), axis=2)
        return met_tokens + ops.max(progress, axis=2, initial=0)

    def hopeless(self, met, progress, room):
        """(B, M) bool: hypotheses that can no longer fit the phrase tokens they miss (a lower
        bound, from `banks`) in `room` ((B,) tokens that still fit before EOS)."""
        missing = ops.sum(self.lengths, axis=1)[:, None] - self.banks(met, progress)
        return missing > room[:, None]

    def groups(self, met, progress):
        """(B, M, C) met and progress -> (B, M) int32 phrases met or being matched: the groups
        the beam is shared among (`allocate`)."""
        return ops.sum(ops.cast(ops.logical_or(met, progress > 0), "int32"), axis=2)

    def allocate(self, scores, met, progress, valid, room, beam_size):
        """Dynamic beam allocation, vectorized: the beam_size candidates to keep alive, (B, K)
        indices into the M candidates (scores: (B, M); met, progress: (B, M, C); valid: (B, M)
        bool; room: (B,) tokens each sentence's hypotheses may still add before EOS).

        Each candidate is ranked by score within its group (`groups`: the phrases it met or
        is matching); candidates are taken by rank, the higher group first at equal rank (a
        round-robin over the groups), so that hypotheses that met more phrases keep slots
        against better-scored ones that met fewer. The groups count phrases, not Post and
        Vilar's tokens: with a phrase of several pieces, a bank per token meant more banks
        than beams, and the best hypotheses of the low banks (the translation without the
        phrase, from which a well-placed phrase starts) lost their slots to the hypotheses
        that had started the phrase anywhere. Those that can no longer fit their missing
        tokens (`banks`) in the room left come last (they keep only slots nobody else
        wants), so that the beams that end at the length limit are, where possible,
        hypotheses that met every phrase.
        """
        groups = self.groups(met, progress)
        ranks = candidate_ranks(scores, groups, valid)
        num_groups = ops.cast(self.num_phrases + 1, "float32")
        keys = ops.cast(groups, "float32") - ops.cast(ranks, "float32") * num_groups
        last = num_groups * ops.cast(ops.shape(scores)[1] + 1, "float32")  # behind every rank
        keys = ops.where(self.hopeless(met, progress, room), keys - last, keys)
        _, keep = ops.top_k(ops.where(valid, keys, NEG_INF), k=beam_size)
        return keep


class ConstraintBanks(Selection):
    """Beam search with constraints: a hypothesis may end only once it has met every phrase
    (or at its limit), each step also considers each beam's best continuation and those that
    advance its phrases (`PhraseConstraints.candidates`), and the alive beams are chosen by
    dynamic beam allocation across groups (`PhraseConstraints.allocate`). A hypothesis forced
    to end at its limit without them ranks behind every one that met them (the pool is
    ordered by "finished_keys": the scores, INCOMPLETE added to those).

    The phrases are loop values, per sentence ("phrases", "phrase_lengths"), as the phrases'
    state of each hypothesis is ("met", "progress"): a compact loop drops them with their
    sentence (`per_sentence`).

    Args:
        constraints: (B, C, L) int32 phrase ids, 0-padded (see the module docstring).
        beam_size: K.
    """

    pool_key = "finished_keys"
    per_sentence = ("met", "progress", "finished_keys", "phrases", "phrase_lengths")

    def __init__(self, constraints, beam_size):
        super().__init__(beam_size)
        self.constraints = constraints

    @staticmethod
    def phrases_of(loop):
        """The `PhraseConstraints` of the sentences a step computes."""
        return PhraseConstraints(loop["phrases"], loop["phrase_lengths"])

    def advancing(self, loop):
        """The step's `Step.advancing`: each hypothesis' phrases' next tokens, computed only
        where a rule asks for them."""
        return lambda: self.phrases_of(loop).next_tokens(loop["met"], loop["progress"])

    def start(self, loop):
        phrases = PhraseConstraints.padded(self.constraints)
        lengths = phrase_lengths(phrases)
        met, progress = PhraseConstraints(phrases, lengths).initial(self.beam_size)
        return dict(loop, met=met, progress=progress, finished_keys=loop["finished_scores"],
                    phrases=phrases, phrase_lengths=lengths)

    def expand(self, loop, step, log_probs):
        """The 2K best continuations other than EOS (the exact top-k in two stages, EOS left
        out without a pass of its own: `top_k.best_continuations_without`), then each beam's
        best other than EOS (found there too), those that advance
        its phrases, and its EOS where it may end (`PhraseConstraints.candidates`):
        M = 2K + K (2 + C)."""
        alive = loop["alive_log_probs"]
        top_scores, top_ids, best = best_continuations_without(alive, log_probs,
                                                               2 * self.beam_size, EOS_ID)
        more = self.phrases_of(loop).candidates(loop["met"], loop["progress"], alive,
                                                log_probs, best, log_probs[:, :, EOS_ID],
                                                step.at_limit)
        parents, tokens, scores = (ops.concatenate([a, b], axis=1) for a, b in zip(
            (top_ids // step.vocab, top_ids % step.vocab, top_scores), more))
        return dict(scores=scores, parents=parents, tokens=tokens)

    def track(self, loop, step, candidates):
        """Each candidate once (the same continuation may come twice), with its phrases' state
        ("met", "progress": (B, M, C)) after its token."""
        parents, tokens = candidates["parents"], candidates["tokens"]
        met, progress = self.phrases_of(loop).advance(
            gather_beams(loop["met"], parents), gather_beams(loop["progress"], parents), tokens)
        real = ops.logical_and(candidates["real"],
                               first_occurrences(parents, tokens, candidates["real"]))
        return dict(candidates, real=real, met=met, progress=progress)

    def finish(self, loop, step, candidates, new_scores):
        """The K best by key: those that lack phrases (ended at their limit) behind those that
        met them."""
        new_keys = ops.where(ops.all(candidates["met"], axis=2), new_scores,
                             new_scores + INCOMPLETE)
        keys, keep = ops.top_k(ops.concatenate([loop["finished_keys"], new_keys], axis=1),
                               k=self.beam_size)
        scores = gather_beams(ops.concatenate([loop["finished_scores"], new_scores], axis=1),
                              keep)
        return {"finished_scores": scores, "finished_keys": keys}, keep

    def keep_alive(self, loop, step, candidates, is_eos):
        """By dynamic beam allocation across the groups (`PhraseConstraints.allocate`): the
        alive beams are not sorted by score."""
        scores = candidates["scores"]
        growing = ops.logical_and(candidates["real"], ops.logical_not(is_eos))
        room = step.limits - step.index - 2  # tokens that still fit before EOS
        keep = self.phrases_of(loop).allocate(scores, candidates["met"], candidates["progress"],
                                              growing, room, self.beam_size)
        return ops.where(gather_beams(growing, keep), gather_beams(scores, keep), NEG_INF), keep

    def best_alive(self, new, step):
        """The best alive beam; once the pool holds K hypotheses that met every phrase, the
        best that can still fit its missing tokens before its limit: one that cannot may
        only end at its limit without them, behind all of those, so that it does not keep
        the sentence searching."""
        hopeless = self.phrases_of(new).hopeless(new["met"], new["progress"],
                                                 step.limits - step.index - 2)
        full = ops.all(new["finished_keys"] > INCOMPLETE / 2, axis=1)[:, None]
        alive = new["alive_log_probs"]
        return ops.max(ops.where(ops.logical_and(full, hopeless), NEG_INF, alive), axis=1)

    def advance(self, loop, step, new, candidates, keep):
        return dict(new, met=gather_beams(candidates["met"], keep),
                    progress=gather_beams(candidates["progress"], keep),
                    phrases=loop["phrases"], phrase_lengths=loop["phrase_lengths"])
