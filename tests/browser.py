"""A headless Chromium page driven over the DevTools protocol, for tests of the web UI.

The UI is a single-page app that keeps a long poll open on a running workflow, so Chromium's own
``--screenshot``/``--dump-dom`` either never settle (``--virtual-time-budget``) or shoot a blank
page (``--timeout``). Over the protocol a test waits until the page shows what it looks for, then
reads its text and takes a screenshot. websocket-client is already a dependency of the
kubernetes client.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import websocket


READ_TEXT = """[document, ...[...document.querySelectorAll('iframe')].map(f => f.contentDocument)]
    .filter(d => d && d.body).map(d => d.body.innerText).join('\\n')"""


class Page:
    """One tab of a headless Chromium started for it; ``with Page() as page: page.open(url)``."""

    def __init__(self, width: int = 1400, height: int = 1100) -> None:
        binary = shutil.which("chromium")
        assert binary, "chromium is not installed: make install installs Debian's chromium"
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-")
        self._log = Path(self._profile.name) / "chromium.log"
        with open(self._log, "w") as log:
            self._proc = subprocess.Popen(
                [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                 f"--window-size={width},{height}", "--remote-debugging-port=0", "--remote-allow-origins=*",
                 f"--user-data-dir={self._profile.name}", "about:blank"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        port = self._devtools_port()
        tab = httpx.put(f"http://127.0.0.1:{port}/json/new?about:blank", timeout=10).json()
        self._ws = websocket.create_connection(tab["webSocketDebuggerUrl"], timeout=30)
        self._ids = itertools.count(1)

    def _devtools_port(self, timeout: float = 60) -> int:
        """Chromium prints ``DevTools listening on ws://127.0.0.1:PORT/...`` once it is up."""
        deadline = time.monotonic() + timeout
        while not (m := re.search(r"DevTools listening on ws://[^:]+:(\d+)/", self._log.read_text())):
            assert self._proc.poll() is None, f"chromium exited: {self._log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "chromium did not listen in time"
            time.sleep(0.2)
        return int(m.group(1))

    def _call(self, method: str, **params) -> dict:
        call_id = next(self._ids)
        self._ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv())
            if message.get("id") == call_id:
                assert "error" not in message, f"{method}: {message['error']}"
                return message["result"]

    def open(self, url: str) -> None:
        self._call("Page.navigate", url=url)

    def text(self) -> str:
        """What a reader sees: the rendered page's text, its frames' too (the UI renders markdown,
        such as a workflow's current details, in an iframe), whitespace collapsed."""
        result = self._call("Runtime.evaluate", returnByValue=True, expression=READ_TEXT)
        return re.sub(r"\s+", " ", result["result"].get("value") or "")

    def wait_for(self, pattern: str, timeout: float = 60) -> str:
        """The page's text once ``pattern`` (a regular expression) is found in it."""
        deadline = time.monotonic() + timeout
        while not re.search(pattern, text := self.text()):
            assert time.monotonic() < deadline, f"the page never showed {pattern!r}; it shows: {text[:3000]}"
            time.sleep(0.5)
        return text

    def click(self, label: str) -> None:
        """Click the link or button whose text is ``label``, as a user picks a tab."""
        found = self._call("Runtime.evaluate", returnByValue=True, expression=(
            "(() => { const e = [...document.querySelectorAll('a, button, [role=tab]')]"
            f".find(e => e.innerText.trim() === {json.dumps(label)}); if (e) e.click(); return !!e; }})()"
        ))
        assert found["result"].get("value"), f"no link or button {label!r} on the page: {self.text()[:2000]}"

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self._call("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        self._ws.close()
        self._proc.terminate()
        self._proc.wait(10)
        self._profile.cleanup()

    def __enter__(self) -> Page:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
