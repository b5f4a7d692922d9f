"""SpotHedge-style mix policy and the return-to-spot stabilisation rule."""

import pytest

from workflows.spot.policy import (
    MIN_PREEMPTION_RATE,
    ZoneMarket,
    _survival,
    on_demand_needed,
    plan_mix,
    preemption_rate,
    return_to_spot,
    stabilisation_delay,
)

OD = 10.0  # on-demand $/replica-hour
SPOT = 3.0


def zones(*rates, price=SPOT):
    return [ZoneMarket(f"z{i}", r, price) for i, r in enumerate(rates)]


def test_reliable_spot_needs_no_hedge():
    plan = plan_mix(4, 0.99, zones(0.0, 0.0), OD, min_preemption_rate=0.0)
    assert plan.on_demand == 0 and plan.spot == 4 and plan.overprovision == 0
    assert plan.availability == pytest.approx(1.0)
    assert plan.cost_per_hour == pytest.approx(4 * SPOT)


def test_a_zone_never_preempted_recently_is_not_certain():
    # without the floor, one zone with no recent preemption would get every replica (no hedge)
    plan = plan_mix(8, 0.99, zones(0.0, 0.0, 0.0, 0.0), OD)
    assert MIN_PREEMPTION_RATE == 0.02
    assert len(plan.spot_per_zone) >= 2 and max(plan.spot_per_zone.values()) < 8
    assert plan.overprovision > 0 and plan.on_demand == 0
    assert plan.availability >= 0.99  # computed at the floor rate, not at 0
    assert _survival([(8, 0.02)])[8] < 0.99  # why one zone cannot do it


def test_zones_chosen_by_expected_cost_per_available_replica():
    # the never-preempted zone is 4.7x the price: a hedge over cheap, slightly shakier zones wins
    markets = [ZoneMarket("reliable-pricey", 0.0, 8.74)] + [ZoneMarket(f"cheap{i}", 0.05, 1.86) for i in range(3)]
    plan = plan_mix(8, 0.99, markets, OD)
    assert "reliable-pricey" not in plan.spot_per_zone
    assert plan.availability >= 0.99 and plan.on_demand == 0
    assert plan.cost_per_hour < 8 * 8.74
    # a cheap zone that is gone most of the time costs more per available replica than its price
    flaky = [ZoneMarket("flaky", 0.6, 1.5), ZoneMarket("steady", 0.05, 2.0), ZoneMarket("steady2", 0.05, 2.0)]
    assert "flaky" not in plan_mix(2, 0.9, flaky, OD).spot_per_zone


def test_overprovisions_across_zones_instead_of_on_demand():
    plan = plan_mix(4, 0.99, zones(0.05, 0.05, 0.05, 0.05), OD)
    assert plan.on_demand == 0
    assert plan.overprovision > 0, "one zone failing must not take the fleet below target"
    assert len(plan.spot_per_zone) >= 2, "replicas spread over zones"
    assert plan.availability >= 0.99
    assert plan.cost_per_hour < 4 * OD


def test_unreliable_spot_falls_back_to_on_demand():
    plan = plan_mix(4, 0.999, zones(0.6, 0.7), OD)
    assert plan.on_demand == 4 and plan.spot == 0 and plan.cost_per_hour == pytest.approx(4 * OD)


def test_mixed_base_when_spot_is_cheap_but_shaky():
    plan = plan_mix(4, 0.95, zones(0.2, 0.2, 0.2), OD, max_overprovision=2)
    assert 0 < plan.on_demand < 4 and plan.spot > 0
    assert plan.availability >= 0.95
    assert plan.cost_per_hour < 4 * OD


def test_preempted_zones_are_avoided_and_reliable_zones_preferred():
    markets = [ZoneMarket("bad", 0.0, 1.0, available=False), ZoneMarket("shaky", 0.3, 1.0), ZoneMarket("good", 0.01, 1.0)]
    plan = plan_mix(2, 0.9, markets, OD)
    assert "bad" not in plan.spot_per_zone
    assert plan.spot_per_zone.get("good", 0) >= plan.spot_per_zone.get("shaky", 0)


