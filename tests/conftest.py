"""Shared test set-up: quiet TensorFlow, fixed seeds, and the shared data folder."""

import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import pytest  # noqa: E402

SHARED_DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(1234)


@pytest.fixture(scope="session")
def shared_data():
    """Path to ../shared/data; a test needing it skips without it, and fails under CI=true."""
    if not SHARED_DATA.is_dir():
        message = f"shared data folder not found: {SHARED_DATA}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + " (CI=true: data-dependent tests must run)")
        pytest.skip(message)
    return SHARED_DATA
