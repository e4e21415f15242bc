"""A full disk during a checkpoint, an average, an export and a summary, made real with the
file-size limit (RLIMIT_FSIZE, `ulimit -f`): writes past it fail with EFBIG as they fail with
ENOSPC on a full disk (Python ignores SIGXFSZ). The error names the file and says "no space
left", the previous files stay as they were and load, no temporary stays behind, and the same
command completes once the limit is lifted."""

import contextlib
import hashlib
import pathlib
import re
import resource
import signal

import pytest

from keras_transformer import cli
from keras_transformer.runs import Run
from keras_transformer.training import compile_model, train
from pipelines.errors import NoSpaceError
from pipelines.files import TEMPORARY_PREFIX
from tests.conftest import toy_config

# Config, JSON and vocabulary files fit; a model or checkpoint of the tests' runtime preset
# (one layer each side: a CTranslate2 model.bin of about 160 kB, a checkpoint of about 500 kB)
# does not.
LIMIT = 100_000


@contextlib.contextmanager
def file_size_limit(size):
    """This process's soft RLIMIT_FSIZE lowered to `size` bytes while the block runs (an
    unprivileged process may raise it back up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def temporaries(folder):
    return [path for path in folder.rglob(TEMPORARY_PREFIX + "*")]


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def command(capsys, *argv):
    """(exit status, last line of stdout or, when it failed, of stderr) of the command run in
    this process."""
    capsys.readouterr()
    status = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    lines = (out if status == 0 else err).strip().splitlines()
    return status, lines[-1] if lines else ""


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one(run_copy, toy_corpus):
    run = Run(run_copy)
    before = {path: digest(path) for path in map(pathlib.Path, run.checkpoints())}
    # (No best.keras: its write at step 22's evaluation would be the first to meet the limit.)
    config = toy_config(toy_corpus, run_copy, train_steps=22, keep_best=False)
    with file_size_limit(LIMIT), pytest.raises(NoSpaceError) as raised:
        train(config)
    message = str(raised.value)
    assert message.startswith(f"no space left on the device writing "
                              f"{run.checkpoint_dir / 'ckpt-22.weights.h5'} ")
    assert "run the same command again" in message
    assert {path: digest(path) for path in map(pathlib.Path, run.checkpoints())} == before
    assert not temporaries(run_copy) and not (run.checkpoint_dir / "ckpt-22.json").exists()
    assert not (run.checkpoint_dir / "ckpt-22.weights.h5").exists()
    # The previous checkpoint still resumes.
    model = run.build_model()
    compile_model(model, run.config)
    assert run.restore(model).step == 20
    # Space freed: the same training completes.
    assert train(config)["step"] == 22


def test_a_full_disk_during_an_average_keeps_the_previous_one(run_copy, capsys):
    run = Run(run_copy)
    assert command(capsys, "average", "--run-dir", run_copy, "--last", "1")[0] == 0
    averaged, decoding = digest(run.averaged_path), run.decoding()
    with file_size_limit(LIMIT):
        status, line = command(capsys, "average", "--run-dir", run_copy, "--last", "2")
    assert status == 2
    assert line.startswith(f"keras-transformer average: error: no space left on the device "
                           f"writing {run.averaged_path} ")
    assert "the previous averaged.keras is kept" in line
    assert digest(run.averaged_path) == averaged and run.decoding() == decoding
    assert not temporaries(run_copy)
    run.load_model()  # loads
    assert command(capsys, "average", "--run-dir", run_copy, "--last", "2")[0] == 0
    assert digest(run.averaged_path) != averaged
    assert run.decoding()["weights"] == "average of the last 2 checkpoints"


def test_a_full_disk_during_a_summary_keeps_the_previous_one(tmp_path):
    run = Run(tmp_path)
    run.write_json("summary.json", {"job": "first"})
    with file_size_limit(1000), pytest.raises(NoSpaceError, match=(
            f"no space left on the device writing {tmp_path / 'summary.json'} .*the previous "
            "summary.json is kept")):
        run.write_json("summary.json", {"job": "second", "examples": ["x" * 2000]})
    assert run.read_json("summary.json") == {"job": "first"}
    assert not temporaries(tmp_path)


def export_loads(format, path):
    if format == "savedmodel":
        import tensorflow as tf

        assert "translate_ids" in tf.saved_model.load(str(path)).signatures
    elif format == "tflite":
        import tensorflow as tf

        tf.lite.Interpreter(model_path=str(path)).allocate_tensors()
    else:
        import ctranslate2

        ctranslate2.Translator(str(path), device="cpu")


@pytest.mark.slow
@pytest.mark.parametrize("format, flags", [
    ("savedmodel", ["--ids-only", "--version", "1"]),
    ("tflite", ["--beam", "1"]),
    ("ctranslate2", ["--quantize", "none"]),  # float32: a model.bin above LIMIT
])
def test_a_full_disk_during_an_export_keeps_the_previous_one(run_copy, tmp_path, capsys, format,
                                                             flags):
    if format == "ctranslate2":
        pytest.importorskip("ctranslate2")
    exports = tmp_path / "exports"
    export = ["export", "--run-dir", run_copy, "--format", format, "--output-dir", exports,
              *flags, "--overwrite"]
    status, line = command(capsys, *export)
    assert status == 0, line
    path = pathlib.Path(line.split(" to ", 1)[1])
    files = {p: digest(p) for p in sorted(path.rglob("*") if path.is_dir() else [path])
             if p.is_file()}
    with file_size_limit(LIMIT):
        status, line = command(capsys, *export)
    assert status == 2
    assert re.match(r"keras-transformer export: error: no space left on the device writing "
                    rf"(\S+) \(file too large for the file-size limit\); ", line), line
    assert {p: digest(p) for p in files} == files  # as they were
    assert not temporaries(exports)
    export_loads(format, path)
    if format == "ctranslate2":  # (the others take 10-20 s an export: one format shows it)
        status, line = command(capsys, *export)  # space freed: the same command completes
        assert status == 0, line
        export_loads(format, path)
