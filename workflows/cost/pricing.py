"""What the fleet costs: GPU-hours x price per pool and capacity type, and cost per token.

Pure code on plain values (the CostReport workflow and the tests call it): Prometheus supplies
GPU-seconds per pod and node, which pod served which deployment version, which node belongs to
which pool and capacity type, and the tokens each version served. GPU time of a pod that never
served (still loading weights, crashed) is still paid for: it is kept as ``(unattributed)``.
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import BaseModel, Field

UNATTRIBUTED = "(unattributed)"
UNKNOWN = "unknown"


class Prices(BaseModel):
    """$ per GPU-hour: a pool's own price wins, then its capacity type's, then ``default``.

    Defaults are illustrative list prices for H100 (p5.48xlarge: $98.32/h for 8 GPUs on demand).
    """

    by_pool: dict[str, float] = Field(default_factory=dict)
    by_capacity_type: dict[str, float] = Field(default_factory=lambda: {"on-demand": 12.29, "spot": 4.92})
    default: float = Field(12.29, ge=0, description="nodes whose pool and capacity type are unknown")

    def gpu_hour(self, pool: str, capacity_type: str) -> float:
        if pool in self.by_pool:
            return self.by_pool[pool]
        return self.by_capacity_type.get(capacity_type, self.default)


class GpuSeconds(BaseModel):
    namespace: str
    pod: str
    node: str
    gpu_seconds: float = Field(ge=0)


class PodInfo(BaseModel):
    namespace: str
    pod: str
    deployment: str
    version: str
    model: str


class NodeInfo(BaseModel):
    node: str
    pool: str
    capacity_type: str


class TokenCount(BaseModel):
    namespace: str
    deployment: str
    version: str
    model: str
    generation_tokens: float = Field(ge=0)
    prompt_tokens: float = Field(ge=0)


class PoolCost(BaseModel):
    """One row of the table: a deployment's GPU time on one pool."""

    namespace: str
    deployment: str
    pool: str
    capacity_type: str
    gpu_hours: float
    price_per_gpu_hour: float
    cost: float


class VersionCost(BaseModel):
    namespace: str
    deployment: str
    version: str
    model: str
    gpu_hours: float
    cost: float
    generation_tokens: float
    prompt_tokens: float
    cost_per_million_tokens: float | None = Field(description="cost / (prompt + generation tokens) x 1e6")
    cost_per_million_generated_tokens: float | None
    generated_tokens_per_gpu_second: float | None


class CostTable(BaseModel):
    pools: list[PoolCost]
    versions: list[VersionCost]
    total_gpu_hours: float
    total_cost: float


def compute_cost(
    gpu: list[GpuSeconds], pods: list[PodInfo], nodes: list[NodeInfo], tokens: list[TokenCount], prices: Prices
) -> CostTable:
    """Attribute each pod's GPU time to its deployment version and its node's pool, then price it."""
    pod_of = {(p.namespace, p.pod): p for p in pods}
    node_of = {n.node: n for n in nodes}
    pool_seconds: dict[tuple[str, str, str, str], float] = defaultdict(float)
    version_seconds: dict[tuple[str, str, str, str], float] = defaultdict(float)
    version_cost: dict[tuple[str, str, str, str], float] = defaultdict(float)
    for g in gpu:
        pod = pod_of.get((g.namespace, g.pod))
        deployment, version, model = (pod.deployment, pod.version, pod.model) if pod else (UNATTRIBUTED, UNATTRIBUTED, "")
        node = node_of.get(g.node)
        pool, capacity = (node.pool, node.capacity_type) if node else (UNKNOWN, UNKNOWN)
        pool_seconds[(g.namespace, deployment, pool, capacity)] += g.gpu_seconds
        vkey = (g.namespace, deployment, version, model)
        version_seconds[vkey] += g.gpu_seconds
        version_cost[vkey] += g.gpu_seconds / 3600 * prices.gpu_hour(pool, capacity)

    pool_rows = []
    for (namespace, deployment, pool, capacity), seconds in sorted(pool_seconds.items()):
        price = prices.gpu_hour(pool, capacity)
        hours = seconds / 3600
        pool_rows.append(PoolCost(namespace=namespace, deployment=deployment, pool=pool, capacity_type=capacity,
                                  gpu_hours=hours, price_per_gpu_hour=price, cost=hours * price))

    token_of = {(t.namespace, t.deployment, t.version, t.model): t for t in tokens}
    version_rows = []
    for key in sorted(set(version_seconds) | set(token_of)):
        namespace, deployment, version, model = key
        seconds, cost = version_seconds.get(key, 0.0), version_cost.get(key, 0.0)
        t = token_of.get(key)
        generated, prompt = (t.generation_tokens, t.prompt_tokens) if t else (0.0, 0.0)
        version_rows.append(VersionCost(
            namespace=namespace, deployment=deployment, version=version, model=model,
            gpu_hours=seconds / 3600, cost=cost, generation_tokens=generated, prompt_tokens=prompt,
            cost_per_million_tokens=cost / (generated + prompt) * 1e6 if generated + prompt else None,
            cost_per_million_generated_tokens=cost / generated * 1e6 if generated else None,
            generated_tokens_per_gpu_second=generated / seconds if seconds else None,
        ))
    return CostTable(
        pools=pool_rows,
        versions=version_rows,
        total_gpu_hours=sum(r.gpu_hours for r in pool_rows),
        total_cost=sum(r.cost for r in pool_rows),
    )


def render_markdown(table: CostTable, title: str) -> str:
    """The report as the Temporal UI shows it in the workflow's current details."""
    lines = [f"## {title}", "", f"**Total: ${table.total_cost:,.2f} for {table.total_gpu_hours:,.2f} GPU-hours**", "",
             "| deployment | pool | capacity | GPU-h | $/GPU-h | cost |", "|---|---|---|---:|---:|---:|"]
    for r in table.pools:
        lines.append(f"| {r.namespace}/{r.deployment} | {r.pool} | {r.capacity_type} | {r.gpu_hours:,.3f} "
                     f"| {r.price_per_gpu_hour:,.2f} | ${r.cost:,.2f} |")
    lines += ["", "| version | model | GPU-h | cost | tokens (gen + prompt) | $/M tokens | $/M generated | gen tok/s/GPU |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for v in table.versions:
        lines.append(f"| {v.namespace}/{v.deployment} {v.version} | {v.model} | {v.gpu_hours:,.3f} | ${v.cost:,.2f} "
                     f"| {v.generation_tokens + v.prompt_tokens:,.0f} | {_money(v.cost_per_million_tokens)} "
                     f"| {_money(v.cost_per_million_generated_tokens)} | {_num(v.generated_tokens_per_gpu_second)} |")
    return "\n".join(lines) + "\n"


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.4f}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"
