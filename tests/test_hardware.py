"""The CPU class and the kernel defaults the command picks for it."""

import pytest

from keras_transformer import hardware


def test_cpu_classes_from_flags():
    assert hardware.cpu_class({"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}) == "amx"
    assert hardware.cpu_class({"avx2", "avx512f", "avx512_bf16"}) == "avx512_bf16"
    assert hardware.cpu_class({"avx2", "avx512f"}) == "avx512"
    assert hardware.cpu_class({"avx", "avx2", "fma"}) == "avx2"
    assert hardware.cpu_class(set()) == "other"
    assert hardware.cpu_class() in ("amx", "avx512_bf16", "avx512", "avx2", "other")


def test_onednn_default_follows_the_class_unless_the_user_set_it(monkeypatch):
    monkeypatch.setattr(hardware, "CHOICES", {})
    for kind, flags in (("avx2", {"avx2"}), ("avx512_bf16", {"avx2", "avx512f", "avx512_bf16"})):
        environ = {}
        choices = hardware.apply_cpu_defaults(environ, flags)
        value, reason = choices["TF_ENABLE_ONEDNN_OPTS"]
        if kind in hardware.ONEDNN_DEFAULT_ON:
            assert environ == {"TF_ENABLE_ONEDNN_OPTS": "1"} and value == "1"
            assert kind in reason
        else:  # left to TensorFlow (on by itself on AVX-512)
            assert environ == {} and "on" in reason
    environ = {"TF_ENABLE_ONEDNN_OPTS": "0"}  # the user's word wins on every class
    choices = hardware.apply_cpu_defaults(environ, {"avx2"})
    assert environ == {"TF_ENABLE_ONEDNN_OPTS": "0"}
    assert choices["TF_ENABLE_ONEDNN_OPTS"] == ("0", "set by the user")
    assert "TF_ENABLE_ONEDNN_OPTS=0 (set by the user)" in hardware.kernel_summary(environ)


# The command, in a fresh process: what the environment holds and whether TensorFlow was
# loaded when the console was set up (TensorFlow reads TF_ENABLE_ONEDNN_OPTS when it loads).
COMMAND = """
import json, os, sys
from keras_transformer import cli, console
from keras_transformer.cli import models
seen = {}
setup = console.setup
def spy(show_native_logs, own_console=True):
    seen["tensorflow_loaded"] = "tensorflow" in sys.modules
    setup(show_native_logs, own_console)
console.setup = spy
models.presets = lambda args: print(json.dumps([os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
                                                seen["tensorflow_loaded"]]))
sys.exit(cli.main(["presets"], own_console=True))
"""


def _command_state():
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    result = subprocess.run([sys.executable, "-c", COMMAND], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-1000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_command_applies_the_cpu_default():
    value, _ = _command_state()
    assert value == ("1" if hardware.cpu_class() in hardware.ONEDNN_DEFAULT_ON else None)


def test_the_console_is_set_up_before_tensorflow_loads():
    _, loaded = _command_state()
    assert not loaded
