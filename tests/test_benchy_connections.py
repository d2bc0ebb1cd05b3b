"""llama-server closes each streamed response's connection unannounced; llama-benchy, which
pools connections, must then get one connection per request, or it loses requests at random
("Server disconnected": a cell failed that way in about one run in four on a loaded 2-core CI)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import REPO, free_port, load_yaml
from gridbench.config.loading import load_grid
from gridbench.engines.kinds import KINDS
from gridbench.engines.manager import SlotManager
from gridbench.harness import benchy

pytestmark = pytest.mark.integration

# back to back streamed requests through one pooled aiohttp session, as llama-benchy makes
# them (its latency probes and runs): prints how many were lost
POOLED_CLIENT = textwrap.dedent(
    """
    import asyncio, sys
    import aiohttp

    async def main(base_url, model, count):
        connector = aiohttp.TCPConnector(limit=6, force_close=False, keepalive_timeout=600)
        lost = 0
        async with aiohttp.ClientSession(connector=connector) as session:
            for _ in range(count):
                body = {"model": model, "messages": [{"role": "user", "content": "hello"}],
                        "max_tokens": 1, "stream": True}
                try:
                    async with session.post(base_url + "/v1/chat/completions", json=body) as response:
                        async for _ in response.content:
                            pass
                except aiohttp.ClientError:
                    lost += 1
        print(lost)

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    """
)


@pytest.fixture
def engine(workdir):
    config = load_yaml(REPO / "config/mechanism.yaml")
    config["engines"]["llamacpp"]["port"] = free_port()
    grid = load_grid(config, "mechanism.yaml")
    cfg = grid.configs["D_f16_n0"]
    manager = SlotManager(["cpu"])
    with manager.lease(cfg) as lease:
        yield grid, cfg, lease
    manager.stop_all()


def closes_after_stream(host: str, port: int, model: str) -> bool:
    """Whether the server closes the connection once a streamed response has ended."""
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 1, "stream": True}
    ).encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(request)
        received = b""
        while chunk := sock.recv(65536):  # the server's close ends this loop; a timeout fails it
            received += chunk
    assert received.startswith(b"HTTP/1.1 200") and received.endswith(b"0\r\n\r\n"), received[-200:]
    return b"connection: close" not in received.split(b"\r\n\r\n")[0].lower()


def test_llamacpp_closes_streamed_connections_unannounced_and_its_kind_says_so(engine):
    _, cfg, lease = engine
    host, port = lease.plan.host, lease.plan.port
    assert closes_after_stream(host, port, lease.plan.served_model_name)
    assert KINDS[cfg.engine.kind].closes_streamed_connections
    assert not KINDS["vllm"].closes_streamed_connections  # uvicorn keeps them alive


def test_llama_benchy_loses_no_request_to_the_closed_connections(engine, tmp_path):
    grid, cfg, lease = engine
    run = benchy.build_run(
        cfg, 0, grid.benchy, base_url=lease.base_url, book_url="http://127.0.0.1:9/book.txt", workdir=tmp_path
    )
    argv = [sys.executable, "-c", POOLED_CLIENT, lease.base_url, lease.plan.served_model_name, "60"]
    started = time.monotonic()
    lost = subprocess.run(argv, env={**os.environ, **run.env}, capture_output=True, text=True, check=True)
    assert lost.stdout.strip() == "0", lost.stdout + lost.stderr
    assert time.monotonic() - started < 60
