"""Real servers for the real-model tests: a server process waited for until /health answers
and stopped after, llama.cpp's (the xllamacpp shim) on a GGUF, and a JSON POST to either."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from conftest import free_port


def wait_healthy(proc: subprocess.Popen, base: str, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, f"{what} exited during start-up"
        try:
            urllib.request.urlopen(base + "/health", timeout=2).close()
            return
        except (urllib.error.URLError, ConnectionError):
            assert time.monotonic() < deadline, f"{what} did not answer /health in {timeout_s:.0f} s"
            time.sleep(0.5)


@contextmanager
def serving(
    argv: list[str], port: int, what: str, timeout_s: float, env: Mapping[str, str] | None = None
) -> Iterator[str]:
    """``argv`` started (listening on ``port``), its base URL once healthy; stopped after."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, base, what, timeout_s)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@contextmanager
def llama_cpp(model: Path, *extra: str) -> Iterator[str]:
    """llama.cpp's own server (gridbench's xllamacpp shim) on ``model``, one thread."""
    port = free_port()
    argv = [sys.executable, "-m", "gridbench.testengines.xllamacpp_server", "-m", str(model)]
    argv += ["--port", str(port), "--threads", "1", "-c", "2048", *extra]
    with serving(argv, port, "the llama.cpp server", 120) as base:
        yield base


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.load(response)
