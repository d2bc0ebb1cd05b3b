"""HTTP probes of a running engine, whatever its kind: readiness and metrics."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping

from gridbench.errors import EngineStartError, EngineTimeoutError

_POLL_S = 0.25


def http_get(url: str, timeout: float = 5.0, headers: Mapping[str, str] | None = None) -> tuple[int, str]:
    """(status, body) of a GET; status 0 when nothing answers."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0, ""


def http_post(
    url: str, timeout: float = 10.0, headers: Mapping[str, str] | None = None, body: bytes = b"{}"
) -> tuple[int, str]:
    """(status, body) of a POST of a JSON body: an empty object by default, all that the
    engines' control endpoints (vLLM's /reset_prefix_cache) take; status 0 when nothing answers."""
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", **dict(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0, ""


def served_names(models_body: str) -> list[str]:
    try:
        data = json.loads(models_body).get("data", [])
    except (json.JSONDecodeError, AttributeError):
        return []
    names = []
    for entry in data:
        names += [entry.get("id"), *(entry.get("aliases") or [])]
    return [n for n in names if n]


def first_fatal_line(log_text: str, patterns: tuple[str, ...]) -> str | None:
    for line in log_text.splitlines():
        if any(re.search(p, line) for p in patterns):
            return line.strip()
    return None


def wait_ready(
    *,
    base_url: str,
    health_path: str,
    served_model_name: str,
    timeout_s: float,
    is_running: Callable[[], bool],
    log_text: Callable[[], str],
    fatal_patterns: tuple[str, ...],
    what: str,
    headers: Mapping[str, str] | None = None,
) -> float:
    """Block until the health path answers 200 and /v1/models lists the served name.

    Fails fast when the engine exits or its log shows a fatal pattern. Returns the seconds
    it took."""
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        if not is_running():
            raise EngineStartError(
                f"{what}: the engine exited during start-up",
                hint="read the log tail below; fix the flag or image",
                log_tail=log_text(),
            )
        fatal = first_fatal_line(log_text(), fatal_patterns)
        if fatal:
            raise EngineStartError(
                f"{what}: the engine log shows a fatal error: {fatal}",
                hint="read the log tail below",
                log_tail=log_text(),
            )
        status, _ = http_get(base_url + health_path, timeout=2.0, headers=headers)
        if status == 200:
            status, body = http_get(base_url + "/v1/models", timeout=5.0, headers=headers)
            if status == 200 and served_model_name in served_names(body):
                return time.monotonic() - started
        if time.monotonic() > deadline:
            raise EngineTimeoutError(
                f"{what}: not ready after {timeout_s:g} s (health {base_url}{health_path}, "
                f"served name {served_model_name!r} in /v1/models)",
                hint="raise the engine's startup_timeout_s or read the log tail below",
                log_tail=log_text(),
            )
        time.sleep(_POLL_S)


def fetch_metrics(base_url: str, headers: Mapping[str, str] | None = None) -> str | None:
    status, body = http_get(base_url + "/metrics", headers=headers)
    return body if status == 200 else None
