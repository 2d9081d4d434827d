# The two commands of the README. Both bootstrap .venv on first use (and when setup.cfg changes).
# jax >= 0.11 needs Python >= 3.12: the first of these that runs and is new enough (pyenv keeps
# 3.12 beside a 3.11 default on the project's machines); else python3 (where pip refuses a Python < 3.12).
PYTHON ?= $(firstword $(shell for p in python3.12 python3.13 $$HOME/.pyenv/versions/3.12*/bin/python3 \
	$$HOME/.pyenv/versions/3.13*/bin/python3; do $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' \
	2>/dev/null && echo $$p; done) python3)
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= experiments/deepmimic_denoise.py
# Empty: motionjax train runs in runs/<config name>[_<variant>] (CONFIG=experiments/autoencoder.py:bandai,8
# -> runs/autoencoder_bandai_8), so each experiment has its own run directory.
WORKDIR ?=
# More flags for motionjax train, e.g. ARGS=--config.data.source=DIR
ARGS ?=

.PHONY: train test test-all bench lint clean

# Bytecode is written as modules are first imported, not compiled for all ~10k files at install (~45 of
# the install's ~95 s; the suite imports ~2k of them): so the recipes below write it even where the
# environment sets PYTHONDONTWRITEBYTECODE, which without .pyc files would recompile jax's sources in every
# test process (docs/history.md, suite15).
unexport PYTHONDONTWRITEBYTECODE

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e '.[data,test]'  # what train, test and bench need; .[dev] adds ruff, tensorboard
	$(PY) -m pip install -q --no-compile --no-deps 'jax2onnx>=0.17,<0.18'  # its orbax pin would downgrade ours (setup.cfg)
	touch $@

train: $(VENV)/.installed
	$(PY) -m motionjax train --config $(CONFIG) $(if $(WORKDIR),--workdir $(WORKDIR)) $(ARGS)

# Whole files per worker, costliest first (tests/conftest.py). make test: the developer's suite, every test
# but the costliest end-to-end runs (the e2e marker, setup.cfg); make test-all (CI's .ci/run): every test.
PYTEST := $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

test: $(VENV)/.installed
	$(PYTEST) -m "not e2e" $(PYTEST_ARGS)

test-all: $(VENV)/.installed
	$(PYTEST) $(PYTEST_ARGS)

bench: $(VENV)/.installed
	$(PY) -m benchmarks.bench  # benchmarks/ is not installed: run from the checkout's root

lint: $(VENV)/.installed
	$(PY) -m ruff --version >/dev/null 2>&1 || $(PY) -m pip install -q 'ruff>=0.5'
	$(PY) -m ruff check motionjax scripts tests experiments benchmarks notebooks setup.py

clean:
	rm -rf $(VENV) runs results .pytest_cache
