"""The fleet simulator's pure parts: the fleet model's replicas per pod, traffic split, GPU assignment, exposition."""

import random
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from infra.sandbox.config import Demand, Profile
from infra.sandbox.fleet_simulator.cluster import (
    Cluster,
    assign_gpus,
    demand_rps,
    pod_rates,
    profile_for,
)
from infra.sandbox.fleet_simulator.simulator import FleetSimulator
from infra.sandbox.fleet_simulator.replicas import (
    SimulatedReplica,
    engine_of,
)
from workflows.core.naming import GPU_RESOURCE, LABEL_APP, LABEL_MODEL, LABEL_VERSION

PROFILE = Profile(capacity_rps=4, error_rate=0.0, ttft_seconds=0.2, tpot_seconds=0.02, output_tokens=101, prompt_tokens=300)


def pod(name, version, ready=True, node="node-a", gpus=1, namespace="llm-serving", app="chat", model="llama"):
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": {LABEL_APP: app, LABEL_VERSION: version, LABEL_MODEL: model}},
        "spec": {"nodeName": node, "containers": [{"name": "vllm", "resources": {"limits": {GPU_RESOURCE: str(gpus)}}}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def service(name, version, namespace="llm-serving"):
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"selector": {LABEL_APP: "chat", LABEL_VERSION: version}}}


def route(weights, namespace="llm-serving"):
    return {"metadata": {"name": "chat", "namespace": namespace}, "spec": {"rules": [{"backendRefs": [{"name": n, "port": 8000, "weight": w} for n, w in weights.items()]}]}}


def _ttft_mean(replica):
    ttft = replica.histograms["vllm:time_to_first_token_seconds"]
    return ttft.sum / ttft.count


def test_replica_under_capacity_has_no_queue_but_a_busy_gpu():
    replica = SimulatedReplica(PROFILE, random.Random(1))
    served = sum(replica.advance(2.0, 1.0) for _ in range(300))
    assert 540 < served < 660  # Poisson arrivals at 2/s
    assert replica.waiting == 0
    assert 0.15 < _ttft_mean(replica) < 0.4  # a prefill step and some sharing, no queueing
    assert replica.gpu_utilisation > 90  # DCGM: a request is always running at half the capacity
    assert replica.generation_tokens == 101 * served and replica.prompt_tokens == 300 * served


def test_replica_short_of_capacity_queues_and_ttft_rises():
    replica = SimulatedReplica(PROFILE, random.Random(1))
    for _ in range(300):
        replica.advance(8.0, 1.0)  # twice the capacity
    assert replica.running >= 0.9 * engine_of(PROFILE).max_num_seqs  # the batch is full ...
    assert replica.waiting > 300  # ... and what it cannot serve queues behind it (it saturates at 1.5 x 4 req/s)
    assert replica.gpu_utilisation >= 95
    queue = replica.histograms["vllm:request_queue_time_seconds"]
    assert queue.sum / queue.count > 2
    assert 4.5 < replica.success / 300 < 7.0  # served at about 1.5 x capacity_rps (engine_for_service is a mean-field fit)
    for _ in range(1000):  # demand drops: the backlog drains
        replica.advance(0.0, 1.0)
    assert replica.waiting == 0 and replica.running == 0 and replica.gpu_utilisation == 0


def test_calibrated_engine_profile_uses_the_fleet_model_table():
    fast = SimulatedReplica(Profile(engine="llama-3.1-8b/H200x1", error_rate=0.0, prompt_tokens=500, output_tokens=200), random.Random(1))
    for _ in range(60):
        fast.advance(20.0, 1.0)  # what the 4 req/s profile could never serve
    assert fast.waiting == 0 and 1000 < fast.success < 1400
    with pytest.raises(ValueError, match="unknown engine"):
        Profile(engine="gpt-5/TPU")


def test_a_replica_sharing_a_gpu_gets_the_kv_cache_its_claim_leaves():
    profile = Profile(engine="llama-3.1-8b/H200x1")
    whole, third = SimulatedReplica(profile), SimulatedReplica(profile, args=("--model", "/w", "--gpu-memory-utilization", "0.3"))
    # 141 GiB x 0.3 - 2 GiB of activations - 15 GiB of weights = 25 GiB, against 110 GiB at vLLM's default 0.9
    assert 0.2 < third.engine.engine.kv_capacity_tokens / whole.engine.engine.kv_capacity_tokens < 0.25
    with pytest.raises(ValueError, match="do not fit"):
        SimulatedReplica(profile, args=("--gpu-memory-utilization", "0.1"))  # vLLM would not start: no room for a KV cache


