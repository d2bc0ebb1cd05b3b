"""How exactly the natural-prompt harness and its peers measure: against a paced server that knows.

The paced server (benchmarks/paced_server.py, its own processes) streams every completion
with a first token ``ttft`` after the request arrived and one token every ``gap`` after
that, on an absolute schedule, and records when it actually wrote each token on the host's
monotonic clock (the clock the clients read). "True" below is what the server did: TTFT =
first write - arrival (the kernel's receive timestamp of the request: the time the request
then waits for the server's loop is the server's), TPOT = (last write - first write) /
(tokens - 1), aggregate = tokens / (last write - first arrival). Each client's numbers are
the ones it reports itself; every client is measured against the truth of its own run.

Clients: gridbench's harness (the numbers it writes into a cell's JSON), llama-benchy,
``vllm bench serve`` (completions, after its /tokenize alignment), AIPerf and GuideLLM;
a client that is not installed is skipped with a line saying so.

    python benchmarks/harness_fidelity.py                  # c = 1, 16, 64 (the last ~23,000 tok/s)
    python benchmarks/harness_fidelity.py --quick          # smaller, for a smoke run
    python benchmarks/harness_fidelity.py --scale --save   # c = 256 and 1024 at ~100,000 tok/s, kept
                                                           # under benchmarks/results/
    python benchmarks/harness_fidelity.py --clients harness --sampler-cpu-ms 0.35
        # the harness again beside a stand-in for the NVML sampler (a thread that holds the
        # GIL that long each --sampler-interval-s, the CPU a sample took on an H100:
        # benchmarks/nvml_sampler.py); pynvml's ctypes calls release the GIL, so this bounds it

Target: measured / true within 1 % for TTFT p50/p99, TPOT p50 and aggregate tok/s.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from gridbench.harness import natural
from gridbench.harness.stats import nearest_rank
from gridbench.util import codec

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
METRICS = (  # key, label, format
    ("ttft_ms_p50", "TTFT p50 (ms)", ".3f"),
    ("ttft_ms_p99", "TTFT p99 (ms)", ".3f"),
    ("tpot_ms_p50", "TPOT p50 (ms)", ".4f"),
    ("output_tok_s", "aggregate (tok/s)", ",.0f"),
)
CLIENTS = ("harness", "benchy", "vllm", "aiperf", "guidellm")
CLIENT_TIMEOUT_S = 900


def _paced_server_module():
    """benchmarks/paced_server.py, which this script also starts as the server's processes."""
    spec = importlib.util.spec_from_file_location("paced_server", HERE / "paced_server.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


paced_server = _paced_server_module()
MODEL = paced_server.MODEL


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

    def at_tok_s(self, tok_s: float) -> Scenario:
        """The same scenario with the token gap that gives a nominal aggregate of ``tok_s``."""
        duration_ms = self.concurrency * self.tokens / tok_s * 1000
        return replace(self, gap_ms=round((duration_ms - self.ttft_ms) / (self.tokens - 1), 4))


SCENARIOS = [
    Scenario(concurrency=1, requests=8, tokens=128, ttft_ms=100, gap_ms=10),
    Scenario(concurrency=16, requests=32, tokens=128, ttft_ms=100, gap_ms=10),
    Scenario(concurrency=64, requests=128, tokens=512, ttft_ms=100, gap_ms=2.5),
]
QUICK = [
    Scenario(concurrency=1, requests=4, tokens=32, ttft_ms=50, gap_ms=10),
    Scenario(concurrency=16, requests=16, tokens=64, ttft_ms=50, gap_ms=5),
]
SCALE_TOK_S = 100_000  # the issue's target: one H200's small model at c = 256, or an 8-GPU node
SCALE = [  # several waves each, at a nominal SCALE_TOK_S unless --scale-tok-s says otherwise
    Scenario(concurrency=256, requests=1024, tokens=512, ttft_ms=100, gap_ms=2.5),
    # a thousand prompts take no less to prefill, and the first tokens of a wave then come
    # in one burst: 100 ms would time the burst more than the client
    Scenario(concurrency=1024, requests=3072, tokens=256, ttft_ms=200, gap_ms=10),
]


class Report:
    """Lines printed as they come and kept, for --save."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)


# --- the truth ---------------------------------------------------------------------------


def truth(server_log: list[dict]) -> dict[str, float]:
    ttft = sorted((e["first"] - e["arrival"]) / 1e6 for e in server_log)
    tpot = sorted((e["last"] - e["first"]) / 1e6 / (e["tokens"] - 1) for e in server_log)
    wall_s = (max(e["last"] for e in server_log) - min(e["arrival"] for e in server_log)) / 1e9
    return {
        "requests": len(server_log),
        "ttft_ms_p50": nearest_rank(ttft, 50),
        "ttft_ms_p99": nearest_rank(ttft, 99),
        "ttft_ms_mean": sum(ttft) / len(ttft),
        "tpot_ms_p50": nearest_rank(tpot, 50),
        "output_tok_s": sum(e["tokens"] for e in server_log) / wall_s,
        "late_p50_ms": nearest_rank(sorted(e["late_p50_ms"] for e in server_log), 50),
        "late_max_ms": max(e["late_max_ms"] for e in server_log),
        # without the kernel's stamp (a sandbox's network stack may give none) a request is
        # dated when the server read it: its wait for the server's loop is then missed
        "kernel_stamped": sum(e["stamped"] for e in server_log) / len(server_log),
    }


def delivery(traces, server_log: list[dict]) -> dict[str, float]:
    """Where the harness's extra time goes, per request (one clock for every process)."""
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


# --- the clients ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Tools:
    """Where the peer clients are (None: not installed) and the files they need."""

    workdir: Path
    benchy: str | None
    vllm: str | None
    aiperf: str | None
    guidellm: str | None

    @property
    def tokenizer_dir(self) -> Path:
        """An HF tokenizer folder (the demo models' vocabulary), written once."""
        folder = self.workdir / "tokenizer"
        if not folder.exists():
            from gridbench.assets.hf_model import tokenizer_files

            folder.mkdir()
            for name, text in tokenizer_files(65536).items():
                (folder / name).write_text(text)
        return folder


@dataclass(frozen=True)
class ClientRun:
    """What a client reported of one scenario, next to the truth of its own run."""

    client: str
    measured: dict[str, float | None]
    true: dict[str, float]
    note: str = ""


def harness_plan(scenario: Scenario, processes: int | str) -> natural.LevelPlan:
    return natural.LevelPlan(
        prompt="Write a story.",
        concurrency=scenario.concurrency,
        requests=scenario.requests,
        warmup=0,
        max_tokens=scenario.tokens,
        temperature=0,
        cache_bust=True,
        extra_body={},
        request_timeout_s=120,
        processes=natural.harness_processes(processes, scenario.concurrency, os.cpu_count()),
    )


def harness_cpu_s() -> float:
    """CPU of this process and of its reaped children (the harness's worker processes; the
    server's processes are reaped only when it stops)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def run_harness(server, scenario: Scenario, processes: int | str) -> tuple[ClientRun, dict]:
    plan = harness_plan(scenario, processes)
    endpoint = natural.Endpoint(server.base_url, MODEL)
    cpu_before, server_cpu_before = harness_cpu_s(), server.cpu_s()
    traces = natural.measure_level(endpoint, plan)
    cpu_s, server_cpu_s = harness_cpu_s() - cpu_before, server.cpu_s() - server_cpu_before
    server_log = server.take_log()
    document = codec.to_json(
        natural.level_result(config="paced", prompt_class="x", plan=plan, traces=traces, spec_decode=None)
    )
    summary = document["summary"]
    assert summary["ok"] == scenario.requests, summary
    tokens = sum(r["output_tokens"] for r in document["requests"])
    measured = {key: summary[key] for key, _, _ in METRICS} | {"ttft_ms_mean": summary["ttft_ms_mean"]}
    cpu_us_per_token = cpu_s / tokens * 1e6
    usable_cores = min(plan.processes, os.cpu_count() or 1)
    extra = {
        "processes": plan.processes,
        "cpu_us_per_token": cpu_us_per_token,
        "ceiling_tok_s": usable_cores * 1e6 / cpu_us_per_token,
        "server_processes": len(server.procs),
        "server_cpu_us_per_token": server_cpu_s / tokens * 1e6,
    } | delivery(traces, server_log)
    note = f"{plan.processes} process{'es' if plan.processes > 1 else ''}"
    return ClientRun("harness", measured, truth(server_log), note), extra


class SamplerStandIn:
    """A thread that spins ``cpu_ms`` holding the GIL every ``interval_s``, as the cells' NVML
    sampler would at its worst, while the harness measures in this process."""

    def __init__(self, cpu_ms: float, interval_s: float) -> None:
        self.cpu_s, self.interval_s = cpu_ms / 1000, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        while not self._stop.wait(self.interval_s):
            until = time.thread_time() + self.cpu_s
            while time.thread_time() < until:
                pass

    def __enter__(self) -> SamplerStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run_harness_beside_sampler(server, scenario: Scenario, args) -> ClientRun:
    with SamplerStandIn(args.sampler_cpu_ms, args.sampler_interval_s):
        run, _ = run_harness(server, scenario, args.processes)
    return replace(
        run, client="harness+sampler", note=f"{run.note}, {args.sampler_cpu_ms} ms GIL held a sample"
    )


def _run(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> str | None:
    """Run a peer client; the reason it failed, or None."""
    try:
        proc = subprocess.run(
            argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return f"no result within {CLIENT_TIMEOUT_S} s"
    if proc.returncode != 0:
        tail = (proc.stdout[-1500:] + proc.stderr[-1500:]).strip()
        return f"exit {proc.returncode}: {tail}"
    return None


def run_benchy(server, scenario: Scenario, tools: Tools) -> ClientRun:
    """llama-benchy's numbers: TTFT is its mean (it reports no percentiles); its tg is
    (tokens - 1) / (last chunk - first chunk) per request, so 1000 / tg stands for TPOT."""
    from gridbench.assets.corpus import write_corpus
    from gridbench.assets.tokenizer import write_tokenizer
    from gridbench.harness.benchy import seed_corpus

    home = tools.workdir / "benchy-home"
    tokenizer = tools.workdir / "tokenizer.json"
    corpus = tools.workdir / "book.txt"
    if not tokenizer.exists():
        write_tokenizer(tokenizer)
        write_corpus(corpus)
    book_url = seed_corpus(corpus, home)
    result = tools.workdir / f"benchy-c{scenario.concurrency}.json"
    argv = [tools.benchy, "--base-url", f"{server.base_url}/v1", "--model", MODEL]
    argv += ["--served-model-name", MODEL, "--tokenizer", str(tokenizer), "--book-url", book_url]
    argv += ["--pp", "16", "--tg", str(scenario.tokens), "--depth", "0"]
    argv += ["--runs", str(max(1, scenario.requests // scenario.concurrency))]
    argv += ["--concurrency", str(scenario.concurrency), "--latency-mode", "none", "--no-warmup"]
    argv += ["--skip-coherence", "--format", "json", "--save-result", str(result)]
    env = {**os.environ, "HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    server.take_log()  # its calibration requests are not streamed, so not logged: a clean slate
    failed = _run(argv, env)
    true = truth(server.take_log()) if not failed else {}
    if failed or not result.exists():
        return ClientRun("llama-benchy", {}, true, failed or "no result file")
    (entry,) = [
        b for b in json.loads(result.read_text())["benchmarks"] if not b.get("is_context_prefill_phase")
    ]
    measured = {
        "ttft_ms_mean": entry["e2e_ttft"]["mean"],
        "tpot_ms_p50": 1000 / entry["tg_req_throughput"]["mean"],
    }
    return ClientRun("llama-benchy", measured, true, "TTFT: its mean vs the true mean; TPOT: 1000/tg")


def run_vllm(server, scenario: Scenario, tools: Tools) -> ClientRun:
    """``vllm bench serve`` on /v1/completions, as its users run it: the random dataset (it
    POSTs /tokenize first and realigns the prompts), every request max_tokens long."""
    result_dir = tools.workdir / "vllm"
    name = f"c{scenario.concurrency}.json"
    argv = [tools.vllm, "bench", "serve", "--backend", "vllm", "--base-url", server.base_url]
    argv += ["--endpoint", "/v1/completions", "--model", MODEL, "--tokenizer", str(tools.tokenizer_dir)]
    argv += [
        "--dataset-name",
        "random",
        "--random-input-len",
        "16",
        "--random-output-len",
        str(scenario.tokens),
    ]
    argv += ["--ignore-eos", "--num-prompts", str(scenario.requests)]
    argv += ["--max-concurrency", str(scenario.concurrency), "--num-warmups", "0"]
    argv += ["--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99"]
    argv += ["--save-result", "--result-dir", str(result_dir), "--result-filename", name]
    argv += ["--disable-tqdm", "--ready-check-timeout-sec", "0", "--temperature", "0"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"}
    server.take_log()
    failed = _run(argv, env)
    true = truth(server.take_log()) if not failed else {}
    if failed:
        return ClientRun("vllm bench serve", {}, true, failed)
    result = json.loads((result_dir / name).read_text())
    measured = {
        "ttft_ms_p50": result["median_ttft_ms"],
        "ttft_ms_p99": result["p99_ttft_ms"],
        "ttft_ms_mean": result["mean_ttft_ms"],
        "tpot_ms_p50": result["median_tpot_ms"],
        "output_tok_s": result["output_throughput"],
    }
    return ClientRun("vllm bench serve", measured, true)


def run_aiperf(server, scenario: Scenario, tools: Tools) -> ClientRun:
    """AIPerf on chat completions, streaming; its inter_token_latency is (e2e - TTFT) /
    (tokens - 1) per request, i.e. TPOT."""
    artifacts = tools.workdir / f"aiperf-c{scenario.concurrency}"
    argv = [tools.aiperf, "profile", "--model", MODEL, "--url", server.base_url]
    argv += ["--endpoint-type", "chat", "--streaming", "--tokenizer", str(tools.tokenizer_dir)]
    argv += ["--concurrency", str(scenario.concurrency), "--request-count", str(scenario.requests)]
    argv += ["--synthetic-input-tokens-mean", "16", "--output-tokens-mean", str(scenario.tokens)]
    # the server's token count: AIPerf would otherwise count the text's tokens with its own
    # tokenizer, and its TPOT would divide by them
    argv += ["--output-tokens-stddev", "0", "--use-server-token-count"]
    argv += ["--extra-inputs", "ignore_eos:true", "--ui-type", "none"]
    argv += ["--artifact-dir", str(artifacts), "--no-server-metrics", "--no-gpu-telemetry"]
    # not HF_HUB_OFFLINE: offline, AIPerf takes a local tokenizer folder for a hub repo id
    server.take_log()
    failed = _run(argv, cwd=tools.workdir)
    true = truth(server.take_log()) if not failed else {}
    exports = sorted(artifacts.rglob("profile_export_aiperf.json"))
    if failed or not exports:
        return ClientRun("AIPerf", {}, true, failed or "no profile_export_aiperf.json")
    metrics = json.loads(exports[-1].read_text())

    def stat(metric: str, name: str) -> float | None:
        return (metrics.get(metric) or {}).get(name)

    measured = {
        "ttft_ms_p50": stat("time_to_first_token", "p50"),
        "ttft_ms_p99": stat("time_to_first_token", "p99"),
        "ttft_ms_mean": stat("time_to_first_token", "avg"),
        "tpot_ms_p50": stat("inter_token_latency", "p50"),
        "output_tok_s": stat("output_token_throughput", "avg"),
    }
    return ClientRun("AIPerf", measured, true)


def run_guidellm(server, scenario: Scenario, tools: Tools) -> ClientRun:
    """GuideLLM's concurrent profile on chat completions; its inter-token latency is
    (e2e - TTFT) / (tokens - 1) per request, our TPOT (its own TPOT divides e2e by tokens)."""
    out = tools.workdir / f"guidellm-c{scenario.concurrency}.json"
    data = f"prompt_tokens=16,output_tokens={scenario.tokens}"
    argv = [tools.guidellm, "run", "--backend", f"kind=openai_http,target={server.base_url},model={MODEL}"]
    argv += ["--profile", f"kind=concurrent,streams={scenario.concurrency}"]
    argv += ["--constraint", f"kind=max_requests,count={scenario.requests}"]
    argv += ["--tokenizer", f"kind=huggingface_auto,model={tools.tokenizer_dir}"]
    argv += ["--data", f"kind=synthetic_text,{data}", "--output", f"kind=json,path={out}"]
    argv += ["--disable-console-interactive"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    server.take_log()
    failed = _run(argv, env, cwd=tools.workdir)
    true = truth(server.take_log()) if not failed else {}
    if failed or not out.exists():
        return ClientRun("GuideLLM", {}, true, failed or "no result file")
    (benchmark,) = json.loads(out.read_text())["benchmarks"]
    metrics = benchmark["metrics"]

    def stat(metric: str, name: str) -> float | None:
        successful = (metrics.get(metric) or {}).get("successful") or {}
        if name in ("p50", "p99"):
            return (successful.get("percentiles") or {}).get(name)
        return successful.get(name)

    measured = {
        "ttft_ms_p50": stat("time_to_first_token_ms", "p50"),
        "ttft_ms_p99": stat("time_to_first_token_ms", "p99"),
        "ttft_ms_mean": stat("time_to_first_token_ms", "mean"),
        "tpot_ms_p50": stat("inter_token_latency_ms", "p50"),  # its TPOT counts the first token
        "output_tok_s": stat("output_tokens_per_second", "mean"),
    }
    return ClientRun("GuideLLM", measured, true)


PEERS: dict[str, tuple[str, Callable[..., ClientRun]]] = {
    "benchy": ("llama-benchy", run_benchy),
    "vllm": ("vllm bench serve", run_vllm),
    "aiperf": ("AIPerf", run_aiperf),
    "guidellm": ("GuideLLM", run_guidellm),
}


# --- the report ----------------------------------------------------------------------------


def error(measured: float | None, true: float | None) -> float | None:
    """measured / true - 1, or None where the client reports no such figure."""
    return measured / true - 1 if measured is not None and true else None


def print_scenario(out: Report, scenario: Scenario, runs: list[ClientRun], extra: dict | None) -> None:
    out(
        f"\n== c={scenario.concurrency}: {scenario.requests} requests x {scenario.tokens} tokens, "
        f"TTFT {scenario.ttft_ms:g} ms, gap {scenario.gap_ms:g} ms "
        f"(nominal aggregate {scenario.nominal_tok_s:,.0f} tok/s)"
    )
    harness = next((r for r in runs if r.client == "harness"), None)
    if harness:
        true = harness.true
        late = f"p50 {true['late_p50_ms']:.3f} ms, max {true['late_max_ms']:.3f} ms"
        stamped = f"{true['kernel_stamped'] * 100:.0f} % of arrivals dated by the kernel"
        out(f"   server lateness vs its schedule: {late}; {stamped}")
        out(f"   {'metric':<20}{'true':>12}{'harness':>12}{'error':>9}")
        for key, label, spec in METRICS:
            t, m = true[key], harness.measured[key]
            out(f"   {label:<20}{t:>12{spec}}{m:>12{spec}}{error(m, t) * 100:>8.2f}%")
    if extra:
        cores = min(extra["processes"], os.cpu_count() or 1)
        out(
            f"   harness: {extra['processes']} process(es), CPU {extra['cpu_us_per_token']:.1f} µs per "
            f"token, ceiling ~{extra['ceiling_tok_s']:,.0f} tok/s (on {cores} free core(s))"
        )
        out(
            f"   paced server: {extra['server_processes']} process(es), "
            f"CPU {extra['server_cpu_us_per_token']:.1f} µs per token"
        )
        out(
            f"   delays p50: request start -> server host {extra['request_ms_p50']:.3f} ms, "
            f"-> server's read {extra['server_read_ms_p50']:.3f} ms (in the true TTFT), "
            f"server write -> harness timestamp: first chunk {extra['first_chunk_ms_p50']:.3f} ms "
            f"(max {extra['first_chunk_ms_max']:.3f}), last chunk {extra['last_chunk_ms_p50']:.3f} ms"
        )
    out("   error of each client against the truth of its own run (measured / true - 1):")
    header = "".join(f"{label.split(' (')[0]:>14}" for _, label, _ in METRICS)
    out(f"   {'client':<18}{header}{'TTFT mean':>14}  note")
    for run in runs:
        cells = ""
        for key in [k for k, _, _ in METRICS] + ["ttft_ms_mean"]:
            e = error(run.measured.get(key), run.true.get(key))
            cells += f"{e * 100:>13.2f}%" if e is not None else f"{'-':>14}"
        note = run.note.replace("\n", " ")
        out(f"   {run.client:<18}{cells}  {note[:300]}")


def machine() -> dict[str, str | int | None]:
    model = None
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.MULTILINE)
        model = found.group(1).strip() if found else None
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model or platform.processor() or None,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": platform.node(),
    }


def find_tools(args, workdir: Path) -> Tools:
    from gridbench.harness.benchy import benchy_executable

    benchy = benchy_executable()
    return Tools(
        workdir=workdir,
        benchy=benchy if Path(benchy).exists() or shutil.which(benchy) else None,
        vllm=args.vllm or shutil.which("vllm"),
        aiperf=args.aiperf or shutil.which("aiperf"),
        guidellm=args.guidellm or shutil.which("guidellm"),
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--quick", action="store_true", help="small scenarios, for a smoke run")
    which.add_argument("--scale", action="store_true", help="c = 256 and 1024 at --scale-tok-s")
    which.add_argument("--all", action="store_true", help="the default scenarios, then the scale ones")
    parser.add_argument(
        "--scale-tok-s", type=float, default=SCALE_TOK_S, help="nominal aggregate of the scale scenarios"
    )
    parser.add_argument(
        "--concurrency", type=int, nargs="+", help="run only the scenarios of these concurrencies"
    )
    parser.add_argument(
        "--clients",
        default=",".join(CLIENTS),
        help=f"comma-separated, of {', '.join(CLIENTS)} (default: all; absent ones are skipped)",
    )
    parser.add_argument(
        "--no-benchy", action="store_true", help="skip llama-benchy (as --clients without it)"
    )
    parser.add_argument(
        "--processes",
        "--workers",
        default="auto",
        help="harness processes per level: auto (natural.processes' default) or a count",
    )
    parser.add_argument(
        "--server-processes",
        type=int,
        default=max(1, min(8, (os.cpu_count() or 2) // 2)),
        help="paced server processes sharing the port (default: half the CPUs, at most 8)",
    )
    parser.add_argument(
        "--sampler-cpu-ms",
        type=float,
        help="also run the harness beside a stand-in for the NVML sampler holding the GIL this long a sample",
    )
    parser.add_argument("--sampler-interval-s", type=float, default=0.1, help="the stand-in's interval")
    parser.add_argument("--vllm", help="the vllm executable (default: vllm on PATH)")
    parser.add_argument("--aiperf", help="the aiperf executable (default: aiperf on PATH)")
    parser.add_argument("--guidellm", help="the guidellm executable (default: guidellm on PATH)")
    parser.add_argument(
        "--save", action="store_true", help="write the text and a JSON under benchmarks/results/"
    )
    args = parser.parse_args()
    args.processes = args.processes if args.processes == "auto" else int(args.processes)
    args.clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    if args.no_benchy:
        args.clients = [c for c in args.clients if c != "benchy"]
    unknown = [c for c in args.clients if c not in CLIENTS]
    if unknown:
        parser.error(f"--clients: unknown {', '.join(unknown)}; allowed values: {', '.join(CLIENTS)}")
    return args


def scenarios(args) -> list[Scenario]:
    scale = [s.at_tok_s(args.scale_tok_s) for s in SCALE]
    chosen = QUICK if args.quick else scale if args.scale else SCENARIOS + scale if args.all else SCENARIOS
    if args.concurrency:
        chosen = [s for s in chosen if s.concurrency in args.concurrency]
    return chosen


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING)
    out = Report()
    host = machine()
    started = datetime.now(UTC)
    out(
        f"host: {host['cpus']} CPUs ({host['cpu_model']}), Python {host['python']}, load average "
        f"{os.getloadavg()[0]:.1f} at start; {args.server_processes} paced server processes"
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="fidelity-") as tmp:
        tools = find_tools(args, Path(tmp))
        for client in args.clients:
            if client != "harness" and getattr(tools, client) is None:
                where = (
                    "beside this Python or on PATH" if client == "benchy" else f"on PATH or --{client} PATH"
                )
                out(f"{PEERS[client][0]}: not installed here ({where}), skipped")
        for scenario in scenarios(args):
            runs, extra = [], None
            with paced_server.PacedServer(
                scenario.ttft_ms, scenario.gap_ms, scenario.tokens, args.server_processes
            ) as server:
                if "harness" in args.clients:
                    run, extra = run_harness(server, scenario, args.processes)
                    runs.append(run)
                    if args.sampler_cpu_ms:
                        runs.append(run_harness_beside_sampler(server, scenario, args))
                for client in args.clients:
                    if client != "harness" and getattr(tools, client) is not None:
                        runs.append(PEERS[client][1](server, scenario, tools))
            print_scenario(out, scenario, runs, extra)
            rows.append(
                {"scenario": asdict(scenario), "harness": extra, "clients": [asdict(r) for r in runs]}
            )
    load = os.getloadavg()[0]
    out(f"\nload average {load:.1f} at the end (on a shared host other work competes for the CPUs)")
    for client in ("harness", "harness+sampler"):
        harness = [run for row in rows for run in row["clients"] if run["client"] == client]
        for keys, what in (
            (("ttft_ms_p50", "tpot_ms_p50", "output_tok_s"), "TTFT p50, TPOT p50, tok/s"),
            ([key for key, _, _ in METRICS], "and TTFT p99"),
        ):
            errors = [abs(error(run["measured"][key], run["true"][key])) for run in harness for key in keys]
            if errors:
                out(f"worst |measured/true - 1| of {client} ({what}): {max(errors) * 100:.2f} % (target 1 %)")
    if args.save:
        save(out, host, started, args, rows)


def save(out: Report, host: dict, started: datetime, args, rows: list[dict]) -> None:
    RESULTS.mkdir(exist_ok=True)
    stem = f"harness_fidelity-{host['cpus']}cpu-{started:%Y%m%dT%H%M%SZ}"
    document = {
        "machine": host,
        "started_at": started.isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
        "server_processes": args.server_processes,
        "scenarios": rows,
    }
    (RESULTS / f"{stem}.json").write_text(json.dumps(document, indent=1) + "\n")
    (RESULTS / f"{stem}.txt").write_text("\n".join(out.lines) + "\n")
    print(f"saved {RESULTS / stem}.txt and .json")


if __name__ == "__main__":
    main()
