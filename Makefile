# Durable: `make up` runs the whole thing on this machine, `make test` runs the suite.
#
# Both create .venv (python3 -m venv) and install the project into it when pyproject.toml
# changed since the last install. `make up` uses the embedded default: SQLite and the
# Celery filesystem:// broker under var/ (or $DURABLE_VAR_DIR). Set DATABASE_URL and
# CELERY_BROKER_URL to use PostgreSQL and Redis instead (see docs/settings.md).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
DOCS_STAMP := $(VENV)/.installed-docs
PORT   ?= 8000
# extra arguments for pytest, e.g. `make test PYTEST_ARGS="-x -k ledger"`
PYTEST_ARGS ?=
# the example services of the live demo (Procfile: llm, payments, smtp)
FAKE_LLM_PORT       ?= 8010
PAYMENTS_PORT       ?= 8020
SMTP_PORT           ?= 1025
SMTP_SINK_HTTP_PORT ?= 1080

# the Procfile's commands (daphne, celery) come from the virtualenv
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: help install up test lint format typecheck docs check bench lock clean

help:
	@echo "make up         install, migrate, start web, worker, beat and the example services"
	@echo "                (scripted LLM, payments, SMTP sink; honcho) and seed the live demo"
	@echo "make test       install, run the whole pytest suite"
	@echo "make lint       ruff check and ruff format --check (version, rules: pyproject.toml)"
	@echo "make format     apply ruff's safe fixes and ruff format"
	@echo "make typecheck  mypy with django-stubs on durable/ and approvals/"
	@echo "make docs       build the docs site into site/ (mkdocs --strict: a broken link fails)"
	@echo "make check      lint, docs, typecheck and test: what CI runs"
	@echo "make bench      side-by-side benchmarks against DBOS, LangGraph and the commit floor"
	@echo "make lock       pin every dependency's version into constraints.txt (uv pip compile)"
	@echo "make clean      remove var/ (or DURABLE_VAR_DIR: the embedded database, broker, secret key)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# uv (pinned) installs the versions pip would choose, in seconds where pip takes a minute;
# --compile-bytecode as pip does, or every process would compile what it imports again
# (PYTHONDONTWRITEBYTECODE is set on CI machines): a second of CPU at each worker start
UV := $(BIN)/uv
$(UV): | $(BIN)/python
	$(BIN)/python -m pip install -q 'uv==0.13.9'

# every install takes the versions in constraints.txt (`make lock` writes it from
# pyproject.toml): a fresh machine then installs what CI last passed with, not whatever
# was released since (a new cryptography broke daphne's pyOpenSSL that way)
CONSTRAINTS := constraints.txt
INSTALL := $(UV) pip install --compile-bytecode --python $(BIN)/python -c $(CONSTRAINTS)

# reinstall only when pyproject.toml or the constraints are newer than the stamp
$(STAMP): pyproject.toml $(CONSTRAINTS) | $(UV)
	$(INSTALL) -e '.[test]'
	touch $@

# The project's own modules, compiled once: where PYTHONDONTWRITEBYTECODE is set (CI
# machines) no process writes them, so every test process, worker and subprocess would
# compile what it imports again (~0.15 s of CPU each). Files already compiled are skipped.
install: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 durable approvals dashboard api config examples tests bench

# `make up` also needs the demo extra: honcho runs the Procfile, aiosmtpd is the SMTP sink
$(DEMO_STAMP): pyproject.toml $(CONSTRAINTS) | $(UV)
	$(INSTALL) -e '.[demo]'
	touch $@

