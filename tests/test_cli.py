"""The command line's pieces without a trained model: verbosity, the console, the decoding
choice and what it says, text lines, the evaluation of a split, the export paths."""

import importlib
import json
import pathlib
import subprocess
import sys

import pytest

from keras_transformer.cli import build_parser, shows_native_logs
from keras_transformer.decoding.decoder import Decoder
from keras_transformer.decoding.engines.precision import resolve_precision
from keras_transformer.decoding.request import DEFAULTS
from keras_transformer.defaults import EXPORT_DIR
from keras_transformer.runs import Run


@pytest.mark.parametrize("argv, shows", [
    (["translate", "--run-dir", "r"], False),
    (["translate", "--run-dir", "r", "--verbose"], True),
    (["presets", "--verbose"], True),
    (["train", "--verbose", "1"], False),
    (["train", "--verbose", "2"], True),
    (["prepare", "--verbose=3"], True),
    (["train"], False),
])
def test_verbosity_is_read_from_the_parsed_arguments(argv, shows):
    assert shows_native_logs(build_parser().parse_args(argv)) is shows


CONSOLE = """
import json, os, sys
import keras_transformer_command  # as the command starts: the package waits to register
keras_transformer_command.waiting = True
from keras_transformer.cli import console
before = os.fstat(2)
console.setup(show_native_logs={show})
after = os.fstat(2)
os.write(2, b"native\\n")
print("python", file=sys.stderr, flush=True)
print(json.dumps({{"moved": [before.st_dev, before.st_ino] != [after.st_dev, after.st_ino],
                  "onednn": "TF_ENABLE_ONEDNN_OPTS" in os.environ,
                  "level": os.environ.get("TF_CPP_MIN_LOG_LEVEL")}}))
"""


