"""Shared test set-up: quiet TensorFlow, fixed seeds, and the shared data folder."""

import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# No persistent XLA cache under the tests (a test of the cache names its own folder).
os.environ.setdefault("KERAS_TRANSFORMER_XLA_CACHE", "off")
# One TensorFlow thread per pool in each test process (and the child processes the tests
# start): `make test` runs three workers on two cores, and TensorFlow's default pools (one
# thread per core each, spinning while they wait for work) fought over the cores; one
# thread each took 18% less CPU over the whole suite (docs/testing.md).
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
# CTranslate2's OpenMP threads (libgomp) sleep while they wait instead of spinning: on
# cores shared by three workers a spinning engine process took from 0.4 to 38 CPU-s
# for the same 40 requests (the load benchmark's smoke run); its answers are the same.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# XLA:CPU (TensorFlow's jit_compile and JAX alike) without its backend optimizations and with
# its classic (LLVM IR) emitters instead of the MLIR fusion emitters, in each test process and
# the child processes the tests start. The tests compare outputs and check that things run,
# not speed: the first flag cuts about 30% of a compilation's CPU, the second about 40% of the
# rest (a tiny model's JAX beam search: 3.3 -> 2.0 CPU-s); TensorFlow's XLA tests took 23-30% less
# CPU with both (docs/testing.md). The second flag exists in the pinned jaxlib and tensorflow
# (setup.py); one without it stops at start-up with "Unknown flag". A flag the environment's
# XLA_FLAGS already sets keeps its value there.
FAST_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
_given = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join([_given] + [
    flag for flag in FAST_XLA_FLAGS if flag.split("=")[0] + "=" not in _given]).strip()

# oneTBB's scalable allocator in place of glibc's malloc in the test workers and every process
# they start (LD_PRELOAD, inherited): TensorFlow's tracing, graph optimization and kernels
# allocate and free many small blocks, and the same tests took about 10% less CPU with it
# (docs/testing.md). The tests check outputs, which no allocator changes; the package never
# asks for one. The `tbb` wheel (a dev pin in setup.py) puts the library in the venv's lib/;
# without it (a venv without the dev extra, a platform with no wheel) the tests run on the
# system's malloc, and LD_PRELOAD's other entries stay first.
# `KERAS_TRANSFORMER_TEST_MALLOC=system` keeps glibc's (a memory checker, a crash to compare).
_ALLOCATOR = [str(pathlib.Path(sys.prefix) / "lib" / name)
              for name in ("libtbbmalloc.so.2", "libtbbmalloc_proxy.so.2")]
if (sys.platform.startswith("linux") and os.environ.get("KERAS_TRANSFORMER_TEST_MALLOC") != "system"
        and all(os.path.exists(path) for path in _ALLOCATOR)):
    _preloaded = os.environ.get("LD_PRELOAD", "").split()
    os.environ["LD_PRELOAD"] = " ".join(
        _preloaded + [path for path in _ALLOCATOR if path not in _preloaded])

import pytest  # noqa: E402

# `--cpu-report FILE`: CPU seconds per test (tests/cpu_report.py).
pytest_plugins = ["tests.cpu_report"]

SHARED_DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"


# -- Order and grouping on the workers (`make test`: pytest -n 3 --dist loadfile) -----------

# The files that cost most in `make test` (CPU-seconds per file in a fresh-clone `make test`
# with `--cpu-report`, rounded; measured 2026-12-02 at c0c6527 on a 2-core AVX2 AMD EPYC in a
# slow phase, so only their order matters; test_serving.py counts test_serving_tf1.py, which
# runs on its worker), run first so that the workers end together; the others follow in
# collection order. A unit of SAME_WORKER counts its files together. A new heavy file belongs
# here.
HEAVY_FILES = {
    "tests/test_export.py": 249, "tests/test_serving.py": 202, "tests/test_alignment.py": 142,
    "tests/test_training.py": 135, "tests/test_search_fixtures.py": 97,
    "tests/test_multilingual.py": 97, "tests/test_gpu_kit.py": 92, "tests/test_constraints.py": 86,
    "tests/test_distill.py": 80, "tests/test_main_job.py": 79, "tests/test_backends.py": 71,
    "tests/test_repetition.py": 68, "tests/test_disk_full.py": 54, "tests/test_xla.py": 52,
    "tests/test_search.py": 48, "tests/test_early_stopping.py": 45, "tests/test_translate.py": 45,
    "tests/runs/test_run.py": 44, "tests/runs/test_checkpoints.py": 43,
    "tests/test_preemption.py": 42, "tests/test_search_jax.py": 42,
    "tests/pipelines/test_batching.py": 41, "tests/pipelines/test_sources.py": 38,
    "tests/test_loading.py": 37, "tests/test_package.py": 36,
}
# Files that share a session fixture run on one worker, as one unit: file -> the file whose
# worker runs it (test_serving_tf1.py reads the SavedModel test_serving.py reads; test_tune.py
# tunes a copy of test_multilingual.py's multi_run).
SAME_WORKER = {"tests/test_serving_tf1.py": "tests/test_serving.py",
               "tests/test_tune.py": "tests/test_multilingual.py"}


