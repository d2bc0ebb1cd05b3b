"""Server-sent events of an OpenAI-style streaming completion, parsed without I/O.

``SSEParser.feed`` takes bytes exactly as they arrived (a chunk may end anywhere: inside a
line, inside a UTF-8 character, between the CR and LF of a line end) and returns the
events those bytes completed. ``parse_chunk`` turns one event into what the harness
needs from it: text, finish reason, usage, the end marker, or an error.
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass
from typing import Any

TEXT_FIELDS = ("content", "reasoning", "reasoning_content")  # reasoning parsers stream there first


@dataclass(frozen=True)
class SSEEvent:
    """One dispatched event: its ``event:`` name (None when absent) and joined ``data:`` lines.

    llama.cpp's server reports a failure inside a stream as an ``error:`` line, which the
    SSE format would drop as an unknown field; it becomes an event named ``error``."""

    event: str | None
    data: str


class SSEParser:
    """Incremental SSE parser (the WHATWG event-stream rules, plus llama.cpp's ``error:``)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._data: list[str] = []
        self._event: str | None = None
        self._pending_cr = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        return self._consume(self._decoder.decode(chunk))

    def finish(self) -> list[SSEEvent]:
        """End of stream: a last event without its blank line still counts."""
        events = self._consume(self._decoder.decode(b"", final=True))
        if self._buffer:
            events += self._line(self._buffer)
            self._buffer = ""
        return events + self._dispatch()

    def _consume(self, text: str) -> list[SSEEvent]:
        if self._pending_cr and text.startswith("\n"):
            text = text[1:]  # the LF of a CRLF split across two chunks
        self._pending_cr = False
        events: list[SSEEvent] = []
        buffer = self._buffer + text
        if "\r" not in buffer:  # the common case: LF line ends only
            *lines, self._buffer = buffer.split("\n")
            for line in lines:
                events += self._line(line)
            return events
        start = 0
        while True:
            cr, lf = buffer.find("\r", start), buffer.find("\n", start)
            if cr == -1 and lf == -1:
                break
            end = min(i for i in (cr, lf) if i != -1)
            events += self._line(buffer[start:end])
            if buffer[end] == "\r":
                if end + 1 == len(buffer):
                    self._pending_cr = True
                elif buffer[end + 1] == "\n":
                    end += 1
            start = end + 1
        self._buffer = buffer[start:]
        return events

    def _line(self, line: str) -> list[SSEEvent]:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return []  # comment / keep-alive
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "error":
            self._event = "error"
            self._data.append(value)
        return []

    def _dispatch(self) -> list[SSEEvent]:
        if not self._data:
            self._event = None
            return []
        event = SSEEvent(self._event, "\n".join(self._data))
        self._data, self._event = [], None
        return [event]


@dataclass(frozen=True)
class StreamChunk:
    """What one event means to the harness."""

    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int | None = None
    done: bool = False
    error: str | None = None
    ignored: str | None = None  # why an event carried nothing usable (non-JSON, unknown shape)

    @property
    def has_text(self) -> bool:
        return bool(self.text)


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
    text: list[str] = []
    finish_reason = None
    for choice in payload.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta") or {}
        text += [delta[f] for f in TEXT_FIELDS if isinstance(delta.get(f), str) and delta[f]]
        finish_reason = choice.get("finish_reason") or finish_reason
    usage = payload.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return StreamChunk(
        text="".join(text),
        finish_reason=finish_reason,
        completion_tokens=tokens if isinstance(tokens, int) and tokens >= 0 else None,
    )


def _error_message(error: Any) -> str:
    if isinstance(error, dict):
        message = error.get("message") or json.dumps(error)
        code = error.get("code") or error.get("type")
        return f"{code}: {message}" if code else str(message)
    return str(error)
