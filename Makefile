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

test: install
	$(VENV)/bin/pytest -q --timeout=300

down:
	$(VENV)/bin/tideplane sandbox down
