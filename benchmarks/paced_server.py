"""A paced OpenAI/vLLM-style server whose timing is known: the truth load generators are measured against.

Every streamed completion (``/v1/chat/completions`` or ``/v1/completions``) gets its first
token ``ttft`` after the request arrived and one token every ``gap`` after that, on an
absolute schedule, and the server records when it actually wrote each token on the host's
monotonic clock (the clock the clients read). A request's arrival is the kernel's receive
timestamp of its first segment (SO_TIMESTAMPNS): the time it then waits for a busy server
loop is the server's, as it would be for a real engine. ``/log`` on a process's control port
hands over (and forgets) what that process served.

Enough HTTP/1.1 and enough of the vLLM surface for peer load generators to run unchanged:
keep-alive (streams are sent chunked), chunked request bodies, ``Expect: 100-continue``,
``/v1/models``, ``/health``, ``/tokenize`` and ``/detokenize`` (the tokenizer is UTF-8 bytes,
which both can invert), and streaming with usage (``stream_options.include_usage``). Several
processes share the port (SO_REUSEPORT) when one loop cannot write the load alone.

With ``SLOTS``, a process streams at most that many completions at once and queues the rest
first come, first served; a queued request's schedule starts when it gets a slot. Its
capacity is then known: SLOTS / (TTFT + (TOKENS - 1) x GAP) requests per second, beyond which
the queue, and TTFT with it, grows without bound (what the load cells' SLO test probes).

With ``--batched``, every token is written on the next tick of one GAP_MS clock shared by
all streams and processes, as an engine decoding a batch writes a token to every stream at
each step: the client then reads its streams' chunks in bursts.

With ``--accept-after-ms=MS``, the port's accept backlog holds one connection and the server
accepts none until MS after it arrived: later connection attempts are dropped and resent by the
client's kernel a second later, as by an engine too busy to accept.

    python benchmarks/paced_server.py serve PORT CONTROL_PORT TTFT_MS GAP_MS TOKENS [SLOTS]
        [--batched] [--accept-after-ms=MS]
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

MODEL = "paced"
SO_TIMESTAMPNS = 35  # Linux; Python's socket module does not name it
_STAMP_SPACE = socket.CMSG_SPACE(16)  # one struct timespec
_RECV_BYTES = 65536
_MAX_HEAD_BYTES = 65536


def realtime_offset_ns(tries: int = 5) -> int:
    """The realtime clock minus the monotonic one. A monotonic read bracketed by two realtime
    reads, the tightest bracket of a few: a process preempted between two plain reads (a
    loaded machine) skewed the offset by the millisecond it waited."""
    offsets = []
    for _ in range(tries):
        before = time.clock_gettime_ns(time.CLOCK_REALTIME)
        monotonic = time.perf_counter_ns()
        after = time.clock_gettime_ns(time.CLOCK_REALTIME)
        offsets.append((after - before, (before + after) // 2 - monotonic))
    return min(offsets)[1]


def kernel_arrival_ns(ancdata) -> int | None:
    """When the kernel received the segment, on the monotonic clock; None without a stamp.
    The stamp is on the realtime clock."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = struct.unpack("qq", data[:16])
            return sec * 1_000_000_000 + nsec - realtime_offset_ns()
    return None


def listening_socket(port: int, reuse_port: bool, backlog: int = 4096) -> socket.socket:
    """A non-blocking listener whose connections carry kernel receive timestamps (inherited)."""
    listener = socket.socket()
    if reuse_port:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(backlog)
    listener.setblocking(False)
    return listener


# --- HTTP/1.1, as much as the clients use ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """One parsed request: when it arrived, its method, target, headers (lower-case) and body."""

    arrival: int  # the kernel's receive stamp of its first bytes; == read when there was none
    read: int  # when the server first read it
    method: bytes
    target: bytes
    headers: dict[bytes, bytes]
    body: bytes

    @property
    def keep_alive(self) -> bool:
        return self.headers.get(b"connection", b"").strip().lower() != b"close"


