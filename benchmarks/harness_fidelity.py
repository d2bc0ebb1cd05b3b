"""How exactly the natural-prompt harness measures: against a paced server whose timing is known.

The paced server (plain asyncio, its own processes) answers every streamed chat completion
with a first text chunk ``ttft`` after the request arrived and one chunk per token every
``gap`` after that, on an absolute schedule, and records when it actually wrote each chunk
on the host's monotonic clock (the clock the harness reads). "True" below is what the
server did: TTFT = first write - arrival (the kernel's receive timestamp of the request's
first segment: the time the request then waits for the server's loop is the server's),
TPOT = (last write - first write) / (tokens - 1), aggregate = tokens / (last write - first
arrival). The harness's numbers are the ones it writes into a cell's JSON. llama-benchy
measures the same server for comparison; its tg is (tokens - 1) / (last chunk - first
chunk) per request, so it is compared with 1 / TPOT.

    python benchmarks/harness_fidelity.py            # c = 1, 16, 64 (the last >= 20,000 tok/s)
    python benchmarks/harness_fidelity.py --quick    # smaller, for a smoke run

Target: measured / true within 1 % for TTFT p50, TPOT p50 and aggregate tok/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gridbench.harness import natural
from gridbench.harness.stats import nearest_rank

MODEL = "paced"


@dataclass(frozen=True)
class Scenario:
    concurrency: int
    requests: int
    tokens: int
    ttft_ms: float
    gap_ms: float

    @property
    def nominal_tok_s(self) -> float:
        """Aggregate while every slot streams (waves of ``concurrency`` requests, no gaps)."""
        duration_ms = self.ttft_ms + (self.tokens - 1) * self.gap_ms
        return self.concurrency * self.tokens / (duration_ms / 1000)


SCENARIOS = [
    Scenario(concurrency=1, requests=8, tokens=128, ttft_ms=100, gap_ms=10),
    Scenario(concurrency=16, requests=32, tokens=128, ttft_ms=100, gap_ms=10),
    Scenario(concurrency=64, requests=128, tokens=512, ttft_ms=100, gap_ms=2.5),
]
QUICK = [
    Scenario(concurrency=1, requests=4, tokens=32, ttft_ms=50, gap_ms=10),
    Scenario(concurrency=16, requests=16, tokens=64, ttft_ms=50, gap_ms=5),
]


# --- the paced server (runs in its own process) --------------------------------------------


SO_TIMESTAMPNS = 35  # Linux; Python's socket module does not name it
_STAMP_SPACE = socket.CMSG_SPACE(16)  # one struct timespec


def kernel_arrival_ns(ancdata) -> int | None:
    """When the kernel received the segment, on the monotonic clock; None without a stamp.
    The stamp is on the realtime clock: both clocks are read back to back to convert it."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = struct.unpack("qq", data[:16])
            monotonic_now = time.perf_counter_ns()
            realtime_now = time.clock_gettime_ns(time.CLOCK_REALTIME)
            return monotonic_now - (realtime_now - (sec * 1_000_000_000 + nsec))
    return None


def listening_socket(port: int, reuse_port: bool) -> socket.socket:
    """A non-blocking listener whose connections carry kernel receive timestamps (inherited)."""
    listener = socket.socket()
    if reuse_port:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(1024)
    listener.setblocking(False)
    return listener


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


