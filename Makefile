# Everything runs from a virtualenv inside the checkout (.venv), created on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export OMP_NUM_THREADS ?= 2

.PHONY: setup test-setup test test-fast demo demo-full clean

$(VENV)/.installed: requirements.txt setup.py
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r requirements.txt
	$(VENV)/bin/pip install -q --no-deps -e .
	# the C++ kernels, compiled once here rather than in the first training run (about 2 minutes: docs/DESIGN.md; never fails)
	$(PY) -m reluformer_mt.cli.build_kernels
	touch $@

setup: $(VENV)/.installed

# the test set-up: the virtualenv, and Debian's chromium + chromedriver for the HTML report's
# browser test (idempotent; skipped with a message where apt-get or root is missing)
test-setup: setup
	sh scripts/install_browser.sh

# one pytest-xdist worker per core (at most 4, one thread each: tests/conftest.py); the tests of
# the tiny demo run on one worker, first; TEST_ARGS="-p no:xdist" runs them one at a time
TEST_ARGS ?= -n auto --maxprocesses 4 --dist loadgroup
test: test-setup
	$(PY) -m pytest -q $(TEST_ARGS) tests

# the main job; options: make demo DEMO_ARGS="--max-update 4000 --size iwslt_de_en --device cuda"
demo: setup
	$(VENV)/bin/reluformer-demo --out runs/demo $(DEMO_ARGS)

# the demo with ReLA and softmax + translation memory too, in the same folder (a finished make demo's
# families are reused, not retrained)
demo-full: setup
	$(VENV)/bin/reluformer-demo --out runs/demo --families reluformer,rela,softmax,softmax+tm $(DEMO_ARGS)

clean:
	rm -rf $(VENV) runs