# the demo's agents talk to the local services unless the environment says otherwise
# (e.g. `make up OPENAI_BASE_URL=https://api.openai.com/v1 OPENAI_API_KEY=sk-...`)
up: export FAKE_LLM_PORT := $(FAKE_LLM_PORT)
up: export PAYMENTS_PORT := $(PAYMENTS_PORT)
# the reference agents email approvers one-time links to approve or reject (docs/api.md)
up: export DURABLE_APPROVAL_EMAIL_WORKFLOW ?= examples.approval_email
up: export SMTP_PORT := $(SMTP_PORT)
up: export SMTP_SINK_HTTP_PORT := $(SMTP_SINK_HTTP_PORT)
up: export OPENAI_BASE_URL ?= http://127.0.0.1:$(FAKE_LLM_PORT)/v1
up: export OPENAI_API_KEY ?= scripted
up: export DURABLE_PAYMENTS_URL ?= http://127.0.0.1:$(PAYMENTS_PORT)
up: export DURABLE_SMTP_SINK_URL ?= http://127.0.0.1:$(SMTP_SINK_HTTP_PORT)
up: export EMAIL_HOST ?= 127.0.0.1
up: export EMAIL_PORT ?= $(SMTP_PORT)
up: export DURABLE_DEMO_URL ?= http://127.0.0.1:$(PORT)/
# the approval links in emails and webhook payloads point at this server
up: export DURABLE_BASE_URL ?= http://127.0.0.1:$(PORT)
# config/ and examples/ are not in the wheel (nor in the editable install's packages): the
# processes import them from the checkout, whichever folder their command runs from
up: export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
# GET /metrics adds up the counters of web, worker and beat processes (prometheus_client's
# multiprocess mode); the folder is emptied at every start, as that mode requires
up: export PROMETHEUS_MULTIPROC_DIR ?= $(or $(DURABLE_VAR_DIR),$(CURDIR)/var)/metrics
# the Procfile's worker serves its own metrics on this port too, unauthenticated, on
# 127.0.0.1 (durable/observability/metrics_server.py; web and beat ignore it); 0 turns it off
up: export DURABLE_METRICS_PORT ?= 9808
up: $(DEMO_STAMP)
	rm -rf "$$PROMETHEUS_MULTIPROC_DIR" && mkdir -p "$$PROMETHEUS_MULTIPROC_DIR"
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py durable_demo
	@echo
	@PORT=$(PORT) $(BIN)/python manage.py durable_demo --ensure-admin
	@echo "Starting web (daphne on 127.0.0.1:$(PORT)), worker, beat, the scripted LLM"
	@echo "(:$(FAKE_LLM_PORT)), the payments service (:$(PAYMENTS_PORT)) and the SMTP sink"
	@echo "(:$(SMTP_PORT)); the demo runs are seeded once they answer. Ctrl-C stops them all."
	@echo "Metrics: http://127.0.0.1:$(PORT)/metrics (logged in, or DURABLE_METRICS_TOKEN);"
	@echo "the worker's own: http://127.0.0.1:$(DURABLE_METRICS_PORT)/ (0: off)."
	@echo
	exec $(BIN)/honcho start -p $(PORT) -f Procfile

# The pytest plugins the suite uses, named: pytest then neither imports the other
# installed ones (langsmith's, anyio's, platformdirs') nor marks every module of each
# plugin's distribution for assertion rewriting, which it parses again in every pytest
# process (no bytecode is written on CI): ~4 s of each process's start
TEST_PLUGINS = pytest_django.plugin,pytest_timeout,_hypothesis_pytestplugin,schemathesis.pytest.plugin,durable.testing.env,approvals.testing

test: install
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTEST_PLUGINS=$(TEST_PLUGINS) $(BIN)/pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# what mypy checks and how strictly: [tool.mypy] in pyproject.toml
typecheck: install
	$(BIN)/mypy

# the docs site (mkdocs.yml): its tools come with the docs extra
$(DOCS_STAMP): pyproject.toml $(CONSTRAINTS) | $(UV)
	$(INSTALL) -e '.[docs]'
	touch $@

# not --quiet: it hides the warnings that --strict counts, and the build then passes
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

check: lint docs typecheck test

# side-by-side benchmarks (bench/README.md): installs the peers (DBOS, LangGraph) into
# .venv through the bench extra; needs PostgreSQL and Redis (BENCH_ARGS="--quick" for a
# short run)
bench: install
	$(INSTALL) -q -e '.[test,bench]'
	$(BIN)/python -m bench $(BENCH_ARGS)

# the pinned versions of every dependency and extra, for Python 3.11+ on any platform:
# after a change to pyproject.toml's dependencies, or to take newer releases on purpose
lock: | $(UV)
	$(UV) pip compile pyproject.toml --all-extras --universal --python-version 3.11 \
		--custom-compile-command "make lock" -o $(CONSTRAINTS)

clean:
	rm -rf $${DURABLE_VAR_DIR:-var}/