def serve(port: int, control_port: int, ttft_ms: float, gap_ms: float, tokens: int) -> None:
    """One server process: the shared port (SO_REUSEPORT spreads connections over the
    processes) and its own control port for /log. Raw non-blocking sockets on asyncio: a
    request's arrival is the kernel's receive timestamp of its first segment
    (SO_TIMESTAMPNS), so the time it waits for this busy loop to read it counts in the
    server's TTFT, as it would for a real server; the schedule is anchored there too."""
    log: list[dict] = []
    chunks = [
        b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" t%d"}}]}\n\n' % k
        for k in range(tokens)
    ]
    tasks: set[asyncio.Future] = set()

    async def stream(conn: socket.socket, arrival: int, read: int, n: int, content: str, usage: dict) -> None:
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(conn, HEAD % b"text/event-stream")
        sent, lateness = [], []
        for k in range(n):
            target = arrival + int((ttft_ms + k * gap_ms) * 1e6)
            delay = target - time.perf_counter_ns()
            if delay > 0:
                await asyncio.sleep(delay / 1e9)
            now = time.perf_counter_ns()
            await loop.sock_sendall(conn, chunks[k])
            sent.append(now)
            lateness.append(now - target)
        await loop.sock_sendall(
            conn,
            b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
            + f'data: {{"choices":[],"usage":{json.dumps(usage)}}}\n\n'.encode()
            + b"data: [DONE]\n\n",
        )
        log.append(
            {"prompt": content[:40], "arrival": arrival, "read": read, "first": sent[0], "last": sent[-1]}
            | {"tokens": n, "late_p50_ms": sorted(lateness)[len(lateness) // 2] / 1e6}
            | {"late_max_ms": max(lateness) / 1e6}
        )

    async def respond(conn: socket.socket, arrival: int, read: int, target: bytes, body: bytes) -> None:
        if target == b"/v1/models":
            return await reply_json(conn, {"object": "list", "data": [{"id": MODEL}]})
        if target == b"/log":
            taken = list(log)
            log.clear()
            return await reply_json(conn, taken)
        request = json.loads(body)
        n = min(int(request.get("max_tokens") or tokens), tokens)
        content = request["messages"][-1]["content"]
        usage = {"prompt_tokens": len(content.split()), "completion_tokens": n, "total_tokens": n}
        if not request.get("stream"):  # llama-benchy's prompt-size calibration
            message = {"role": "assistant", "content": "".join(f" t{k}" for k in range(n))}
            return await reply_json(conn, {"choices": [{"index": 0, "message": message}], "usage": usage})
        await stream(conn, arrival, read, n, content, usage)

    async def read_request(conn: socket.socket) -> tuple[int, int, bytes, bytes]:
        """(arrival, first read, target, body) of the connection's one request."""
        data, arrival = b"", None
        while True:
            try:
                segment, ancdata, _, _ = conn.recvmsg(65536, _STAMP_SPACE)
            except BlockingIOError:
                await readable(conn)
                continue
            if not segment:
                raise ConnectionError("the client closed before its request was complete")
            if arrival is None:
                read = time.perf_counter_ns()
                arrival = kernel_arrival_ns(ancdata) or read
            data += segment
            head, found, body = data.partition(b"\r\n\r\n")
            if not found:
                continue
            request_line, *headers = head.split(b"\r\n")
            fields = dict(line.lower().split(b":", 1) for line in headers)
            length = int(fields.get(b"content-length", 0))
            if len(body) >= length:
                return arrival, read, request_line.split()[1], body[:length]

    async def handle(conn: socket.socket) -> None:
        with conn:  # one request per connection (every response says Connection: close)
            await respond(conn, *await read_request(conn))

    async def accept(listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(listener)
            conn.setblocking(False)
            tasks.add(task := asyncio.ensure_future(handle(conn)))
            task.add_done_callback(tasks.discard)

    async def run() -> None:
        shared, control = listening_socket(port, True), listening_socket(control_port, False)
        await asyncio.gather(accept(shared), accept(control))

    asyncio.run(run())


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nConnection: close\r\n\r\n"


async def reply_json(conn: socket.socket, document) -> None:
    body = HEAD % b"application/json" + json.dumps(document).encode()
    await asyncio.get_running_loop().sock_sendall(conn, body)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PacedServer:
    """``processes`` server processes on one port, each started as ``this script serve ...``."""

    def __init__(self, scenario: Scenario, processes: int) -> None:
        self.port = _free_port()
        self.control_ports = [_free_port() for _ in range(processes)]
        timing = [str(scenario.ttft_ms), str(scenario.gap_ms), str(scenario.tokens)]
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
                        raise RuntimeError("the paced server did not start") from None
                    time.sleep(0.05)

    def take_log(self) -> list[dict]:
        log = []
        for control in self.control_ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{control}/log", timeout=10) as r:
                log += json.load(r)
        return log

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=10)


# --- measuring ---------------------------------------------------------------------------


def truth(server_log: list[dict]) -> dict[str, float]:
    ttft = sorted((e["first"] - e["arrival"]) / 1e6 for e in server_log)
    tpot = sorted((e["last"] - e["first"]) / 1e6 / (e["tokens"] - 1) for e in server_log)
    wall_s = (max(e["last"] for e in server_log) - min(e["arrival"] for e in server_log)) / 1e9
    return {
        "ttft_ms_p50": nearest_rank(ttft, 50),
        "tpot_ms_p50": nearest_rank(tpot, 50),
        "output_tok_s": sum(e["tokens"] for e in server_log) / wall_s,
        "late_p50_ms": nearest_rank(sorted(e["late_p50_ms"] for e in server_log), 50),
        "late_max_ms": max(e["late_max_ms"] for e in server_log),
    }


def delivery(traces, server_log: list[dict]) -> dict[str, float]:
    """Where the harness's extra time goes, per request (one clock for both processes)."""
    by_index = {int(re.match(r"\[bench-(\d+)\]", e["prompt"]).group(1)): e for e in server_log}
    to_server = sorted((by_index[t.index]["arrival"] - t.start_ns) / 1e6 for t in traces)
    server_read = sorted((by_index[t.index]["read"] - by_index[t.index]["arrival"]) / 1e6 for t in traces)
    first_chunk = sorted((t.text_chunk_ns[0] - by_index[t.index]["first"]) / 1e6 for t in traces)
    last_chunk = sorted((t.text_chunk_ns[-1] - by_index[t.index]["last"]) / 1e6 for t in traces)
    return {
        "request_ms_p50": nearest_rank(to_server, 50),
        "server_read_ms_p50": nearest_rank(server_read, 50),
        "first_chunk_ms_p50": nearest_rank(first_chunk, 50),
        "last_chunk_ms_p50": nearest_rank(last_chunk, 50),
        "first_chunk_ms_max": first_chunk[-1],
    }


def run_harness(server: PacedServer, scenario: Scenario) -> tuple[dict[str, float], list]:
    plan = natural.LevelPlan(
        prompt="Write a story.",
        concurrency=scenario.concurrency,
        requests=scenario.requests,
        warmup=0,
        max_tokens=scenario.tokens,
        temperature=0,
        cache_bust=True,
        extra_body={},
        request_timeout_s=120,
    )
    endpoint = natural.Endpoint(server.base_url, MODEL)
    cpu_before = time.process_time()
    traces = natural.measure_level(endpoint, plan)
    cpu_s = time.process_time() - cpu_before
    document = natural.result_document(
        config="paced", prompt_class="x", plan=plan, traces=traces, spec_decode=None
    )
    summary = document["summary"]
    assert summary["ok"] == scenario.requests, summary
    tokens = sum(r["output_tokens"] for r in document["requests"])
    measured = {
        "ttft_ms_p50": summary["ttft_ms_p50"],
        "tpot_ms_p50": summary["tpot_ms_p50"],
        "output_tok_s": summary["output_tok_s"],
        "cpu_us_per_token": cpu_s / tokens * 1e6,
    }
    return measured, traces


def run_llama_benchy(server: PacedServer, scenario: Scenario, workdir: Path) -> dict[str, float] | None:
    """llama-benchy's tg and TTFT of the same server (offline: local tokenizer, seeded corpus)."""
    from gridbench.assets.corpus import write_corpus
    from gridbench.assets.tokenizer import write_tokenizer
    from gridbench.harness.benchy import benchy_executable, seed_corpus

    home = workdir / "benchy-home"
    tokenizer = workdir / "tokenizer.json"
    corpus = workdir / "book.txt"
    if not tokenizer.exists():
        write_tokenizer(tokenizer)
        write_corpus(corpus)
    book_url = seed_corpus(corpus, home)
    result = workdir / f"benchy-c{scenario.concurrency}.json"
    argv = [
        benchy_executable(),
        "--base-url",
        f"{server.base_url}/v1",
        "--model",
        MODEL,
        "--served-model-name",
        MODEL,
        "--tokenizer",
        str(tokenizer),
        "--book-url",
        book_url,
        "--pp",
        "16",
        "--tg",
        str(scenario.tokens),
        "--depth",
        "0",
        "--runs",
        str(max(1, scenario.requests // scenario.concurrency)),
        "--concurrency",
        str(scenario.concurrency),
        "--latency-mode",
        "none",
        "--no-warmup",
        "--skip-coherence",
        "--format",
        "json",
        "--save-result",
        str(result),
    ]
    env = {**os.environ, "HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not result.exists():
        print(f"llama-benchy failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        return None
    (entry,) = [
        b for b in json.loads(result.read_text())["benchmarks"] if not b.get("is_context_prefill_phase")
    ]
    return {
        "tg_req_tok_s": entry["tg_req_throughput"]["mean"],
        "tg_tok_s": entry["tg_throughput"]["mean"],
        "e2e_ttft_ms": entry["e2e_ttft"]["mean"],
    }


def ratio(measured: float | None, true: float | None) -> str:
    return f"{measured / true:.4f}" if measured and true else "n/a"


def main() -> None:
    if sys.argv[1:2] == ["serve"]:
        port, control_port, ttft_ms, gap_ms, tokens = sys.argv[2:7]
        serve(int(port), int(control_port), float(ttft_ms), float(gap_ms), int(tokens))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small scenarios, for a smoke run")
    parser.add_argument("--no-benchy", action="store_true", help="skip llama-benchy's measurement")
    parser.add_argument(
        "--server-processes",
        type=int,
        default=max(1, min(8, (os.cpu_count() or 2) // 2)),
        help="paced server processes sharing the port (default: half the CPUs, at most 8)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(
        f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; "
        f"{args.server_processes} paced server processes, the harness in this one"
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="fidelity-") as tmp:
        for scenario in QUICK if args.quick else SCENARIOS:
            server = PacedServer(scenario, args.server_processes)
            try:
                measured, traces = run_harness(server, scenario)
                server_log = server.take_log()
                true = truth(server_log)
                measured |= delivery(traces, server_log)
                benchy = None if args.no_benchy else run_llama_benchy(server, scenario, Path(tmp))
                benchy_truth = truth(server.take_log()) if benchy else None
            finally:
                server.stop()
            rows.append((scenario, measured, true, benchy, benchy_truth))
            print_scenario(scenario, measured, true, benchy, benchy_truth)
    load = os.getloadavg()[0]
    print(f"\nload average {load:.1f} at the end (on a shared host other work competes for the CPUs)")
    worst = max(
        abs(m[k] / t[k] - 1) for _, m, t, _, _ in rows for k in ("ttft_ms_p50", "tpot_ms_p50", "output_tok_s")
    )
    print(f"worst |measured/true - 1| of the harness: {worst * 100:.2f} % (target 1 %)")


def print_scenario(scenario, measured, true, benchy, benchy_truth) -> None:
    print(
        f"\n== c={scenario.concurrency}: {scenario.requests} requests x {scenario.tokens} tokens, "
        f"TTFT {scenario.ttft_ms:g} ms, gap {scenario.gap_ms:g} ms "
        f"(nominal aggregate {scenario.nominal_tok_s:,.0f} tok/s)"
    )
    late = f"p50 {true['late_p50_ms']:.3f} ms, max {true['late_max_ms']:.3f} ms"
    print(f"   server lateness vs its schedule: {late}")
    print(f"   {'metric':<22}{'true':>12}{'harness':>12}{'ratio':>9}")
    for key, label, spec in (
        ("ttft_ms_p50", "TTFT p50 (ms)", ".3f"),
        ("tpot_ms_p50", "TPOT p50 (ms)", ".3f"),
        ("output_tok_s", "aggregate (tok/s)", ",.1f"),
    ):
        t, m = true[key], measured[key]
        print(f"   {label:<22}{t:>12{spec}}{m:>12{spec}}{ratio(m, t):>9}")
    print(f"   harness CPU time per token: {measured['cpu_us_per_token']:.1f} µs")
    print(
        f"   delays p50: request start -> server host {measured['request_ms_p50']:.3f} ms, "
        f"-> server's read {measured['server_read_ms_p50']:.3f} ms (in the true TTFT), "
        f"server write -> harness timestamp: first chunk {measured['first_chunk_ms_p50']:.3f} ms "
        f"(max {measured['first_chunk_ms_max']:.3f}), last chunk {measured['last_chunk_ms_p50']:.3f} ms"
    )
    if benchy:
        decode_true = 1000 / benchy_truth["tpot_ms_p50"]
        decode_harness = 1000 / measured["tpot_ms_p50"]
        print(
            f"   decode tok/s per request: true {decode_true:.2f} (llama-benchy's run), "
            f"llama-benchy tg {benchy['tg_req_tok_s']:.2f} ({ratio(benchy['tg_req_tok_s'], decode_true)}); "
            f"true {1000 / true['tpot_ms_p50']:.2f} (harness run), harness 1/TPOT {decode_harness:.2f} "
            f"({ratio(decode_harness, 1000 / true['tpot_ms_p50'])})"
        )
        ttft, ttft_true = benchy["e2e_ttft_ms"], benchy_truth["ttft_ms_p50"]
        print(
            f"   llama-benchy TTFT mean {ttft:.3f} ms vs true p50 {ttft_true:.3f} "
            f"({ratio(ttft, ttft_true)}); its batch tg {benchy['tg_tok_s']:,.1f} tok/s"
        )


if __name__ == "__main__":
    main()
