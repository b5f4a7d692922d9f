"""ModelRollout's quality gates on the time-skipping server, with test_rollout's stub fleet plus
the golden-set and shadow activities: what runs when, what a failure leaves on the route, and
that a canary is never promoted on no shadow evidence."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from temporalio import activity
from temporalio.client import WorkflowHandle

from tests.workflows.rollout.test_rollout import (
    NEW,
    SET_REGISTRY_STATUS,
    SET_ROUTE_WEIGHTS,
    STABLE,
    Fleet,
    client,
    metered_env,
    rollout_input,
    run_rollout,
)
from workflows.quality.contract import GoldenSetFound, GoldenSetInput
from workflows.quality.contract import (
    JUDGE_SHADOW_PAIRS,
    READ_SHADOW_PAIRS,
    RUN_GOLDEN_SET,
    GoldenRunInput,
    GoldenRunResult,
    ShadowJudgeInput,
    ShadowJudgement,
    ShadowPairsInput,
    ShadowPairsResult,
)
from workflows.core.verdicts import CaseResult
from workflows.quality.golden_set import GoldenRevision, GoldenSet
from workflows.quality.shadow import ShadowPair, tally
from workflows.rollout.types import Outcome, RolloutStatus, Stage

GOLDEN = GoldenSet.model_validate(
    {
        "min_pass_rate": 0.5,
        "cases": [
            {"id": "dose", "prompt": "max dose?", "must_pass": True, "checks": [{"contains": ["4 grams"]}]},
            {"id": "capital", "prompt": "capital?", "checks": [{"contains": ["Paris"]}]},
        ],
    }
)
ALL_PASS = [CaseResult(id="dose", passed=True), CaseResult(id="capital", passed=True)]
DOSE_WRONG = [CaseResult(id="dose", passed=False, failures=["contains: missing ['4 grams']"], answer="8 grams"), ALL_PASS[1]]
SHADOW = {"shadow": {"percent": 20, "thresholds": {"min_pairs": 4}}}


def same(n: int, start: int = 0) -> list[ShadowPair]:
    return [ShadowPair(seq=start + i, prompt=f"p{i}", stable_answer="a", canary_answer="a") for i in range(n)]


def drifted(n: int) -> list[ShadowPair]:
    return [ShadowPair(seq=i, prompt=f"q{i}", stable_answer="a", canary_answer="I'm sorry, I can't.") for i in range(n)]


class QualityFleet(Fleet):
    def __init__(
        self, client, *, new: list[CaseResult] = ALL_PASS, pairs: Callable[[int], list[ShadowPair]] = lambda n: [], **kw: Any
    ) -> None:
        super().__init__(client, **kw)
        self.new_results, self.pairs = new, pairs
        self.shadow_reads = 0

    def activities(self) -> list[Callable]:
        return [*super().activities(), self.run_golden_set, self.read_shadow_pairs, self.judge_shadow_pairs]

    @activity.defn(name="read_golden_set")
    async def read_golden_set(self, input: GoldenSetInput) -> GoldenSetFound:
        return GoldenSetFound(current=GoldenRevision(revision=3, sha256="0" * 64, set_at="2026-01-01T00:00:00Z", golden=GOLDEN))

    @activity.defn(name=RUN_GOLDEN_SET)
    async def run_golden_set(self, input: GoldenRunInput) -> GoldenRunResult:
        await self._record(RUN_GOLDEN_SET, input)
        return GoldenRunResult(new=self.new_results, stable=ALL_PASS if input.stable_version else None)

    @activity.defn(name=READ_SHADOW_PAIRS)
    async def read_shadow_pairs(self, input: ShadowPairsInput) -> ShadowPairsResult:
        await self._record(READ_SHADOW_PAIRS, input)
        self.shadow_reads += 1
        pairs = self.pairs(self.shadow_reads)
        return ShadowPairsResult(pairs=pairs, last=input.after + len(pairs))

    @activity.defn(name=JUDGE_SHADOW_PAIRS)
    async def judge_shadow_pairs(self, input: ShadowJudgeInput) -> ShadowJudgement:
        await self._record(JUDGE_SHADOW_PAIRS, input)
        self.shadow_reads += 1
        pairs = self.pairs(self.shadow_reads)
        return ShadowJudgement(tally=tally(pairs, input.structured), read=len(pairs), last=input.after + len(pairs))

    def mirrors(self) -> list[tuple[dict[str, int], Any]]:
        return [(arg.weights, arg.mirror) for name, arg in self.calls if name == SET_ROUTE_WEIGHTS]


async def test_a_failing_must_pass_case_rolls_back_before_any_traffic(client):
    fleet = QualityFleet(client, new=DOSE_WRONG)
    result = await run_rollout(fleet, rollout_input(weights_uri=None, sha256=None, **SHADOW))
    assert result.outcome is Outcome.ROLLED_BACK
    assert result.reason.startswith("golden set failed at warm-up: must-pass case(s) failed: dose")
    assert result.weight_reached == 0 and all(w.get(NEW, 0) == 0 for w, _ in fleet.mirrors())
    assert all(mirror is None for _, mirror in fleet.mirrors())  # the shadow never started
    (golden_run,) = [arg for name, arg in fleet.calls if name == RUN_GOLDEN_SET]
    assert (golden_run.version, golden_run.stable_version) == (NEW, STABLE)
    recorded = [r.benchmark for r in fleet.recorded("record_registry_benchmark") if r.benchmark.golden is not None]
    assert [(b.dataset, b.golden.failing_cases) for b in recorded] == [("golden set r3", ["dose"])]
    assert result.golden is not None and result.golden.must_pass_failed == ["dose"]
    # the version is wrong, not the attempt: deprecated as a failed canary gate leaves it, never rolled out again
    assert [s.status.state for s in fleet.recorded(SET_REGISTRY_STATUS)] == ["deprecated"]


async def test_drift_rolls_back_at_the_first_step_and_removes_the_mirror(client):
    fleet = QualityFleet(client, pairs=lambda n: drifted(6))
    result = await run_rollout(fleet, rollout_input(weights_uri=None, sha256=None, **SHADOW))  # from the registry
    assert result.outcome is Outcome.ROLLED_BACK and result.weight_reached == 1
    assert result.reason.startswith("shadow comparison failed at 1 %: exact agreement 0% < 90%")
    assert "'q0': stable 'a' / canary \"I'm sorry, I can't.\"" in result.reason
    routes = fleet.mirrors()
    assert routes[0] == ({STABLE: 100, NEW: 0}, None)  # added to the route without a mirror
    assert routes[1][0] == {STABLE: 100, NEW: 0} and routes[1][1].percent == 20  # mirror before the canary
    assert routes[2][0] == {STABLE: 99, NEW: 1} and routes[2][1] is not None
    assert routes[-1] == ({STABLE: 100, NEW: 0}, None)  # the rollback took the mirror away
    assert [s.status.state for s in fleet.recorded(SET_REGISTRY_STATUS)] == ["canary", "deprecated"]


async def test_never_promoted_on_no_shadow_evidence(client):
    """No mirrored pairs in any window: the rollout pauses before promotion; resume promotes."""
    seen: list[RolloutStatus] = []

    async def resume_when_paused(handle: WorkflowHandle) -> None:
        while True:
            status = await handle.query("status", result_type=RolloutStatus)
            if status.paused:
                seen.append(status)
                await handle.signal("resume")
                return
            if status.stage in (Stage.PROMOTED, Stage.ROLLED_BACK):
                return  # ended without pausing: the assertions below say so
            await asyncio.sleep(0.05)

    fleet = QualityFleet(client, pairs=lambda n: [])
    result = await run_rollout(fleet, rollout_input(**SHADOW), until=resume_when_paused)
    (paused,) = seen
    assert paused.stage is Stage.PAUSED and paused.weight == 50
    assert paused.pause_reason.startswith("shadow comparison never conclusive before promotion")
    assert paused.shadow is not None and paused.shadow.verdict == "inconclusive"
    assert result.outcome is Outcome.PROMOTED
    assert fleet.mirrors()[-1] == ({STABLE: 0, NEW: 100}, None)  # promoted: no mirror


async def test_a_passing_shadow_window_lets_the_ladder_promote(client):
    fleet = QualityFleet(client, pairs=lambda n: same(5, start=10 * n))
    result = await run_rollout(fleet, rollout_input(**SHADOW))
    assert result.outcome is Outcome.PROMOTED, result.reason
    assert result.shadow is not None and result.shadow.verdict == "pass"
    assert result.golden is not None and result.golden.passed
    assert fleet.mirrors()[-1] == ({STABLE: 0, NEW: 100}, None)


LONG = 4000  # characters a prompt: a few KB each, as real chat prompts are


class MirrorRecorder:
    """The shadow recorder's HTTP endpoint (``/mirror/<namespace>/<route>?after=&limit=``) holding
    ``pairs`` recorded (stable version, canary version) pairs, served by the real client."""

    def __init__(self, pairs: list[dict]) -> None:
        import http.server
        import json
        import threading
        from urllib.parse import parse_qs, urlparse

        recorded = pairs
        self.served = 0
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                query = parse_qs(urlparse(self.path).query)
                after, limit = int(query.get("after", ["0"])[0]), int(query.get("limit", ["1000"])[0])
                page = [p for p in recorded if p["seq"] > after][:limit]
                recorder.served += len(page)
                body = json.dumps({"pairs": page, "last": page[-1]["seq"] if page else after}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/mirror/{{namespace}}/{{name}}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def long_pairs(n: int, refusing_every: int = 0) -> list[dict]:
    """``n`` pairs with prompts of LONG characters; every ``refusing_every``-th canary answer a refusal."""
    pairs = []
    for i in range(1, n + 1):
        answer = f"answer {i % 97} " + "lorem ipsum " * 80
        refuses = refusing_every and i % refusing_every == 0
        pairs.append(
            {
                "seq": i,
                "prompt": f"customer {i}: " + "x" * LONG,
                "stable_version": STABLE,
                "stable_answer": answer,
                "canary_version": NEW,
                "canary_answer": "I'm sorry, I can't help with that. " + "y" * 900 if refuses else answer,
            }
        )
    return pairs


class RecordedShadowFleet(QualityFleet):
    """The stub fleet, but the shadow activities are the worker's own, reading a real recorder."""

    def __init__(self, client, recorder: MirrorRecorder, **kw: Any) -> None:
        from activities.quality.quality_activities import QualityActivities
        from activities.quality.shadow_pairs import ShadowPairsClient

        super().__init__(client, **kw)
        self.real = QualityActivities(None, "http://unused", None, ShadowPairsClient(recorder.url))  # type: ignore[arg-type]

    def activities(self) -> list[Callable]:
        names = {READ_SHADOW_PAIRS, "judge_shadow_pairs"}
        stubs = [a for a in super().activities() if getattr(a, "__temporal_activity_definition").name not in names]
        return [*stubs, *self.real_shadow()]

    def real_shadow(self) -> list[Callable]:
        real = self.real
        found = []
        for name in ("read_shadow_pairs", "judge_shadow_pairs"):
            method = getattr(real, name, None)
            if method is None:
                continue
            defn = getattr(method, "__temporal_activity_definition")

            def bind(method: Callable = method, defn: Any = defn) -> Callable:
                async def run(req):  # the real method, off the event loop as the worker runs it
                    return await asyncio.to_thread(method, req)

                run.__annotations__ = {"req": defn.arg_types[0], "return": defn.ret_type}
                return activity.defn(name=defn.name)(run)

            found.append(bind())
        return found