def test_errors_are_drawn_per_request_at_the_profile_rate():
    replica = SimulatedReplica(PROFILE.model_copy(update={"error_rate": 0.1}), random.Random(1))
    for _ in range(300):
        replica.advance(3.0, 1.0)
    total = replica.errors + replica.success
    assert 800 < total < 1000
    assert 0.07 < replica.errors / total < 0.13


def test_proxied_request_joins_the_engine_and_counts_once():
    replica = SimulatedReplica(PROFILE, random.Random(1))
    request = replica.submit(prompt_tokens=40, max_tokens=16)
    assert request.finished_s is None
    assert replica.advance(0.0, 5.0) == 1
    assert request.output_tokens == 16 and request.ttft > 0 and request.finished_s > request.first_token_s
    assert replica.success == 1 and request.failed is False
    replica.advance(0.0, 1.0)
    assert replica.histograms["vllm:e2e_request_latency_seconds"].count == 1


def test_profile_lookup_prefers_version_then_model_then_default():
    good, bad, default = Profile(error_rate=0), Profile(error_rate=0.5), Profile(error_rate=0.01)
    profiles = {"llama@2.0.0": bad, "llama": good, "default": default}
    assert profile_for(profiles, "llama", "2.0.0") is bad
    assert profile_for(profiles, "llama", "1.0.0") is good
    assert profile_for(profiles, "mistral", "1") is default
    assert profile_for({}, "mistral", "1") == Profile()


def test_demand_split_by_route_weights_then_ready_pods():
    pods = [pod("v1-a", "1"), pod("v1-b", "1"), pod("v2-a", "2"), pod("v2-b", "2", ready=False)]
    services = [service("chat-v1", "1"), service("chat-v2", "2")]
    rates = pod_rates({"llm-serving/chat": 100}, [route({"chat-v1": 90, "chat-v2": 10})], services, pods)
    assert rates == {("llm-serving", "v1-a"): 45, ("llm-serving", "v1-b"): 45, ("llm-serving", "v2-a"): 10}


def test_backend_without_ready_pods_drops_its_share():
    pods = [pod("v1-a", "1"), pod("v2-a", "2", ready=False)]
    rates = pod_rates({"llm-serving/chat": 10}, [route({"chat-v1": 50, "chat-v2": 50})], [service("chat-v1", "1"), service("chat-v2", "2")], pods)
    assert rates == {("llm-serving", "v1-a"): 5}


def test_without_route_the_logical_deployment_pods_share():
    rates = pod_rates({"llm-serving/chat": 9}, [], [], [pod("a", "1"), pod("b", "1"), pod("c", "1", app="other")])
    assert rates == {("llm-serving", "a"): 4.5, ("llm-serving", "b"): 4.5}


def test_gpu_assignment_keeps_holders_and_frees_departed():
    first = assign_gpus({}, {"n": 4}, {"n": [("ns/a", 2), ("ns/b", 1)]})
    assert first == {"n": ["ns/a", "ns/a", "ns/b", None]}
    second = assign_gpus(first, {"n": 4}, {"n": [("ns/b", 1), ("ns/c", 2)]})
    assert second == {"n": ["ns/c", "ns/c", "ns/b", None]}