def _unit(nodeid):
    """The unit of work of a test: its file, or the file whose worker runs it."""
    path = nodeid.split("::", 1)[0]
    return SAME_WORKER.get(path, path)


def pytest_collection_modifyitems(items):
    """Heaviest units first, the others in collection order; the tests of a unit together,
    in their order."""
    first = {}
    for index, item in enumerate(items):
        first.setdefault(_unit(item.nodeid), index)

    def key(item):
        unit = _unit(item.nodeid)
        return -HEAVY_FILES.get(unit, 0), first[unit]

    items.sort(key=key)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """With --dist loadfile: the units above (a file, or the files of SAME_WORKER) in the
    collection's order. xdist's own order (files with most tests first) would start the
    heaviest files last and leave one worker idle at the end."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class UnitScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid):
            return _unit(nodeid)

    config.option.loadscopereorder = False
    return UnitScheduling(config, log)


@pytest.fixture(scope="session", autouse=True)
def _data_cache(tmp_path_factory):
    """Prepared training data goes to a folder of this test session, not ~/.cache (subprocess
    runs inherit it)."""
    os.environ["KERAS_TRANSFORMER_DATA_CACHE"] = str(tmp_path_factory.mktemp("data-cache"))


@pytest.fixture(scope="session", autouse=True)
def _cheaper_graph_building():
    """Tracing is the largest part of the workers' CPU; three parts of TensorFlow's work per
    graph op that no test reads are skipped in the workers, the graphs and errors unchanged
    (tests/graph_building.py)."""
    from tests.graph_building import cheaper_graph_building

    with cheaper_graph_building():
        yield


# TensorFlow's graph optimizer (Grappler's meta-optimizer) off in the test workers: it rewrites
# each graph the first time a `tf.function` runs, and a tiny model's first training step cost
# 1.5-2.1 CPU-s with it against 0.6-0.9 without (steps after the first: 24 ms either way); no
# single pass turned off saved anything, the optimizer off did (docs/testing.md). Its rewrites
# keep what a graph computes, but not every float to the last bit (fused kernels), so a test
# that compares what it computes in this process to the last bit or byte with what a child
# process computed (which runs TensorFlow as it ships) turns it back on (`graph_optimizer_on`).
# Child processes (the fresh-process loads, the TF1 Session, the served SavedModels) keep it:
# it is what TensorFlow Serving runs.
# `KERAS_TRANSFORMER_TEST_GRAPH_OPTIMIZER=on` leaves it on in the workers too.
GRAPH_OPTIMIZER_SWITCH = "KERAS_TRANSFORMER_TEST_GRAPH_OPTIMIZER"


def graph_optimizer_off_in_workers():
    """Whether the test workers run TensorFlow's graph optimizer off (GRAPH_OPTIMIZER_SWITCH)."""
    return os.environ.get(GRAPH_OPTIMIZER_SWITCH) != "on"


def set_graph_optimizer(on):
    """TensorFlow's graph optimizer on or off for the functions this process instantiates from
    now on (a function keeps the optimizer's choice of its first run)."""
    import tensorflow as tf

    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": not on})


@pytest.fixture(scope="session", autouse=True)
def _graph_optimizer_off():
    if not graph_optimizer_off_in_workers():
        yield
        return
    set_graph_optimizer(False)
    yield
    set_graph_optimizer(True)


@pytest.fixture
def graph_optimizer_on():
    """TensorFlow's graph optimizer on during the test, as in a child process: for a test whose
    numbers or text, computed in this process, must equal a child process's to the last bit."""
    set_graph_optimizer(True)
    yield
    set_graph_optimizer(not graph_optimizer_off_in_workers())


@pytest.fixture(autouse=True)
def _seed():
    # Keras (and TensorFlow) are imported here, in the workers, not when pytest loads this
    # file: the xdist controller, which runs no test, then starts its workers without the
    # 6-7 CPU-s of importing TensorFlow first.
    import keras

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


def run_decoder(run, command="export", **given):
    """The decoder of a run (a `Run` or its directory) as the commands build it: `given`
    values, the rest the run's saved choice or the defaults (`Decoder.resolve`); the export
    command's by default (what `export.export_run` takes)."""
    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.runs import open_run

    run = open_run(run) if isinstance(run, (str, os.PathLike)) else run
    return Decoder.resolve(run, given, command=command)


def run_engine(run, command="translate", **given):
    """The engine of a run as the commands build it (`run_decoder`)."""
    return run_decoder(run, command, **given).engine()


# A preset that exists only while the tests run, so that tests can change it after training.
RUNTIME_PRESET = "test-runtime-tiny"