async def history_bytes(client, workflow_id: str) -> int:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return len(history.to_json().encode())


async def test_ten_thousand_long_mirrored_pairs_are_judged_in_the_activity_and_stay_out_of_history(client):
    """10,000 mirrored pairs with prompts of a few KB (about 55 MB of user traffic): the verdict is
    right and the rollout's history stays under 2 MB, for a pass and for a drift alike."""
    recorder = MirrorRecorder(long_pairs(10_000))
    try:
        fleet = RecordedShadowFleet(client, recorder)
        result = await run_rollout(fleet, rollout_input(**SHADOW))
        size = await history_bytes(client, fleet.workflow_id)
    finally:
        recorder.close()
    # promoted without pausing for want of shadow evidence: the window of all 10,000 passed
    assert result.outcome is Outcome.PROMOTED, result.reason
    assert recorder.served == 10_000
    assert size < 2_000_000, f"history {size} bytes"

    recorder = MirrorRecorder(long_pairs(10_000, refusing_every=5))  # a fifth refused
    try:
        fleet = RecordedShadowFleet(client, recorder)
        result = await run_rollout(fleet, rollout_input(**SHADOW))
        size = await history_bytes(client, fleet.workflow_id)
    finally:
        recorder.close()
    assert result.outcome is Outcome.ROLLED_BACK and result.weight_reached == 1
    assert result.shadow is not None and result.shadow.measures.pairs == 10_000
    assert result.reason.startswith("shadow comparison failed at 1 %: exact agreement 80% < 90%"), result.reason
    assert "refusal rate 20% vs stable 0%" in result.reason
    assert len(result.reason) < 2000  # examples cut, not whole prompts
    assert size < 2_000_000, f"history {size} bytes"
