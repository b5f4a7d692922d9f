"""The quality gates' activities: the golden set asked of the new version's and stable's own
Services and graded here (JSON Schema needs ``jsonschema``), the pairs of mirrored requests read
from their recorder and counted here (only the counts go back to the workflow), and the model's current golden set from the registry."""

from __future__ import annotations

import httpx
import jsonschema
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.clients.vllm import VllmClient, service_url
from activities.quality.golden_sets import golden_history
from activities.quality.shadow_pairs import ShadowPairsClient
from activities.registry.store import Registry
from workflows.core.naming import DeploymentRef
from workflows.core.verdicts import CaseResult
from workflows.quality import contract
from workflows.quality.contract import (
    JUDGE_SHADOW_PAIRS,
    READ_GOLDEN_SET,
    READ_SHADOW_PAIRS,
    RUN_GOLDEN_SET,
    GoldenRunInput,
    GoldenRunResult,
    GoldenSetFound,
    GoldenSetInput,
    ShadowJudgeInput,
    ShadowJudgement,
    ShadowPairsInput,
    ShadowPairsResult,
)
from workflows.quality.golden_set import grade
from workflows.quality.shadow import ShadowPair, ShadowTally, tally


SHADOW_PAGE = 1000  # pairs asked of the recorder at a time
SHADOW_READ_MAX = 100_000  # pairs counted in one activity (the rest: next window)


class QualityActivities(contract.QualityActivities):
    """One instance per worker, thread-safe."""

    def __init__(self, vllm: VllmClient, service_url_template: str, registry: Registry, shadow: ShadowPairsClient | None = None) -> None:
        """``shadow``: where mirrored answers are recorded (None: the shadow gate cannot run)."""
        self.vllm = vllm
        self.service_url_template = service_url_template
        self.registry = registry
        self.shadow = shadow or ShadowPairsClient(None)

    @activity.defn(name=RUN_GOLDEN_SET)
    def run_golden_set(self, req: GoldenRunInput) -> GoldenRunResult:
        """Every case to the new version's and stable's own Services (temperature 0, so a version
        answers a prompt the same way each time), graded here (JSON Schema needs ``jsonschema``)."""
        golden = req.golden
        bodies = [
            {"prompt": case.prompt, "max_tokens": case.max_tokens or golden.max_tokens, "temperature": 0, "model": req.model}
            for case in golden.cases
        ]
        versions = [req.version] + ([req.stable_version] if req.stable_version else [])
        graded: list[list[CaseResult]] = []
        for version in versions:
            url = service_url(self.service_url_template, req.deployment, version)
            answers = self.vllm.answers(url, bodies, lambda done: activity.heartbeat({"version": version, "done": done}))
            results = []
            for case, (text, error) in zip(golden.cases, answers):
                if text is None:
                    results.append(CaseResult(id=case.id, passed=False, failures=[f"request failed: {error}"]))
                else:
                    results.append(grade(case, text, schema_problem))
            graded.append(results)
        return GoldenRunResult(new=graded[0], stable=graded[1] if len(graded) > 1 else None)

    @activity.defn(name=READ_SHADOW_PAIRS)
    def read_shadow_pairs(self, req: ShadowPairsInput) -> ShadowPairsResult:
        """Pairs recorded for the route since ``after`` in which the canary is ``version`` and the
        user's answer came from ``stable_version`` (others, e.g. of an earlier rollout, skipped).
        Runs from before the shadow-tally patch only: newer ones call judge_shadow_pairs."""
        pairs, last, _ = self._page(req.deployment, req.version, req.stable_version, req.after)
        return ShadowPairsResult(pairs=pairs, last=last)

    @activity.defn(name=JUDGE_SHADOW_PAIRS)
    def judge_shadow_pairs(self, req: ShadowJudgeInput) -> ShadowJudgement:
        """Every pair recorded since ``after`` (page by page, at most SHADOW_READ_MAX), counted here:
        the workflow gets the counts and a few cut examples, never the user's traffic."""
        counted, after, read = ShadowTally(), req.after, 0
        while read < SHADOW_READ_MAX:
            pairs, last, page = self._page(req.deployment, req.version, req.stable_version, after)
            counted = counted.merged(tally(pairs, req.structured))
            read += page
            if page < SHADOW_PAGE or last <= after:
                after = max(after, last)
                break
            after = last
        return ShadowJudgement(tally=counted, read=read, last=after)

    def _page(self, ref: DeploymentRef, version: str, stable_version: str, after: int) -> tuple[list[ShadowPair], int, int]:
        """One page from the recorder: this rollout's pairs, the last sequence number, and how many were read."""
        if self.shadow.url_template is None:
            raise ApplicationError(
                "shadow comparison asked for, but TIDEPLANE_SHADOW_PAIRS_URL is not set (where mirrored answers are recorded)",
                type="ShadowNotConfigured",
                non_retryable=True,
            )
        try:
            doc = self.shadow.pairs(ref.namespace, ref.name, after, limit=SHADOW_PAGE)
        except httpx.HTTPError as exc:
            raise ApplicationError(f"reading shadow pairs of {ref}: {exc!r}") from exc
        recorded = doc.get("pairs", [])
        pairs = [
            ShadowPair(seq=p["seq"], prompt=p["prompt"], stable_answer=p["stable_answer"], canary_answer=p["canary_answer"])
            for p in recorded
            if p.get("canary_version") == version and p.get("stable_version") == stable_version
        ]
        return pairs, int(doc.get("last", after)), len(recorded)

    @activity.defn(name=READ_GOLDEN_SET)
    def read_golden_set(self, req: GoldenSetInput) -> GoldenSetFound:
        history = golden_history(self.registry, req.model)
        return GoldenSetFound(current=history.current if history else None)


def schema_problem(instance: object, schema: dict) -> str | None:
    """JSON Schema validation for quality.grade: the first error's message and path, or None."""
    try:
        jsonschema.validate(instance, schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        return f"{exc.message}" + (f" at /{where}" if where else "")
    except jsonschema.SchemaError as exc:
        return f"the golden set's schema is invalid: {exc.message}"
    return None