def chunked_body(data: bytes) -> tuple[bytes, int] | None:
    """A chunked request body and the bytes it took, or None while incomplete."""
    body, at = [], 0
    while True:
        line_end = data.find(b"\r\n", at)
        if line_end < 0:
            return None
        size = int(data[at:line_end].split(b";")[0], 16)
        start = line_end + 2
        if size == 0:
            trailer_end = data.find(b"\r\n\r\n", line_end)  # the last chunk, trailers, blank line
            return (b"".join(body), trailer_end + 4) if trailer_end >= 0 else None
        if len(data) < start + size + 2:
            return None
        body.append(data[start : start + size])
        at = start + size + 2


class Connection:
    """A kept-alive connection's reads: requests one after another, each dated on arrival."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buffer = b""
        self.arrival = self.read = 0

    async def _recv(self) -> bool:
        while True:
            try:
                segment, ancdata, _, _ = self.conn.recvmsg(_RECV_BYTES, _STAMP_SPACE)
            except BlockingIOError:
                await readable(self.conn)
                continue
            if not segment:
                return False
            if not self.buffer:  # the first bytes of the next request
                self.read = time.perf_counter_ns()
                self.arrival = kernel_arrival_ns(ancdata) or self.read
            self.buffer += segment
            return True

    async def request(self) -> Request | None:
        """The next request; None when the client closed between requests."""
        continued = False
        while True:
            head, found, rest = self.buffer.partition(b"\r\n\r\n")
            if found:
                request_line, *lines = head.split(b"\r\n")
                headers = {}
                for line in lines:
                    name, _, value = line.partition(b":")
                    headers[name.strip().lower()] = value.strip()
                if headers.get(b"expect", b"").lower() == b"100-continue" and not continued:
                    await send(self.conn, b"HTTP/1.1 100 Continue\r\n\r\n")
                    continued = True
                if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
                    parsed = chunked_body(rest)
                else:
                    length = int(headers.get(b"content-length", b"0"))
                    parsed = (rest[:length], length) if len(rest) >= length else None
                if parsed is not None:
                    body, used = parsed
                    self.buffer = rest[used:]
                    method, target = request_line.split()[:2]
                    return Request(self.arrival, self.read, method, target, headers, body)
            elif len(self.buffer) > _MAX_HEAD_BYTES:
                raise ConnectionError("request head too large")
            had_bytes = bool(self.buffer)
            if not await self._recv():
                if had_bytes:
                    raise ConnectionError("the client closed before its request was complete")
                return None


async def readable(conn: socket.socket) -> None:
    """Until ``conn`` has data (recvmsg, for the timestamps, has no asyncio counterpart)."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    # the loop may report the socket again before the waiting task runs
    loop.add_reader(conn.fileno(), lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(conn.fileno())


async def send(conn: socket.socket, data: bytes) -> None:
    await asyncio.get_running_loop().sock_sendall(conn, data)


def head(status: str, content_type: bytes, keep_alive: bool, length: int | None) -> bytes:
    framing = b"Transfer-Encoding: chunked" if length is None else b"Content-Length: %d" % length
    connection = b"keep-alive" if keep_alive else b"close"
    return b"HTTP/1.1 %s\r\nContent-Type: %s\r\n%s\r\nConnection: %s\r\n\r\n" % (
        status.encode(),
        content_type,
        framing,
        connection,
    )


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked response."""
    return b"%x\r\n%s\r\n" % (len(data), data)


async def reply_json(conn: socket.socket, request: Request, document, status: str = "200 OK") -> None:
    body = json.dumps(document).encode()
    await send(conn, head(status, b"application/json", request.keep_alive, len(body)) + body)


# --- the OpenAI/vLLM surface -------------------------------------------------------------


def sse(document: dict) -> bytes:
    return b"data: " + json.dumps(document, separators=(",", ":")).encode() + b"\n\n"


def token_events(kind: str, tokens: int) -> list[bytes]:
    """Token k's event, as vLLM writes it; the last one carries the finish reason."""
    events = []
    for k in range(tokens):
        finish = "length" if k == tokens - 1 else None
        if kind == "chat":
            choice = {"index": 0, "delta": {"content": f" t{k}"}, "logprobs": None, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": f" t{k}", "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        events.append(
            sse({"id": "paced-0", "object": obj, "created": 0, "model": MODEL, "choices": [choice]})
        )
    return events


def prompt_text(request: dict) -> str:
    """The prompt as text: a completion's prompt, or the last chat message's text parts."""
    if "messages" in request:
        content = request["messages"][-1].get("content") or ""
        if isinstance(content, list):  # content parts
            return "".join(part.get("text", "") for part in content if isinstance(part, dict))
        return content
    prompt = request.get("prompt", "")
    if isinstance(prompt, list):  # token ids, or a batch of one prompt
        prompt = prompt[0] if prompt and not isinstance(prompt[0], int) else prompt
        return prompt if isinstance(prompt, str) else bytes(t % 256 for t in prompt).decode(errors="replace")
    return prompt


def serve(
    port: int,
    control_port: int,
    ttft_ms: float,
    gap_ms: float,
    tokens: int,
    slots: int | None = None,
    batched: bool = False,
    accept_after_ms: float = 0,
) -> None:
    """One server process: the shared port (SO_REUSEPORT spreads connections over the
    processes) and its own control port for /log. Raw non-blocking sockets on asyncio.
    With ``accept_after_ms``, the shared port's backlog holds one connection and nothing is
    accepted until that long after it arrived: later connection attempts are dropped, as by a
    saturated engine."""
    log: list[dict] = []
    gap_ns = int(gap_ms * 1e6)
    events = {kind: token_events(kind, tokens) for kind in ("chat", "completion")}
    tasks: set[asyncio.Future] = set()

    gate = asyncio.Semaphore(slots) if slots else None  # FIFO: waiters wake in arrival order

    async def stream(
        conn: socket.socket, request: Request, kind: str, n: int, usage: dict, prompt: str, asked: int
    ):
        """The stream once a slot is free (at once without SLOTS)."""
        if gate is None:
            return await stream_from(request.arrival, conn, request, kind, n, usage, prompt, asked)
        async with gate:
            start = max(request.arrival, time.perf_counter_ns())
            await stream_from(start, conn, request, kind, n, usage, prompt, asked)

    async def stream_from(
        start: int, conn, request: Request, kind: str, n: int, usage: dict, prompt: str, asked: int
    ):
        """The tokens on their schedule from ``start``, each event a chunk of its own; the last
        token, the usage block and [DONE] in one write, so the stream ends when its last token is
        out. The log keeps what the request asked for (``asked``) beside the ``n`` it was sent."""
        await send(conn, head("200 OK", b"text/event-stream", request.keep_alive, None))
        sent, lateness = [], []
        token_events = events[kind]
        for k in range(n):
            target = start + int((ttft_ms + k * gap_ms) * 1e6)
            if batched:  # on the next tick of one clock shared by every stream and process
                target = -(-target // gap_ns) * gap_ns
            delay = target - time.perf_counter_ns()
            if delay > 0:
                await asyncio.sleep(delay / 1e9)
            event = token_events[k if k < n - 1 else -1]  # the last carries the finish reason
            if k == n - 1:
                event += sse(
                    {"id": "paced-0", "object": "usage", "model": MODEL, "choices": [], "usage": usage}
                )
                event += b"data: [DONE]\n\n"
            data = chunk(event) + (chunk(b"") if k == n - 1 else b"")
            now = time.perf_counter_ns()
            await send(conn, data)
            sent.append(now)
            lateness.append(now - target)
        log.append(
            {"prompt": prompt[:40], "arrival": request.arrival, "read": request.read, "first": sent[0]}
            | {"stamped": request.arrival != request.read}
            | {
                "last": sent[-1],
                "tokens": n,
                "asked": asked,
                "late_p50_ms": sorted(lateness)[len(lateness) // 2] / 1e6,
            }
            | {"late_max_ms": max(lateness) / 1e6}
        )

    async def respond(conn: socket.socket, request: Request) -> None:
        target = request.target.split(b"?")[0]
        if target in (b"/v1/models", b"/models"):
            model = {
                "id": MODEL,
                "object": "model",
                "root": MODEL,
                "owned_by": "paced",
                "max_model_len": 65536,
            }
            return await reply_json(conn, request, {"object": "list", "data": [model]})
        if target in (b"/health", b"/ping"):
            return await reply_json(conn, request, {})
        if target == b"/log":
            taken = list(log)
            log.clear()
            return await reply_json(conn, request, taken)
        if target not in (b"/tokenize", b"/detokenize", b"/v1/chat/completions", b"/v1/completions"):
            return await reply_json(conn, request, {"error": {"message": "not found"}}, "404 Not Found")
        body = json.loads(request.body)
        if target == b"/tokenize":  # the tokenizer is UTF-8 bytes: /detokenize inverts it
            ids = list(prompt_text(body).encode())
            return await reply_json(conn, request, {"tokens": ids, "count": len(ids), "max_model_len": 65536})
        if target == b"/detokenize":
            text = bytes(t % 256 for t in body["tokens"]).decode(errors="replace")
            return await reply_json(conn, request, {"prompt": text})
        kind = "chat" if target == b"/v1/chat/completions" else "completion"
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or tokens
        n = max(1, min(int(asked), tokens))
        prompt = prompt_text(body)
        prompt_tokens = len(prompt.encode())
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        if not body.get("stream"):  # llama-benchy's prompt-size calibration
            text = "".join(f" t{k}" for k in range(n))
            choice = {"index": 0, "finish_reason": "length"}
            choice |= (
                {"message": {"role": "assistant", "content": text}} if kind == "chat" else {"text": text}
            )
            return await reply_json(conn, request, {"id": "paced-0", "choices": [choice], "usage": usage})
        await stream(conn, request, kind, n, usage, prompt, int(asked))

    async def handle(conn: socket.socket) -> None:
        with conn:
            reader = Connection(conn)
            try:
                while (request := await reader.request()) is not None:
                    await respond(conn, request)
                    if not request.keep_alive:
                        break
            except (ConnectionError, OSError):
                pass  # the client went away: what it was sent is already logged or never was

    async def accept(listener: socket.socket, after_ms: float = 0) -> None:
        loop = asyncio.get_running_loop()
        if after_ms:  # timed from the first connection's arrival, however late the clients start
            await readable(listener)
            await asyncio.sleep(after_ms / 1e3)
        while True:
            conn, _ = await loop.sock_accept(listener)
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tasks.add(task := asyncio.ensure_future(handle(conn)))
            task.add_done_callback(tasks.discard)

    async def run() -> None:
        shared = listening_socket(port, True, backlog=0 if accept_after_ms else 4096)
        control = listening_socket(control_port, False)
        await asyncio.gather(accept(shared, accept_after_ms), accept(control))

    asyncio.run(run())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PacedServer:
    """``processes`` server processes on one port, each started as ``this script serve ...``."""

    def __init__(
        self,
        ttft_ms: float,
        gap_ms: float,
        tokens: int,
        processes: int,
        slots: int | None = None,
        batched: bool = False,
        accept_after_ms: float = 0,
    ) -> None:
        self.port = _free_port()
        self.control_ports = [_free_port() for _ in range(processes)]
        timing = [str(ttft_ms), str(gap_ms), str(tokens), *([str(slots)] if slots else [])]
        timing += ["--batched"] if batched else []
        timing += [f"--accept-after-ms={accept_after_ms:g}"] if accept_after_ms else []
        self.procs = [
            subprocess.Popen([sys.executable, __file__, "serve", str(self.port), str(control), *timing])
            for control in self.control_ports
        ]
        self.base_url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        for control in self.control_ports:
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{control}/v1/models", timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                        self.stop()
                        raise RuntimeError("the paced server did not start") from None
                    time.sleep(0.05)

    def take_log(self) -> list[dict]:
        """Every process's record of the streams it served since the last call."""
        log = []
        for control in self.control_ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{control}/log", timeout=30) as r:
                log += json.load(r)
        return log

    def cpu_s(self) -> float:
        """CPU time the server's processes have used so far (Linux: /proc/PID/stat)."""
        ticks = 0
        for proc in self.procs:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=10)

    def __enter__(self) -> PacedServer:
        return self

    def __exit__(self, *_exc) -> None:
        self.stop()


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    flags = dict(a[2:].partition("=")[::2] for a in sys.argv[1:] if a.startswith("--"))
    if args[:1] != ["serve"] or len(args) not in (6, 7) or set(flags) - {"batched", "accept-after-ms"}:
        raise SystemExit(__doc__.rsplit("\n\n", 1)[-1])
    port, control_port, ttft_ms, gap_ms, tokens = args[1:6]
    slots = int(args[6]) if len(args) == 7 else None
    serve(
        int(port),
        int(control_port),
        float(ttft_ms),
        float(gap_ms),
        int(tokens),
        slots,
        batched="batched" in flags,
        accept_after_ms=float(flags.get("accept-after-ms") or 0),
    )


if __name__ == "__main__":
    main()
