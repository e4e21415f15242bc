"""The same weights give the same logits and the same searches on TensorFlow and on JAX.

The test process runs TensorFlow; a subprocess with KERAS_BACKEND=jax loads the weights saved
here and runs the same code (the search written once in `keras.ops`, jitted by JAX with static
shapes), on padded rows of different lengths.
"""

import ast
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_transformer import Transformer
from keras_transformer.decoding.search.beam_search import compiled_beam_search
from keras_transformer.decoding.search.sampling import compiled_sample_search
from keras_transformer.decoding.search.scoring import compiled_scorer
from keras_transformer.decoding.search.greedy import compiled_greedy_search
from keras_transformer.models import Ensemble
from pipelines.special_ids import BOS_ID, EOS_ID
from tests.search_helpers import tiny_model

ROOT = pathlib.Path(__file__).resolve().parents[1]
VOCAB = 40

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed"),
    # JAX compiles four searches in a subprocess (about 30 s); test_backends.py keeps a JAX
    # subprocess in `make test-fast`.
    pytest.mark.slow,
]

JAX_SCRIPT = """
import json, sys
import jax
import numpy as np
from keras_transformer import Transformer
from keras_transformer.models import Ensemble
from keras_transformer.decoding.search.beam_search import compiled_beam_search
from keras_transformer.decoding.search.greedy import compiled_greedy_search
from keras_transformer.decoding.search.sampling import compiled_sample_search
from keras_transformer.decoding.search.scoring import compiled_scorer

folder = sys.argv[1]
model = Transformer.from_preset("tiny", vocab_size={vocab}, dropout=0.0, num_layers={layers})
model.build()
model.load_weights(folder + "/model.weights.h5")
inputs = np.load(folder + "/inputs.npz")
source, target = inputs["source"], inputs["target"]
greedy_ids, greedy_scores = compiled_greedy_search(model)(source)
beam = compiled_beam_search(model, 4)(source)
again = compiled_beam_search(model, 4)(source[:1, :5])  # another shape: compiled again
other = Transformer.from_preset("tiny", vocab_size={vocab}, dropout=0.0, num_layers=1)
other.build()
other.load_weights(folder + "/other.weights.h5")
ensemble = compiled_greedy_search(Ensemble([model, other]))(source)
prefix = inputs["prefix"]
prefix_beam = compiled_beam_search(model, 4, with_prefix=True)(source, prefix)
prefix_greedy = compiled_greedy_search(model, with_prefix=True)(source, prefix)
top1 = compiled_sample_search(model, 2, top_k=1)(source, np.int32(3))
topk = compiled_sample_search(model, 16, top_k=3)(source, np.int32(4))
topp = compiled_sample_search(model, 16, top_p=0.5)(source, np.int32(5))
scored = compiled_scorer(model)(source, beam["ids"][:, 0])
constrained = compiled_beam_search(model, 4, with_constraints=True)(source,
                                                                    inputs["constraints"])
# The forward pass jitted, as JAX runs the model everywhere else (op by op, JAX would compile
# each operation of the model on its own: about 5 s more here).
logits = np.asarray(jax.jit(lambda source, target: model((source, target)))(source, target))
np.savez(folder + "/jax.npz", prefix_beam_ids=prefix_beam["ids"],
         constrained_ids=constrained["ids"], constrained_scores=constrained["scores"],
         prefix_greedy_ids=prefix_greedy[0], top1_ids=top1["ids"], topk_ids=topk["ids"],
         topp_ids=topp["ids"], scored=scored["log_prob"], logits=logits,
         greedy_ids=greedy_ids, greedy_scores=greedy_scores, beam_ids=beam["ids"],
         beam_scores=beam["scores"], beam_log_probs=beam["log_probs"], again_ids=again["ids"],
         ensemble_ids=ensemble[0], ensemble_scores=ensemble[1])
print(json.dumps({{"backend": __import__("keras").backend.backend(),
                   "types": sorted({{type(v).__name__ for v in beam.values()}})}}))
"""


