"""``tideplane rollout`` against a real (time-skipping) Temporal server and the rollout's stubs:
it reads and steers the run with the same query, signals and update a ``temporal`` user sends,
and ``status`` exits 0 promoted, 1 rolled back, 2 paused, 3 running."""

from __future__ import annotations

import argparse
import io
import json
import uuid
from typing import Any

import pytest
import yaml
from temporalio.client import WorkflowFailureError, WorkflowHandle

from tests.workflows.rollout.test_rollout import (
    BAD,
    GOOD,
    NEW,
    QUERY_GATES,
    STABLE,
    Fleet,
    client,  # noqa: F401 - fixture
    metered_env,  # noqa: F401 - fixture
    retired,
    time_running,
    rollout_input,
    run_rollout,
    wait_status,
    worker,
)
from workers.cli import rollout as cli
from workers.cli.main import _parser
from workers.config import load_settings
from workflows.core.naming import rollout_workflow_id
from workflows.rollout import gates as canary
from workflows.rollout.types import Outcome
from workflows.rollout.client import rollout_result, start_rollout


def _args(line: str) -> argparse.Namespace:
    return _parser().parse_args(line.split())


async def _run(line: str, settings, capsys) -> tuple[int, str]:
    args = _args(line)
    code = await cli.COMMANDS[args.rollout_command](args, settings)
    return code, capsys.readouterr().out


async def test_get_status_pause_and_promote_from_the_cli(client, capsys):  # noqa: F811
    settings = load_settings().model_copy(update={"temporal_address": client.service_client.config.target_host,
                                                  "temporal_namespace": client.namespace})
    inp = rollout_input()
    sent: list[int] = []

    async def pause_at_5(fleet: Fleet, name: str, arg: Any) -> None:  # the operator pauses at 5 %, from the CLI
        if name == QUERY_GATES and fleet.route.get(NEW) == 5 and not sent:
            sent.append((await _run(f"rollout pause {inp.deployment} --reason dashboards", settings, capsys))[0])

    fleet = Fleet(client, hook=pause_at_5)

    async def operator(handle: WorkflowHandle) -> None:
        await wait_status(handle, lambda s: s.paused)
        assert sent == [0]
        code, out = await _run(f"rollout status {inp.deployment}", settings, capsys)
        assert code == cli.PAUSED and "paused" in out and "dashboards" in out
        code, out = await _run(f"rollout get {inp.deployment} -o json", settings, capsys)
        seen = json.loads(out)
        assert seen["state"] == "RUNNING" and seen["status"]["paused"] and seen["status"]["weight"] == 5
        code, out = await _run(f"rollout get {inp.deployment}", settings, capsys)
        assert "ladder   1 → [5] → 50 → 100 %" in out and f"{STABLE} 95 %, {NEW} 5 %" in out and "PAUSED" in out
        assert "error_rate" in out  # each gate's value against its threshold
        code, out = await _run(f"rollout promote {inp.deployment} --full --force", settings, capsys)
        assert code == 0 and "promote accepted: skip to 100 %" in out

    result = await run_rollout(fleet, inp, until=operator)
    assert result.outcome is Outcome.PROMOTED and fleet.route == {STABLE: 0, NEW: 100}


async def test_status_of_a_rolled_back_rollout_exits_1_and_get_shows_the_verdict(client, capsys):  # noqa: F811
    settings = load_settings().model_copy(update={"temporal_address": client.service_client.config.target_host,
                                                  "temporal_namespace": client.namespace})
    failing = {**GOOD, canary.ERROR_RATE: BAD[canary.ERROR_RATE]}
    fleet = Fleet(client, gates=lambda w, n: failing if w == 5 else GOOD)
    inp = rollout_input()
    seen: dict[str, Any] = {}
    async with worker(fleet, f"rollout-test-{uuid.uuid4().hex[:8]}") as w:
        handle = await start_rollout(client, inp, task_queue=w.task_queue)
        fleet.workflow_id = handle.id
        with pytest.raises(WorkflowFailureError):
            await handle.result()  # a rolled-back run fails
        result = await rollout_result(handle)
        seen["status"] = await _run(f"rollout status {inp.deployment}", settings, capsys)
        seen["get"] = await _run(f"rollout get {inp.deployment} -o yaml", settings, capsys)
        stream = io.StringIO()
        seen["watch"] = (await cli.watch(handle, stream)).code, stream.getvalue()
    await retired(fleet, inp.deployment)
    assert result.outcome is Outcome.ROLLED_BACK
    code, out = seen["status"]
    assert code == cli.FAILED and out.startswith("not promoted (rolled_back): ") and canary.ERROR_RATE in out
    assert "outcome: rolled_back" in seen["get"][1] and "state: FAILED" in seen["get"][1]
    code, text = seen["watch"]
    assert code == cli.FAILED and "FAIL error_rate" in text and "outcome  rolled_back" in text


