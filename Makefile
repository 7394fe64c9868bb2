# Durable: `make up` runs the whole thing on this machine, `make test` runs the suite.
#
# Both create .venv (python3 -m venv) and install the project into it when pyproject.toml
# changed since the last install. `make up` uses the embedded default: SQLite and the
# Celery filesystem:// broker under var/ (or $DURABLE_VAR_DIR). Set DATABASE_URL and
# CELERY_BROKER_URL to use PostgreSQL and Redis instead (see README.md, "Settings").

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PORT   ?= 8000
# extra arguments for pytest, e.g. `make test PYTEST_ARGS="-x -k ledger"`
PYTEST_ARGS ?=

# the Procfile's commands (daphne, celery) come from the virtualenv
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: help install up test lint clean

help:
	@echo "make up     install, migrate, seed a demo run, start web + worker + beat (honcho)"
	@echo "make test   install, run the whole pytest suite"
	@echo "make lint   ruff check"
	@echo "make clean  remove var/ (the embedded database, broker folder and secret key)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# reinstall only when pyproject.toml is newer than the stamp
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e '.[test]'
	touch $@

install: $(STAMP)

up: install
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py durable_demo
	@echo
	@PORT=$(PORT) $(BIN)/python manage.py durable_demo --ensure-admin
	@echo "Starting web (daphne on 127.0.0.1:$(PORT)), worker and beat; Ctrl-C stops them all."
	@echo
	exec $(BIN)/honcho start -p $(PORT) -f Procfile

test: install
	$(BIN)/pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf var/
