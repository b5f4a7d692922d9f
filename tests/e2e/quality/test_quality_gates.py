"""Quality gates end to end in the sandbox: a release that is fast and error-free but wrong on a
must-pass golden case is stopped at warm-up and never gets traffic; one whose everyday answers
drift is rolled back by the shadow comparison of mirrored live requests; a good one passes both.

Real parts only: the golden set is stored with ``tideplane registry golden set`` (a subprocess),
rollouts start with the ``temporal`` CLI and run in a ``tideplane worker`` process, the fleet
simulator answers per version from its profile (infra/sandbox/answers.py) and honours the
HTTPRoute's RequestMirror filter. Three namespaces roll out at once, one stable replica each.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client

from infra.sandbox.config import Demand, Profile
from infra.sandbox.knobs import set_demand, set_profile
from infra.sandbox.launcher import REPO
from tests.e2e.rollout.test_rollout import (
    GOOD_PROFILE,
    IMAGE,
    NAME,
    ROUTE_API,
    STABLE,
    Followed,
    clean_up,
    follow,
    route_weights,
    rollout_input,
    temporal_start,
)
from tests.sandbox_fixtures import create_logical_deployment, wait_until
from workflows.core.naming import versioned_name
from workflows.registry.schema import Manifest
from workflows.rollout.types import Outcome

MODEL = "e2e-qa-llm"
NS_GOOD, NS_WRONG, NS_DRIFT = "e2e-qa-good", "e2e-qa-wrong", "e2e-qa-drift"
GOOD, WRONG, DRIFT = "1.1.0", "1.3.0", "1.4.0"
GOLDEN = REPO / "infra" / "sandbox" / "golden.yaml"
MUST_PASS = "paracetamol-max-dose"
SHADOW = {"percent": 50, "thresholds": {"min_pairs": 10}}
RPS = 4.0


def tideplane(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *argv], cwd=REPO, env={**os.environ, **env},
        capture_output=True, text=True, timeout=60,
    )


@dataclass
class Run:
    followed: Followed
    canary_weights: list[int]  # every weight the new version had on the route, as polled
    mirrors: list[dict]  # every RequestMirror filter seen on the route
    final_route: dict
    manifest: Manifest


async def watch_route(custom: client.CustomObjectsApi, namespace: str, version: str, run: dict, done: asyncio.Event) -> None:
    service = versioned_name(NAME, version)
    while not done.is_set():
        try:
            route = await asyncio.to_thread(custom.get_namespaced_custom_object, *ROUTE_API, namespace, "httproutes", NAME)
        except client.ApiException:
            route = None
        if route is not None:
            run["weights"].append(route_weights(route).get(service, 0))
            rule = route["spec"]["rules"][0]
            run["mirrors"] += [f for f in rule.get("filters") or [] if f.get("type") == "RequestMirror"]
        await asyncio.sleep(0.2)


@pytest.fixture(scope="module")
async def runs(sandbox, kube, registry, worker, temporal, tmp_path_factory) -> dict[str, Run]:
    weights = tmp_path_factory.mktemp("qa-weights")
    set_profile(kube, MODEL, STABLE, GOOD_PROFILE)
    profiles = {
        GOOD: GOOD_PROFILE,
        WRONG: GOOD_PROFILE.model_copy(update={"golden_failures": ["paracetamol"]}),
        DRIFT: GOOD_PROFILE.model_copy(update={"drift": 0.5}),
    }
    for version in (STABLE, *profiles):
        path = weights / version / "model.safetensors"
        path.parent.mkdir(parents=True)
        path.write_bytes(version.encode() * 1024)
        registry.register(MODEL, version, str(path), image=IMAGE)
    for version, profile in profiles.items():
        set_profile(kube, MODEL, version, profile)
    stored = tideplane(sandbox.env, "registry", "golden", "set", MODEL, str(GOLDEN))
    assert stored.returncode == 0, stored.stderr
    assert "revision 1, 6 cases (1 must pass)" in stored.stdout, stored.stdout
    again = tideplane(sandbox.env, "registry", "golden", "set", MODEL, str(GOLDEN))
    assert "unchanged: revision 1" in again.stdout, again.stdout

    namespaces = {NS_GOOD: GOOD, NS_WRONG: WRONG, NS_DRIFT: DRIFT}
    custom = client.CustomObjectsApi(kube)
    with ExitStack() as stack:
        for namespace in namespaces:
            create_logical_deployment(kube, namespace, NAME, STABLE, MODEL, 1)
            set_demand(kube, f"{namespace}/{NAME}", Demand(rps=RPS))
            stack.callback(clean_up, kube, namespace)
        apps = client.AppsV1Api(kube)
        wait_until(
            lambda: all((apps.read_namespaced_deployment(versioned_name(NAME, STABLE), ns).status.ready_replicas or 0) >= 1 for ns in namespaces),
            30, "the stable versions to be Ready",
        )
        seen = {ns: {"weights": [], "mirrors": []} for ns in namespaces}
        done = asyncio.Event()
        watchers = [asyncio.ensure_future(watch_route(custom, ns, v, seen[ns], done)) for ns, v in namespaces.items()]
        for namespace, version in namespaces.items():
            inp = {**rollout_input(f"{namespace}/{NAME}", MODEL, version), "shadow": SHADOW}
            started = await asyncio.to_thread(temporal_start, sandbox.urls["temporal"], inp)
            assert started.returncode == 0, started.stderr
        try:
            followed = await asyncio.wait_for(
                asyncio.gather(*(follow(temporal, f"{ns}/{NAME}", apps, STABLE) for ns in namespaces)), timeout=150
            )
        finally:
            done.set()
            await asyncio.gather(*watchers)
        return {
            ns: Run(
                f, seen[ns]["weights"], seen[ns]["mirrors"],
                custom.get_namespaced_custom_object(*ROUTE_API, ns, "httproutes", NAME), registry.show(MODEL, v),
            )
            for (ns, v), f in zip(namespaces.items(), followed)
        }


def test_wrong_on_a_must_pass_case_never_gets_traffic(runs):
    run = runs[NS_WRONG]
    result = run.followed.result
    assert result.outcome is Outcome.ROLLED_BACK, result.reason
    assert MUST_PASS in result.reason and "golden set failed at warm-up" in result.reason
    assert result.weight_reached == 0 and set(run.canary_weights) == {0}
    assert result.golden is not None and result.golden.must_pass_failed == [MUST_PASS]
    assert result.golden.stable_pass_rate == 1.0 and result.golden.new_pass_rate < 1.0
    (example,) = result.golden.examples
    assert "8 grams" in example.answer and "contains: missing ['4 grams']" in example.failures
    assert not run.mirrors, "the shadow comparison starts only after the golden set passed"
    # Recorded in the registry with the benchmark, naming the case.
    (recorded,) = [b for b in run.manifest.benchmarks if b.golden is not None]
    assert recorded.dataset == "golden set r1" and recorded.golden.failing_cases == [MUST_PASS]
    assert not recorded.golden.passed


def test_drifting_answers_rolled_back_by_the_shadow_gate(runs):
    run = runs[NS_DRIFT]
    result = run.followed.result
    assert result.outcome is Outcome.ROLLED_BACK, result.reason
    assert result.golden is not None and result.golden.passed  # the facts are right
    assert "shadow comparison failed at 5 %" in result.reason and "exact agreement" in result.reason
    assert result.weight_reached == 5
    shadow = result.shadow
    assert shadow is not None and shadow.verdict == "fail" and shadow.measures.pairs >= 10
    assert shadow.measures.exact_agreement < 0.9 and shadow.examples
    assert all(p.stable_answer != p.canary_answer for p in shadow.examples)
    # The route mirrored to the canary while it was one, and the mirror went with the rollback.
    drift_service = versioned_name(NAME, DRIFT)
    assert run.mirrors and {m["requestMirror"]["backendRef"]["name"] for m in run.mirrors} == {drift_service}
    assert {m["requestMirror"]["percent"] for m in run.mirrors} == {SHADOW["percent"]}
    rule = run.final_route["spec"]["rules"][0]
    assert not rule.get("filters")
    assert route_weights(run.final_route) == {versioned_name(NAME, STABLE): 100, drift_service: 0}


def test_good_release_passes_both_quality_gates(runs):
    run = runs[NS_GOOD]
    result = run.followed.result
    assert result.outcome is Outcome.PROMOTED, result.reason
    assert result.golden is not None and result.golden.passed and result.golden.new_pass_rate == 1.0
    assert result.shadow is not None and result.shadow.verdict == "pass", result.shadow
    assert run.mirrors  # it was compared, not waved through
    assert not run.final_route["spec"]["rules"][0].get("filters")  # promoted: no mirror left
    (recorded,) = [b for b in run.manifest.benchmarks if b.golden is not None]
    assert recorded.golden.passed


def test_golden_show_prints_the_stored_set(sandbox, runs):
    shown = tideplane(sandbox.env, "registry", "golden", "show", MODEL, "--json")
    assert shown.returncode == 0, shown.stderr
    assert [c["id"] for c in json.loads(shown.stdout)["cases"]][3] == MUST_PASS


def test_golden_set_bad_input_is_refused_with_the_field(sandbox, runs, tmp_path):
    """README bad-input rows: a check of two kinds, a model not in the registry; nothing stored."""
    bad = tmp_path / "golden.yaml"
    bad.write_text('cases: [{id: a, prompt: "2 + 2", checks: [{exact: "4", regex: "4"}]}]\n')
    refused = tideplane(sandbox.env, "registry", "golden", "set", MODEL, str(bad))
    assert refused.returncode == 1
    assert f"error: golden set {bad}: cases.0.checks.0: Value error, a check has exactly one of exact, normalised, regex, " \
        "json_schema, contains, not_contains, number; got ['exact', 'regex']" in refused.stderr
    unknown = tideplane(sandbox.env, "registry", "golden", "set", "no-such-model", str(GOLDEN))
    assert unknown.returncode == 1
    assert "error: model 'no-such-model' is not in the registry (register a version first)" in unknown.stderr
    shown = tideplane(sandbox.env, "registry", "golden", "show", MODEL)
    assert "revision 1 of 1" in shown.stdout, shown.stdout
