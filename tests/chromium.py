"""A real headless Chromium for the tests, driven over the DevTools protocol (a websocket; the
``websocket-client`` package). Debian's ``chromium`` package; ``scripts/ensure-chromium`` installs
it when missing, and ``HEADRACE_CHROMIUM`` names another binary."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["Chromium", "find_chromium"]


def find_chromium() -> str | None:
    return os.environ.get("HEADRACE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


class Chromium:
    """One headless browser with one page: ``start()``, ``open(url)``, ``evaluate(js)``,
    ``wait_for(js)``, ``screenshot(path)``, ``stop()``. ``errors`` gathers the page's uncaught
    exceptions and console errors."""

    def __init__(self, binary: str, width: int = 1400, height: int = 1150):
        self.binary, self.width, self.height = binary, width, height
        self.errors: list[str] = []
        self._dir = tempfile.mkdtemp(prefix="headrace-chromium-")
        self._process: subprocess.Popen[bytes] | None = None
        self._socket: Any = None
        self._log: Any = None
        self._id = 0

    def start(self, timeout_s: float = 30) -> "Chromium":
        import websocket

        self._log = log = open(os.path.join(self._dir, "chromium.log"), "wb")
        self._process = subprocess.Popen(
            [self.binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--disable-extensions", "--hide-scrollbars", "--remote-debugging-port=0",
             f"--user-data-dir={self._dir}/profile", f"--window-size={self.width},{self.height}", "about:blank"],
            stdout=log, stderr=subprocess.STDOUT)
        active = Path(self._dir, "profile", "DevToolsActivePort")
        deadline = time.monotonic() + timeout_s
        while not (active.exists() and active.read_text().strip()):
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Chromium did not start (exit {self._process.poll()}): "
                                   + Path(self._dir, "chromium.log").read_text()[-2000:])
            time.sleep(0.05)
        port = int(active.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
            page = next(t for t in json.load(response) if t["type"] == "page")
        self._socket = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.call("Runtime.enable")
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height, deviceScaleFactor=1,
                  mobile=False)
        return self

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and return its result (events that arrive meanwhile are read for errors)."""
        self._id += 1
        self._socket.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self._socket.recv())
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"DevTools {method} failed: {message['error']}")
                return dict(message.get("result", {}))
            self._note(message)

    def _note(self, event: dict[str, Any]) -> None:
        params = event.get("params", {})
        if event.get("method") == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.errors.append(details.get("exception", {}).get("description") or details.get("text", "?"))
        elif event.get("method") == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float, what: str) -> Any:
        """Poll ``expression`` until it is truthy; its value. Fails saying ``what`` did not happen."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} within {timeout_s} s (last value {value!r}; page errors {self.errors})")
            time.sleep(0.2)

    def screenshot(self, path: str | Path) -> bytes:
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"])
        Path(path).write_bytes(data)
        return data

    def stop(self) -> None:
        if self._socket is not None:
            self._socket.close()
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._log is not None:
            self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)
