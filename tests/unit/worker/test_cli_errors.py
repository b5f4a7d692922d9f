"""One error style and exit-code table for the whole tideplane CLI (issue 33, "CLI and errors";
the table is in docs/reference.md and workers/cli/errors.py): every error is one line beginning
``tideplane: error: ``, a system that is down is that line (no traceback), a bad value names its
rule, a missing file exits 2 in every command."""

from __future__ import annotations

import pytest

from workers.cli.main import run

PREFIX = "tideplane: error: "


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "Traceback" not in "\n".join(err), err
    return err[-1]


def _code(argv: list[str]) -> int:
    try:
        return run(argv)
    except SystemExit as exc:  # argparse's usage errors
        return exc.code


def test_a_bad_value_names_its_rule(capsys):
    assert _code(["cost", "report", "--window-hours", "0"]) == 2
    assert _error(capsys) == PREFIX + "argument --window-hours: must be > 0 and <= 744 (31 days), got 0"


def test_an_unknown_subcommand_is_a_usage_error_in_the_same_style(capsys):
    assert _code(["rollout", "nope"]) == 2
    assert _error(capsys).startswith(PREFIX + "argument rollout_command: invalid choice: 'nope'")


@pytest.mark.parametrize("argv", [
    ["rollout", "start", "{missing}"],
    ["registry", "golden", "set", "llama", "{missing}"],
    ["schedules", "apply", "{missing}"],
])
def test_a_missing_file_exits_2_everywhere(argv, tmp_path, capsys):
    missing = str(tmp_path / "missing.yaml")
    assert _code([a.replace("{missing}", missing) for a in argv]) == 2
    line = _error(capsys)
    assert line.startswith(PREFIX) and missing in line and "No such file" in line.replace("no such file", "No such file")


def test_s3_down_is_one_line(monkeypatch, capsys):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    assert _code(["registry", "list"]) == 1
    assert _error(capsys).startswith(PREFIX + "S3 unreachable: Could not connect to the endpoint URL")


def test_temporal_down_is_one_line(capsys):
    assert _code(["rollout", "status", "llm-serving/chat", "--address", "127.0.0.1:9"]) == 1
    assert _error(capsys) == PREFIX + "cannot reach Temporal: Connection refused (check --address / TEMPORAL_ADDRESS)"


def test_an_invalid_rollout_spec_names_the_field_and_exits_2(tmp_path, capsys):
    spec = tmp_path / "r.json"
    spec.write_text('{"deployment": "llm-serving/chat", "model": "m", "version": "1.0.0", "image": "vllm/vllm-openai:v0.6.3", "replicas": 0}')
    assert _code(["rollout", "start", str(spec), "--dry-run"]) == 2
    assert _error(capsys) == PREFIX + "invalid rollout: replicas: Input should be greater than or equal to 1"


def test_version(capsys):
    assert _code(["--version"]) == 0
    assert capsys.readouterr().out.startswith("tideplane ")
