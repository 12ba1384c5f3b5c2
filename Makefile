# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.rlckpt-installed

.PHONY: install demo test lint test-rgw bench clean

install: $(STAMP)

# torch==2.13.0 (the CPU build on this disk) goes in first: anything that depends on torch
# installed before it would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -qq --upgrade pip
	$(PY) -m pip install -qq torch==2.13.0
	$(PY) -m pip install -qq -e '.[s3,train,test,bench]'
	touch $(STAMP)

demo: $(STAMP)
	bash scripts/demo.sh

# Lint, format and types first (seconds), then the suite on two workers: one runs the end-to-end
# `rlckpt train` runs (each with its own TransferQueue and actors, mostly starting them) while the other runs
# the rest beside it (tests/conftest.py groups them).
test: $(STAMP) lint
	$(PY) -m pytest -n 2 --dist loadgroup

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The store suite against a throwaway Ceph RADOS Gateway on 127.0.0.1 (installs Ceph from Debian).
test-rgw: $(STAMP)
	bash scripts/rgw.sh test

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis demo-run
