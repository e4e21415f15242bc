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
from keras_transformer.decoding.beam_search import compiled_beam_search
from keras_transformer.decoding.search import compiled_greedy_search
from keras_transformer.models import Ensemble
from pipelines.special_ids import BOS_ID, EOS_ID

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
import numpy as np
from keras_transformer import Transformer
from keras_transformer.models import Ensemble
from keras_transformer.decoding.beam_search import compiled_beam_search
from keras_transformer.decoding.search import compiled_greedy_search

folder = sys.argv[1]
model = Transformer.from_preset("tiny", vocab_size={vocab}, dropout=0.0)
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
np.savez(folder + "/jax.npz", logits=np.asarray(model((source, target))),
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
    keras.utils.set_random_seed(11)
    model = Transformer.from_preset("tiny", vocab_size=VOCAB, dropout=0.0)
    model.build()
    model.save_weights(str(folder / "model.weights.h5"))
    other = Transformer.from_preset("tiny", vocab_size=VOCAB, dropout=0.0, num_layers=1)
    other.build()
    other.save_weights(str(folder / "other.weights.h5"))
    source = sources()
    target = np.concatenate([np.full((3, 1), BOS_ID, "int32"), source[:, :5]], axis=1)
    np.savez(folder / "inputs.npz", source=source, target=target)

    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run([sys.executable, "-c", JAX_SCRIPT.format(vocab=VOCAB), str(folder)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"backend": "jax", "types": ["ndarray"]}  # numpy out under JAX

    greedy_ids, greedy_scores = compiled_greedy_search(model)(source)
    beam = compiled_beam_search(model, 4)(source)
    tf_results = dict(
        logits=np.asarray(model((source, target))), greedy_ids=np.asarray(greedy_ids),
        greedy_scores=np.asarray(greedy_scores),
        **{f"beam_{key}": np.asarray(value) for key, value in beam.items()},
        again_ids=np.asarray(compiled_beam_search(model, 4)(source[:1, :5])["ids"]))
    ensemble = compiled_greedy_search(Ensemble([model, other]))(source)
    tf_results.update(ensemble_ids=np.asarray(ensemble[0]),
                      ensemble_scores=np.asarray(ensemble[1]))
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


@pytest.mark.parametrize("name", ["search.py", "beam_search.py"])
def test_search_modules_do_not_import_tensorflow_at_module_level(name):
    tree = ast.parse((ROOT / "keras_transformer" / "decoding" / name).read_text())
    top_level = [alias.name for node in tree.body if isinstance(node, ast.Import)
                 for alias in node.names]
    top_level += [node.module for node in tree.body if isinstance(node, ast.ImportFrom)]
    assert not [m for m in top_level if m and m.split(".")[0] == "tensorflow"]
