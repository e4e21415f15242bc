# keras-transformer: `make demo` runs the main job, `make test` runs the test suite,
# `make test-fast` the quick subset for the edit-test loop (every module, no long trainings).
# Both create .venv and install the package (pinned versions in setup.py) on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install demo test test-fast coverage-fast bench gpu-kit clean

install: $(STAMP)

# The install runs uv (pinned below; a pip package with no dependencies) in the venv's place of
# pip: the same pins from setup.py, unpacked in parallel and compiled to bytecode as pip does,
# in 42 s of wall time from an empty cache (28 s with it filled) where pip took 111 s (2 cores,
# docs/testing.md). pip stays in the venv, upgraded, for `make gpu-kit`'s `pip download`. Where
# uv cannot be installed (no wheel for the platform), pip does the whole install as before;
# `make INSTALLER=pip ...` chooses pip.
UV_VERSION := 0.13.9
INSTALLER ?= uv

$(STAMP): setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if [ "$(INSTALLER)" = uv ] && $(BIN)/python -m pip install --quiet 'uv==$(UV_VERSION)'; then \
	  echo "installing with uv $(UV_VERSION): uv pip install -e '.[dev]'"; \
	  $(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode \
	    --upgrade-package pip pip -e '.[dev]'; \
	else \
	  echo "installing with pip ($(if $(filter uv,$(INSTALLER)),uv $(UV_VERSION) could not be installed,INSTALLER=$(INSTALLER)))"; \
	  $(BIN)/python -m pip install --quiet --upgrade pip && \
	  $(BIN)/python -m pip install --quiet -e '.[dev]'; \
	fi
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/keras-transformer demo

# The full suite on three pytest workers, the fast subset on two (each test file stays on one
# worker, so its fixtures are built once). Three on a 2-core machine: the tests spend part of
# their time waiting on child processes and on the disk (exports, checkpoints), and a third
# worker fills those waits (two workers kept the CPUs 171% busy of 200%).
# The fast subset waits on few child processes, so it runs on two workers, one per core
# (2 workers 1 min 53 s against 3 workers 2 min 9 s; the tests run TensorFlow on one thread
# each: tests/conftest.py). `PYTEST_WORKERS=0` (`PYTEST_FAST_WORKERS=0`) runs them in one
# process.
PYTEST_WORKERS ?= 3
PYTEST_FAST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile tests

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n $(PYTEST_FAST_WORKERS) --dist loadfile -m "not slow" tests

# The fast subset under coverage: the lines it runs in each module.
coverage-fast: $(STAMP)
	$(BIN)/python -m coverage run --source=keras_transformer,pipelines -m pytest -q -m "not slow" tests
	$(BIN)/python -m coverage report --skip-empty

bench: $(STAMP)
	$(BIN)/python benchmarks/train_step.py --preset base

# The GPU kit (benchmarks/gpu_kit.py; docs/backends.md): the wheels a GPU machine lacks, the
# Multi30k data prepared here and the `gpu-check` command, in the git-ignored folder gpu-kit/.
GPU_KIT ?= gpu-kit

gpu-kit: $(STAMP)
	$(BIN)/python benchmarks/gpu_kit.py --output $(GPU_KIT)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .coverage
