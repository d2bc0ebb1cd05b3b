"""How closely the open-loop load harness keeps its arrival schedule, against the paced server.

Prints, against the issue's target (p99 <= 1 ms at the highest rate a study uses):
  * the harness's schedule lag (a request's body out minus its due time, as its result file
    records it), p50 / p99 / max, at --rate for --requests Poisson arrivals,
  * the same lag as the server saw it (the kernel's receive stamp of the request, on the
    same monotonic clock), which checks the harness's own record,
  * the reference, measured at the same time in a process of its own: a bare asyncio loop
    waking at the same due times and doing nothing else (what the machine's scheduler gives
    any Python client meanwhile; a stall of the whole host lands in both),
  * what one full garbage collection of this process's heap costs, and what it costs with that
    heap frozen, as the harness freezes it while its schedule runs.

Each --processes setting is measured in turn against the same server (load.processes: the
schedule dealt across that many loops). --batched writes every stream's tokens on one shared
clock, as an engine decoding a batch does, so the client reads them in bursts.

usage: python benchmarks/load_schedule.py [--rate 100] [--requests 1000] [--processes 1,auto]
       [--batched] [--server-processes 2]   (repository root, project venv)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import paced_server

from gridbench.harness import load, natural
from gridbench.harness.arrivals import Arrival, schedule
from gridbench.harness.stats import nearest_rank

TARGET_P99_MS = 1.0


def reference_lags_ms(offsets_s: tuple[float, ...]) -> list[float]:
    """A bare loop's lateness at the same due times: the floor of any asyncio client."""

    async def run() -> list[float]:
        origin = time.perf_counter_ns() + 20_000_000
        lags = []
        for offset in offsets_s:
            due = origin + round(offset * 1e9)
            await natural.wait_until(due)
            lags.append((time.perf_counter_ns() - due) / 1e6)
        return lags

    return asyncio.run(run())


@contextmanager
def reference_alongside(offsets_s: tuple[float, ...]) -> Iterator[Callable[[], list[float]]]:
    """``reference_lags_ms`` in a process of its own, its schedule starting as the block begins
    and running beside what the block measures, so both see the same host: a reference
    measured before the harness missed a stall of the whole machine that the harness then met
    (a 2-core machine busy building an image: 100-170 ms, every process at once). The yielded
    function waits for the reference and returns its lags."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "reference"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdin and proc.stdout
        if proc.stdout.readline().strip() != "ready":  # its imports done: the schedule starts at once
            raise RuntimeError("the reference loop did not start")
        proc.stdin.write(json.dumps(offsets_s) + "\n")
        proc.stdin.flush()

        def lags() -> list[float]:
            out, _ = proc.communicate(timeout=60 + offsets_s[-1])
            return json.loads(out)

        yield lags
    finally:
        proc.kill()
        proc.wait()


def harness_lags_ms(
    base_url: str, offsets_s: tuple[float, ...], tokens: int, processes: int
) -> tuple[list[float], list[int]]:
    """The harness's recorded lags, and each request's due time by its prompt's index."""
    plan = natural.LevelPlan("Write a story.", 1, len(offsets_s), 0, tokens, 0, True, {}, 60)
    requests = [plan.request(i) for i in range(len(offsets_s))]
    endpoint = natural.Endpoint(base_url, "paced")
    run = load.run_open_loop(endpoint, requests, offsets_s, 60, processes=processes)
    failed = [t.error for t in run.traces if t.status != "ok"]
    if failed:
        raise SystemExit(f"{len(failed)} requests failed; first: {failed[0]}")
    return [r.lag_ms for r in load.load_requests(run)], list(run.due_ns)


def full_collection_ms(frozen: bool) -> float:
    """One full collection's time, the heap as it is or frozen first (the median of five)."""
    if frozen:
        gc.freeze()
    times = []
    for _ in range(5):
        start = time.perf_counter_ns()
        gc.collect()
        times.append((time.perf_counter_ns() - start) / 1e6)
    gc.unfreeze()
    return sorted(times)[2]


def line(name: str, lags_ms: list[float]) -> str:
    ordered = sorted(lags_ms)
    p50, p99 = nearest_rank(ordered, 50), nearest_rank(ordered, 99)
    return f"  {name:<34} p50 {p50:7.3f} ms   p99 {p99:7.3f} ms   max {ordered[-1]:7.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=100.0, help="requests per second (Poisson)")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=32, help="each stream's tokens, 5 ms apart")
    parser.add_argument(
        "--processes",
        default="1,auto",
        help='harness processes to compare, comma-separated counts or "auto" (load.processes)',
    )
    parser.add_argument(
        "--batched",
        action="store_true",
        help="every stream's tokens on one shared 5 ms clock, as an engine decoding a batch",
    )
    parser.add_argument("--server-processes", type=int, default=2)
    args = parser.parse_args()
    offsets = schedule(Arrival("poisson"), args.rate, args.requests, seed=0).offsets_s
    in_flight = args.rate * (50 + 5 * (args.tokens - 1)) / 1e3
    print(
        f"open-loop schedule at {args.rate:g} req/s, {args.requests} requests, "
        f"~{in_flight:.0f} streams in flight, {'batched' if args.batched else 'independent'} "
        f"token clocks, {os.cpu_count()} CPUs"
    )
    server = paced_server.PacedServer(
        ttft_ms=50, gap_ms=5, tokens=args.tokens, processes=args.server_processes, batched=args.batched
    )
    with server:
        for setting in args.processes.split(","):
            processes = load.load_processes(
                setting if setting == "auto" else int(setting), args.rate, args.requests, os.cpu_count()
            )
            with reference_alongside(offsets) as reference_lags:
                lags, due = harness_lags_ms(server.base_url, offsets, args.tokens, processes)
                reference = reference_lags()
            truth = server.take_log()
            arrived = {int(re.match(r"\[bench-(\d+)\]", e["prompt"]).group(1)): e["arrival"] for e in truth}
            seen = [(arrived[i] - due[i]) / 1e6 for i in range(len(due))]
            print(line(f"harness, {processes} process(es) ({setting})", lags))
            print(line("  a bare asyncio timer beside it", reference))
            print(line("  as the server's kernel saw it", seen))
            p99 = nearest_rank(sorted(lags), 99)
            verdict = "meets" if p99 is not None and p99 <= TARGET_P99_MS else "misses"
            ratio = p99 / max(nearest_rank(sorted(reference), 99), 1e-3)
            print(
                f"  p99 {p99:.3f} ms ({ratio:.1f}x the bare timer's) {verdict} "
                f"the target of {TARGET_P99_MS:g} ms"
            )
    print(
        f"a full collection of this process's {len(gc.get_objects())} objects: "
        f"{full_collection_ms(frozen=False):.2f} ms; frozen, as during the schedule: "
        f"{full_collection_ms(frozen=True):.2f} ms"
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["reference"]:  # reference_alongside's process
        print("ready", flush=True)
        print(json.dumps(reference_lags_ms(tuple(json.loads(sys.stdin.readline())))))
    else:
        main()
