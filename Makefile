# Two commands on a fresh machine with Python 3.11: `make demo` and `make test`.
# Every install comes from a lock (requirements/*.txt: exact versions with sha256 hashes, made by `make lock`).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TOOLS ?= .venv-tools
# the locked packages ($(2): extra pip options), then the project itself (editable, built by the locked setuptools)
# with the extras $(3), from what is installed only (--no-index): it fails when pyproject.toml asks for something
# the lock lacks
define install_lock
	$(PIP) install -q $(2) --require-hashes -r $(1)
	$(PIP) install -q --no-index --no-build-isolation -e '.$(3)' \
		|| { echo "$(1) lacks what pyproject.toml asks for: run make lock"; exit 1; }
endef

.PHONY: demo test bench install install-test lock audit clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# the core dependencies only (numpy, scipy, pydantic, PyYAML, typer, rich, DuckDB, matplotlib): no torch, Ray, llama.cpp.
# --no-compile: Python byte-compiles only the modules the demo imports, when it imports them (a third less install)
$(VENV)/.core: requirements/core.txt pyproject.toml | $(PY)
	$(call install_lock,requirements/core.txt,--no-compile,)
	touch $@

# everything the tests need: every extra (torch, Gymnasium, SB3, Ray, FastAPI, llama-cpp-python compiled by pip, ...)
# Everything byte-compiled (also what the demo installed without), so that no test process compiles a module again
# where PYTHONDONTWRITEBYTECODE is set.
$(VENV)/.test: requirements/test.txt pyproject.toml | $(PY)
	$(call install_lock,requirements/test.txt,,[test])
	$(PY) -m compileall -q -j 0 $$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') >/dev/null || true
	touch $(VENV)/.core $@

install: $(VENV)/.core
install-test: $(VENV)/.test

## the main job on the embedded default: a small sweep (4 routers x 3 loads x 3 seeds), tables and an HTML report
demo: $(VENV)/.core
	$(VENV)/bin/fleetwise sweep default --db results/fleetwise.duckdb --report

## the whole test suite: everything on 2 workers, then the Ray tests in a loopback-only network namespace
test: $(VENV)/.test
	OMP_NUM_THREADS=1 $(PY) -m pytest -n 2 -m "not ray" tests
	OMP_NUM_THREADS=1 scripts/loopback-ns $(PY) -m pytest -m ray tests

## speed and accuracy benchmarks quoted in docs/
bench: $(VENV)/.core
	$(VENV)/bin/fleetwise bench sim-speed --sizes 10000,100000,1000000
	$(VENV)/bin/fleetwise perf validate
	$(VENV)/bin/fleetwise perf validate --profile $${FLEETWISE_DATA:-../shared/data}/h200-operator-timings/h200-ops-2026-11-30.json

# pip-tools and pip-audit live in their own venv, installed from their own lock
$(TOOLS)/.installed: requirements/tools.txt
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install -q --require-hashes -r requirements/tools.txt
	touch $@

COMPILE := CUSTOM_COMPILE_COMMAND="make lock" $(TOOLS)/bin/pip-compile -q --generate-hashes --allow-unsafe \
	--strip-extras --no-emit-index-url --no-emit-find-links $(if $(UPGRADE),--upgrade)

## re-resolve the locks after a change to pyproject.toml (keeps the pinned versions that still fit; UPGRADE=1: newest)
## The test lock is resolved first; the core lock is constrained to it, so both pin the same versions.
lock: $(TOOLS)/.installed
	$(COMPILE) --extra test --build-deps-for editable -c constraints.txt -o requirements/test.txt pyproject.toml
	$(COMPILE) --build-deps-for editable -c constraints.txt -c requirements/test.txt -o requirements/core.txt \
		pyproject.toml
	$(COMPILE) -o requirements/tools.txt requirements/tools.in

## known vulnerabilities in every locked package (needs network access to PyPI's vulnerability data; not in make test)
audit: $(TOOLS)/.installed
	$(TOOLS)/bin/pip-audit --strict --progress-spinner off --disable-pip \
		-r requirements/core.txt -r requirements/test.txt -r requirements/tools.txt

clean:
	rm -rf $(VENV) $(TOOLS) .pytest_cache .hypothesis
