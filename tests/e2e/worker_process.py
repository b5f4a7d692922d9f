"""``tideplane worker`` run as its own process against the sandbox, as an operator runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from infra.sandbox.launcher import REPO
from infra.sandbox.ports import wait_for_port


class WorkerProcess:
    """``tideplane worker`` as its own process (own session), pointed at the sandbox."""

    def __init__(self, env: dict[str, str], log: Path):
        self.env, self.log = env, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "workers.cli", "worker"], cwd=REPO, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, **self.env, "PYTHONUNBUFFERED": "1"},
            )
        wait_for_port(int(self.env["TIDEPLANE_METRICS_PORT"]), timeout=60)
        assert self.proc.poll() is None, f"worker exited: {self.log.read_text()[-2000:]}"

    def kill(self) -> int:
        """SIGKILL: no graceful shutdown, running activities and the sticky cache die with it."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