def test_no_zones_or_zero_target():
    assert plan_mix(3, 0.99, [], OD).on_demand == 3
    zero = plan_mix(0, 0.99, zones(0.1), OD)
    assert zero.on_demand == 0 and zero.spot == 0 and zero.cost_per_hour == 0


def test_higher_target_never_cheaper():
    markets = zones(0.1, 0.15, 0.2)
    costs = [plan_mix(4, a, markets, OD).cost_per_hour for a in (0.5, 0.9, 0.99, 0.999)]
    assert costs == sorted(costs)


@pytest.mark.parametrize("bad", [(-1, 0.9, 0.02), (2, 1.5, 0.02), (2, -0.1, 0.02), (2, 0.9, 1.5)])
def test_bad_input(bad):
    with pytest.raises(ValueError):
        plan_mix(bad[0], bad[1], zones(0.1), OD, min_preemption_rate=bad[2])


def test_survival_matches_enumeration():
    # two zones: 2 replicas at p=0.1, 1 replica at p=0.5
    s = _survival([(2, 0.1), (1, 0.5)])
    assert s[0] == pytest.approx(1.0)
    assert s[1] == pytest.approx(1 - 0.1 * 0.5)
    assert s[2] == pytest.approx(0.9)
    assert s[3] == pytest.approx(0.9 * 0.5)


def test_fallback_covers_the_spot_shortfall():
    assert on_demand_needed(4, 4) == 0
    assert on_demand_needed(4, 1) == 3
    assert on_demand_needed(4, 6, base=1) == 1


def test_preemption_rate_window():
    assert preemption_rate([0, 0, 1, 1], 2) == 1.0
    assert preemption_rate([0, 0, 1, 1], 4) == 0.5
    assert preemption_rate([], 5) == 0.0


def test_stabilisation_doubles_with_flaps_and_caps():
    assert stabilisation_delay(300, 0, 3600) == 300
    assert stabilisation_delay(300, 2, 3600) == 1200
    assert stabilisation_delay(300, 10, 3600) == 3600


def test_return_to_spot_needs_the_whole_delay():
    assert not return_to_spot(None, 1000, 300)
    assert not return_to_spot(800, 1000, 300)
    assert return_to_spot(700, 1000, 300)


def test_a_notice_lives_until_its_instance_is_gone_and_a_rebalance_for_its_hold():
    from datetime import UTC, datetime, timedelta

    from workflows.spot.events import NoticeKind, SpotNotice
    from workflows.spot.policy import notice_expiry, notice_key, rebalance_hold

    t = datetime(2026, 1, 1, tzinfo=UTC)
    warn = SpotNotice(kind=NoticeKind.INTERRUPTION, instance_id="i-0123456789abcdef0", event_id="a", time=t, action="terminate")
    gone = SpotNotice(kind=NoticeKind.STATE_CHANGE, instance_id="i-0123456789abcdef0", event_id="b", time=t, state="shutting-down")
    hint = SpotNotice(kind=NoticeKind.REBALANCE, instance_id="i-0123456789abcdef0", event_id="c", time=t)
    assert notice_expiry(warn, 300) == t + timedelta(seconds=120)
    assert notice_expiry(gone, 300) == t + timedelta(seconds=120), "a going-away state still absorbs its repeats"
    assert notice_expiry(hint, rebalance_hold(None, 300)) == t + timedelta(seconds=300)
    assert len({notice_key(warn), notice_key(gone), notice_key(hint)}) == 3, "an interruption after a rebalance is news"
    assert notice_key(warn) == notice_key(warn.model_copy(update={"event_id": "other"}))
    assert rebalance_hold(900, 300) == 900


