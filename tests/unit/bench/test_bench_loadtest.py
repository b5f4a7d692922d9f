"""A replica's capacity from a load test of the engine model (benchmarks.loadtest)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from benchmarks import loadtest
from infra.fleetmodel.fleet import FleetConfig
from infra.fleetmodel.sizes import SizeMix, TokenDist, fixed

CFG = FleetConfig(step_s=15.0)


def test_capacity_is_the_highest_load_within_the_ttft_slo():
    capacity = loadtest.load_test_capacity(CFG, fixed(500, 200))
    assert loadtest.within_slo(CFG, fixed(500, 200), capacity)
    assert not loadtest.within_slo(CFG, fixed(500, 200), capacity * 1.03)


def test_longer_prompts_or_a_tighter_slo_lower_the_capacity():
    base = loadtest.load_test_capacity(CFG, fixed(500, 200))
    assert loadtest.load_test_capacity(CFG, fixed(4000, 200)) < base
    assert loadtest.load_test_capacity(replace(CFG, ttft_slo_s=0.05), fixed(500, 200)) < base


def test_pooled_sizes_weigh_the_span_s_windows_alike():
    short, long = TokenDist.of({100: 1.0}), TokenDist.of({900: 1.0})
    mix = SizeMix(600.0, (short, long, long), (short, short, short), "test")
    pooled = loadtest.pooled_sizes(mix, 0, 1200)  # the first two windows only
    assert pooled.at(0)[0].mean() == pytest.approx(500.0)
    assert pooled.at(10**6)[0].mean() == pytest.approx(500.0)