def sources():
    rng = np.random.default_rng(0)
    ids = rng.integers(4, VOCAB, (3, 8)).astype("int32")
    for row, length in enumerate([8, 5, 3]):  # padded, as Translator pads a batch
        ids[row, length - 1] = EOS_ID
        ids[row, length:] = 0
    return ids


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(TensorFlow results, JAX results) of the same weights on the same inputs."""
    folder = tmp_path_factory.mktemp("search-jax")
    model = tiny_model(VOCAB, seed=11)
    model.save_weights(str(folder / "model.weights.h5"))
    other = Transformer.from_preset("tiny", vocab_size=VOCAB, dropout=0.0, num_layers=1)
    other.build()
    other.save_weights(str(folder / "other.weights.h5"))
    source = sources()
    target = np.concatenate([np.full((3, 1), BOS_ID, "int32"), source[:, :5]], axis=1)
    prefix = np.array([[5, 6, 7], [9, 0, 0], [0, 0, 0]], np.int32)
    # Terminology: sentence 0 two phrases, sentence 1 one of three tokens, sentence 2 none.
    constraints = np.array([[[11, 12, 0], [30, 0, 0]], [[5, 6, 7], [0, 0, 0]],
                            [[0, 0, 0], [0, 0, 0]]], np.int32)
    np.savez(folder / "inputs.npz", source=source, target=target, prefix=prefix,
             constraints=constraints)

    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    script = JAX_SCRIPT.format(vocab=VOCAB, layers=model.architecture["num_layers"])
    result = subprocess.run([sys.executable, "-c", script, str(folder)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"backend": "jax", "types": ["ndarray"]}  # numpy out under JAX

    greedy_ids, greedy_scores = compiled_greedy_search(model)(source)
    # Here one traced search takes both shapes (its input signature leaves them open).
    beam_search = compiled_beam_search(model, 4)
    beam = beam_search(source)
    tf_results = dict(
        logits=np.asarray(model((source, target))), greedy_ids=np.asarray(greedy_ids),
        greedy_scores=np.asarray(greedy_scores),
        **{f"beam_{key}": np.asarray(value) for key, value in beam.items()},
        again_ids=np.asarray(beam_search(source[:1, :5])["ids"]))
    ensemble = compiled_greedy_search(Ensemble([model, other]))(source)
    tf_results.update(ensemble_ids=np.asarray(ensemble[0]),
                      ensemble_scores=np.asarray(ensemble[1]))
    tf_results.update(
        prefix_beam_ids=np.asarray(compiled_beam_search(model, 4, with_prefix=True)(
            source, prefix)["ids"]),
        prefix_greedy_ids=np.asarray(compiled_greedy_search(model, with_prefix=True)(
            source, prefix)[0]),
        top1_ids=np.asarray(compiled_sample_search(model, 2, top_k=1)(source, np.int32(3))[
            "ids"]),
        **{f"constrained_{key}": np.asarray(value) for key, value in compiled_beam_search(
            model, 4, with_constraints=True)(source, constraints).items() if key != "log_probs"},
        scored=np.asarray(compiled_scorer(model)(source, beam["ids"][:, 0])["log_prob"]),
        first_log_probs=np.asarray(keras.ops.log_softmax(model((source, target[:, :1]))[:, 0])))
    return tf_results, dict(np.load(folder / "jax.npz"))


def test_logits_agree_across_backends(runs):
    tf_results, jax_results = runs
    assert jax_results["logits"].dtype == np.float32
    np.testing.assert_allclose(jax_results["logits"], tf_results["logits"], rtol=1e-4, atol=1e-4)


def test_greedy_search_agrees_across_backends(runs):
    tf_results, jax_results = runs
    # JAX's static buffer (padded width + 50) is trimmed on the host to the same columns.
    np.testing.assert_array_equal(jax_results["greedy_ids"], tf_results["greedy_ids"])
    np.testing.assert_allclose(jax_results["greedy_scores"], tf_results["greedy_scores"],
                               rtol=1e-4, atol=1e-4)


def test_beam_search_agrees_across_backends(runs):
    tf_results, jax_results = runs
    assert jax_results["beam_ids"].shape[:2] == (3, 4)
    np.testing.assert_array_equal(jax_results["beam_ids"], tf_results["beam_ids"])
    np.testing.assert_array_equal(jax_results["again_ids"], tf_results["again_ids"])
    for key in ("beam_scores", "beam_log_probs"):
        np.testing.assert_allclose(jax_results[key], tf_results[key], rtol=1e-4, atol=1e-4)


def test_an_ensemble_greedy_search_agrees_across_backends(runs):
    tf_results, jax_results = runs
    np.testing.assert_array_equal(jax_results["ensemble_ids"], tf_results["ensemble_ids"])
    np.testing.assert_allclose(jax_results["ensemble_scores"], tf_results["ensemble_scores"],
                               rtol=1e-4, atol=1e-4)
    # Two different models: the ensemble's search is not the first model's.
    assert not np.allclose(tf_results["ensemble_scores"], tf_results["greedy_scores"])


def test_prefixes_top_k_1_sampling_and_scores_agree_across_backends(runs):
    tf_results, jax_results = runs
    for key in ("prefix_beam_ids", "prefix_greedy_ids", "top1_ids"):
        np.testing.assert_array_equal(jax_results[key], tf_results[key], err_msg=key)
    assert list(tf_results["prefix_beam_ids"][0, 0, :3]) == [5, 6, 7]
    np.testing.assert_allclose(jax_results["scored"], tf_results["scored"], atol=1e-4)
    np.testing.assert_allclose(tf_results["scored"], tf_results["beam_log_probs"][:, 0],
                               atol=1e-4)


def test_jax_samples_stay_in_the_top_k_and_top_p_sets_of_the_same_weights(runs):
    tf_results, jax_results = runs
    first = tf_results["first_log_probs"].copy()  # (3, V) the first step's, on TensorFlow
    first[:, :2] = -np.inf  # PAD and BOS are never generated: the search renormalizes without
    first -= np.log(np.sum(np.exp(first), axis=1, keepdims=True))
    order = np.argsort(-first, axis=1)
    for row in range(3):
        top3 = set(order[row, :3].tolist())
        drawn = set(jax_results["topk_ids"][row, :, 0].tolist())
        assert drawn <= top3 and len(drawn) > 1, (drawn, top3)
        probs = np.exp(first[row, order[row]])
        nucleus = set(order[row, : int(np.searchsorted(np.cumsum(probs), 0.5)) + 1].tolist())
        assert set(jax_results["topp_ids"][row, :, 0].tolist()) <= nucleus


@pytest.mark.parametrize("name", sorted(
    p.name for p in (ROOT / "keras_transformer" / "decoding" / "search").glob("*.py")))
def test_search_modules_do_not_import_tensorflow_at_module_level(name):
    tree = ast.parse((ROOT / "keras_transformer" / "decoding" / "search" / name).read_text())
    top_level = [alias.name for node in tree.body if isinstance(node, ast.Import)
                 for alias in node.names]
    top_level += [node.module for node in tree.body if isinstance(node, ast.ImportFrom)]
    assert not [m for m in top_level if m and m.split(".")[0] == "tensorflow"]


def test_constrained_beam_search_agrees_across_backends(runs):
    tf_results, jax_results = runs
    np.testing.assert_array_equal(jax_results["constrained_ids"], tf_results["constrained_ids"])
    np.testing.assert_allclose(jax_results["constrained_scores"],
                               tf_results["constrained_scores"], rtol=1e-4, atol=1e-4)