def test_workflows_and_the_benchmark_call_the_same_policy_functions():
    """The benchmark's figures are for the code that runs: the same function objects, not copies."""
    import benchmarks.spot as bench
    import workflows.scaling.loop as loop
    import workflows.spot.mix as mix
    import workflows.spot.reclaim as reclaim
    import workflows.spot.return_to_spot as back
    import workflows.spot.watcher as watcher
    from workflows.spot import policy

    used = {
        reclaim: ["on_demand_needed", "preemption_predicted", "DomainRisk", "rebalance_hold"],
        back: ["on_demand_needed", "on_demand_target", "stabilisation_delay"],
        watcher: ["notice_expiry", "notice_key", "rebalance_hold"],
        mix: ["plan_mix", "preemption_rate", "ZoneMarket"],
        loop: ["warm_pool_needed"],
        bench: ["on_demand_needed", "on_demand_target", "preemption_predicted", "preemption_rate", "warm_pool_needed", "DomainRisk"],
    }
    for module, names in used.items():
        for name in names:
            assert getattr(module, name) is getattr(policy, name), f"{module.__name__}.{name}"
    # the scaling loop's spot mix and the benchmark plan with the same function, fed the same way
    for name in ("plan_spot_mix", "observe", "markets", "SpotMixPolicy"):
        assert getattr(loop, name) is getattr(mix, name), f"loop.{name}"
    for name in ("plan_spot_mix", "observe", "markets", "SpotMixPolicy", "DomainNow"):
        assert getattr(bench, name) is getattr(mix, name), f"bench.{name}"
    # what the workflows decide with, the benchmark decides with too
    assert {"on_demand_needed", "on_demand_target", "preemption_predicted"} <= set(used[bench])


def test_on_demand_covers_replicas_at_risk_ahead_of_their_loss():
    assert on_demand_needed(8, 10, at_risk=4) == 2, "two spare spot replicas absorb part of the loss"
    assert on_demand_needed(8, 12, at_risk=4) == 0
    assert on_demand_needed(8, 8, at_risk=0, base=1) == 1


def test_on_demand_grows_at_once_and_shrinks_after_the_stabilisation_delay():
    from workflows.spot.policy import on_demand_target

    assert on_demand_target(held=1, need=3, healthy_since=None, now=0, stabilisation_seconds=300, flaps=0, max_stabilisation_seconds=3600) == 3
    assert on_demand_target(3, 0, healthy_since=100, now=399, stabilisation_seconds=300, flaps=0, max_stabilisation_seconds=3600) == 3
    assert on_demand_target(3, 0, healthy_since=100, now=400, stabilisation_seconds=300, flaps=0, max_stabilisation_seconds=3600) == 0
    assert on_demand_target(3, 0, healthy_since=100, now=400, stabilisation_seconds=300, flaps=1, max_stabilisation_seconds=3600) == 3


def test_preemption_predicted_by_notice_rebalance_or_a_shaky_domain():
    from workflows.spot.policy import DomainRisk, PrewarmRule, preemption_predicted

    assert preemption_predicted(DomainRisk(notice=True)) and preemption_predicted(DomainRisk(rebalance=True))
    assert not preemption_predicted(DomainRisk(preemption_rate=0.9, launch_failure_rate=0.9)), "off by default"
    rule = PrewarmRule(preemption_rate=0.1, launch_failure_rate=0.5)
    assert preemption_predicted(DomainRisk(preemption_rate=0.1), rule)
    assert preemption_predicted(DomainRisk(launch_failure_rate=0.6), rule)
    assert not preemption_predicted(DomainRisk(preemption_rate=0.05, launch_failure_rate=0.2), rule)


def test_a_domain_holds_no_more_than_its_capacity():
    markets = [ZoneMarket("a", 0.05, SPOT, capacity=2), ZoneMarket("b", 0.05, SPOT, capacity=16), ZoneMarket("c", 0.05, SPOT, capacity=0)]
    plan = plan_mix(8, 0.99, markets, OD)
    assert plan.spot_per_zone.get("a", 0) <= 2 and "c" not in plan.spot_per_zone
    assert plan.availability >= 0.99
    full = plan_mix(4, 0.99, [ZoneMarket("a", 0.05, SPOT, capacity=1)], OD)
    assert full.spot <= 1 and full.on_demand >= 3, "what spot cannot hold goes on demand"


