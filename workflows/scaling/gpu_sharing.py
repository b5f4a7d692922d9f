"""Models sharing GPUs: pack replicas onto GPUs by memory, and split a shared pool between models.

A vLLM replica preallocates ``--gpu-memory-utilization`` of its GPU's memory at start (weights,
activations, then as much KV cache as the rest holds) and fails to start when that much is not
free, so on a shared GPU (the NVIDIA device plugin's time-slicing or MPS replicas, which isolate
no memory) the fractions of the replicas on one GPU must sum to at most 1. The planner below
places replicas by that claim: first fit by free memory (the tightest GPU that holds it, keeping
emptier GPUs whole for larger claims); when none does, it makes room by moving smaller replicas
to other GPUs; only then does it ask for a node. ``share_pool`` decides, when a shared pool's GPUs
do not hold what every model wants, which models give GPUs back (the idle ones, down to their
minimum) and which get them (the busy ones). Pure: plain values in and out, reused by the
multi-model benchmark.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from workflows.core.gpu_shares import EPSILON, GPU_MEMORY_UTILIZATION_FLAG

ACTIVATION_RESERVE_GIB = 2.0  # torch/CUDA-graph/activation memory beside weights and KV (infra/fleetmodel/calibration.yaml)


class ModelShare(BaseModel):
    """One model's replica shape on a shared GPU."""

    model: str
    gpu_memory_utilization: float = Field(gt=0, le=1, description="vLLM's claim: this fraction of the GPU's memory")
    weights_gib: float = Field(gt=0)
    min_kv_cache_gib: float = Field(0, ge=0, description="KV cache the model needs at least (its max context)")

    def kv_cache_gib(self, gpu_memory_gib: float, reserve_gib: float = ACTIVATION_RESERVE_GIB) -> float:
        """The KV cache a replica gets on a GPU of ``gpu_memory_gib``: its claim less weights and activations."""
        return self.gpu_memory_utilization * gpu_memory_gib - reserve_gib - self.weights_gib

    def fits_gpu(self, gpu_memory_gib: float, reserve_gib: float = ACTIVATION_RESERVE_GIB) -> bool:
        """Weights and the minimum KV cache fit in the claim (vLLM refuses to start otherwise)."""
        return self.kv_cache_gib(gpu_memory_gib, reserve_gib) >= max(self.min_kv_cache_gib, EPSILON)


class SharedReplica(BaseModel):
    name: str = Field(description="unique within a plan, e.g. the pod name")
    share: ModelShare
    compute_share: float = Field(0, ge=0, le=1, description="fraction of the GPU's time its load keeps busy")

    @property
    def fraction(self) -> float:
        return self.share.gpu_memory_utilization


class SharedGpu(BaseModel):
    node: str
    index: int
    memory_gib: float = Field(gt=0)
    replicas: list[SharedReplica] = Field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.node}/{self.index}"

    @property
    def used_fraction(self) -> float:
        return sum(r.fraction for r in self.replicas)

    @property
    def free_fraction(self) -> float:
        return max(0.0, 1.0 - self.used_fraction)

    @property
    def compute(self) -> float:
        return sum(r.compute_share for r in self.replicas)


class Move(BaseModel):
    replica: str
    source: str = Field(description="node/index it leaves")
    target: str = Field(description="node/index it goes to")


class PackPlan(BaseModel):
    placed: dict[str, str] = Field(default_factory=dict, description="new replica -> node/index")
    moves: list[Move] = Field(default_factory=list, description="replicas moved to make room (each restarts)")
    new_nodes: list[str] = Field(default_factory=list)
    unplaceable: dict[str, str] = Field(default_factory=dict, description="replica -> why")
    gpus: list[SharedGpu] = Field(default_factory=list, description="every GPU after the plan")
    report: str = ""


class PackLimits(BaseModel):
    """The pool's node shape and how full a shared GPU may get."""

    gpus_per_node: int = Field(8, ge=1)
    gpu_memory_gib: float = Field(80, gt=0)
    max_compute_share: float = Field(
        1.0, gt=0, le=1,
        description="a GPU holding more than one replica keeps their compute shares at most this (time-slicing"
        " takes turns: co-located busy replicas slow each other down)",
    )
    reserve_gib: float = Field(ACTIVATION_RESERVE_GIB, ge=0)
    new_node_prefix: str = "new"


