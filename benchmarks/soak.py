"""Chaos soak: a long demo-engine sweep with faults injected at random but reproducibly.

The engine command is benchmarks/chaos_proxy.py in front of the CPU demo engine: per
completion request (seeded) it answers HTTP 500, stalls the stream, cuts it, or SIGKILLs
the engine. A chaos thread here SIGKILLs a running llama-benchy now and then (seeded).
Timeouts are short, so a stall costs seconds. After the sweep it checks and prints:
  * cells, faults injected by kind, faults survived (the sweep went on past them),
  * every cell ok, or failed with a failure record whose reason names what happened,
  * no failed cell without an injected fault,
  * zero orphaned processes (engine, proxy, llama-benchy, watchdog) once the sweep ended,
  * zero partial files (results/.tmp leftovers, a result without its provenance, bad JSON),
then reruns once with chaos off and checks that Snakemake reran exactly the failed cells,
that every cell is then ok, and that no result measured during the chaos run changed
(data lost = 0). Exits 1 when an invariant fails.

usage: python benchmarks/soak.py [--cells 200] [--seed 1] [--rate 0.08] [--workdir DIR]
       (from the repository root, in the project venv)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PROXY = REPO / "benchmarks/chaos_proxy.py"
SOAK_MARKER = "GRIDBENCH_SOAK_RUN"  # in the environment of every process the sweep starts
CONFIGS = {
    "D_f16_n0": {"engine": "llamacpp", "checkpoint": "f16", "speculation": "none"},
    "D_q8_0_n0": {"engine": "llamacpp", "checkpoint": "q8_0", "speculation": "none"},
    "D_f16_draft4": {"engine": "llamacpp", "checkpoint": "f16", "speculation": "draft4"},
}
DEPTH_STEP = 8
BENCHY_TIMEOUT_S = 10
NATURAL_REQUEST_TIMEOUT_S = 6
# What a failure record's reason says for each fault; a failed cell must match one of its faults.
REASON_PATTERNS = {
    "http500": r"HTTP 500",
    "stall": r"still running after|no complete response within",
    "cut": r"connection|incomplete|closed|disconnect|payload|no readable result",
    "kill": r"engine died|connection|refused",
    "benchy_kill": r"llama-benchy was killed by SIGKILL",
}


@dataclass(frozen=True)
class SoakOptions:
    cells: int
    seed: int
    rate: float
    benchy_kill_rate: float
    workdir: Path
    port: int
    natural: bool = True
    assets: Path | None = None  # generated demo resources to copy; the workflow makes them otherwise


@dataclass(frozen=True)
class Fault:
    kind: str
    time: float
    config: str


@dataclass
class Cell:
    key: str  # the path under results/raw/ or results/natural/, without .json
    result: Path
    provenance: Path
    failure: Path
    ok: bool = False
    reason: str | None = None
    interval: tuple[float, float] | None = None
    faults: list[Fault] = field(default_factory=list)


@dataclass
class SoakReport:
    cells: int
    ok_after_chaos: int
    failed_after_chaos: list[str]
    faults: Counter
    faults_survived: int
    faults_outside_cells: int
    unexplained_failures: list[str]
    orphans: list[str]
    partial_files: list[str]
    rerun_cells: list[str]
    ok_after_rerun: int
    data_lost: list[str]
    chaos_s: float
    rerun_s: float
    problems: list[str] = field(default_factory=list)

    def print(self) -> None:
        print(f"cells:                 {self.cells}")
        print(f"faults injected:       {sum(self.faults.values())} {dict(sorted(self.faults.items()))}")
        print(f"faults survived:       {self.faults_survived} (their cell ok, or failed saying why)")
        print(f"  outside any cell:    {self.faults_outside_cells}")
        print(f"ok after chaos:        {self.ok_after_chaos}")
        print(f"failed after chaos:    {len(self.failed_after_chaos)} (each with a failure record)")
        print(f"unexplained failures:  {len(self.unexplained_failures)}")
        print(f"orphaned processes:    {len(self.orphans)}")
        print(f"partial files:         {len(self.partial_files)}")
        print(
            f"rerun cells:           {len(self.rerun_cells)} (= the failed cells: "
            f"{sorted(self.rerun_cells) == sorted(self.failed_after_chaos)})"
        )
        print(f"ok after rerun:        {self.ok_after_rerun}/{self.cells}")
        print(f"data lost:             {len(self.data_lost)}")
        print(f"time:                  chaos sweep {self.chaos_s:.0f} s, clean rerun {self.rerun_s:.0f} s")
        for problem in self.problems:
            print(f"INVARIANT FAILED: {problem}")


def soak_config(options: SoakOptions, chaos_log: Path, chaos_switch: Path) -> dict:
    """The demo grid, cheap per cell: tiny pp/tg, one run, many distinct small depths."""
    config = yaml.safe_load((REPO / "config/mechanism.yaml").read_text())
    configs = dict(list(CONFIGS.items())[: 3 if options.cells >= 60 else 2])
    natural_cells = len(configs) if options.natural else 0
    per_config = -(-(options.cells - natural_cells) // len(configs))
    proxy = [sys.executable, str(PROXY), "--chaos-log", str(chaos_log), "--chaos-switch", str(chaos_switch)]
    proxy += ["--chaos-seed", str(options.seed), "--chaos-rate", str(options.rate)]
    config["engines"]["llamacpp"].update(command=proxy, port=options.port, startup_timeout_s=60)
    config["configs"] = configs
    config["depths"] = [DEPTH_STEP * i for i in range(per_config)]
    config["benchy"] = {
        "pp": 8,
        # The demo engine decodes 1,000-3,700 tok/s here: 16 tokens took 5 ms, within one
        # scheduling delay of a loaded 2-core machine, so an answer read in one burst left a
        # cell unmeasured twice in a row (CI, 2026-12-06). 256 tokens take 70-250 ms.
        "tg": 256,
        "runs": 1,
        "latency_mode": "none",
        "skip_coherence": True,
        "extra_body": {"temperature": 0},
        "timeout_s": BENCHY_TIMEOUT_S,
    }
    if options.natural:
        config["natural"] = {
            "prompt_classes": ["code"],
            "concurrency": [1],
            "requests": 3,
            "max_tokens": 4,
            "warmup": 1,
            "request_timeout_s": NATURAL_REQUEST_TIMEOUT_S,
        }
    else:
        config.pop("natural", None)
    return config


def expected_cells(workdir: Path, config: dict) -> dict[str, Cell]:
    cells = {}
    for name in config["configs"]:
        for depth in config["depths"]:
            key = f"{name}/depth_{depth}"
            cells[key] = Cell(
                key,
                workdir / f"results/raw/{key}.json",
                workdir / f"results/raw/{key}.provenance.json",
                workdir / f"results/failures/{key}.json",
            )
        natural = config.get("natural") or {}
        for prompt_class in natural.get("prompt_classes", []):
            for concurrency in natural["concurrency"]:
                key = f"{name}/{prompt_class}_c{concurrency}"
                cells[f"natural:{key}"] = Cell(
                    f"natural:{key}",
                    workdir / f"results/natural/{key}.json",
                    workdir / f"results/natural/{key}.provenance.json",
                    workdir / f"results/failures/natural/{key}.json",
                )
    return cells


def timestamp(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def read_cells(cells: dict[str, Cell]) -> None:
    """Each cell's outcome and when it ran, from its provenance or its failure record."""
    for cell in cells.values():
        cell.ok, cell.reason, cell.interval = False, None, None
        if cell.provenance.exists():
            record = json.loads(cell.provenance.read_text())
            cell.ok = cell.result.exists()
            cell.interval = (timestamp(record["started_at"]), timestamp(record["finished_at"]))
        elif cell.failure.exists():
            record = json.loads(cell.failure.read_text())
            cell.reason = record["reason"]
            cell.interval = (timestamp(record["started_at"]), timestamp(record["failed_at"]))


