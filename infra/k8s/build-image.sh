#!/bin/sh
# Builds the worker image from the repository root: infra/k8s/build-image.sh IMAGE[:TAG]
# BASE_DIGEST (required) is the digest of docker.io/library/python:3.11-slim-bookworm you reviewed,
# e.g. from `skopeo inspect --format '{{.Digest}}' docker://docker.io/library/python:3.11-slim-bookworm`
# or `docker buildx imagetools inspect python:3.11-slim-bookworm` (the index digest, multi-arch).
# BUILDER: podman (default) or docker.
set -eu
cd "$(dirname "$0")/../.."
image=${1:?usage: BASE_DIGEST=sha256:... infra/k8s/build-image.sh IMAGE[:TAG]}
if ! printf '%s' "${BASE_DIGEST:-}" | grep -Eqx 'sha256:[0-9a-f]{64}'; then
    echo "build-image: BASE_DIGEST must be sha256:<64 hex digits> of python:3.11-slim-bookworm, got '${BASE_DIGEST:-}'" >&2
    exit 2
fi
exec "${BUILDER:-podman}" build --build-arg "BASE_DIGEST=$BASE_DIGEST" -f infra/k8s/Containerfile -t "$image" .