def _room(gpu: SharedGpu, replica: SharedReplica, limits: PackLimits, added: list[SharedReplica] = (),
          removed: list[SharedReplica] = ()) -> bool:
    """Whether ``replica`` fits on ``gpu`` once ``added`` are on it and ``removed`` are off it."""
    if gpu.used_fraction + sum(r.fraction for r in added) - sum(r.fraction for r in removed) + replica.fraction > 1 + EPSILON:
        return False
    if not replica.share.fits_gpu(gpu.memory_gib, limits.reserve_gib):
        return False
    others = len(gpu.replicas) + len(added) - len(removed)
    compute = gpu.compute + sum(r.compute_share for r in added) - sum(r.compute_share for r in removed)
    return not (others and compute + replica.compute_share > limits.max_compute_share + EPSILON)


def first_fit(gpus: list[SharedGpu], replica: SharedReplica, limits: PackLimits, exclude: str | None = None,
              added: dict[str, list[SharedReplica]] | None = None) -> SharedGpu | None:
    """The GPU with the least free memory that still holds ``replica`` (ties: node, index);
    ``added``: replicas planned onto GPUs (by key) but not placed yet."""
    added = added or {}
    fitting = [g for g in gpus if g.key != exclude and _room(g, replica, limits, added.get(g.key, []))]
    return min(fitting, key=lambda g: (g.free_fraction - sum(r.fraction for r in added.get(g.key, [])), g.node, g.index),
               default=None)


def _copy(gpus: list[SharedGpu]) -> list[SharedGpu]:
    """New GPU lists to place into; the replicas themselves are never changed, so they are shared."""
    return [g.model_copy(update={"replicas": list(g.replicas)}) for g in gpus]


def _make_room(gpus: list[SharedGpu], replica: SharedReplica, limits: PackLimits) -> tuple[SharedGpu, list[Move]] | None:
    """Free one GPU for ``replica`` by moving replicas smaller than it elsewhere: the GPU needing
    the fewest moves (then the least memory moved) wins; None when no GPU can be freed enough.
    Changes ``gpus`` only when it succeeds."""
    best: tuple[tuple[int, float, str], SharedGpu, dict[str, list[SharedReplica]], list[SharedReplica]] | None = None
    most_free = max((g.free_fraction for g in gpus), default=0.0)
    for target in gpus:
        # only smaller models move for a larger one, and only those some GPU has room for
        smaller = sorted((r for r in target.replicas if r.fraction < replica.fraction and r.fraction <= most_free + EPSILON),
                         key=lambda r: (r.fraction, r.name))
        if (not smaller or not replica.share.fits_gpu(target.memory_gib, limits.reserve_gib)
                or target.used_fraction - sum(r.fraction for r in smaller) + replica.fraction > 1 + EPSILON):
            continue  # even moving all of them would not make room
        added: dict[str, list[SharedReplica]] = {}
        leaving: list[SharedReplica] = []
        for small in smaller:
            if _room(target, replica, limits, removed=leaving):
                break
            dest = first_fit(gpus, small, limits, exclude=target.key, added=added)
            if dest is not None:
                added.setdefault(dest.key, []).append(small)
                leaving.append(small)
        if leaving and _room(target, replica, limits, removed=leaving):
            score = (len(leaving), sum(r.fraction for r in leaving), target.key)
            if best is None or score < best[0]:
                best = (score, target, added, leaving)
    if best is None:
        return None
    _, target, added, leaving = best
    by_key = {g.key: g for g in gpus}
    moves = []
    for key, arriving in added.items():
        for small in arriving:
            target.replicas.remove(small)
            by_key[key].replicas.append(small)
            moves.append(Move(replica=small.name, source=target.key, target=key))
    return target, moves


