"""An OpenAI-style streaming server that fails on purpose, for the harness's error counting.

Request N (from its ``[bench-N] `` prefix) behaves as ``$FAULTS`` says, e.g.
``FAULTS="2:500,3:429,5:drop"``; unlisted requests stream normally. Behaviours:
ok, 500, 429, drop (connection cut mid-stream), error (error object in the stream),
llamacpp-error (an ``error:`` line), nodone (no [DONE]), nousage (no usage block), hang.

It accepts (and ignores) the llama-server flags gridbench passes, so the workflow can
start it as an engine: ``python tests/fault_server.py --port P [llama-server flags]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re

from aiohttp import web

TOKENS = 8
GAP_S = 0.002


def chunk(delta: dict, finish: str | None = None) -> bytes:
    body = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":8,"total_tokens":17}}\n\n'
DONE = b"data: [DONE]\n\n"


def faults() -> dict[int, str]:
    pairs = (item.split(":") for item in os.environ.get("FAULTS", "").split(",") if item)
    return {int(index): behaviour for index, behaviour in pairs}


async def completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    match = re.match(r"\[bench-(\d+)\] ", body["messages"][0]["content"])
    behaviour = faults().get(int(match.group(1)) if match else -1, "ok")
    if behaviour == "500":
        return web.json_response({"error": {"message": "engine core died", "code": 500}}, status=500)
    if behaviour == "429":
        return web.json_response({"error": {"message": "too many requests", "code": 429}}, status=429)
    if behaviour == "hang":
        await asyncio.sleep(3600)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(chunk({"role": "assistant", "content": None}))
    for k in range(TOKENS):
        await asyncio.sleep(GAP_S)
        await response.write(chunk({"content": f" w{k}"}))
        if behaviour == "drop" and k == 2:
            request.transport.close()  # cut mid-stream: the chunked body never completes
            return response
        if behaviour == "error" and k == 1:
            await response.write(b'data: {"error": {"message": "CUDA error: illegal memory access"}}\n\n')
            await response.write_eof()
            return response
        if behaviour == "llamacpp-error" and k == 1:
            await response.write(
                b'error: {"code": 500, "message": "slot unavailable", "type": "server_error"}\n\n'
            )
            await response.write_eof()
            return response
    await response.write(chunk({}, "length"))
    if behaviour != "nousage":
        await response.write(USAGE)
    if behaviour != "nodone":
        await response.write(DONE)
    await response.write_eof()
    return response


def app(alias: str) -> web.Application:
    application = web.Application()

    async def models(_):
        return web.json_response({"object": "list", "data": [{"id": alias}]})

    async def ok(_):
        return web.json_response({"status": "ok", "build_info": "fault-server"})

    application.add_routes(
        [
            web.post("/v1/chat/completions", completions),
            web.get("/v1/models", models),
            web.get("/health", ok),
            web.get("/props", ok),
            web.get("/metrics", lambda _: web.Response(text="# no speculation\n")),
        ]
    )
    return application


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--alias", default="fault")
    args, _ = parser.parse_known_args()
    web.run_app(app(args.alias), host=args.host, port=args.port, print=None, shutdown_timeout=0.5)


if __name__ == "__main__":
    main()