def test_across_regions_the_plan_survives_losing_the_region_holding_the_most():
    # a cheap, steady zone would take all 4 (P = 0.98 >= 0.98): but its region can go in one minute
    markets = [ZoneMarket("east-a", 0.0, 1.0, group="east"), ZoneMarket("east-b", 0.0, 1.2, group="east"),
               ZoneMarket("west-a", 0.0, 1.5, group="west")]
    alone = plan_mix(4, 0.98, markets, OD)
    assert set(alone.spot_per_zone) <= {"east-a", "east-b"}, "without the hedge one region holds every replica"
    hedged = plan_mix(4, 0.98, markets, OD, survive_group_loss=True)
    east = sum(c for z, c in hedged.spot_per_zone.items() if z.startswith("east"))
    west = hedged.spot_per_zone.get("west-a", 0)
    assert min(east, west) + hedged.on_demand >= 4, "either region can go and the target still holds"
    # one region only: nothing to hedge across, the plan is the independent-domain one
    one = [ZoneMarket(z.zone, z.preemption_rate, z.spot_price, group="east") for z in markets[:2]]
    assert plan_mix(4, 0.98, one, OD, survive_group_loss=True) == plan_mix(4, 0.98, one, OD)


def test_the_spot_mix_rates_each_pool_over_its_window_and_names_every_pool():
    from workflows.spot.mix import DomainNow, SpotDomain, SpotMixPolicy, markets, observe, plan_spot_mix, replicas_per_pool

    mix = SpotMixPolicy(domains=[SpotDomain(pool="a", zone="z-a", instance_type="t", spot_price=1.0),
                                 SpotDomain(pool="b", zone="z-b", instance_type="t", spot_price=1.5)],
                        on_demand_price=4.0, window_samples=4)
    history: dict[str, list[int]] = {}
    for available in (False, False, True, True, True):  # pool a lost twice, long ago; pool b always there
        history = observe(history, [DomainNow(pool="a", available=available, capacity=8), DomainNow(pool="b", available=True, capacity=8)], 4)
    assert history == {"a": [1, 0, 0, 0], "b": [0, 0, 0, 0]}  # the last 4 samples, 1 = unavailable
    now = [DomainNow(pool="a", available=True, capacity=8), DomainNow(pool="b", available=False, capacity=0)]
    rated = {m.zone: m for m in markets(mix, now, history)}
    assert rated["t/z-a"].preemption_rate == 0.25 and not rated["t/z-b"].available
    plan = plan_spot_mix(6, mix, now, history)
    assert replicas_per_pool(plan, mix) == {"a": plan.spot, "b": 0}  # nothing on the pool that is gone


def test_the_warm_pool_covers_the_worst_group_loss_beyond_the_base_and_spare():
    from workflows.spot.policy import MixPlan, ZoneMarket, warm_pool_needed

    zones = [ZoneMarket("a", 0.1, 1.0, group="r1"), ZoneMarket("b", 0.1, 1.0, group="r1"), ZoneMarket("c", 0.1, 1.0, group="r2")]
    # one region holds 6 of 10 spot replicas: losing it leaves 4 + base 2 of 8, so 2 must start warm
    assert warm_pool_needed(MixPlan(8, {"a": 3, "b": 3, "c": 4}, 2, 0.99, 0.0), zones) == 2
    # all spot in one region (one cluster): the warm pool covers all of the spot share
    assert warm_pool_needed(MixPlan(8, {"a": 4, "b": 4}, 1, 0.99, 0.0), zones) == 7
    assert warm_pool_needed(MixPlan(8, {}, 8, 1.0, 0.0), zones) == 0