@pytest.mark.parametrize("show", [False, True])
def test_the_console_hides_native_logs_unless_asked(show):
    import os

    environ = {k: v for k, v in os.environ.items()
               if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")}
    result = subprocess.run([sys.executable, "-c", CONSOLE.format(show=show)],
                            capture_output=True, text=True, env=environ)
    assert result.returncode == 0, result.stderr
    state = json.loads(result.stdout)
    assert state["moved"] is (not show)
    assert ("native" in result.stderr) is show and "python" in result.stderr
    assert state["level"] == "2"
    from keras_transformer import hardware

    assert state["onednn"] is (hardware.cpu_class() in hardware.ONEDNN_DEFAULT_ON)


class FakeRun(Run):
    """A run directory with model files and a saved choice, without training."""

    def __init__(self, directory, choices=None, averaged=True):
        super().__init__(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.model_path.write_bytes(b"")
        if averaged:
            self.averaged_path.write_bytes(b"")
        if choices:
            self.save_decoding(**choices)


def choice(run, **given):
    """The decoder of a run for the values given on the command line."""
    return Decoder.from_flags(build_parser().parse_args(
        ["translate", "--run-dir", str(run.directory),
         *[f"--{key}={value}" for key, value in given.items()]]), "translate", run)


def test_the_frameworks_optional_imports_fail_only_while_they_start(tmp_path, monkeypatch):
    from keras_transformer.cli import lean_start

    assert lean_start.optional_imports("tensorflow") == ("jax", "matplotlib")
    assert lean_start.optional_imports("jax") == ("matplotlib",)  # Keras on JAX needs it
    package = tmp_path / "optional_plots"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "pyplot.py").write_text("DRAWN = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with lean_start.without_optional_imports(["optional_plots", "json"]):
        with pytest.raises(ModuleNotFoundError, match="not imported while the command starts"):
            importlib.import_module("optional_plots.pyplot")
        import json as again  # already imported: left alone
    assert again is json and "optional_plots" not in sys.modules
    import optional_plots.pyplot

    assert optional_plots.pyplot.DRAWN
    monkeypatch.delitem(sys.modules, "optional_plots")
    monkeypatch.delitem(sys.modules, "optional_plots.pyplot")


def test_without_a_saved_choice_the_defaults_decode(tmp_path):
    decoder = choice(FakeRun(tmp_path))
    request = decoder.request
    assert (decoder.model_file()[0], request.beam_size, request.alpha) == (
        tmp_path / Run.AVERAGED, DEFAULTS["beam_size"], DEFAULTS["alpha"])
    precision, reason = resolve_precision()  # said before anything is built
    assert decoder.describe() == (
        f"decoding with {Run.AVERAGED}: beam_size {DEFAULTS['beam_size']}, alpha "
        f"{DEFAULTS['alpha']}, stop_horizon {DEFAULTS['stop_horizon']}, precision {precision}, "
        f"batch_size {DEFAULTS['batch_size']}, "
        f"{said_xla(precision)}, engine tensorflow; {reason}")


def test_the_saved_choice_decodes_and_flags_override_it(tmp_path):
    run = FakeRun(tmp_path, dict(model=Run.MODEL, weights="final weights", beam_size=5,
                                 alpha=1.0, chosen_by="the main job, on val"))
    decoder = choice(run)
    request = decoder.request
    assert (decoder.model_file()[0], request.beam_size, request.alpha) == (run.model_path, 5,
                                                                            1.0)
    precision, reason = resolve_precision()
    assert decoder.describe() == (
        f"decoding with {Run.MODEL} (final weights) [run]: beam_size 5 [run], alpha 1.0 [run], "
        f"stop_horizon 3, precision {precision}, batch_size 64, {said_xla(precision)}, "
        f"engine tensorflow; "
        f"run: chosen by the main job, "
        f"on val (a flag overrides it); {reason}")
    decoder = choice(run, beam=2)
    assert (decoder.request.beam_size, decoder.request.alpha) == (2, 1.0)
    assert "beam_size 2 [flag], alpha 1.0 [run]," in decoder.describe()
    other = tmp_path / "other.keras"
    decoder = choice(run, model=other, alpha=0.0)
    request = decoder.request
    assert (decoder.model_file()[0], request.beam_size, request.alpha) == (other, 5, 0.0)
    assert decoder.describe().startswith(f"decoding with {other} [flag]: beam_size 5 [run], "
                                         "alpha 0.0 [flag],")


def test_a_saved_choice_out_of_range_is_refused_naming_the_file(tmp_path):
    from keras_transformer.errors import InputError

    run = FakeRun(tmp_path)
    run.decoding_path.write_text('{"format_version": 1, "alpha": 1.0}', encoding="utf-8")
    assert choice(run).request.alpha == 1.0
    with pytest.raises(InputError, match="must be at least 1"):
        choice(run, beam=0)


def test_average_records_its_model_and_keeps_the_search(tmp_path, monkeypatch):
    from keras_transformer.cli import export

    run = FakeRun(tmp_path, dict(beam_size=5, alpha=1.0, chosen_by="the main job, on val"),
                  averaged=False)
    monkeypatch.setattr(Run, "average", lambda self, k, every=1: ("model", ["a", "b"]))
    monkeypatch.setattr(Run, "save_model", lambda self, model, averaged, path: (
        self.averaged_path.write_bytes(b"") and None) or self.averaged_path)
    export.average(build_parser().parse_args(["average", "--run-dir", str(tmp_path),
                                              "--last", "2", "--every", "3"]))
    assert Run(tmp_path).decoding() == {
        "model": Run.AVERAGED, "weights": "average of the last 2 checkpoints, 3 apart",
        "chosen_by": "keras-transformer average", "beam_size": 5, "alpha": 1.0}


def test_text_lines_policy(tmp_path):
    from keras_transformer.decoding.jobs import textio
    from keras_transformer.errors import InputError

    path = tmp_path / "in.txt"
    path.write_bytes(b"one\r\ntw\xffo\nthree\n")
    with pytest.raises(InputError, match=r"line 2: invalid UTF-8 .* byte 2 of the line, byte 7 "
                                         "of the input. Nothing was translated"):
        textio.read_lines(str(path))
    bad = textio.BadLines(str(path))
    texts = [bad.decode(*line) for line in textio.raw_lines(str(path))]
    assert texts == ["one", None, "three"]
    assert textio.run_on(lambda t: [s.upper() for s in t], texts, "") == ["ONE", "", "THREE"]
    with pytest.raises(InputError, match="1 input line"):
        bad.check()
    with pytest.raises(InputError, match="Input file not found"):
        list(textio.raw_lines(str(tmp_path / "missing.txt")))


def test_evaluate_split_writes_and_scores(tmp_path):
    from keras_transformer.evaluation.evaluate import evaluate_split

    class Echo:
        def translate(self, texts, progress=None):
            if progress is not None:
                progress.update(len(texts))
            return list(texts)

    output = tmp_path / "hyp.txt"
    result = evaluate_split(Echo(), ["Ein Hund läuft.", "Die Katze."], ["Ein Hund läuft.",
                            "Die Katze."], lang="de", output=output, progress=False)
    assert output.read_text(encoding="utf-8") == "Ein Hund läuft.\nDie Katze.\n"
    assert result["sacrebleu"] == 100.0 and result["literature_references"] == "normalized"
    assert result["lines"][0].startswith("sacreBLEU 100.00")


def test_one_function_decides_where_exports_go(tmp_path):
    from keras_transformer.errors import InputError
    from keras_transformer.export import ctranslate2_folder, export_base

    run_dir = tmp_path / "my-run"
    assert export_base(run_dir) == pathlib.Path(EXPORT_DIR) / "my-run"
    assert ctranslate2_folder(run_dir) == pathlib.Path(EXPORT_DIR) / "my-run" / "ctranslate2"
    assert ctranslate2_folder(run_dir, "int8", tmp_path, "x") == tmp_path / "x" / "ctranslate2-int8"
    with pytest.raises(InputError, match="use letters"):
        export_base(run_dir, name="a b")
    # A run of several targets exports under its own name (the demo's).
    several = tmp_path / "multi30k-en-de+fr+cs-quick"
    assert ctranslate2_folder(several) == \
        pathlib.Path(EXPORT_DIR) / several.name / "ctranslate2"


def said_xla(precision):
    """What the decoder's line says of XLA under auto (`decoding.engines.xla`)."""
    from keras_transformer.decoding.engines.xla import resolve_xla

    on, why = resolve_xla(None, precision)
    return f"xla {'on' if on else 'off'} [{why}]"
