"""Sandbox-tier fixtures: the whole sandbox (once per session) and fresh emulated clusters."""

from tests.kube_fixtures import kube_api, kube_api_url, kube_kubeconfig  # noqa: F401
from tests.sandbox_fixtures import _reset_sandbox_after_module, sandbox  # noqa: F401
