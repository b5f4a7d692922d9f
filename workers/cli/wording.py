"""How the CLI and the benchmarks word counts (one rule, so no output says "1 files")."""

from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """``1 file``, ``4 files``, ``1,024 files``: the count with its noun, plural unless it is one."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
