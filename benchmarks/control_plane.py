"""Control-plane benchmark: N ReactiveScaling loops on a local Temporal dev server.

The real ReactiveScaling workflow runs against stub activities registered under the contract's
names (get_scale, read_scaling_signals, scale_version), which answer from memory: queue spikes
every tenth decision, so each loop scales up and, after its window and cooldown, back down.
Loops start spread over one interval (as deployments created over time would be). Over
``duration_s`` of wall time the bench samples, from /proc (no psutil): the CPU and resident
memory of this process (the worker, plus the client that started the loops) and of the dev
server; per decision the cycle latency (get_scale start to the decision applied) and the timer
lag (start-to-start period minus the interval: the decision's own time plus the timer's lateness); and afterwards the history of sample loops,
scaled to a simulated day (2880 decisions at 30 s), with the bound continue-as-new keeps per run.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from benchmarks.scaling import markdown_table as _table
from benchmarks.scaling import write_csv
from infra.sandbox.ports import free_port
from workflows.scaling import contract as acts
from workflows.core import search_attributes
from workflows.rollout.contract import SCALE_VERSION, ScaleVersionInput
from workflows.scaling.decide import ScalingPolicy, Signals
from workflows.scaling.loop import ReactiveScaling
from workflows.scaling.loop_state import ScalingInput

TASK_QUEUE = "tideplane-bench-control-plane"
COLUMNS = [
    "loops", "wall_s", "decisions", "decisions_per_s", "worker_cpu_percent", "worker_rss_mib", "server_cpu_percent",
    "server_rss_mib", "cycle_p50_ms", "cycle_p99_ms", "timer_lag_p50_ms", "timer_lag_p99_ms",
    "history_events_per_decision", "history_kib_per_day", "history_kib_per_run_max",
]
TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int | str = "self") -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def _rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _children() -> list[int]:
    """Processes this bench started (the dev server): their parent is us."""
    me = str(os.getpid())
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == me:
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


class StubFleet:
    """In-memory deployments behind the scaling activities' names; records each decision's timing."""

    def __init__(self) -> None:
        self.replicas: dict[str, int] = defaultdict(lambda: 2)
        self.cycles: dict[str, int] = defaultdict(int)
        self.started: dict[str, float] = {}
        self.periods: list[float] = []
        self.latencies: list[float] = []
        self.decisions = 0

    def activities(self):
        @activity.defn(name=acts.GET_SCALE)
        async def get_scale(target: acts.ScaleTarget) -> acts.ScaleStatus:
            now = time.monotonic()
            if target.deployment in self.started:
                self.periods.append(now - self.started[target.deployment])
            self.started[target.deployment] = now
            n = self.replicas[target.deployment]
            return acts.ScaleStatus(version="1.0.0", replicas=n, ready_replicas=n)

        @activity.defn(name=acts.READ_SCALING_SIGNALS)
        async def read_signals(request: acts.ReadSignalsInput) -> Signals:
            cycle = self.cycles[request.deployment]
            self.cycles[request.deployment] += 1
            self._done(request.deployment, after_signals=True)
            spike = cycle % 10 == 0
            return Signals(queue_waiting=200.0 if spike else 0.0, running=4.0, ttft_p99_seconds=0.5, gpu_util_percent=85.0 if spike else 20.0)

        @activity.defn(name=SCALE_VERSION)
        async def scale_version(request: ScaleVersionInput) -> None:
            self.replicas[request.deployment.name] = request.replicas
            self._done(request.deployment.name, after_signals=False)

        return [get_scale, read_signals, scale_version]

    def _done(self, deployment: str, after_signals: bool) -> None:
        """A decision ends at the scale call when there is one, else at the signal read (approximation
        for holds: the workflow's decide step itself takes microseconds)."""
        start = self.started.get(deployment)
        if start is None:
            return
        if after_signals:
            self.decisions += 1
        else:
            self.latencies.append(time.monotonic() - start)


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _measure(client: Client, server_pid: int | None, loops: int, duration_s: float, interval_s: float, iterations_per_run: int) -> dict:
    fleet = StubFleet()
    prefix = f"bench{loops}"
    policy = ScalingPolicy(min_replicas=1, max_replicas=64, stabilisation_seconds=120, cooldown_seconds=180)
    async with Worker(
        client,
        task_queue=TASK_QUEUE,
        workflows=[ReactiveScaling],
        activities=fleet.activities(),
        max_concurrent_workflow_tasks=200,
        max_concurrent_activities=400,
    ):
        cpu0, srv0, t0 = _cpu_seconds(), _cpu_seconds(server_pid) if server_pid else 0.0, time.monotonic()
        handles = []
        for i in range(loops):
            handles.append(
                await client.start_workflow(
                    ReactiveScaling.run,
                    ScalingInput(deployment=f"{prefix}/loop-{i}", policy=policy, interval_seconds=interval_s, iterations_per_run=iterations_per_run),
                    id=f"scaling/{prefix}/loop-{i}",
                    task_queue=TASK_QUEUE,
                )
            )
            await asyncio.sleep(interval_s / loops)
        remaining = duration_s - (time.monotonic() - t0)
        rss_peak = srv_peak = 0.0
        while remaining > 0:
            await asyncio.sleep(min(5.0, remaining))
            rss_peak = max(rss_peak, _rss_mib())
            srv_peak = max(srv_peak, _rss_mib(server_pid) if server_pid else 0.0)
            remaining = duration_s - (time.monotonic() - t0)
        wall = time.monotonic() - t0
        cpu, srv = _cpu_seconds() - cpu0, (_cpu_seconds(server_pid) - srv0) if server_pid else 0.0
        decisions = fleet.decisions
        sample = handles[:: max(1, loops // 5)][:5]
        events = size = runs_decisions = 0
        for handle in sample:  # the current run's history against the decisions that run made
            history = await handle.fetch_history()
            events += len(history.events)
            size += sum(e.ByteSize() for e in history.events)
            runs_decisions += (await handle.query(ReactiveScaling.status)).iteration
        for handle in handles:
            await handle.terminate("benchmark over")
    per_decision_events = events / max(1, runs_decisions)
    per_decision_bytes = size / max(1, runs_decisions)
    lags = [p - interval_s for p in fleet.periods]
    return {
        "loops": loops,
        "wall_s": round(wall, 0),
        "decisions": decisions,
        "decisions_per_s": round(decisions / wall, 1),
        "worker_cpu_percent": round(100 * cpu / wall, 1),
        "worker_rss_mib": round(rss_peak, 0),
        "server_cpu_percent": round(100 * srv / wall, 1),
        "server_rss_mib": round(srv_peak, 0),
        "cycle_p50_ms": round(1000 * _quantile(fleet.latencies, 0.5), 0),
        "cycle_p99_ms": round(1000 * _quantile(fleet.latencies, 0.99), 0),
        "timer_lag_p50_ms": round(1000 * _quantile(lags, 0.5), 0),
        "timer_lag_p99_ms": round(1000 * _quantile(lags, 0.99), 0),
        "history_events_per_decision": round(per_decision_events, 1),
        "history_kib_per_day": round(per_decision_bytes * 86400 / interval_s / 1024, 0),
        "history_kib_per_run_max": round(per_decision_bytes * iterations_per_run / 1024, 0),
    }


async def run(out_dir: Path | None, loops: tuple[int, ...] = (100,), duration_s: float = 300.0, interval_s: float = 30.0, iterations_per_run: int = 240) -> list[dict]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.executable).parent / "temporal"),
        data_converter=pydantic_data_converter,
        search_attributes=list(search_attributes.ALL),
        port=free_port(),
        ui=False,
    )
    try:
        children = _children()
        server_pid = children[0] if len(children) == 1 else None
        table = []
        for n in loops:
            row = await _measure(env.client, server_pid, n, duration_s, interval_s, iterations_per_run)
            print(markdown_table([row]), flush=True)
            table.append(row)
    finally:
        await env.shutdown()
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_csv(out_dir / "control-plane.csv", table, COLUMNS)
        (out_dir / "control-plane.md").write_text(
            f"Temporal dev server (temporal server start-dev, in-memory SQLite) + one worker process on the same machine "
            f"({os.cpu_count()} cores); interval {interval_s:g}s, {duration_s:g}s of wall time per N, "
            f"continue-as-new every {iterations_per_run} decisions\n\n" + markdown_table(table) + "\n"
        )
    return table


def markdown_table(table: list[dict]) -> str:
    return _table(table, COLUMNS)

