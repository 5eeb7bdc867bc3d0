# Set-up and tests on a fresh machine: `make test`. Everything lives in .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install test

install: $(VENV)/.installed

$(VENV)/.installed: requirements.txt tests/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt
	touch $@

test: install
	$(PY) -m pytest -q tests
