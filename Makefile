# `make run` and `make test` work on a fresh clone with only python3 present.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export NUMBA_CACHE_DIR ?= $(CURDIR)/.numba_cache

.PHONY: run test test-slow fuzz lint golden results clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

# plan, build, verify and simulate vit-tiny (2 layers) on c600; compare with the reference
run: $(STAMP)
	$(BIN)/tileplan run

# the fast suite on TEST_WORKERS processes (pytest-xdist): both cores share the
# first-run compilation and the tests; `-m slow` runs serially (GBs per test)
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -q -n $(TEST_WORKERS)

test-slow: $(STAMP)
	$(BIN)/pytest -q -m slow

# random small ViTs on random devices (experiments/fuzz.py); make test runs 200
FUZZ_CASES ?= 2000
FUZZ_SEED  ?= 1
fuzz: $(STAMP)
	$(BIN)/python -m experiments.fuzz --cases $(FUZZ_CASES) --seed $(FUZZ_SEED) --workers 2

# rewrite tests/golden_cycles.json after a change meant to move cycles or packages
golden: $(STAMP)
	$(BIN)/python tests/golden.py --write

# re-run the experiments; each rewrites its block of docs/results.md
RESULTS := fit_c600 bench_planning bench_optimizer run_sweeps bench_sweep \
           estimate_accuracy bench_simulator crosscheck_engines bench_kernels calibrate mutations \
           model_families bench_report bench_import exchange_schedule
results: $(STAMP)
	for e in $(RESULTS); do \
	  TILEPLAN_RESULTS=docs/results.md $(BIN)/python experiments/$$e.py || exit 1; \
	done

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .numba_cache artifacts .pytest_cache
