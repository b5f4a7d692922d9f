# Two commands on a fresh Debian machine with Python 3.11 and root: `make demo`, `make test`.
PYTHON ?= python3.11
VENV := .venv
INSTALLED := $(VENV)/.installed
PROMETHEUS := /usr/bin/prometheus
KUBECTL := $(shell command -v kubectl || echo /usr/bin/kubectl)

.PHONY: demo test down install

install: $(INSTALLED) $(PROMETHEUS) $(KUBECTL)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(INSTALLED): pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/pip install --quiet -e '.[test,bench]'
	touch $@

$(PROMETHEUS):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus

/usr/bin/kubectl:
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client

demo: install
	$(VENV)/bin/tideplane demo

# The layer contracts (pyproject.toml, [tool.importlinter]) first: they take a second.
# pytest exits 5 when it collects no tests (with -n too); make stops on any non-zero exit, so that fails too.
# Two xdist workers: one runs every module that uses the sandbox, the other everything else
# meanwhile (tests/conftest.py groups them). A test outside tests/unit that fails once runs once more;
# -r fER lists each failure, error and rerun by name in the summary, so a flake is never silent.
test: install
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/pytest -q --timeout=300 -n 2 --dist loadscope -r fER

down:
	$(VENV)/bin/tideplane sandbox down