def attribute(cells: dict[str, Cell], faults: list[Fault]) -> int:
    """Hands each fault to the cell that was running when it was injected; returns the
    number of faults outside every cell."""
    outside = 0
    for cell in cells.values():
        cell.faults = []
    for fault in faults:
        owner = next(
            (c for c in cells.values() if c.interval and c.interval[0] <= fault.time <= c.interval[1]),
            None,
        )
        if owner is None:
            outside += 1
        else:
            owner.faults.append(fault)
    return outside


def proxy_faults(chaos_log: Path) -> list[Fault]:
    if not chaos_log.exists():
        return []
    events = [json.loads(line) for line in chaos_log.read_text().splitlines()]
    return [Fault(e["kind"], e["time"], e["config"]) for e in events if e["event"] == "fault"]


class BenchyKiller(threading.Thread):
    """SIGKILLs a running llama-benchy of this soak now and then; seeded per process seen."""

    def __init__(self, marker: str, seed: int, rate: float):
        super().__init__(daemon=True)
        self.marker, self.rate = marker, rate
        self.rng = random.Random(f"{seed}:benchy")
        self.seen: set[int] = set()
        self.kills: list[Fault] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.2):
            for proc in soak_processes(self.marker, ("llama-benchy",)):
                if proc.pid in self.seen:
                    continue
                self.seen.add(proc.pid)
                if self.rng.random() < self.rate:
                    time.sleep(self.rng.uniform(0.1, 1.0))  # somewhere in its measurement
                    try:
                        proc.send_signal(signal.SIGKILL)
                    except psutil.NoSuchProcess:
                        continue  # it finished first: no fault
                    self.kills.append(Fault("benchy_kill", time.time(), ""))


