"""An OpenAI-compatible streaming server that misbehaves on purpose, for the fault tests.

It takes the llama-server flags gridbench passes (--host, --port, --alias; others are
ignored) and answers /health, /v1/models and streamed /v1/chat/completions with one word
per chunk, then fails as told:
  --status-every N --status S   every Nth chat request answers HTTP S (500, 429 ...)
  --drop-after K                close the connection after K tokens of every stream
  --truncate                    end every stream early, without usage or [DONE]
  --hang                        accept chat requests and never answer them
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from aiohttp import web


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--alias", default="fault")
    parser.add_argument("--status-every", type=int, default=0)
    parser.add_argument("--status", type=int, default=500)
    parser.add_argument("--drop-after", type=int, default=0)
    parser.add_argument("--truncate", action="store_true")
    parser.add_argument("--hang", action="store_true")
    args, _ignored = parser.parse_known_args()
    return args


def main() -> None:
    args = parse()
    count = {"chat": 0}

    async def health(_request):
        return web.json_response({"status": "ok"})

    async def models(_request):
        return web.json_response({"object": "list", "data": [{"id": args.alias, "object": "model"}]})

    async def chat(request):
        body = await request.json()
        count["chat"] += 1
        if args.hang:
            await asyncio.sleep(3600)
        if args.status_every and count["chat"] % args.status_every == 0:
            return web.json_response(
                {"error": {"message": "injected", "code": args.status}}, status=args.status
            )
        n = int(body.get("max_tokens", 16))
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body["messages"])
        if not body.get("stream"):
            text = " Paris" * n
            return web.json_response(
                {
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "length",
                        }
                    ],
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n},
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def send(data) -> None:
            await response.write(f"data: {json.dumps(data)}\n\n".encode())

        await send({"choices": [{"index": 0, "delta": {"role": "assistant"}}], "created": int(time.time())})
        for i in range(n):
            if args.drop_after and i == args.drop_after:
                request.transport.close()
                return response
            if args.truncate and i == n // 2:
                await response.write_eof()
                return response
            await asyncio.sleep(0.002)
            await send({"choices": [{"index": 0, "delta": {"content": " word"}}]})
        await send({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        await send({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n}})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.add_routes(
        [web.get("/health", health), web.get("/v1/models", models), web.post("/v1/chat/completions", chat)]
    )
    web.run_app(app, host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
