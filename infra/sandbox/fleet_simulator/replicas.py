"""The simulated vLLM replica of one pod: the fleet model's replica (infra.fleetmodel), fed in
sandbox time, with the engine the pod's profile and its container's batching arguments give."""

from __future__ import annotations

import random

from infra.fleetmodel.engine import Engine, engine_for_service, load_engine
from infra.fleetmodel.metrics import Histogram, dcgm_gpu_util
from infra.fleetmodel.replica import Replica, Request
from infra.sandbox.config import Profile
from infra.sandbox.lora import LoraAdapters
from infra.sandbox.fleet_simulator.vllm_args import batching, gpu_memory_utilization


def engine_of(profile: Profile, args: tuple[str, ...] = ()) -> Engine:
    """The profile's calibrated engine, or one with its stated TTFT, TPOT and capacity, under the
    batching arguments of the pod's container (``--max-num-seqs`` ..., as vLLM reads them); a
    calibrated engine gets the KV cache its ``--gpu-memory-utilization`` leaves (a replica sharing
    a GPU gets a smaller one; ``ValueError`` when the weights leave none: vLLM would not start)."""
    if profile.engine:
        engine = load_engine(profile.engine, gpu_memory_utilization=gpu_memory_utilization(list(args)))
    else:
        engine = engine_for_service(profile.ttft_seconds, profile.tpot_seconds, profile.prompt_tokens, profile.output_tokens,
                                    profile.capacity_rps, profile.gpu_memory_gib)
    return engine.with_batching(**batching(list(args)))


def container_args(pod: dict) -> tuple[str, ...]:
    """The args of the pod's containers (the serving container's engine arguments among them)."""
    return tuple(a for c in (pod.get("spec") or {}).get("containers") or [] for a in c.get("args") or [])


class SimulatedReplica:
    """One pod's vLLM engine: continuous batching, KV cache and preemption as in ``infra.fleetmodel``.

    The demand arrives as a Poisson stream of requests of the profile's sizes; proxied requests
    join the same engine. Each completed request fails with the profile's ``error_rate``, drawn
    per request (HTTP 500), as a flaky release would.
    """

    def __init__(self, profile: Profile, rng: random.Random | None = None, clock: float = 0.0, args: tuple[str, ...] = ()):
        self.rng = rng or random.Random()
        self.profile = profile
        self.args = args  # the pod's container args: fixed for its life (a new template makes new pods)
        self.engine = Replica(engine_of(profile, args), clock=clock)
        self.success = 0
        self.errors = 0
        self.prompt_tokens = 0  # of finished requests (vLLM counts per step; per request keeps totals exact)
        self.generation_tokens = 0
        self.busy_fraction = 0.0  # of the last tick: what DCGM samples
        self._proxied: list[Request] = []  # arrived through the proxy since the last tick
        self.lora = LoraAdapters()  # dynamically loaded adapters (infra/sandbox/lora.py); set from the pod

    def set_profile(self, profile: Profile) -> None:
        if profile != self.profile:
            self.profile = profile
            self.engine.engine = engine_of(profile, self.args)

    @property
    def clock(self) -> float:
        return self.engine.clock

    @property
    def waiting(self) -> int:
        return len(self.engine.waiting)

    @property
    def running(self) -> int:
        return len(self.engine.running)

    @property
    def kv_cache_usage(self) -> float:
        return min(1.0, self.engine.kv_usage)

    @property
    def gpu_utilisation(self) -> float:
        """Percent, as DCGM_FI_DEV_GPU_UTIL reports it: near full whenever a batch runs."""
        return dcgm_gpu_util(self.busy_fraction, self.engine.engine.busy_duty)

    @property
    def proxied(self) -> list[Request]:
        """Requests through the proxy not yet handed to the engine (they join at the next tick)."""
        return self._proxied

    @property
    def histograms(self) -> dict[str, Histogram]:
        return self.engine.histograms

    @property
    def preemptions(self) -> int:
        return self.engine.preemptions

    def advance(self, rps: float, dt: float) -> int:
        """Offer ``rps`` for ``dt`` sandbox seconds; returns the requests completed (incl. errors)."""
        start, end = self.engine.clock, self.engine.clock + dt
        arrivals, t = [], start
        while rps > 0:
            t += self.rng.expovariate(rps)
            if t >= end:
                break
            arrivals.append(Request(t, self.profile.prompt_tokens, self.profile.output_tokens))
        arrivals = sorted(arrivals + self._proxied, key=lambda r: r.arrival_s)
        self._proxied = []
        busy = self.engine.busy_s
        self.engine.advance_to(end, arrivals)
        self.busy_fraction = (self.engine.busy_s - busy) / dt if dt > 0 else 0.0
        done = self.engine.finished
        self.engine.finished = []
        self.engine.first_tokens.clear()
        for request in done:
            self.prompt_tokens += request.prompt_tokens
            self.generation_tokens += request.output_tokens
            request.failed = self.rng.random() < self.profile.error_rate
            self.errors += request.failed
            self.success += not request.failed
        return len(done)

    def submit(self, prompt_tokens: int, max_tokens: int) -> Request:
        """A proxied request joins the queue now; it is done when its ``finished_s`` is set."""
        request = Request(self.engine.clock, max(1, prompt_tokens), max(1, min(max_tokens, self.profile.output_tokens)))
        self._proxied.append(request)
        return request
