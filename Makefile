SHELL := /bin/bash
# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
SPEC   ?= examples/tiny.yaml

.DEFAULT_GOAL := install
.PHONY: run test suite install lint validate scan build unit functional e2e bench iam-report clean

# aws-sam-cli pins boto3: it gets a virtualenv of its own, which uv (a dev dependency) fills from PyPI.
UV := $(BIN)/uv
SAM_VENV := .venv-sam
SAM      := SAM_CLI_TELEMETRY=0 $(SAM_VENV)/bin/sam
# checkov pins its own boto3 and conflicts with aws-sam-cli: a virtualenv of its own too.
CHECKOV_VENV := .venv-checkov
CHECKOV      := $(CHECKOV_VENV)/bin/checkov

# Bytecode is written whatever the environment says (PYTHONDONTWRITEBYTECODE): the suite's workers, and every
# trainer, torchrun rank and twin job they start, import the same modules; each is compiled once, when first
# imported, instead of once per process. So nothing is compiled at install (uv compiles nothing; pip is told
# --no-compile: torch alone is thousands of files the runs never import); the check below imports what every run
# needs, compiling it once before the suite's workers start.
unexport PYTHONDONTWRITEBYTECODE

# uv first, by pip at pyproject.toml's pin: it installs the project, and fills the tools' virtualenvs (below) meanwhile.
UV_PIN := $(shell grep -o '"uv==[^"]*"' pyproject.toml | tr -d '"')
$(BIN)/uv:
	@echo "lustrain install [1/3]: a virtualenv in $(VENV), and $(UV_PIN) into it by pip"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile $(UV_PIN)

# The project by uv too: about 8 s where pip took 87 (78 CPU-s), on the critical path of `make test` from a clean
# clone. uv reads no pip configuration, so the folders of wheels that pip's configuration (its global or install
# section) or PIP_FIND_LINKS names (where a machine keeps wheels PyPI lacks, such as torch's CPU build) are passed
# on: the same wheels pip would take. Like pip with --no-compile, uv compiles no bytecode.
FIND_LINKS = $(sort $(PIP_FIND_LINKS) $(foreach key,global install,$(shell $(PYTHON) -m pip config get $(key).find-links 2>/dev/null)))
# What `make run` and `make test` say as they install (docs/figures.md has the times, quiet and busy): uv prints
# what it resolved, downloaded and installed (with progress bars on a terminal).
$(STAMP): pyproject.toml $(BIN)/uv
	@echo "lustrain install [2/3]: the project and its dependencies into $(VENV) (torch's CPU wheel, moto, the twin's"
	@echo "  tools, the tests' tools: about 1.8 GB installed; see docs/figures.md for how long it takes)"
	$(UV) pip install --python $(BIN)/python $(addprefix --find-links ,$(FIND_LINKS)) -e '.[dev]'
	@echo "lustrain install [3/3]: importing torch, moto and the twin once (compiles what every run imports)"
	$(BIN)/python -c "import lustrain, lustrain_core, lustrain_trainer, torch, moto, lustrain.twin.rehearse, torch.distributed.checkpoint"
	touch $(STAMP)
	@echo "lustrain install: done ($(VENV))"

install: $(STAMP)

## The main job: a whole run rehearsed on the local twin.
run: install
	@echo "lustrain: rehearsing $(SPEC) on the local twin (see docs/figures.md for how long it takes)"
	$(BIN)/lustrain rehearse $(SPEC)

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

$(SAM_VENV)/bin/sam: $(STAMP)
	$(UV) venv --quiet --allow-existing --python $(PYTHON) $(SAM_VENV)
	$(UV) pip install --quiet --python $(SAM_VENV)/bin/python aws-sam-cli==1.170.0

## The template: cfn-lint, then SAM's own validation.
validate: install $(SAM_VENV)/bin/sam
	$(BIN)/cfn-lint template.yaml
	$(SAM) validate --lint --region us-east-1

$(CHECKOV): $(STAMP)
	$(UV) venv --quiet --allow-existing --python $(PYTHON) $(CHECKOV_VENV)
	$(UV) pip install --quiet --python $(CHECKOV_VENV)/bin/python checkov==3.3.30