# Its model: one layer each side (the package's tiny preset has two). What the tests of
# `tiny_run` check is the commands, files, signatures and searches around a model, not its
# depth, and each of their traces, exports and fresh-process loads costs about half as much
# for one layer; tests that check the choice of a layer train two (test_alignment's digits).
RUNTIME_MODEL = dict(num_layers=1, d_model=32, num_heads=4, d_ff=64)


def register_runtime_preset():
    """Registers the runtime preset in this process (a child process that opens `tiny_run`
    calls it too: `RUNTIME_CLI`)."""
    from keras_transformer.models import presets

    presets.PRESETS[RUNTIME_PRESET] = presets._variant(
        "tiny, registered by the tests", model=dict(RUNTIME_MODEL),
        training=dict(warmup_steps=50, train_steps=20))


# The command line in a child process that knows the runtime preset (run from the repository).
RUNTIME_CLI = ["-c", "import sys; from tests.conftest import register_runtime_preset; "
               "register_runtime_preset(); from keras_transformer import cli; "
               "sys.exit(cli.main(sys.argv[1:]))"]


@pytest.fixture(scope="session")
def runtime_preset():
    from keras_transformer.models import presets

    register_runtime_preset()
    yield RUNTIME_PRESET
    presets.PRESETS.pop(RUNTIME_PRESET, None)


def _session_folder(tmp_path_factory):
    """A folder all workers of this test session share: under pytest-xdist, the parent of
    the workers' own base folders (one per `pytest` command); else this process's own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(tmp_path_factory, name, make):
    """`make(folder)` run by the first worker of the session that asks for `name`; the
    others wait for it (a file lock) and get the same folder. `make` must leave nothing a
    test changes: tests that change what it made work on a copy."""
    import fcntl

    folder = _session_folder(tmp_path_factory) / "made-once" / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        done = folder.parent / f"{name}.done"
        if not done.exists():
            if folder.exists():  # a worker that failed half-way: start again
                import shutil

                shutil.rmtree(folder)
            make(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def toy_corpus(tmp_path_factory):
    """The toy corpus (tests/training_helpers.py), written once per test session and read by
    every worker (the same paths, so that runs trained on it agree on their data)."""
    from tests.training_helpers import write_corpus

    folder = made_once(tmp_path_factory, "toy-corpus", write_corpus)
    return {name: folder / name for name in ("train.src", "train.tgt", "dev.src", "dev.tgt")}


def toy_config(corpus, output_dir, **overrides):
    """The config of a tiny run on the toy corpus (checkpoints and dev loss every 10 steps,
    TensorBoard points every 5)."""
    from keras_transformer.runs import make_config

    settings = dict(
        preset=RUNTIME_PRESET, dataset="text", train_src=str(corpus["train.src"]),
        train_tgt=str(corpus["train.tgt"]), dev_src=str(corpus["dev.src"]),
        dev_tgt=str(corpus["dev.tgt"]), vocab_size=400, tokens_per_batch=256, max_length=32,
        warmup_steps=50, train_steps=20, checkpoint_steps=10, eval_steps=10, log_steps=5,
        verbose=0,
        precision="float32", output_dir=str(output_dir))  # the same numbers on every CPU class
    return make_config(**{**settings, **overrides})


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, toy_corpus, runtime_preset):
    """A run of the runtime preset trained to step 20 (checkpoints at 10 and 20), by the
    first worker of the session that needs it; each worker gets a copy of its own (a run has
    one writer at a time: two workers exporting one run would refuse each other). Tests that
    change it work on a copy (`run_copy`)."""
    import shutil

    from keras_transformer.training import train

    trained = made_once(tmp_path_factory, "tiny-run",
                        lambda folder: train(toy_config(toy_corpus, folder)))
    run_dir = tmp_path_factory.mktemp("tiny-run") / "run"
    shutil.copytree(trained, run_dir)
    return run_dir


@pytest.fixture
def run_copy(tiny_run, tmp_path):
    """A private copy of `tiny_run` (to damage, move or train further)."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(tiny_run, copy)
    return copy


@pytest.fixture(scope="session")
def toy_saved_model(tiny_run, tmp_path_factory):
    """`tiny_run` exported once as a SavedModel (the export's defaults: beam 4, alpha 0.6),
    read by the serving tests (tests/test_serving.py, tests/test_serving_tf1.py); the two
    files run on one worker (`pytest_xdist_make_scheduler` below), so it is exported once."""
    from keras_transformer import export

    return export.export_run(run_decoder(tiny_run),
                             output_dir=tmp_path_factory.mktemp("toy-export"), name="toy")


@pytest.fixture(scope="session")
def toy_translators(tiny_run):
    """In-process translators of `tiny_run` by beam size (alpha 0.6, float32: as the exports
    search), each made on first use, so that the serving tests share their compiled
    searches."""
    class Translators(dict):
        def __missing__(self, beam_size):
            self[beam_size] = run_engine(tiny_run, beam_size=beam_size, alpha=0.6,
                                         precision="float32")
            return self[beam_size]

    return Translators()