def test_each_pod_exposes_its_vllm_series_and_the_fleet_its_dcgm_series():
    fleet = FleetSimulator(time_scale=10, seed=1)
    node = {"metadata": {"name": "node-a", "labels": {"nvidia.com/gpu.memory": "81920"}}, "status": {"allocatable": {GPU_RESOURCE: "2"}}}
    cluster = Cluster(pods=[pod("v1-a", "1")], services=[service("chat-v1", "1")], routes=[route({"chat-v1": 100})], nodes=[node], profiles={"default": PROFILE}, demand={"llm-serving/chat": Demand(rps=2)})
    fleet.update(cluster, 0.5)
    fleet.update(cluster, 0.5)  # 10 sandbox seconds at 2 rps
    text = fleet.pod_metrics("llm-serving", "v1-a")
    labels = 'model_name="llama",engine="0"'
    served = int(re.search(rf'vllm:request_success_total{{{re.escape(labels)},finished_reason="length"}} (\d+)\.0', text).group(1))
    assert 8 <= served <= 32  # Poisson at 2 rps for 10 s, minus the few still in the batch
    assert f'vllm:e2e_request_latency_seconds_count{{{labels}}} {float(served)!r}' in text
    assert f'http_requests_total{{method="POST",status="2xx",handler="/v1/completions"}} {float(served)!r}' in text
    assert f'vllm:num_preemptions_total{{{labels}}} 0.0' in text
    assert "# TYPE vllm:e2e_request_latency_seconds histogram" in text
    text = fleet.metrics()
    assert "vllm:" not in text and "http_requests_total" not in text  # engine series only on the pods' own addresses
    assert 'DCGM_FI_DEV_FB_USED{gpu="0",' in text and 'Hostname="node-a",namespace="llm-serving",pod="v1-a"' in text
    assert 'DCGM_FI_DEV_FB_FREE{gpu="1",' in text
    assert fleet.route("llm-serving", "chat-v1")[0].name == "v1-a"
    assert fleet.route("llm-serving", "missing") is None


def test_demand_curve_interpolates_and_repeats():
    tide = Demand(curve=[(100, 50), (0, 10)], period_seconds=200)
    assert tide.curve[0] == (0, 10)
    assert demand_rps(tide, 50) == 30
    assert demand_rps(tide, 150) == 50  # after the last point: hold
    assert demand_rps(tide, 250) == 30  # next period
    assert demand_rps(Demand(rps=7), 1e6) == 7


def test_changed_demand_restarts_its_curve_clock():
    fleet = FleetSimulator(time_scale=1, seed=1)
    ramp = Demand(curve=[(0, 0), (10, 100)])
    cluster = Cluster(demand={"ns/chat": ramp})
    fleet.update(cluster, 5)  # first seen: the curve starts here
    fleet.update(cluster, 5)
    assert fleet._current_demand(cluster.demand) == {"ns/chat": 50}
    steady = Cluster(demand={"ns/chat": Demand(curve=[(0, 1), (10, 1)])})
    fleet.update(steady, 5)
    assert fleet._current_demand(steady.demand) == {"ns/chat": 1}


def test_a_time_sliced_gpu_is_one_dcgm_device_holding_its_pods_claims():
    """One physical GPU whose series dcgm-exporter (--kubernetes-virtual-gpus) copies to each pod on
    it: the same device, its memory the sum of the claims, a vgpu label per pod."""
    fleet = FleetSimulator(time_scale=10, seed=1)
    node = {"metadata": {"name": "node-s", "labels": {"nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.count": "1",
                                                       "nvidia.com/gpu.sharing-strategy": "time-slicing"}},
            "status": {"allocatable": {"nvidia.com/gpu.shared": "4"}}}
    pods = []
    for name, claim in (("chat-a", "0.45"), ("embed-a", "0.3")):
        p = pod(name, "1", node="node-s")
        p["metadata"]["annotations"] = {"sandbox.tideplane.io/gpu-index": "0"}
        p["spec"]["containers"][0] = {"name": "vllm", "args": ["--gpu-memory-utilization", claim],
                                      "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}
        pods.append(p)
    fleet.update(Cluster(pods=pods, nodes=[node], profiles={"default": PROFILE}), 0.5)
    text = fleet.metrics()
    series = {name: [(s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]
              for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")}
    used, free = series["DCGM_FI_DEV_FB_USED"], series["DCGM_FI_DEV_FB_FREE"]
    assert sorted((labels["pod"], labels["vgpu"]) for labels, _ in used) == [("chat-a", "0"), ("embed-a", "1")]
    assert {(labels["UUID"], labels["gpu"], value) for labels, value in used} == {(used[0][0]["UUID"], "0", 61440.0)}  # 0.75 of 80 GiB
    assert {value for _, value in free} == {20480.0}
    assert not re.search(r'[{,]gpu="1"', text)  # one physical GPU, although it advertises 4 shares

