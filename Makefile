# Two commands on a fresh machine with Python 3.11: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_FLAGS ?= -q -c constraints.txt

.PHONY: demo test bench install clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install $(PIP_FLAGS) -e '.[test]'
	touch $@

install: $(VENV)/.installed

## the main job on the embedded default: a small sweep (4 routers x 3 loads x 3 seeds), tables and an HTML report
demo: $(VENV)/.installed
	$(VENV)/bin/fleetwise sweep default --db results/fleetwise.duckdb --report

## the whole test suite: everything on 2 workers, then the Ray tests in a loopback-only network namespace
test: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) -m pytest -n 2 -m "not ray" tests
	OMP_NUM_THREADS=1 scripts/loopback-ns $(PY) -m pytest -m ray tests

## speed and accuracy benchmarks quoted in docs/
bench: $(VENV)/.installed
	$(VENV)/bin/fleetwise bench sim-speed --sizes 10000,100000,1000000
	$(VENV)/bin/fleetwise perf validate
	$(VENV)/bin/fleetwise perf validate --profile $${FLEETWISE_DATA:-../shared/data}/h200-operator-timings/h200-ops-2026-11-30.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
