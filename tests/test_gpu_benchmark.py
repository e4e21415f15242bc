"""benchmarks/gpu.py, the GPU benchmark, runs on a CPU under JAX on tiny shapes and prints what
it promises: one JSON line per measurement, positive step times, a plausible MFU."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

needs_jax = pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                               reason="jax is not installed (the benchmark runs Keras on JAX)")


def run_benchmark(*args):
    """Runs `benchmarks/gpu.py --tiny ...` as on the GPU machine: Keras on JAX, no TensorFlow
    (the script blocks its import). Returns the parsed JSON lines."""
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    result = subprocess.run(
        [sys.executable, "benchmarks/gpu.py", "--tiny", "--steps", "2", "--warmup", "1", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]  # every line is JSON
    by_kind = {}
    for line in lines:
        by_kind.setdefault(line["benchmark"], []).append(line)
    return by_kind


def check_training(lines, engine):
    steps = [line for line in lines if line["engine"] == engine]
    assert sorted(line["dtype"] for line in steps) == ["bf16", "fp32"], steps
    for line in steps:
        assert "error" not in line and "skipped" not in line, line
        assert line["ms_per_step"] > 0 and line["target_tokens_per_s"] > 0, line
        assert line["model_tflop_per_step"] > 0, line
        assert 0 < line["mfu"] < 1.5, line


@needs_jax
@pytest.mark.slow  # 20-30 s on 2 cores: XLA compiles the training step and searches per dtype
def test_tiny_run_on_jax_without_tensorflow():
    lines = run_benchmark("--engines", "ours", "--search-batches", "4")
    (environment,) = lines["gpu_environment"]
    assert environment["jax_backend"] == "cpu"
    (peak,) = lines["gpu_matmul_peak"]
    assert peak["bf16_tflops"] > 0 and peak["fp32_tflops"] > 0
    check_training(lines["gpu_train_step"], "keras-jax")
    search = lines["gpu_search"]
    assert {(line["search"], line["dtype"]) for line in search} == {
        (name, dtype) for name in ("greedy", "beam") for dtype in ("bf16", "fp32")}, search
    for line in search:
        assert "error" not in line and "skipped" not in line, line
        assert line["sentences_per_s"] > 0 and line["target_tokens"] > 0, line
    # The script blocks `import tensorflow`, so reaching the end proves that our model, its
    # training under JAX and its search need no TensorFlow.
    (summary,) = lines["gpu_summary"]
    assert summary["tensorflow_imported"] is False and summary["failed"] is False


@needs_jax
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")
def test_tiny_run_with_torch_compile():
    # torch.compile of even the tiny model takes about a minute per dtype on 2 CPU cores.
    lines = run_benchmark("--engines", "torch", "--no-search")
    check_training(lines["gpu_train_step"], "torch-compile")
