# Everything runs from a virtualenv inside the checkout (.venv), created on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SHARED_DATA ?= ../shared/data
export OMP_NUM_THREADS ?= 2

.PHONY: setup test test-fast demo clean

$(VENV)/.installed: requirements.txt setup.py
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements.txt
	$(VENV)/bin/pip install -q --no-deps -e .
	touch $@

setup: $(VENV)/.installed

test: setup
	$(PY) -m pytest -q tests

demo: setup
	$(PY) -m reluformer_mt.cli.quickstart --data $(SHARED_DATA) --out runs/quickstart

clean:
	rm -rf $(VENV) runs