def pack(gpus: list[SharedGpu], replicas: list[SharedReplica], limits: PackLimits) -> PackPlan:
    """Place ``replicas`` (largest claim first): first fit by free memory, else consolidate by
    moving smaller replicas, else on a new node of the pool's shape."""
    state = _copy(gpus)
    plan = PackPlan()
    for replica in sorted(replicas, key=lambda r: (-r.fraction, -r.compute_share, r.name)):
        if not replica.share.fits_gpu(limits.gpu_memory_gib, limits.reserve_gib) and not any(
            replica.share.fits_gpu(g.memory_gib, limits.reserve_gib) for g in state
        ):
            kv = replica.share.kv_cache_gib(limits.gpu_memory_gib, limits.reserve_gib)
            plan.unplaceable[replica.name] = (
                f"{replica.share.model} at {GPU_MEMORY_UTILIZATION_FLAG} {replica.fraction:g} leaves {kv:.1f} GiB for the KV cache"
                f" on a {limits.gpu_memory_gib:g} GiB GPU (weights {replica.share.weights_gib:g} GiB, needs"
                f" {replica.share.min_kv_cache_gib:g} GiB of KV cache)"
            )
            continue
        gpu = first_fit(state, replica, limits)
        if gpu is None:
            made = _make_room(state, replica, limits)
            if made is not None:
                gpu, moves = made
                plan.moves += moves
        if gpu is None:
            name = f"{limits.new_node_prefix}-{len(plan.new_nodes) + 1}"
            plan.new_nodes.append(name)
            fresh = [SharedGpu(node=name, index=i, memory_gib=limits.gpu_memory_gib) for i in range(limits.gpus_per_node)]
            state += fresh
            gpu = fresh[0]
        gpu.replicas.append(replica)
        plan.placed[replica.name] = gpu.key
    plan.gpus = state
    used = sum(1 for g in state if g.replicas)
    plan.report = (
        f"{len(plan.placed)} of {len(replicas)} replica(s) placed on {used} GPU(s): {len(plan.moves)} moved to make room,"
        f" {len(plan.new_nodes)} new node(s)"
    )
    if plan.unplaceable:
        plan.report += f"; {len(plan.unplaceable)} unplaceable: {next(iter(plan.unplaceable.values()))}"
    return plan


def release(gpus: list[SharedGpu], names: set[str]) -> list[SharedGpu]:
    """The GPUs without the replicas ``names`` (scaled down or gone)."""
    out = _copy(gpus)
    for gpu in out:
        gpu.replicas = [r for r in gpu.replicas if r.name not in names]
    return out


class ModelDemand(BaseModel):
    """What one model of a shared pool wants now (its own scaling decision) and may not go below."""

    model: str
    desired: int = Field(ge=0)
    min_replicas: int = Field(0, ge=0)
    gpu_memory_utilization: float = Field(gt=0, le=1)
    busy: float = Field(0, ge=0, description="load per replica it has now (e.g. utilisation), to rank who gets GPUs")


def model_demand(model: str, desired: int, min_replicas: int, claim: float, request_rate: float, ready: int) -> ModelDemand:
    """A model's want as ``share_pool`` ranks it: busy is its arrivals (requests/s) per Ready replica.
    One definition for SharedPoolScaling and the multi-model benchmark."""
    return ModelDemand(model=model, desired=desired, min_replicas=min_replicas, gpu_memory_utilization=claim,
                       busy=request_rate / max(1, ready))


def share_pool(capacity_gpus: float, demands: list[ModelDemand]) -> dict[str, int]:
    """Replicas per model when a shared pool's GPUs (in whole-GPU memory) may not hold every want.

    Every model keeps its minimum; models that want less (idle) give their GPUs back; the memory
    left goes to the models that want more, one replica at a time to the busiest per replica
    (the one whose replicas carry the most load), so a burst on one model is served by the
    GPUs another does not need. No model gets more than it wants (or its minimum, if higher).
    """
    grant = {d.model: d.min_replicas for d in demands}
    used = sum(grant[d.model] * d.gpu_memory_utilization for d in demands)
    wanting = {d.model: d for d in demands if d.desired > grant[d.model]}
    while wanting:
        best = min(wanting.values(), key=lambda d: (-d.busy * d.desired / max(1, grant[d.model]), d.model))
        if used + best.gpu_memory_utilization > capacity_gpus + EPSILON:
            del wanting[best.model]  # its next replica does not fit; a smaller model's may
            continue
        grant[best.model] += 1
        used += best.gpu_memory_utilization
        if grant[best.model] >= best.desired:
            del wanting[best.model]
    return grant

