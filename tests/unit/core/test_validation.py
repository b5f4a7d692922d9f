"""A file a user wrote that a model refuses is reported with every wrong field's dotted path, the
same way for the sandbox config, golden sets and schedules (workflows.core.failures.field_errors)."""

import pytest

from infra.sandbox.config import SandboxConfigError, load_config
from workers.cli.quality import load_golden


def test_sandbox_config_names_each_wrong_field(tmp_path):
    path = tmp_path / "sandbox.yaml"
    path.write_text("node_pools:\n  - {name: gpu, count: -1, capacity_type: spot, gpus: 4}\n  - {name: cpu, count: 1, capacity_type: reserved, gpus: 0}\n")
    with pytest.raises(SandboxConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert message.startswith(f"invalid sandbox config {path}: node_pools.0.count: Input should be greater than or equal to 0; ")
    assert "node_pools.1.capacity_type: Input should be 'on-demand' or 'spot'" in message


def test_a_file_that_is_not_a_mapping_is_named_as_the_file(tmp_path):
    path = tmp_path / "golden.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(SystemExit, match=rf"^tideplane: error: golden set {path}: \(file\): Input should be a valid dictionary"):
        load_golden(str(path))