def test_start_validates_locally_and_names_the_field(tmp_path, capsys):
    spec = tmp_path / "rollout.yaml"
    spec.write_text("deployment: llm-serving/chat\nmodel: llama\nversion: 1.3.0\nimage: vllm/vllm-openai:v0.6.3\nsteps: [{weight: 50, window_seconds: 60}, {weight: 5, window_seconds: 60}]\n")
    from workers.cli.main import run as main  # main() itself ends the process once Temporal's runtime started

    assert main(["rollout", "start", str(spec), "--dry-run"]) == 2
    assert "tideplane: error: invalid rollout: steps: Value error, weights must be strictly increasing" in capsys.readouterr().err
    spec.write_text("deployment: llm-serving/chat\nmodel: llama\nversion: 1.3.0\nimage: vllm/vllm-openai:v0.6.3\n")
    assert main(["rollout", "start", str(spec), "--dry-run"]) == 0
    assert main(["rollout", "start", str(tmp_path / "missing.yaml")]) == 2
    assert capsys.readouterr().err.strip().endswith("missing.yaml: no such file")


def test_the_view_marks_the_current_step_and_each_gate():
    from workflows.rollout.types import RolloutStatus, Stage

    status = RolloutStatus(deployment="ns/chat", version="1.3.0", stable_version="1.2.0", stage=Stage.CANARY, weight=50, step=2,
                           steps=[1, 5, 50, 100], paused=False, pause_reason=None, analysis={}, last_verdict=None, verdicts=[],
                           timings={}, replicas={"1.2.0": 4, "1.3.0": 2})
    lines = cli.render(status)
    assert "ladder   1 → 5 → [50] → 100 %" in lines and "weights  1.2.0 50 %, 1.3.0 50 %" in lines
    assert "replicas 1.2.0 4, 1.3.0 2" in lines
    assert cli.exit_code(status, None, "RUNNING") == cli.RUNNING and cli.exit_code(None, None, "FAILED") == cli.FAILED


def test_the_view_shows_the_download_with_rate_and_eta():
    progress = cli.heartbeat_progress({"bytes_done": 4 * 1024**3, "bytes_total": 16 * 1024**3}, 100.0)
    assert cli.download_line(progress) == "download [#####...............] 4.0 GiB of 16.0 GiB (25 %)  41.0 MiB/s  ETA 5m00s"
    assert cli.heartbeat_progress({"verified": {}}, 10.0) is None


async def test_apply_leaves_an_unchanged_spec_and_a_changed_one_supersedes_the_running_rollout(client, tmp_path, capsys):  # noqa: F811
    inp = rollout_input()
    wid = rollout_workflow_id(inp.deployment)
    releases = tmp_path / "releases"
    releases.mkdir()
    spec = releases / "chat.yaml"
    spec.write_text(yaml.safe_dump(inp.model_dump(mode="json")))
    fleet = Fleet(client)
    fleet.workflow_id, fleet.deployment = wid, inp.deployment.split("/")[1]
    async with worker(fleet, f"rollout-test-{uuid.uuid4().hex[:8]}") as w:
        settings = load_settings().model_copy(update={"temporal_address": client.service_client.config.target_host,
                                                      "temporal_namespace": client.namespace, "task_queue": w.task_queue})
        code, out = await _run(f"rollout apply {releases}", settings, capsys)
        assert code == 0 and f"{inp.deployment}: started {wid}" in out
        first = (await client.get_workflow_handle(wid).describe()).run_id
        await wait_status(client.get_workflow_handle(wid), lambda s: s.weight >= 1)

        code, out = await _run(f"rollout apply {spec}", settings, capsys)
        assert code == 0 and f"{inp.deployment}: unchanged (running, {spec})" in out
        assert (await client.get_workflow_handle(wid).describe()).run_id == first

        spec.write_text(yaml.safe_dump(inp.model_copy(update={"image": "vllm/vllm-openai:v0.6.4"}).model_dump(mode="json")))
        code, out = await _run(f"rollout apply {spec}", settings, capsys)
        assert code == 0 and "previous rollout aborted" in out and f"{inp.deployment}: superseded {wid}" in out
        old = await rollout_result(client.get_workflow_handle(wid, run_id=first))
        assert old.outcome is Outcome.ABORTED and "superseded by" in (old.reason or "")
        second = (await client.get_workflow_handle(wid).describe()).run_id
        assert second != first
        async with time_running(client):
            assert (await rollout_result(client.get_workflow_handle(wid, run_id=second))).outcome is Outcome.PROMOTED

        code, out = await _run(f"rollout apply {spec}", settings, capsys)
        assert code == 0 and f"{inp.deployment}: unchanged (completed, {spec})" in out


def test_apply_validates_every_spec_before_starting_any(tmp_path, capsys):
    from workers.cli.main import run as main

    good = "model: llama\nversion: 1.3.0\nimage: vllm/vllm-openai:v0.6.3\n"
    (tmp_path / "a.yaml").write_text("deployment: llm-serving/chat\n" + good)
    (tmp_path / "b.yaml").write_text("deployment: llm-serving/code\nmodel: llama\nversion: 1.3.0\n")
    (tmp_path / "notes.txt").write_text("not a spec")
    assert main(["rollout", "apply", str(tmp_path), "--address", "127.0.0.1:1"]) == 2
    assert f"{tmp_path / 'b.yaml'}: invalid rollout: image: Field required" in capsys.readouterr().err
    (tmp_path / "b.yaml").write_text("deployment: llm-serving/chat\n" + good)
    assert main(["rollout", "apply", str(tmp_path), "--address", "127.0.0.1:1"]) == 2
    assert "deployment llm-serving/chat is also in" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["rollout", "apply", str(empty)]) == 2
    assert "no *.yaml, *.yml or *.json rollout spec" in capsys.readouterr().err
