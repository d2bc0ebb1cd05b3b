"""What the orchestration costs, measured on the demo grid and on a generated large grid.

Prints, against targets:
  * engine starts per config during a demo sweep (target 1),
  * orchestration overhead per cell = (sweep wall time - sum of llama-benchy wall times) / cells
    (target <= 1 s), llama-benchy's own time being the reference measured in the same run; the
    sweep is timed from the first cell's start to the last one's end, and the whole run's
    one-off costs (Snakemake's start, assets, dataset, graphs, report) are printed beside it,
  * `snakemake -n` wall time on a generated 2,000-cell grid (target <= 10 s), beside the
    dry-run of the 16-cell demo as the reference.

usage: python benchmarks/orchestration.py   (from the repository root, in the project venv)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def snakemake(workdir: Path, *args: str) -> float:
    started = time.monotonic()
    subprocess.run(
        [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args],
        cwd=workdir,  # Snakemake reads --configfile against the directory it starts in
        check=True,
        capture_output=True,
        text=True,
    )
    return time.monotonic() - started


def demo_sweep(workdir: Path) -> None:
    config = yaml.safe_load((REPO / "config/mechanism.yaml").read_text())
    config["engines"]["llamacpp"]["port"] = 18950
    config.pop("natural", None)  # llama-benchy cells only: their wall time is the reference
    (workdir / "grid.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    wall = snakemake(workdir, "-j1", "--configfile", "grid.yaml")
    records = [json.loads(p.read_text()) for p in workdir.glob("results/raw/*/*.provenance.json")]
    bench_wall = sum(r["bench"]["wall_s"] for r in records)
    events = [json.loads(line) for line in (workdir / "logs/engines/events.jsonl").read_text().splitlines()]
    starts = Counter(e["config"] for e in events if e["event"] == "start")
    cells = len(records)
    first = min(datetime.fromisoformat(r["started_at"]) for r in records)
    last = max(datetime.fromisoformat(r["finished_at"]) for r in records)
    cell_phase = (last - first).total_seconds()
    print(f"demo sweep: {cells} cells in {wall:.1f} s, llama-benchy {bench_wall:.1f} s of it")
    print(f"  engine starts per config: {dict(starts)} (target 1 each)")
    overhead = (cell_phase - bench_wall) / cells
    print(
        f"  orchestration overhead per cell: {overhead:.2f} s (target <= 1 s), from the first cell's "
        f"start to the last one's end ({cell_phase:.1f} s); ratio to llama-benchy time per cell: "
        f"{overhead / (bench_wall / cells):.2f}"
    )
    print(
        f"  the whole run over its cells: {(wall - bench_wall) / cells:.2f} s per cell, with "
        f"{wall - cell_phase:.1f} s once per run (Snakemake's start, the assets, the engine check, "
        "dataset, graphs and report)"
    )


def large_grid(workdir: Path, cells: int = 2000) -> None:
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    depths = list(range(0, 100 * 16, 16))  # 100 depths
    n_configs = cells // len(depths)
    base = config["configs"]["Q_bf16_stock_n0"]
    config["configs"] = {f"C{i:03d}": dict(base) for i in range(n_configs)}
    config["depths"] = depths
    (workdir / "large.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    demo_dry = snakemake(workdir, "-n", "--configfile", str(REPO / "config/mechanism.yaml"))
    large_dry = snakemake(workdir, "-n", "--configfile", "large.yaml")
    print(
        f"snakemake -n on {n_configs * len(depths)} cells: {large_dry:.1f} s (target <= 10 s); "
        f"demo dry-run (16 cells) {demo_dry:.1f} s, ratio {large_dry / demo_dry:.1f}"
    )


def main() -> None:
    os.environ["PATH"] = f"{BIN}{os.pathsep}{os.environ['PATH']}"
    work = Path(tempfile.mkdtemp(prefix="gridbench-orchestration-"))
    os.environ.setdefault("GRIDBENCH_SLOT_DIR", str(work / "slots"))
    try:
        shutil.copytree(REPO / "config", work / "config")
        large_grid(work)
        demo_sweep(work)
    finally:
        subprocess.run([str(BIN / "gridbench"), "engine", "stop", "--all"], cwd=work, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
