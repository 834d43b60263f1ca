SHELL := /bin/bash
# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
SPEC   ?= examples/tiny.yaml

.PHONY: run test install lint unit functional e2e bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]' 2>&1 \
	  | { grep -v "is ignored: it is neither" || true; }; test $${PIPESTATUS[0]} -eq 0
	$(BIN)/python -c "import lustrain, lustrain_core, lustrain_trainer, torch, moto"
	touch $(STAMP)

install: $(STAMP)

## The main job: a whole run rehearsed on the local twin.
run: install
	$(BIN)/lustrain rehearse $(SPEC)

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

test: install lint
	$(BIN)/python -m pytest

unit: install
	$(BIN)/python -m pytest tests/unit

functional: install
	$(BIN)/python -m pytest tests/functional

e2e: install
	$(BIN)/python -m pytest tests/e2e

bench: install
	$(BIN)/python bench/trainer_data.py
	$(BIN)/python bench/control_plane.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
