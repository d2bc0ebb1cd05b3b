"""Loaded at start-up by the llama-benchy process gridbench runs against an engine that closes
each streamed response's connection unannounced (``EngineKind.closes_streamed_connections``):
on its PYTHONPATH, so it touches no other Python.

llama-benchy pools kept-alive connections (aiohttp ``force_close=False``). llama-server ends
every streamed response by closing its connection a few milliseconds after the last chunk,
without ``Connection: close``; a request sent on the pooled connection in that window is lost
("Server disconnected"). On a loaded 2-core host half of back-to-back streamed requests were.
One connection per request, as gridbench's own harness does, takes the race away.
"""

import functools
from typing import Any

import aiohttp

_connector_init = aiohttp.TCPConnector.__init__


@functools.wraps(_connector_init)
def _one_connection_per_request(self: aiohttp.TCPConnector, *args: Any, **kwargs: Any) -> None:
    kwargs["force_close"] = True
    kwargs.pop("keepalive_timeout", None)  # aiohttp refuses it together with force_close
    _connector_init(self, *args, **kwargs)


# the deliberate monkeypatch this file exists for: mypy forbids assigning to a method
aiohttp.TCPConnector.__init__ = _one_connection_per_request  # type: ignore[method-assign]