## The scanners: checkov (settings in .checkov.yaml; every skip justified in template.yaml's Metadata).
scan: install $(CHECKOV)
	$(CHECKOV) --config-file .checkov.yaml -f template.yaml

## The Lambda bundle for `sam deploy` (python3.12 must be on PATH; pyenv users: PYENV_VERSION=3.11.7:3.12.1).
build: $(SAM_VENV)/bin/sam
	$(SAM) build

# A local MLflow tracking server for the tests of the run's MLflow logging (tests/e2e/test_rehearsal.py): the server
# (mlflow, with its database and web stack, about 600 MB) stays out of the project's virtualenv, which only talks
# to it over its REST API. Made while uv installs the project; what the server imports is compiled here, once.
MLFLOW_VENV := .venv-mlflow
MLFLOW      := $(MLFLOW_VENV)/bin/mlflow
$(MLFLOW): $(BIN)/uv
	$(UV) venv --quiet --allow-existing --python $(PYTHON) $(MLFLOW_VENV)
	$(UV) pip install --quiet --python $(MLFLOW_VENV)/bin/python mlflow==3.17.2
	$(MLFLOW_VENV)/bin/python -c "import mlflow.cli, mlflow.server.fastapi_app"

# Debian's Chromium, which the dashboard's test drives headless (tests/e2e/test_dashboard.py, through Playwright,
# whose own browser download cannot be reached from a private network); elsewhere, set CHROMIUM to a Chromium or
# Chrome binary.
CHROMIUM ?= /usr/bin/chromium
SUDO     := $(if $(filter 0,$(shell id -u)),,sudo)
$(CHROMIUM):
	@command -v apt-get > /dev/null || { echo "no apt-get: install Chromium and set CHROMIUM to its path" >&2; exit 1; }
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium > /dev/null

# Three workers on the machine's two cores: the twin's runs wait (polls, stops, the trainer's start) as well as
# compute, and a third worker keeps both cores busy meanwhile; a test file stays on one worker, so a module's shared
# twin is built once. Files are handed out in the order tests/conftest.py collects them, the slow ones first
# (--no-loadscope-reorder: xdist would otherwise hand out the files with the most tests first, which left the
# minutes-long e2e files of one or two tests for last, run one after another while the other workers idled).
# Writing bytecode (above) keeps pytest's rewritten test files too: about 35 of the suite's 950 CPU-seconds
# (bench/suite_cpu.py).
PYTEST := $(BIN)/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder

# The suite runs beside the checks of the code and the template (lint, then validate and scan, which each install a
# tool into a virtualenv of its own): from a clean clone those downloads overlap the tests instead of preceding them.
# Each part's output is printed whole when it ends; any part failing fails `make test`.
# Chromium's install from Debian overlaps the project's from PyPI.
test:
	$(MAKE) --no-print-directory -j 2 --output-sync=target suite lint validate scan

suite: $(STAMP) $(CHROMIUM) $(MLFLOW)
	LUSTRAIN_CHROMIUM=$(CHROMIUM) LUSTRAIN_MLFLOW=$(abspath $(MLFLOW)) $(PYTEST)

unit: install
	$(PYTEST) tests/unit

functional: $(STAMP) $(MLFLOW)
	LUSTRAIN_MLFLOW=$(abspath $(MLFLOW)) $(PYTEST) tests/functional

e2e: $(STAMP) $(CHROMIUM) $(MLFLOW)
	LUSTRAIN_CHROMIUM=$(CHROMIUM) LUSTRAIN_MLFLOW=$(abspath $(MLFLOW)) $(PYTEST) tests/e2e

bench: install
	$(BIN)/python bench/trainer_data.py
	$(BIN)/python bench/trainer_scale.py --skip-data
	$(BIN)/python bench/control_plane.py
	$(BIN)/python bench/fault_matrix.py
	$(BIN)/python bench/load.py
	$(BIN)/python bench/recovery.py
	$(BIN)/python bench/cancel.py

## Least privilege, measured: per role, the actions the twin's runs used and the grants none used (bench/).
iam-report: install
	$(BIN)/python bench/iam_report.py

clean:
	rm -rf $(VENV) $(MLFLOW_VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
