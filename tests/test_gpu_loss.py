"""The loss as JAX computes it (reductions of the logits, no float32 softmax kept) gives the
values and gradients of the label-smoothed formula, for float32 and bfloat16 logits."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from keras_transformer.training.loss import _logsumexp_losses, _smoothed_losses_and_probs

ROOT = pathlib.Path(__file__).resolve().parents[1]
N, V = 24, 37


def reference(logits, labels, eps):
    """float64 losses and d(sum of losses * weights)/d logits, in numpy."""
    z = logits.astype(np.float64)
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    nll = lse - z[np.arange(len(labels)), labels]
    losses = (1 - eps) * nll + eps * (lse - z.mean(-1))
    softmax = np.exp(z - lse[:, None])
    target = np.full_like(z, eps / z.shape[-1])
    target[np.arange(len(labels)), labels] += 1 - eps
    return losses, softmax - target


def data(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(N, V)).astype("float32") * 4,
            rng.integers(0, V, N).astype("int32"))


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_logsumexp_losses_equal_the_softmax_formula(eps):
    from keras import ops

    logits, labels = data()
    new = ops.convert_to_numpy(_logsumexp_losses(logits, labels, eps))
    old = ops.convert_to_numpy(_smoothed_losses_and_probs(logits, labels, eps)[0])
    np.testing.assert_allclose(new, old, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(new, reference(logits, labels, eps)[0], rtol=1e-5, atol=1e-5)


JAX_SCRIPT = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
from keras_transformer.training.loss import smoothed_token_losses
args = json.loads(sys.argv[1])
logits = np.asarray(args["logits"], np.float32).reshape(args["shape"])
labels = np.asarray(args["labels"], np.int32).reshape(args["shape"][:2])
out = {}
for dtype in ("float32", "bfloat16"):
    z = jnp.asarray(logits, dtype)
    def total(z):
        return jnp.sum(smoothed_token_losses(labels, z, args["eps"]))
    losses = smoothed_token_losses(labels, z, args["eps"])
    grad = jax.jit(jax.grad(total))(z)
    out[dtype] = {"losses": np.asarray(losses, np.float64).ravel().tolist(),
                  "loss_dtype": str(losses.dtype), "grad_dtype": str(grad.dtype),
                  "grad": np.asarray(grad, np.float64).ravel().tolist(),
                  "z": np.asarray(z.astype(jnp.float32)).ravel().tolist()}
print(json.dumps(out))
"""


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_jax_loss_and_gradient_equal_the_formula_in_float32_and_bf16(eps):
    pytest.importorskip("jax")
    logits, labels = data(1)
    shape = (2, N // 2, V)
    arguments = json.dumps({"logits": logits.ravel().tolist(), "labels": labels.tolist(),
                            "shape": shape, "eps": eps})
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", JAX_SCRIPT, arguments], capture_output=True,
                            text=True, timeout=300, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    for dtype, tolerance in (("float32", 1e-5), ("bfloat16", 1e-2)):
        got = out[dtype]
        z = np.asarray(got["z"], np.float32).reshape(N, V)  # the logits as that dtype holds them
        losses, grad = reference(z, labels, eps)
        assert got["loss_dtype"] == "float32" and got["grad_dtype"] == dtype
        np.testing.assert_allclose(got["losses"], losses, rtol=1e-5, atol=1e-5)
        # The gradient is written in the logits' dtype (bf16 keeps 8 bits of mantissa).
        np.testing.assert_allclose(np.asarray(got["grad"]).reshape(N, V), grad,
                                   atol=tolerance, rtol=tolerance)
