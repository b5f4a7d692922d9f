#!/bin/sh
# Regenerates infra/k8s/requirements.lock, the worker image's dependencies with every file pinned
# by its SHA-256 (the Containerfile installs it with --require-hashes). Versions: those of the
# tested environment (.venv's pip freeze as constraints); hashes: from PyPI itself, never from a
# local mirror or wheel folder (their files may differ). Needs pip-tools: infra/k8s/lock.sh [path/to/pip-compile].
# Run it after changing pyproject.toml's dependencies; tests/unit/worker/test_k8s_manifests.py fails until then.
set -eu
cd "$(dirname "$0")/../.."
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
.venv/bin/pip freeze --exclude-editable >"$constraints"
env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null CUSTOM_COMPILE_COMMAND=infra/k8s/lock.sh \
    "${1:-pip-compile}" --quiet --generate-hashes --allow-unsafe --strip-extras --no-annotate \
    --no-emit-index-url --no-emit-find-links --index-url https://pypi.org/simple \
    --constraint "$constraints" --output-file infra/k8s/requirements.lock pyproject.toml infra/k8s/requirements.in
