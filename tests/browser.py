"""Headless Chromium driven over the DevTools protocol: load a local page with the network
off, read what it logged, evaluate JavaScript in it and take a screenshot.

Debian's ``chromium`` package is the browser (scripts/test.sh installs it); the protocol
runs over one WebSocket (websocket-client), so no driver binary or browser download is needed.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import websocket

CHROMIUM = shutil.which("chromium")
START_TIMEOUT_S = 30
LOAD_TIMEOUT_S = 60


@dataclass(frozen=True)
class ConsoleError:
    source: str  # exception, console or log (the browser's own: a failed load, a blocked fetch)
    text: str


class Chromium:
    """One headless browser with one page; a context manager that ends the browser."""

    def __init__(self, width: int = 1400, height: int = 1000):
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-")
        # no network: every host name fails to resolve and any proxy use goes nowhere, so a
        # page that fetches anything from outside logs an error
        self._process = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",  # tests run as root
                "--disable-gpu",
                "--disable-dev-shm-usage",  # a container's /dev/shm is often too small for it
                "--no-first-run",
                "--remote-debugging-port=0",
                f"--user-data-dir={self._profile.name}",
                "--host-resolver-rules=MAP * ~NOTFOUND",
                "--proxy-server=127.0.0.1:9",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # its own group: the renderer, GPU, network and crash handler processes are its
            # children, and they can outlive the browser process writing into the profile
            start_new_session=True,
        )
        self._events: list[dict[str, Any]] = []
        self._next_id = 0
        try:
            self._socket = websocket.create_connection(self._page_socket_url(), suppress_origin=True)
            for domain in ("Page", "Runtime", "Log"):
                self.call(f"{domain}.enable")
        except BaseException:
            self.close()
            raise

    def _page_socket_url(self) -> str:
        port_file = Path(self._profile.name) / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self._process.poll() is not None:
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
            targets = json.load(response)
        return next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its answer, keeping the events that come first."""
        self._next_id += 1
        self._socket.send(json.dumps({"id": self._next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._socket.recv())
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self._events.append(message)

    def load(self, path: Path) -> None:
        """Open a local file and wait for its load event."""
        self._events.clear()
        self.call("Page.navigate", url=path.resolve().as_uri())
        self._socket.settimeout(LOAD_TIMEOUT_S)
        while not any(e.get("method") == "Page.loadEventFired" for e in self._events):
            self._events.append(json.loads(self._socket.recv()))

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[ConsoleError]:
        """Everything the page reported as an error since it was loaded."""
        self.call("Runtime.evaluate", expression="0")  # collect the events sent so far
        found = []
        for event in self._events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append(ConsoleError("exception", details.get("exception", {}).get("description", "")))
            elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
                found.append(ConsoleError("console", text))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                entry = params["entry"]
                found.append(ConsoleError("log", f"{entry['text']} {entry.get('url', '')}".strip()))
        return found

    def screenshot(self, path: Path) -> None:
        """The whole page, not only the window, as PNG."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        if getattr(self, "_socket", None) is not None:
            self._socket.close()
        _stop_group(self._process.pid)
        self._process.wait()
        self._profile.cleanup()

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _live_members(group: int) -> list[int]:
    """Processes of the group that still run (a zombie writes nothing)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended while being read
        state, process_group = fields[0], int(fields[2])
        if process_group == group and state != "Z":
            members.append(int(stat.parent.name))
    return members


def _stop_group(group: int, grace_s: float = 10) -> None:
    """Terminate every process of the browser's group and wait until none runs, so nothing
    writes into the profile while it is removed."""
    deadline = time.monotonic() + grace_s
    sent = signal.SIGTERM
    while members := _live_members(group):
        for pid in members:
            with contextlib.suppress(ProcessLookupError):  # ended since it was listed
                os.kill(pid, sent)
        if time.monotonic() > deadline:
            sent = signal.SIGKILL
        time.sleep(0.05)
