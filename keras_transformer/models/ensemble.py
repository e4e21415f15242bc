"""An ensemble of Transformers that share a vocabulary, searched as one model.

    ensemble = Ensemble([run_a.load_model(), run_b.load_model()])
    Translator(ensemble, run_a.vocabulary()).translate(["A dog runs in the park."])

At every search step each member gives its next-token distribution and the ensemble takes
their mean, p(y | ...) = (1/M) sum_m p_m(y | ...), computed in log space (logsumexp of the
members' log-probabilities minus log M). Each member keeps its own encoder output and its own
self-attention caches; `decoding.search.step.model_step` builds the ensemble's step function from the
members' (the search functions, the exports and the JAX path use it unchanged).

Members must share the vocabulary (the same pieces in the same order): `Ensemble` checks the
output sizes; `runs.EnsembleRun.vocabulary` also compares the pieces of the runs' vocabularies.
"""

import keras

from keras_transformer.errors import InputError


@keras.saving.register_keras_serializable(package="keras_transformer")
class Ensemble(keras.Model):
    """Transformers decoded together (the mean of their next-token probabilities).

    Not trained: load or train the members, then wrap them. Its `variables` are all the
    members' (what a compiled search or an export tracks). It saves as one .keras file (its
    config holds the members' configs) that `keras.models.load_model` reads back.
    """

    def __init__(self, members, **kwargs):
        super().__init__(**kwargs)
        members = list(members)
        if not members:
            raise InputError("an ensemble needs at least one model.")
        sizes = {int(member.target_vocab_size or member.vocab_size) for member in members}
        if len(sizes) > 1:
            raise InputError(f"the models of an ensemble must share one vocabulary; their "
                             f"output sizes differ: {sorted(sizes)}.")
        self.members = members
        # No weights of its own: built once its members are (trained models always are).
        self.built = all(member.built for member in members)

    def call(self, inputs, training=None):
        """(source_ids, target_ids) -> the log of the members' mean probabilities (B, T, V)."""
        return mean_of_probabilities([member(inputs, training=training)
                                      for member in self.members])

    def get_config(self):
        return {**super().get_config(),
                "members": [keras.saving.serialize_keras_object(m) for m in self.members]}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        members = [keras.saving.deserialize_keras_object(m) for m in config.pop("members")]
        for member in members:  # built, so that the saved weights load into them
            if not member.built:
                member.build()
        return cls(members, **config)


def mean_of_probabilities(logits):
    """log((1/M) sum_m softmax(logits[m])) for a list of M same-shaped logit tensors (last
    axis: the vocabulary), computed in float32 log space."""
    import math

    log_probs = [keras.ops.log_softmax(keras.ops.cast(x, "float32"), axis=-1) for x in logits]
    if len(log_probs) == 1:
        return log_probs[0]
    stacked = keras.ops.stack(log_probs, axis=0)
    return keras.ops.logsumexp(stacked, axis=0) - math.log(len(log_probs))
