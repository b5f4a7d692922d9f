"""ModelRollout's patches are kept in one place: every ``workflow.patched`` its modules ask names an id
of workflows/rollout/patches.py, and that module lists each id (with the history that replays it)."""

from __future__ import annotations

import ast
from pathlib import Path

from workflows.rollout import patches

ROLLOUT = Path(patches.__file__).parent


def asked_patches() -> dict[str, set[str]]:
    """Module -> the names passed to ``workflow.patched(...)`` in it."""
    asked: dict[str, set[str]] = {}
    for path in sorted(ROLLOUT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "patched":
                (arg,) = node.args
                asked.setdefault(path.relative_to(ROLLOUT).as_posix(), set()).add(ast.unparse(arg))
    return asked


def test_every_patch_the_rollout_asks_is_an_id_of_its_patches_module():
    asked = asked_patches()
    assert asked, "no workflow.patched found: the scan is broken"
    listed = {name: getattr(patches, name) for name in dir(patches) if name.endswith("_PATCH")}
    for module, names in asked.items():
        assert names <= set(listed), f"{module} asks {sorted(names - set(listed))}, not ids of workflows/rollout/patches.py"
    assert set(patches.PATCHES) == set(listed.values())
    for patch_id in patches.PATCHES:
        assert f"``{patch_id}" in patches.__doc__, f"{patch_id}: say in the patches module which history replays it"


def test_no_step_of_the_rollout_imports_another():
    """Each step works on the run state and returns what happened; the workflow sequences them."""
    steps = {p.stem for p in (ROLLOUT / "steps").glob("*.py") if p.stem != "__init__"}
    assert {"stage", "warm_up", "canary", "shadow", "promote", "roll_back", "retire"} <= steps
    for step in sorted(steps):
        tree = ast.parse((ROLLOUT / "steps" / f"{step}.py").read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module for a in n.names}
        others = {f"workflows.rollout.steps.{s}" for s in steps - {step}}
        assert not imported & others, f"steps/{step}.py imports {sorted(imported & others)}"