def soak_processes(marker: str, names: tuple[str, ...] = ()) -> list[psutil.Process]:
    """Live processes that carry this soak's marker (the sweep's descendants, detached ones included)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(SOAK_MARKER) != marker:
                continue
            if names and not any(n in " ".join(proc.info["cmdline"] or []) for n in names):
                continue
            found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def orphans(marker: str, grace_s: float = 10.0) -> list[str]:
    """Processes of the sweep still alive ``grace_s`` after it ended (watchdogs need a few s)."""
    deadline = time.monotonic() + grace_s
    while True:
        left = soak_processes(marker)
        if not left or time.monotonic() > deadline:
            return [f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:160]}" for p in left]
        time.sleep(0.5)


def partial_files(workdir: Path) -> list[str]:
    found = []
    scratch = workdir / "results/.tmp"
    if scratch.exists():
        found += [f"scratch left: {p}" for p in scratch.iterdir()]
    for folder in ("raw", "natural"):
        for path in (workdir / "results" / folder).glob("*/*.json"):
            if path.name.endswith(".provenance.json"):
                if not path.with_name(path.name.replace(".provenance.json", ".json")).exists():
                    found.append(f"provenance without result: {path}")
            elif not path.with_suffix(".provenance.json").exists():
                found.append(f"result without provenance: {path}")
    # the cells' own records; a failed cell's kept llama-benchy files may be partial by nature
    records = [
        *(workdir / "results").glob("*/*/*.json"),
        *(workdir / "results/failures/natural").glob("*/*.json"),
    ]
    for path in records:
        try:
            json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            found.append(f"bad JSON: {path}: {err}")
    found += [f"temporary file: {p}" for p in (workdir / "results").rglob("*.tmp*") if p.is_file()]
    return found


def snakemake(workdir: Path, env: dict[str, str]) -> float:
    argv = [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(workdir), "-j1"]
    started = time.monotonic()
    subprocess.run(
        [*argv, "--configfile", str(workdir / "soak.yaml")],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=6 * 3600,
    )  # a sweep with failed cells exits non-zero: the checks below judge it
    return time.monotonic() - started


def jobs_of_last_run(workdir: Path) -> list[str]:
    """The cells Snakemake's latest run scheduled, as Cell keys, from its own log."""
    log = sorted((workdir / ".snakemake/log").glob("*.snakemake.log"))[-1].read_text()
    keys = []
    for match in re.finditer(
        r"^(?:local)?rule (bench_cell|natural_cell):\n((?:    .*\n)+)", log, re.MULTILINE
    ):
        wildcards = dict(
            pair.split("=", 1)
            for pair in re.search(r"^    wildcards: (.*)$", match.group(2), re.MULTILINE).group(1).split(", ")
        )
        if match.group(1) == "bench_cell":
            keys.append(f"{wildcards['config']}/depth_{wildcards['depth']}")
        else:
            keys.append(
                f"natural:{wildcards['config']}/{wildcards['prompt_class']}_c{wildcards['concurrency']}"
            )
    return keys


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_soak(options: SoakOptions) -> SoakReport:
    workdir = options.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    if options.assets and not (workdir / "resources").exists():
        shutil.copytree(options.assets / "resources", workdir / "resources", symlinks=True)
    chaos_log, chaos_switch = workdir / "logs/chaos.jsonl", workdir / "chaos.on"
    config = soak_config(options, chaos_log, chaos_switch)
    (workdir / "soak.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    cells = expected_cells(workdir, config)
    marker = uuid.uuid4().hex
    env = {
        **os.environ,
        SOAK_MARKER: marker,
        "GRIDBENCH_SLOT_DIR": str(workdir / "slots"),
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
    }

    chaos_switch.touch()
    killer = BenchyKiller(marker, options.seed, options.benchy_kill_rate)
    killer.start()
    chaos_s = snakemake(workdir, env)
    killer.stopped.set()
    killer.join()
    chaos_switch.unlink()
    left_after_chaos = orphans(marker)

    read_cells(cells)
    faults = proxy_faults(chaos_log) + killer.kills
    outside = attribute(cells, faults)
    failed = sorted(k for k, c in cells.items() if not c.ok)
    unexplained = []
    for key in failed:
        cell = cells[key]
        if cell.reason is None:
            unexplained.append(f"{key}: neither a result nor a failure record")
        elif not cell.faults:
            unexplained.append(f"{key}: failed without an injected fault: {cell.reason}")
        elif not any(re.search(REASON_PATTERNS[f.kind], cell.reason, re.IGNORECASE) for f in cell.faults):
            kinds = sorted({f.kind for f in cell.faults})
            unexplained.append(f"{key}: reason does not name its fault {kinds}: {cell.reason}")
    measured = {k: digest(c.result) + digest(c.provenance) for k, c in cells.items() if c.ok}
    partial = partial_files(workdir)
    # the rerun replaces the failed cells' logs and removes their records: keep them to read
    for kept in ("logs/cells", "results/failures"):
        if (workdir / kept).exists():
            shutil.copytree(workdir / kept, workdir / "logs/chaos-run" / Path(kept).name, dirs_exist_ok=True)

    rerun_s = snakemake(workdir, env)
    rerun = jobs_of_last_run(workdir)
    left_after_rerun = orphans(marker)
    read_cells(cells)
    lost = [
        k
        for k, d in measured.items()
        if not cells[k].ok or digest(cells[k].result) + digest(cells[k].provenance) != d
    ]

    report = SoakReport(
        cells=len(cells),
        ok_after_chaos=len(cells) - len(failed),
        failed_after_chaos=failed,
        faults=Counter(f.kind for f in faults),
        faults_survived=sum(
            len(c.faults) for k, c in cells.items() if not any(u.startswith(f"{k}:") for u in unexplained)
        ),
        faults_outside_cells=outside,
        unexplained_failures=unexplained,
        orphans=left_after_chaos + left_after_rerun,
        partial_files=partial + partial_files(workdir),
        rerun_cells=rerun,
        ok_after_rerun=sum(c.ok for c in cells.values()),
        data_lost=lost,
        chaos_s=chaos_s,
        rerun_s=rerun_s,
    )
    report.problems = invariant_problems(report)
    return report


def invariant_problems(report: SoakReport) -> list[str]:
    problems = [f"unexplained failure: {u}" for u in report.unexplained_failures]
    problems += [f"orphaned process: {o}" for o in report.orphans]
    problems += [f"partial file: {p}" for p in report.partial_files]
    problems += [f"data lost: {k}" for k in report.data_lost]
    if sorted(report.rerun_cells) != report.failed_after_chaos:
        problems.append(
            f"the rerun ran {sorted(report.rerun_cells)}, not the failed cells {report.failed_after_chaos}"
        )
    if report.ok_after_rerun != report.cells:
        problems.append(f"only {report.ok_after_rerun} of {report.cells} cells ok after the clean rerun")
    if not report.faults:
        problems.append("no fault was injected: raise --rate or --cells")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=0.08, help="fault chance per completion request")
    parser.add_argument("--benchy-kill-rate", type=float, default=0.05, help="chance per llama-benchy run")
    parser.add_argument("--workdir", type=Path, help="kept afterwards (default: a temporary one, removed)")
    parser.add_argument("--port", type=int, default=18960)
    parser.add_argument("--no-natural", dest="natural", action="store_false")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gridbench-soak-"))
    options = SoakOptions(
        cells=args.cells,
        seed=args.seed,
        rate=args.rate,
        benchy_kill_rate=args.benchy_kill_rate,
        workdir=workdir.resolve(),
        port=args.port,
        natural=args.natural,
    )
    report = run_soak(options)
    report.print()
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
