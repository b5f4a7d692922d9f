"""``tideplane completion bash`` completes from the parser: a real bash, sourcing the script,
offers the rollout subcommands after ``rollout`` and a subcommand's own flags after it."""

from __future__ import annotations

import subprocess

import pytest

from workers.cli.completion import bash_script
from workers.cli.main import _parser


def _complete(script: str, words: list[str]) -> list[str]:
    line = " ".join(f'"{w}"' for w in words)
    probe = f'{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _tideplane; printf "%s\\n" "${{COMPREPLY[@]}}"'
    return subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True, timeout=30).stdout.split()


def test_bash_completes_commands_and_flags():
    script = bash_script(_parser())
    assert {"start", "get", "status", "promote", "abort"} <= set(_complete(script, ["tideplane", "rollout", ""]))
    assert _complete(script, ["tideplane", "rollout", "get", "--w"]) == ["--watch"]
    assert "rollout" in _complete(script, ["tideplane", "ro"])
