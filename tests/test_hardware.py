"""The CPU class and the kernel defaults the command picks for it."""

import pytest

from keras_transformer import hardware


def test_cpu_classes_from_flags(monkeypatch):
    assert hardware.cpu_class({"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}) == "amx"
    assert hardware.cpu_class({"avx2", "avx512f", "avx512_bf16"}) == "avx512_bf16"
    assert hardware.cpu_class({"avx2", "avx512f"}) == "avx512"
    assert hardware.cpu_class({"avx", "avx2", "fma"}) == "avx2"
    assert hardware.cpu_class(set()) == "other"
    # Without flags given, this CPU's are read.
    assert hardware.cpu_class() == hardware.cpu_class(hardware.cpu_flags())
    for flags, kind in (({"avx2", "avx512f", "amx_tile"}, "amx"), ({"fma", "avx2"}, "avx2"),
                        (set(), "other")):
        monkeypatch.setattr(hardware, "cpu_flags", lambda flags=flags: set(flags))
        assert hardware.cpu_class() == kind


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


def test_onednn_on_follows_the_variable_else_tensorflows_default_for_the_class():
    for kind, flags in (("amx", {"amx_bf16", "avx512f"}), ("avx512", {"avx512f"}),
                        ("avx2", {"avx2"})):
        assert hardware.cpu_class(flags) == kind
        assert hardware.onednn_on({}, flags) is (kind != "avx2"), kind
        for value, on in (("0", False), ("false", False), (" False ", False), ("1", True),
                          ("true", True)):
            assert hardware.onednn_on({"TF_ENABLE_ONEDNN_OPTS": value}, flags) is on, value


# The command, in a fresh process: what the environment holds and whether TensorFlow was
# loaded when the console was set up (TensorFlow reads TF_ENABLE_ONEDNN_OPTS when it loads).
# The spies are set while the entry point's `waiting` holds the package's registration back,
# as `keras_transformer_command.main` does while it imports the command line.
COMMAND = """
import json, os, sys
import keras_transformer_command
keras_transformer_command.waiting = True
from keras_transformer import cli
from keras_transformer.cli import console
from keras_transformer.cli import models
seen = {}
setup = console.setup
def spy(show_native_logs, own_console=True):
    seen["tensorflow_loaded"] = "tensorflow" in sys.modules
    setup(show_native_logs, own_console)
console.setup = spy
models.presets = lambda args: print(json.dumps([os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
                                                seen["tensorflow_loaded"]]))
sys.argv = ["keras-transformer", "presets"]
keras_transformer_command.main()
"""


@pytest.fixture(scope="module")
def command_state():
    """(TF_ENABLE_ONEDNN_OPTS, whether TensorFlow was loaded when the console was set up) in
    one `keras-transformer presets` process, which both tests below read."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    result = subprocess.run([sys.executable, "-c", COMMAND], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-1000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a fresh interpreter importing TensorFlow (about 7 CPU-s)
def test_the_command_applies_the_cpu_default(command_state):
    value, _ = command_state
    assert value == ("1" if hardware.cpu_class() in hardware.ONEDNN_DEFAULT_ON else None)


@pytest.mark.slow  # the same interpreter
def test_the_console_is_set_up_before_tensorflow_loads(command_state):
    _, loaded = command_state
    assert not loaded


# Flag sets as /proc/cpuinfo records them on the three kinds of machine this project runs on
# (abridged to the flags that decide): an AVX2 AMD EPYC (Zen 2/3), an AVX-512 Intel Xeon
# without bf16 (Cascade Lake), and bf16 machines (AMD EPYC Zen 4; Intel Sapphire Rapids: AMX).
AVX2_EPYC = set("fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi2 sha_ni".split())
AVX512_XEON = AVX2_EPYC | set("avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni".split())
ZEN4_EPYC = AVX512_XEON | {"avx512_bf16"}
SAPPHIRE_RAPIDS = ZEN4_EPYC | {"amx_bf16", "amx_tile", "amx_int8"}


def test_auto_precision_is_bf16_only_where_the_cpu_has_it():
    for flags, policy in ((AVX2_EPYC, "float32"), (AVX512_XEON, "float32"),
                          (ZEN4_EPYC, "mixed_bfloat16"), (SAPPHIRE_RAPIDS, "mixed_bfloat16")):
        chosen, reason = hardware.choose_precision(flags)
        assert chosen == policy, (sorted(flags), reason)
        assert hardware.has_bf16(flags) == (policy == "mixed_bfloat16")
        assert hardware.cpu_class(flags) in reason
    # JAX on a CPU keeps float32 (bf16 kernels are oneDNN's); a bf16 GPU trains in bf16.
    assert hardware.choose_precision(SAPPHIRE_RAPIDS, "jax", ("cpu", False))[0] == "float32"
    assert hardware.choose_precision(AVX2_EPYC, "jax", ("gpu", True))[0] == "mixed_bfloat16"
    assert hardware.choose_precision(AVX2_EPYC, "jax", ("gpu", False))[0] == "float32"


def test_the_config_resolves_auto_and_a_resumed_run_keeps_its_precision(monkeypatch):
    from keras_transformer.runs import config as config_module
    from keras_transformer.runs.config import make_config

    for flags, policy in ((AVX2_EPYC, "float32"), (SAPPHIRE_RAPIDS, "mixed_bfloat16")):
        monkeypatch.setattr(hardware, "cpu_flags", lambda flags=flags: set(flags))
        config = make_config(preset="tiny").resolved()
        assert config.precision == policy
        assert f"precision {policy} [auto: " in config.describe()
    # A run trained in bf16 resumes on an AVX2 machine in bf16: auto is not a change.
    assert config.continued(make_config(preset="tiny")).precision == "mixed_bfloat16"
    assert config.continued(make_config(precision="auto")).precision == "mixed_bfloat16"
    monkeypatch.setattr(hardware, "cpu_flags", lambda: set(AVX2_EPYC))
    assert config_module.TrainConfig.from_document(config.to_dict(), "x").resolved() \
        .precision == "mixed_bfloat16"
    assert make_config(precision="float32").resolved().sources.get("precision") == "given"
