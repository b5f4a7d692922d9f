"""The product's import graph, read from the source (grimp, as lint-imports reads it: lazy imports and
TYPE_CHECKING ones included): no two product files import each other, directly or around a circle,
and capabilities compose one way only, whatever the layer (workflows, activities, the CLI).

The per-layer rules (which module may compose which capability) are the import-linter contracts in
pyproject.toml; this adds what a contract per layer cannot see: circles through several layers, and
a capability that composes another in one layer and is composed by it in another.
"""

from __future__ import annotations

from collections import defaultdict

import grimp
import pytest

PRODUCT = ("workflows", "activities", "workers", "infra", "benchmarks")
CAPABILITIES = {"rollout", "quality", "node_cache", "scaling", "spot", "registry", "cost", "quotas", "adapters", "classes"}
# Who composes whom (pyproject.toml's independence contracts name the modules that do).
COMPOSES = {
    ("adapters", "rollout"), ("adapters", "registry"),
    ("rollout", "quality"), ("rollout", "node_cache"), ("rollout", "registry"),
    ("quality", "registry"),
    ("scaling", "spot"), ("scaling", "cost"), ("scaling", "rollout"),
}


@pytest.fixture(scope="module")
def imports() -> dict[str, set[str]]:
    """Every product module -> the product modules it imports."""
    graph = grimp.build_graph(*PRODUCT, include_external_packages=False, cache_dir=None)
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_circles_finds_a_circle_and_only_circles():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_two_product_files_import_each_other(imports):
    assert len(imports) > 150, "the graph is missing modules: the scan is broken"
    assert circles(imports) == []


def capability(module: str) -> str | None:
    """``workflows.rollout.steps.stage`` -> ``rollout``; the core, the clients, the worker: None."""
    parts = module.split(".")
    if parts[0] in ("workflows", "activities") and len(parts) > 1 and parts[1] in CAPABILITIES:
        return parts[1]
    if parts[:2] == ["workers", "cli"] and len(parts) > 2 and parts[2] in CAPABILITIES:
        return parts[2]
    return None


def test_capabilities_compose_one_way_in_every_layer(imports):
    used: dict[tuple[str, str], list[str]] = defaultdict(list)
    for module, targets in imports.items():
        for target in targets:
            a, b = capability(module), capability(target)
            if a and b and a != b:
                used[(a, b)].append(f"{module} -> {target}")
    undeclared = {pair: sorted(lines) for pair, lines in used.items() if pair not in COMPOSES}
    assert not undeclared, f"capabilities importing each other outside COMPOSES: {undeclared}"
    assert set(used) == COMPOSES, f"declared but not composed any more: {sorted(COMPOSES - set(used))}"
    graph = defaultdict(set)
    for a, b in COMPOSES:
        graph[a].add(b)
    assert circles(graph) == []
