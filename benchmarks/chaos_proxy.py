"""A chaos reverse proxy used as an engine command by the soak (benchmarks/soak.py).

It takes llama-server flags like the CPU demo engine, starts the real engine
(``python -m gridbench.testengines.xllamacpp_server``) on an internal port with the same
flags, and forwards every request to it. Per completion request a seeded RNG picks a fault:
  http500  answer HTTP 500 without asking the engine
  stall    forward the first line of the stream, then send nothing more
  cut      forward two events of the stream, then close the connection
  kill     SIGKILL the real engine after the first line and exit (the engine "dies")
Each injected fault is appended as a JSON line to --chaos-log. Chaos is on only while the
file --chaos-switch exists, so the soak's clean rerun uses the same engine command (same
config fingerprint) without faults.

usage: python chaos_proxy.py --chaos-log F --chaos-switch F --chaos-seed N --chaos-rate P
       [--chaos-kinds http500,stall,cut,kill] LLAMA-SERVER FLAGS (--host, --port, --alias ...)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web

FAULT_KINDS = ("http500", "stall", "cut", "kill")
COMPLETION_PATHS = ("/v1/chat/completions", "/v1/completions")
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "content-encoding"}


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chaos-log", type=Path, required=True)
    parser.add_argument("--chaos-switch", type=Path, required=True)
    parser.add_argument("--chaos-seed", type=int, default=0)
    parser.add_argument("--chaos-rate", type=float, default=0.05)
    parser.add_argument("--chaos-kinds", default=",".join(FAULT_KINDS))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("-a", "--alias", default="engine")
    args, engine_flags = parser.parse_known_args(argv)
    return args, engine_flags


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ChaosLog:
    """Appends one JSON line per event; also numbers this proxy's start, so that each
    restarted engine draws its own reproducible fault sequence."""

    def __init__(self, path: Path, alias: str):
        self.path = path
        self.alias = alias
        path.parent.mkdir(parents=True, exist_ok=True)
        earlier = path.read_text().splitlines() if path.exists() else []
        self.start_number = sum(1 for line in earlier if f'"start", "config": "{alias}"' in line)
        self.write("start")

    def write(self, event: str, **fields) -> None:
        line = json.dumps({"event": event, "config": self.alias, "time": time.time(), **fields})
        with self.path.open("a") as f:
            f.write(line + "\n")


def main() -> None:
    args, engine_flags = parse(sys.argv[1:])
    kinds = [k for k in args.chaos_kinds.split(",") if k]
    chaos_log = ChaosLog(args.chaos_log, args.alias)
    rng = random.Random(f"{args.chaos_seed}:{args.alias}:{chaos_log.start_number}")
    internal_port = free_port()
    # the engine stays in this process group, so gridbench's killpg stops both
    engine = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gridbench.testengines.xllamacpp_server",
            *engine_flags,
            "--alias",
            args.alias,
            "--host",
            "127.0.0.1",
            "--port",
            str(internal_port),
        ]
    )
    upstream = f"http://127.0.0.1:{internal_port}"

    def pick_fault() -> str | None:
        # the draws do not depend on the switch, so a run's sequence is the same either way
        roll, kind = rng.random(), rng.choice(kinds)
        return kind if roll < args.chaos_rate and args.chaos_switch.exists() else None

    async def watch_engine(_app):
        async def watch():
            while engine.poll() is None:  # noqa: ASYNC110 (a child process has nothing to await)
                await asyncio.sleep(0.2)
            os._exit(1)  # an engine that died on its own takes the proxy with it

        task = asyncio.create_task(watch())
        yield
        task.cancel()

    async def forward(request: web.Request) -> web.StreamResponse:
        fault = pick_fault() if request.path in COMPLETION_PATHS else None
        if fault:
            chaos_log.write("fault", kind=fault, path=request.path)
        if fault == "http500":
            return web.json_response({"error": {"message": "chaos: injected 500", "code": 500}}, status=500)
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS | {"host"}}
        session: aiohttp.ClientSession = request.app["session"]
        try:
            upstream_response = await session.request(
                request.method, upstream + request.path_qs, data=body, headers=headers
            )
        except aiohttp.ClientConnectionError:
            return web.json_response({"error": "engine not reachable"}, status=503)
        async with upstream_response:
            response = web.StreamResponse(
                status=upstream_response.status,
                headers={k: v for k, v in upstream_response.headers.items() if k.lower() not in HOP_HEADERS},
            )
            await response.prepare(request)
            lines = 0
            # line by line, as the engine wrote them: coalesced chunks would read as one burst
            async for line in upstream_response.content:
                await response.write(line)
                lines += 1
                if fault == "kill":
                    os.kill(engine.pid, signal.SIGKILL)
                    os._exit(137)
                if fault == "stall":
                    # let the engine go: a connection held open would hold one of its HTTP
                    # workers, and hang later cells that met no fault
                    upstream_response.close()
                    await asyncio.sleep(3600)
                if fault == "cut" and lines >= 4:  # two SSE events
                    request.transport.close()
                    return response
            await response.write_eof()
            return response

    async def open_session(app):
        # a fresh connection per request: a kept-alive one the engine closed would fail a
        # request as "engine not reachable", a fault nobody injected
        app["session"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True), timeout=aiohttp.ClientTimeout(total=None)
        )
        yield
        await app["session"].close()

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.cleanup_ctx.extend([open_session, watch_engine])
    app.router.add_route("*", "/{tail:.*}", forward)
    try:
        web.run_app(app, host=args.host, port=args.port, print=None, handle_signals=True)
    finally:
        engine.terminate()


if __name__ == "__main__":
    main()
