"""Server-sent events of an OpenAI-style streaming completion, parsed without I/O.

``SSEParser.feed`` takes bytes exactly as they arrived (a chunk may end anywhere: inside a
line, inside a UTF-8 character, between the CR and LF of a line end) and returns the
events those bytes completed. ``parse_chunk`` turns one event into what the harness
needs from it: text, finish reason, usage, the end marker, or an error.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

TEXT_FIELDS = ("content", "reasoning", "reasoning_content")  # reasoning parsers stream there first
# a text field holding a non-empty string; quotes inside JSON strings are escaped, so this
# matches only a real key (or, harmlessly for the check below, a value that equals its name)
_TEXT_VALUE = re.compile(r'"(?:content|reasoning|reasoning_content)" ?: ?"[^"]')
# any of these makes an event more than "text or not": it goes to the full parse
_NOT_PLAIN = ('"usage"', '"error"', '"finish_reason":"', '"finish_reason": "')


class SSEEvent(NamedTuple):
    """One dispatched event: its ``event:`` name (None when absent) and joined ``data:`` lines.

    llama.cpp's server reports a failure inside a stream as an ``error:`` line, which the
    SSE format would drop as an unknown field; it becomes an event named ``error``."""

    event: str | None
    data: str


class SSEParser:
    """Incremental SSE parser (the WHATWG event-stream rules, plus llama.cpp's ``error:``).

    It splits bytes (a line end never falls inside a UTF-8 character) and decodes each
    event's data once it is complete."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []
        self._event: str | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if (  # the common read: one whole "data:" event, nothing pending
            not self._buffer
            and not self._data
            and self._event is None
            and chunk.startswith(b"data: ")
            and chunk.endswith(b"\n\n")
            and chunk.count(b"\n") == 2
            and b"\r" not in chunk
        ):
            return [SSEEvent(None, chunk[6:-2].decode("utf-8", "replace"))]
        buffer = self._buffer + chunk
        held = b""
        if b"\r" in buffer:
            if buffer.endswith(b"\r"):  # perhaps the CR of a CRLF whose LF comes next
                buffer, held = buffer[:-1], b"\r"
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *lines, rest = buffer.split(b"\n")
        self._buffer = rest + held
        events: list[SSEEvent] = []
        for line in lines:
            if line.startswith(b"data:"):  # the common case, kept short
                self._data.append(line[6:] if line.startswith(b"data: ") else line[5:])
            elif line:
                self._field(line)
            elif self._data:
                events.append(self._dispatch())
            else:
                self._event = None
        return events

    def finish(self) -> list[SSEEvent]:
        """End of stream: a last event without its blank line still counts."""
        events = self.feed(b"\n") if self._buffer.endswith(b"\r") else []
        if self._buffer:
            events += self.feed(b"\n")
        if self._data:
            events.append(self._dispatch())
        return events

    def _field(self, line: bytes) -> None:
        if line.startswith(b":"):
            return  # comment / keep-alive
        name, sep, value = line.partition(b":")
        if sep and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"error":
            self._event = "error"
            self._data.append(value)

    def _dispatch(self) -> SSEEvent:
        event = SSEEvent(self._event, b"\n".join(self._data).decode("utf-8", "replace"))
        self._data, self._event = [], None
        return event


class StreamChunk(NamedTuple):
    """What one event means to the harness."""

    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int | None = None
    done: bool = False
    error: str | None = None
    ignored: str | None = None  # why an event carried nothing usable (non-JSON, unknown shape)
    # the usage chunk's every integer outside its choices, by dotted key ("usage.prompt_tokens",
    # "timings.cache_n"): the engine kind says which holds what (EngineKind.cached_prompt_tokens)
    counts: tuple[tuple[str, int], ...] = ()

    @property
    def has_text(self) -> bool:
        return bool(self.text)


def plain_delta_has_text(event: SSEEvent) -> bool | None:
    """Whether a plain delta event carries text, read without parsing its JSON; None when
    the event is anything else (usage, finish reason, error, [DONE], another shape), which
    ``parse_chunk`` must read. Nearly every event of a stream is a plain delta, and a JSON
    parse per token is most of the harness's own time per token."""
    data = event.data
    if event.event is not None or not (data.startswith("{") and data.endswith("}")):
        return None
    if '"delta"' not in data or any(marker in data for marker in _NOT_PLAIN):
        return None
    return _TEXT_VALUE.search(data) is not None


def parse_chunk(event: SSEEvent) -> StreamChunk:
    data = event.data.strip()
    if data == "[DONE]":
        return StreamChunk(done=True)
    try:
        payload = json.loads(data)
    except json.JSONDecodeError:
        if event.event == "error":
            return StreamChunk(error=data or "error event without a message")
        return StreamChunk(ignored=f"not JSON: {data[:80]!r}")
    if not isinstance(payload, dict):
        return StreamChunk(ignored=f"not a JSON object: {data[:80]!r}")
    if event.event == "error" or "error" in payload:
        return StreamChunk(error=_error_message(payload.get("error", payload)))
    text = ""
    finish_reason = None
    for choice in payload.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            for name in TEXT_FIELDS:
                value = delta.get(name)
                if value and isinstance(value, str):
                    text += value
        finish_reason = choice.get("finish_reason") or finish_reason
    usage = payload.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return StreamChunk(
        text=text,
        finish_reason=finish_reason,
        completion_tokens=tokens if isinstance(tokens, int) and tokens >= 0 else None,
        counts=tuple(_integers(payload, skip="choices")) if isinstance(usage, dict) else (),
    )


def _integers(value: Any, prefix: str = "", skip: str | None = None) -> list[tuple[str, int]]:
    """Every integer in a parsed JSON value by its dotted key (a boolean is no count)."""
    if isinstance(value, dict):
        return [
            pair
            for key, inner in value.items()
            if key != skip
            for pair in _integers(inner, f"{prefix}{key}.")
        ]
    if isinstance(value, int) and not isinstance(value, bool):
        return [(prefix.rstrip("."), value)]
    return []


def _error_message(error: Any) -> str:
    if isinstance(error, dict):
        message = error.get("message") or json.dumps(error)
        code = error.get("code") or error.get("type")
        return f"{code}: {message}" if code else str(message)
    return str(error)
