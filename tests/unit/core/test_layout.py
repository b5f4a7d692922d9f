"""The code stays readable in one walk (issue 29): no giant module, ModelRollout's module short
enough to read as the runbook, every capability under one name in each layer and in the docs, and a
README that is a front door with its two commands."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.core.test_import_graph import CAPABILITIES

ROOT = Path(__file__).resolve().parents[3]
LAYERS = ("workflows", "activities", "workers")


def test_no_product_module_is_over_600_lines():
    long = {
        str(path.relative_to(ROOT)): n
        for layer in LAYERS
        for path in (ROOT / layer).rglob("*.py")
        if (n := len(path.read_text().splitlines())) > 600
    }
    assert not long, f"split these by concept: {long}"


def test_model_rollouts_module_reads_as_the_runbook():
    module = ROOT / "workflows" / "rollout" / "workflow.py"
    assert "class ModelRollout" in module.read_text()
    assert len(module.read_text().splitlines()) < 300


@pytest.mark.parametrize("capability", sorted(CAPABILITIES))
def test_each_capability_has_one_name_in_every_layer_and_a_doc(capability):
    missing = [where for where in (f"workflows/{capability}", f"activities/{capability}") if not (ROOT / where).is_dir()]
    missing += [] if (ROOT / "docs" / f"{capability}.md").is_file() else [f"docs/{capability}.md"]
    assert not missing, f"{capability} lacks {missing}"


def test_the_readme_is_a_front_door_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 200
    assert "make demo" in lines and "make test" in lines  # each alone on its line: the quick start's block
