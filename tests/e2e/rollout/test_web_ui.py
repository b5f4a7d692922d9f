"""The Temporal web UI shows a running rollout as a user sees it, in a real browser (issue 35, item 7).

A rollout of the sandbox is held at its 5 % step (a long analysis window) by a ``tideplane worker``
process; headless Chromium (Debian's ``chromium``, installed by ``make install``; tests/browser.py)
opens the run's page in the sandbox's web UI, waits until it has rendered, reads its text and
takes a screenshot. The page must carry the run's current details: the step on the ladder, each gate's
value against its threshold, and the traffic split. Those details leave the worker encrypted (the
temporal CLI without the codec sees only ``binary/encrypted``), so the page can show them only
through the sandbox's codec server, whose log records the UI's decode calls by their origin.

``TIDEPLANE_UI_SCREENSHOT=docs/images/web-ui-rollout.png`` keeps the screenshot there (the README's
picture is made so).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import quote

from kubernetes import client
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError

from infra.sandbox.launcher import BIN
from tests.e2e.rollout.test_rollout import (
    GOOD,
    GOOD_PROFILE,
    NAME,
    STABLE,
    clean_up,
    follow,
    prepare,
    rollout_input,
    stable_ready,
    temporal_start,
)
from tests.browser import Page
from tests.sandbox_fixtures import wait_until
from workflows.core.naming import rollout_workflow_id
from workflows.rollout.gates import ERROR_RATE, TTFT_P99

NAMESPACE, MODEL = "e2e-web-ui", "e2e-ui-llm"
DEPLOYMENT = f"{NAMESPACE}/{NAME}"
HELD_WEIGHT = 5
CURRENT_DETAILS = rf"canary · {MODEL} {GOOD} → {DEPLOYMENT} · {HELD_WEIGHT} % \(step 1: {HELD_WEIGHT} → 50 → 100\)"


def ui_decodes(sandbox) -> int:
    """The codec server's decode calls from the web UI's origin so far (its log, a line per call)."""
    log = (sandbox.state_dir / "logs" / "codec.log").read_text(errors="replace")
    return len(re.findall(rf"decode \d+ payloads for {re.escape(sandbox.urls['temporal-ui'])}$", log, re.M))


def raw_metadata_payloads(sandbox, workflow_id: str) -> list[dict]:
    """The run's summary and current details as Temporal hands them out, without the codec."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_CODEC_")}
    out = subprocess.run([str(BIN / "temporal"), "workflow", "metadata", "--address", sandbox.urls["temporal"],
                          "-w", workflow_id, "--output", "json"], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr

    def payloads(node) -> list[dict]:
        if isinstance(node, dict):
            return [node] if "metadata" in node and "data" in node else [p for v in node.values() for p in payloads(v)]
        return [p for v in node for p in payloads(v)] if isinstance(node, list) else []

    return payloads(json.loads(out.stdout))


def shown(url: str, shot: Path) -> str:
    """The run's page text once its current details are rendered, and its screenshot at that moment."""
    with Page() as page:
        page.open(url)
        page.wait_for("User Metadata")
        page.click("User Metadata")
        page.wait_for(CURRENT_DETAILS)
        page.wait_for(r"verdict \d+ at")  # the details' last line, rendered with the rest
        page.screenshot(shot)
        return page.text()


async def test_the_web_ui_shows_a_running_rollouts_step_gates_and_weights(sandbox, kube, registry, worker, temporal, tmp_path):
    prepare(kube, registry, tmp_path, NAMESPACE, MODEL, {GOOD: GOOD_PROFILE})
    with ExitStack() as stack:
        stack.callback(clean_up, kube, NAMESPACE)
        wait_until(lambda: stable_ready(kube, NAMESPACE), 30, "the stable version to be Ready")
        inp = rollout_input(DEPLOYMENT, MODEL, GOOD)
        inp["steps"] = [{"weight": HELD_WEIGHT, "window_seconds": 3600}, {"weight": 50, "window_seconds": 3600}]
        started = await asyncio.to_thread(temporal_start, sandbox.urls["temporal"], inp)
        assert started.returncode == 0, started.stderr
        handle = temporal.get_workflow_handle(rollout_workflow_id(DEPLOYMENT))
        try:
            await asyncio.wait_for(
                follow(temporal, DEPLOYMENT, client.AppsV1Api(kube), STABLE,
                       until=lambda s: s.last_verdict is not None and s.weight == HELD_WEIGHT),
                timeout=120,
            )
            run = await handle.describe()
            assert run.status == WorkflowExecutionStatus.RUNNING
            url = f"{sandbox.urls['temporal-ui']}/namespaces/default/workflows/{quote(run.id, safe='')}/{run.run_id}"
            shot = tmp_path / "web-ui-rollout.png"
            decodes_before = ui_decodes(sandbox)
            text = await asyncio.to_thread(shown, url, shot)
            decodes = ui_decodes(sandbox) - decodes_before
            raw = raw_metadata_payloads(sandbox, run.id)
        finally:
            with contextlib.suppress(RPCError):  # already over if the test failed by it
                await handle.signal("abort", {"reason": "the web UI test is over"})  # the canary goes, then the namespace
            with contextlib.suppress(WorkflowFailureError):
                await asyncio.wait_for(handle.result(), timeout=60)

    assert shot.stat().st_size > 10_000, "the screenshot is blank"
    if target := os.environ.get("TIDEPLANE_UI_SCREENSHOT"):
        shutil.copyfile(shot, Path(target))
    assert "RUNNING" in text.upper() and run.id in text
    # what the page shows came through the codec server: Temporal holds the details only encrypted
    assert raw and {base64.b64decode(p["metadata"]["encoding"]) for p in raw} == {b"binary/encrypted"}
    assert not any(f"step 1: {HELD_WEIGHT}".encode() in base64.b64decode(p["data"]) for p in raw)
    assert decodes > 0, "the web UI made no decode call to the codec server"
    # the current details, as the workflow sets them: the ladder's step and the canary's weight ...
    assert re.search(CURRENT_DETAILS, text)
    assert f"stable: {STABLE}" in text
    # ... and each gate's value against its threshold in the last verdict
    assert re.search(rf"verdict \d+ at {HELD_WEIGHT} % .*: pass: requests [\d.]+, {ERROR_RATE} [\d.e-]+ ≤ 0.01", text), text[:4000]
    assert re.search(rf"{TTFT_P99} [\d.e-]+ ≤ [\d.]+", text)
