"""The CLI's progress line (workers/cli/progress.py): bytes, rate and ETA on a terminal, nothing in CI logs."""

from __future__ import annotations

import io

from workers.cli.progress import ProgressLine

MiB = 1024 * 1024


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_terminal_sees_bytes_rate_and_eta_rewritten_in_place():
    out, clock = Terminal(), Clock()
    progress = ProgressLine("register llama@1.0.0", 100 * MiB, stream=out, clock=clock)
    clock.now += 5
    progress(50 * MiB)
    assert out.getvalue() == "\rregister llama@1.0.0: [##########..........] 50.0 MiB of 100.0 MiB (50 %)  10.0 MiB/s  ETA 5s"
    clock.now += 0.01
    progress(1)
    assert out.getvalue().count("\r") == 1, "redrawn at most every 0.1 s"
    clock.now += 5
    progress(50 * MiB - 1)
    progress.close()
    assert out.getvalue().endswith("\rregister llama@1.0.0: [####################] 100.0 MiB of 100.0 MiB (100 %)  10.0 MiB/s\n")


def test_unknown_total_shows_bytes_and_rate_only():
    clock = Clock()
    progress = ProgressLine("register m@1.0.0", stream=Terminal(), clock=clock)
    clock.now += 120
    progress(600 * MiB)
    assert progress.render(clock.now) == "register m@1.0.0: 600.0 MiB  5.0 MiB/s"


def test_not_a_terminal_writes_nothing():
    out = io.StringIO()
    progress = ProgressLine("register m@1.0.0", 10, stream=out, interval=0)
    progress(5)
    progress.close()
    assert out.getvalue() == "" and progress.done == 5
