"""The GPU kit is built here (TensorFlow prepares the data) and its `gpu-check --tiny` runs end
to end on JAX's CPU backend in processes where `import tensorflow` fails, as on the GPU
machine: the speed part, the quick recipe and the sweep each leave their JSON lines."""

import gzip
import importlib.util
import json
import os
import pathlib
import random
import subprocess
import sys

import pytest

from tests.training_helpers import WORDS

ROOT = pathlib.Path(__file__).resolve().parents[1]

# On PYTHONPATH, this sitecustomize makes every `import tensorflow*` fail in the process and in
# everything it starts (a finder ahead of all others).
BLOCKER = '''import sys


class NoTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "tensorflow_text", "tensorflow_datasets"):
            raise ImportError(f"{name} is blocked: the GPU machine has no TensorFlow")
        return None


sys.meta_path.insert(0, NoTensorFlow())
'''


def write_multi30k(folder, seed=0):
    """Raw Multi30k-shaped files (train, val, test_2016_flickr in en, de, fr; .gz) and the
    tokenized references (tok/), on a toy task: German is the English reversed, upper case."""
    rng = random.Random(seed)
    (folder / "tok").mkdir(parents=True)
    for stem, count in (("train", 400), ("val", 24), ("test_2016_flickr", 20)):
        english = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9)))
                   for _ in range(count)]
        german = [" ".join(reversed(line.split())).upper() for line in english]
        for lang, lines in (("en", english), ("de", german), ("fr", english)):
            with gzip.open(folder / f"{stem}.{lang}.gz", "wt", encoding="utf-8") as file:
                file.write("\n".join(lines) + "\n")
        if stem != "train":
            (folder / "tok" / f"{stem}.lc.norm.tok.de").write_text(
                "\n".join(line.lower() for line in german) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """A kit without wheels (no registry in tests), from the toy corpus."""
    folder = tmp_path_factory.mktemp("gpu-kit")
    write_multi30k(folder / "source")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2",
           "KERAS_TRANSFORMER_DATA_CACHE": str(folder / "cache")}
    result = subprocess.run(
        [sys.executable, "benchmarks/gpu_kit.py", "--no-wheels", "--source-dir",
         str(folder / "source"), "--data-dir", str(folder / "tfds"), "--vocab-size", "400",
         "--output", str(folder / "kit")], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return folder / "kit"


@pytest.mark.slow  # builds the kit under TensorFlow, then trains and decodes three times
def test_kit_holds_the_data_and_a_script_that_runs_without_tensorflow(kit, tmp_path):
    info = json.loads((kit / "kit.json").read_text())
    assert info["statistics"]["pairs"] == 400 and info["wheels"] == []
    assert 0 < info["bytes"]["total"] < 2**20
    for name in ("manifest.json", "statistics.json", "spm.model", "shard-00000.npz"):
        assert (kit / "data" / "prepared" / name).is_file(), name
    for name in ("val.en.gz", "val.de.gz", "test_2016_flickr.en.gz", "test_2016_flickr.de.gz",
                 "tok/test_2016_flickr.lc.norm.tok.de"):
        assert (kit / "data" / "multi30k" / name).is_file(), name
    assert os.access(kit / "gpu-check", os.X_OK)

    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed (gpu-check runs Keras on JAX)")
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    # The parts share a JAX compilation cache: parts b and c search with the same tiny model
    # (as do the sweep's settings), so a search compiled once is read back, not compiled again.
    env = {**os.environ, "PYTHONPATH": str(blocker), "KERAS_BACKEND": "jax",
           "JAX_PLATFORMS": "cpu", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax-cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    blocked = subprocess.run([sys.executable, "-c", "import tensorflow"], env=env,
                             capture_output=True, text=True)
    assert blocked.returncode != 0 and "blocked" in blocked.stderr  # the blocker works

    result = subprocess.run(["sh", str(kit / "gpu-check"), "--tiny", "--work",
                             str(tmp_path / "runs")], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=1500)
    lines = (tmp_path / "out" / "gpu-check.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    logs = {part: (tmp_path / "out" / f"{part}.log").read_text()[-2000:] for part in "abc"}
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:], logs)
    by_check = {}
    for record in records:
        by_check.setdefault(record.get("check") or record.get("benchmark"), []).append(record)

    (summary,) = by_check["gpu_check_summary"]
    assert summary["passed"] == {"a": True, "b": True, "c": True}, logs
    (step,) = by_check["gpu_train_step"]  # part a: our engine on the tiny shape in bf16
    assert step["part"] == "a" and step["engine"] == "keras-jax" and step["dtype"] == "bf16"
    assert step["ms_per_step"] > 0 and 0 < step["mfu"] < 1.5
    assert [line["tensorflow_imported"] for line in by_check["gpu_summary"]] == [False]

    (quick,) = by_check["quick_recipe"]  # part b: the demo's job under JAX from the kit's data
    assert quick["backend"] == "jax" and quick["steps"] == 2
    assert quick["alpha"] in (0.6, 1.0, 1.4, 1.8) and quick["weights"]
    assert quick["test2016"]["literature_references"] == "official"
    assert quick["test2016"]["sacrebleu"] >= 0 and quick["tensorflow_imported"] is False
    # Static shapes by default under JAX; the first step (its compilation) and the rate.
    assert quick["pad_to_bucket"] is True and quick["stopped"] == "reached train_steps=2"
    assert 0 < quick["first_step_s"] < quick["train_minutes"] * 60 + 1
    assert quick["steps_per_s"] > 0 and quick["steps_per_s_after_first"] > 0

    sweep = by_check["sweep"]  # part c: every tiny setting trained and scored on val
    assert [line["setting"] for line in sweep] == ["full", "dropout-0.2"]
    assert all(line["val_greedy_sacrebleu"] >= 0 and line["steps"] == 2 for line in sweep)
    assert all(line["pad_to_bucket"] is True and line["first_step_s"] > 0 for line in sweep)
    (best,) = by_check["full_recipe_best"]
    assert best["setting"] == max(sweep, key=lambda line: line["val_greedy_sacrebleu"])[
        "setting"]
    assert best["test2016"]["literature_references"] == "official"
    assert best["tensorflow_imported"] is False
