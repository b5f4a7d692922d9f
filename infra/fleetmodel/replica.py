"""A vLLM replica at the level of requests and scheduler steps (the request-level mode).

Each step is one vLLM V1 scheduler iteration: the running requests go first (one decode token
each, or the next chunk of a prompt still being prefilled), then waiting requests are admitted
first-come first-served while ``max_num_seqs``, the ``max_num_batched_tokens`` budget and free KV
cache allow (chunked prefill). When a decode step needs KV slots the cache does not have, the most
recently admitted request is preempted: its KV is freed and it goes back to the head of the queue
to be recomputed (prompt + tokens generated so far), as vLLM's recompute preemption does. The step
lasts ``Engine.step_seconds`` of its batched tokens and the KV it reads; the step that completes a
prompt emits that request's first token. Without chunked prefill (``Engine.chunked_prefill`` False,
vLLM's ``--no-enable-chunked-prefill``) a prompt is admitted only into a step with room for all of it.

Stretches of pure decode with a constant batch are advanced in one go (the step time grows
linearly with the KV read), so an hour of a busy replica costs events, not steps.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from infra.fleetmodel.engine import Engine
from infra.fleetmodel.metrics import HISTOGRAMS, Histogram


@dataclass(eq=False)
class Request:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    to_prefill: int = 0  # prompt (+ generated, after a preemption) tokens to compute before decoding
    prefilled: int = 0
    generated: int = 0
    admitted_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    preemptions: int = 0
    kv: int = 0  # KV-cache slots this request holds
    active: bool = False  # in the running batch

    def __post_init__(self) -> None:
        self.output_tokens = max(1, self.output_tokens)
        self.prompt_tokens = max(1, self.prompt_tokens)
        self.to_prefill = self.prompt_tokens

    @property
    def ttft(self) -> float:
        return self.first_token_s - self.arrival_s


@dataclass
class Replica:
    """One vLLM engine; ``advance_to`` runs its steps up to a time, ``submit`` queues a request."""

    engine: Engine
    clock: float = 0.0
    inbound: deque = field(default_factory=deque)  # arrived, not yet past the front end (``frontend_s``)
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    kv_used: int = 0
    busy_s: float = 0.0  # time with a step running (DCGM's "a kernel was executing")
    preemptions: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: list = field(default_factory=list)  # completed since the caller last took them
    first_tokens: list = field(default_factory=list)  # requests whose first token came since last taken
    histograms: dict = field(default_factory=lambda: {name: Histogram(b) for name, (b, _) in HISTOGRAMS.items()})

    def submit(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def kv_usage(self) -> float:
        return self.kv_used / self.engine.kv_capacity_tokens

    def advance_to(self, t_end: float, arrivals: list[Request] | None = None) -> None:
        """Run steps until ``t_end``; ``arrivals`` (sorted by arrival) join the queue when they arrive."""
        pending = self.inbound
        if arrivals:
            pending.extend(arrivals)
            if len(pending) > len(arrivals) and pending[-len(arrivals) - 1].arrival_s > arrivals[0].arrival_s:
                self.inbound = pending = deque(sorted(pending, key=lambda r: r.arrival_s))
        late = self.engine.frontend_s  # a request reaches the scheduler this long after it arrives
        while True:
            while pending and pending[0].arrival_s + late <= self.clock:
                self.waiting.append(pending.popleft())
            if not self.running and not self.waiting:
                nxt = pending[0].arrival_s + late if pending else t_end
                if nxt >= t_end:
                    self.clock = max(self.clock, t_end)
                    return
                self.clock = nxt
                continue
            if self.clock >= t_end:
                return
            next_arrival = pending[0].arrival_s + late if pending else math.inf
            if not self._decode_stretch(min(next_arrival, t_end)):
                self._step()

    # -- one scheduler iteration

    def _step(self) -> None:
        eng = self.engine
        budget = eng.max_num_batched_tokens
        tokens = 0
        plan: list[tuple[Request, int]] = []  # (request, prompt tokens computed this step; 0 = decode)
        for r in list(self.running):
            if not r.active:  # preempted earlier in this step
                continue
            if r.prefilled < r.to_prefill:
                chunk = min(r.to_prefill - r.prefilled, budget - tokens)
                if chunk <= 0:
                    continue
                if not self._reserve(chunk, r):
                    continue
                plan.append((r, chunk))
                tokens += chunk
            else:
                if not self._reserve(1, r):
                    continue
                plan.append((r, 0))
                tokens += 1
        while self.waiting and len(self.running) < eng.max_num_seqs and tokens < budget:
            r = self.waiting[0]
            remaining = r.to_prefill - r.prefilled
            chunk = min(remaining, budget - tokens)
            if not eng.chunked_prefill and chunk < remaining:
                if tokens:
                    break  # the whole prompt waits for a step with room for it
                chunk = remaining  # unchunked, vLLM raises the budget to the longest prompt (max_model_len)
            if self.kv_used + chunk > eng.kv_capacity_tokens:
                break  # head of line waits for KV (FCFS)
            self.waiting.popleft()
            if r.admitted_s is None:
                r.admitted_s = self.clock
            self.running.append(r)
            r.active = True
            r.kv += chunk
            self.kv_used += chunk
            plan.append((r, chunk))
            tokens += chunk
        if not plan:  # nothing fits (a prompt larger than the whole cache): drop the head as vLLM rejects it
            self.waiting.popleft()
            return
        duration = eng.step_seconds(tokens, self.kv_used)
        self.clock += duration
        self.busy_s += duration
        decoding = 0
        for r, chunk in plan:
            if chunk:
                r.prefilled += chunk
                self.prompt_tokens += chunk
                if r.prefilled >= r.to_prefill:  # the step that completes the prompt samples a token
                    self._emit(r, 1)
                    if r.first_token_s is None:
                        r.first_token_s = self.clock
                        self.first_tokens.append(r)
            else:
                decoding += 1
                self._emit(r, 1)
        if decoding:
            self.histograms["vllm:inter_token_latency_seconds"].observe(duration, decoding)
        self._finish()

    def _reserve(self, slots: int, r: Request) -> bool:
        """KV for ``slots`` more tokens of ``r``, preempting the newest other running requests if needed."""
        while self.kv_used + slots > self.engine.kv_capacity_tokens:
            victim = self.running[-1]
            self._preempt(victim)
            if victim is r:
                return False
        self.kv_used += slots
        r.kv += slots
        return True

    def _preempt(self, r: Request) -> None:
        self.running.remove(r)
        r.active = False
        self.kv_used -= r.kv
        r.kv = 0
        r.to_prefill, r.prefilled = r.prompt_tokens + r.generated, 0
        r.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(r)

    def _emit(self, r: Request, n: int) -> None:
        r.generated += n
        self.generation_tokens += n

    def _finish(self) -> None:
        done = [r for r in self.running if r.prefilled >= r.to_prefill and r.generated >= r.output_tokens]
        for r in done:
            self.running.remove(r)
            r.active = False
            self.kv_used -= r.kv
            r.finished_s = self.clock
            self._record(r)

    def _record(self, r: Request) -> None:
        h = self.histograms
        decode = r.finished_s - r.first_token_s
        h["vllm:time_to_first_token_seconds"].observe(r.ttft)
        h["vllm:e2e_request_latency_seconds"].observe(r.finished_s - r.arrival_s)
        h["vllm:request_queue_time_seconds"].observe(r.admitted_s - r.arrival_s)
        h["vllm:request_prefill_time_seconds"].observe(r.first_token_s - r.admitted_s)
        h["vllm:request_decode_time_seconds"].observe(decode)
        h["vllm:request_time_per_output_token_seconds"].observe(decode / max(1, r.output_tokens - 1))
        self.finished.append(r)

    # -- many decode steps at once

    def _decode_stretch(self, until: float) -> bool:
        """Advance a stretch of identical decode-only steps, if the scheduler would do nothing else.

        Holds while every running request decodes, no waiting request can be admitted, and no
        request finishes or runs out of KV before the last step; stops at ``until`` (the next
        arrival, or the end of the caller's interval). Returns False when one plain step is needed.
        """
        eng = self.engine
        n = len(self.running)
        if n == 0 or any(r.prefilled < r.to_prefill for r in self.running):
            return False
        if self.waiting and n < eng.max_num_seqs and self.kv_used + n + min(eng.max_num_batched_tokens - n, self.waiting[0].to_prefill) <= eng.kv_capacity_tokens:
            return False  # the head of the queue would be admitted next step
        to_finish = min(r.output_tokens - r.generated for r in self.running)
        kv_room = (eng.kv_capacity_tokens - self.kv_used) // n
        k = min(to_finish, kv_room)
        if k < 2:
            return False
        first = eng.step_seconds(n, self.kv_used)
        slope = eng.step_seconds(n, self.kv_used + n) - first
        if until < math.inf:  # steps that start before `until`: solve sum_{j<k} (first + slope j) >= until - clock
            span = until - self.clock
            if slope > 1e-15:
                fit = math.ceil((-(first - slope / 2) + math.sqrt((first - slope / 2) ** 2 + 2 * slope * span)) / slope)
            else:
                fit = math.ceil(span / first)
            k = min(k, max(1, fit))
        if k < 2:
            return False
        elapsed = k * first + slope * k * (k - 1) / 2
        self.clock += elapsed
        self.busy_s += elapsed
        for r in self.running:
            r.generated += k
            r.kv += k
        self.generation_tokens += n * k
        self.kv_used += n * k
        self.histograms["vllm:inter_token_latency_seconds"].observe(elapsed / k, n * k)
        self._finish()
        return True
