"""Everything one ModelRollout run knows, in one object: what it was asked, where it stands, what
the operator asked of it and what it measured. Every step (workflows/rollout/steps/) reads and
writes this ``RunState``; the query, the web UI's current details and the result are read from it.

Plain state and what follows from it alone (no activity, no timer): the steps act, this records.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime

from temporalio import workflow

from workflows.core.batching_settings import SweepRecord
from workflows.core.naming import DeploymentRef
from workflows.core.transfer import DownloadProgress
from workflows.core.verdicts import GoldenVerdict
from workflows.core.versions import VersionInfo
from workflows.node_cache.contract import NodeCacheProgress
from workflows.quality.shadow import ShadowPair, ShadowTally, ShadowVerdict
from workflows.rollout.batching import SweepChoice
from workflows.rollout.contract import Benchmark, RouteMirror, StagedWeights
from workflows.rollout.diagnosis import Diagnosis
from workflows.rollout.gates import StepAnalysis, canary_replicas
from workflows.rollout.types import (
    Outcome,
    PromoteInput,
    RolloutInput,
    RolloutResult,
    RolloutStatus,
    Stage,
    VerdictRecord,
)

# Once here, pause and abort are ignored: traffic is fully on the new version or already going back.
FINISHING = (Stage.PROMOTED, Stage.ROLLING_BACK, Stage.ROLLED_BACK)


@dataclass
class RunState:
    input: RolloutInput
    ref: DeploymentRef
    stage: Stage
    stage_since: datetime
    in_registry: bool  # weights came from the registry: keep the version's registry status current
    target_replicas: int  # the promoted version's size (the stable's, unless the input says)
    weight: int = 0  # the new version's route weight, as last set
    max_weight: int = 0
    step: int | None = None  # index into input.steps of the current canary step
    stable: VersionInfo | None = None
    canary_replicas: int = 0
    cluster_changed: bool = False  # something of this rollout is in the cluster: a failure rolls back
    in_flight: asyncio.Future | None = None  # a forward cluster change still running
    ended_in: str | None = None  # stage label where a rollback started
    timings: dict[str, float] = field(default_factory=dict)
    telemetry: list[asyncio.Future] = field(default_factory=list)  # metrics activities of runs recorded before the meter
    notices: list[asyncio.Future] = field(default_factory=list)  # notice deliveries, drained before the run returns
    # what the operator asked (signals and the promote update)
    paused: bool = False
    pause_reason: str | None = None
    abort_reason: str | None = None
    promote: PromoteInput | None = None
    # what the steps found and measured
    staged: StagedWeights | None = None
    download: DownloadProgress | None = None  # stage_weights' last report (its staging_progress signal)
    nodes: list[NodeCacheProgress] = field(default_factory=list)  # pre-staging progress per node
    adapters: dict[str, str] | None = None  # None: no adapter to carry; else those carried to this version
    cold_start: float | None = None
    benchmark: Benchmark | None = None
    batching: SweepChoice | None = None
    sweep: SweepRecord | None = None
    golden: GoldenVerdict | None = None
    canary_since: datetime | None = None
    analysis: StepAnalysis = field(default_factory=StepAnalysis)
    verdicts: list[VerdictRecord] = field(default_factory=list)  # the latest, bounded (VERDICT_HISTORY)
    verdict_count: int = 0  # every observation
    diagnosis: Diagnosis | None = None  # the last observation's cause
    holding: str | None = None  # why the analysis clock is held or the canary re-sized (None: it runs)
    resizes: int = 0  # overload re-sizes of the current step
    mirror: RouteMirror | None = None  # set once the shadow comparison starts
    shadow: ShadowVerdict | None = None
    shadow_after: int = 0  # last mirrored pair read
    shadow_pairs: list[ShadowPair] = field(default_factory=list)  # the current window's pairs (before shadow-tally)
    shadow_tally: ShadowTally = field(default_factory=ShadowTally)  # the current window's counts
    shadow_passed: bool = False  # some window's comparison passed

    @classmethod
    def start(cls, input: RolloutInput) -> RunState:
        return cls(
            input=input,
            ref=input.ref,
            stage=Stage.RESOLVING if input.weights_uri is None else Stage.STAGING,
            stage_since=workflow.now(),
            in_registry=input.weights_uri is None,
            target_replicas=input.replicas or 1,
        )

    @property
    def finishing(self) -> bool:
        return self.stage in FINISHING

    def follow_total(self, live: int | None) -> None:
        """The promoted size follows the stable's live total (the scaling loop's); a size the input
        fixed stays, and an unreadable or empty stable keeps the last total."""
        if self.input.replicas is None and live:
            self.target_replicas = live

    def share(self, weight: int) -> int:
        """Replicas the canary needs to carry ``weight`` % of the promoted size."""
        return canary_replicas(self.target_replicas, weight)

    def query_variables(self) -> dict[str, str]:
        """The ${...} variables of the gate and fleet queries (GateQueries, FleetQueries)."""
        assert self.stable is not None
        return {
            "namespace": self.ref.namespace,
            "deployment": self.ref.name,
            "model": self.input.model,
            "version": self.input.version,
            "stable_version": self.stable.version,
            "window": self.input.query_window,
        }

    def stage_label(self, weight: int) -> str:
        """Stage as the metrics name it: ``canary-5`` inside the ladder, else the stage."""
        in_ladder = self.step is not None and self.stage in (Stage.CANARY, Stage.PAUSED)
        return f"canary-{weight}" if in_ladder else self.stage.value

    def mirror_for(self, weights: dict[str, int]) -> RouteMirror | None:
        """Mirror only while the new version is a canary: not once promoted, never on the way back."""
        if self.mirror is None or weights.get(self.input.version, 0) >= 100 or self.finishing:
            return None
        return self.mirror

    def all_timings(self) -> dict[str, float]:
        timings = dict(self.timings)
        if self.cold_start is not None:
            timings["cold_start"] = self.cold_start
        return timings

    def details(self, note: str = "") -> str:
        """Current details in the UI: stage, weight, the last verdict with its numbers."""
        inp = self.input
        head = f"**{self.stage.value}** · {inp.model} {inp.version} → {inp.deployment} · **{self.weight} %**"
        if self.step is not None:
            head += f" (step {self.step + 1}: {' → '.join(str(s.weight) for s in inp.steps)})"
        lines = [head]
        if self.stable is not None:
            lines.append(f"stable: {self.stable.version} ({self.target_replicas} replicas)")
        if self.paused:
            lines.append(f"⏸ paused: {self.pause_reason} — signal `resume` / `abort`, or update `promote`")
        if self.holding:
            lines.append(f"⚠ {self.holding}")
        if note:
            lines.append(note)
        if self.download is not None and self.stage is Stage.STAGING:
            lines.append(self.download.describe())
        lines += [v.describe() for v in (self.golden, self.shadow) if v is not None]
        if self.nodes:
            lines.append("nodes: " + ", ".join(n.describe() for n in self.nodes))
        if self.verdicts:
            last = self.verdicts[-1]
            lines.append(
                f"verdict {self.verdict_count} at {last.weight} % ({last.at:%Y-%m-%d %H:%M:%S} UTC):"
                f" {last.evaluation.describe()}"
            )
            a = self.analysis
            lines.append(
                f"step: {a.passes} pass, {a.failures} fail, {a.inconclusives} inconclusive, {a.errors} metric errors"
            )
            if last.diagnosis is not None:
                lines.append(f"cause: {last.diagnosis.describe()}")
        return "\n\n".join(lines)

    def status(self) -> RolloutStatus:
        return RolloutStatus(
            deployment=self.input.deployment,
            version=self.input.version,
            stable_version=self.stable.version if self.stable else None,
            stage=self.stage,
            weight=self.weight,
            step=self.step,
            steps=[s.weight for s in self.input.steps],
            paused=self.paused,
            pause_reason=self.pause_reason if self.paused else None,
            analysis=self.analysis,
            last_verdict=self.verdicts[-1] if self.verdicts else None,
            verdicts=self.verdicts,
            timings=self.all_timings(),
            golden=self.golden,
            shadow=self.shadow,
            batching=self.batching,
            nodes=self.nodes,
            replicas=self.replicas(),
            diagnosis=self.diagnosis,
            holding=self.holding,
            download=self.download,
        )

    def replicas(self) -> dict[str, int]:
        """Replicas by version as this run last sized them (the cluster's own count may lag)."""
        sized: dict[str, int] = {}
        if self.stable is not None:
            sized[self.stable.version] = 0 if self.stage is Stage.PROMOTED else self.target_replicas
        if self.stage is Stage.PROMOTED:
            sized[self.input.version] = self.target_replicas
        elif self.canary_replicas or self.step is not None:
            sized[self.input.version] = self.canary_replicas
        return sized

    def result(self, outcome: Outcome, reason: str) -> RolloutResult:
        return RolloutResult(
            deployment=self.input.deployment,
            version=self.input.version,
            previous_version=self.stable.version if self.stable else None,
            outcome=outcome,
            reason=reason,
            weight_reached=self.max_weight,
            cold_start_seconds=self.cold_start,
            benchmark=self.benchmark,
            staged=self.staged,
            timings=self.all_timings(),
            golden=self.golden,
            shadow=self.shadow,
            batching=self.batching,
        )
