"""The workflow end to end on the real CPU engine: cells, warm reuse, dataset, reruns."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, write_config

pytestmark = pytest.mark.workflow


def snakemake(workdir: Path, *args: str, background: bool = False):
    argv = [
        str(Path(sys.executable).parent / "snakemake"),
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(workdir),
        "-j1",
        *args,
    ]
    if background:
        return subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
    return subprocess.run(argv, capture_output=True, text=True, timeout=600)


def events(workdir: Path) -> list[dict]:
    path = workdir / "logs/engines/events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def jobs_of_last_run(workdir: Path, rule: str) -> list[dict[str, str]]:
    """The wildcards of every job of ``rule`` in Snakemake's own log of its latest run."""
    log = sorted((workdir / ".snakemake/log").glob("*.snakemake.log"))[-1].read_text()
    jobs = []
    for block in log.split("\n\n"):
        lines = block.strip().splitlines()
        if any(line.strip() in (f"rule {rule}:", f"localrule {rule}:") for line in lines):
            wildcards = next(line for line in lines if "wildcards:" in line)
            jobs.append(dict(p.split("=") for p in wildcards.split("wildcards:")[1].strip().split(", ")))
    return jobs


def test_small_grid_end_to_end(workdir, demo_config):
    demo_config["configs"] = {k: demo_config["configs"][k] for k in ("D_f16_n0", "D_f16_draft4")}
    demo_config["depths"] = [0, 256]
    write_config(workdir / "grid.yaml", demo_config)
    result = snakemake(workdir, "--configfile", "grid.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    starts = [e["config"] for e in events(workdir) if e["event"] == "start"]
    assert starts == ["D_f16_n0", "D_f16_draft4"]  # one warm engine per config
    assert [e["event"] for e in events(workdir)][-1] == "stop"  # none left running

    frame = pd.read_parquet(workdir / "dataset/dataset.parquet")
    assert list(frame["config"]) == ["D_f16_n0", "D_f16_n0", "D_f16_draft4", "D_f16_draft4"]
    assert (frame["status"] == "ok").all() and (frame["decode_tps"] > 0).all()
    draft = frame[frame["config"] == "D_f16_draft4"]
    assert (draft["acceptance_rate"] > 0.8).all()  # the draft shares the target's output matrix
    assert frame[frame["config"] == "D_f16_n0"]["acceptance_rate"].isna().all()

    document = json.loads((workdir / "dataset/dataset.json").read_text())
    assert document["D_f16_n0"]["version"] == "0.4.0"
    assert "NaN" not in (workdir / "dataset/dataset.json").read_text()
    raw = json.loads((workdir / "results/raw/D_f16_n0/depth_256.json").read_text())
    assert raw["benchmarks"][0]["context_size"] == 256
    prov = json.loads((workdir / "results/raw/D_f16_n0/depth_256.provenance.json").read_text())
    assert prov["engine"]["serve_argv"][:3] == ["python3", "-m", "gridbench.testengines.xllamacpp_server"]
    assert prov["versions"] == {
        "gridbench": prov["versions"]["gridbench"],
        "load_generator": "llama-benchy",
        "load_generator_version": "0.4.0",
    }
    assert "--depth" in prov["bench"]["argv"] and prov["fingerprint"]


def test_a_failed_cell_reruns_alone(workdir, demo_config):
    demo_config["configs"] = {"D_q8_0_n0": demo_config["configs"]["D_q8_0_n0"]}
    demo_config["depths"] = [0, 256, 512]
    write_config(workdir / "grid.yaml", demo_config)
    proc = snakemake(workdir, "--configfile", "grid.yaml", background=True)
    victim_log = workdir / "logs/cells/D_q8_0_n0/depth_256.log"
    deadline = time.monotonic() + 180
    while "llama-benchy (0.4.0)" not in (victim_log.read_text() if victim_log.exists() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.05)
    slot = json.loads(next(Path(os.environ["GRIDBENCH_SLOT_DIR"]).glob("slot-*.json")).read_text())
    os.killpg(slot["handle"]["pid"], signal.SIGKILL)  # the engine dies mid-cell
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0

    failure = json.loads((workdir / "results/failures/D_q8_0_n0/depth_256.json").read_text())
    assert failure["config"] == "D_q8_0_n0" and failure["depth"] == 256
    assert not (workdir / "results/raw/D_q8_0_n0/depth_256.json").exists()
    for depth in (0, 512):  # the other cells are unaffected: a fresh engine took over
        assert (workdir / f"results/raw/D_q8_0_n0/depth_{depth}.json").exists(), output
    assert len([e for e in events(workdir) if e["event"] == "start"]) == 2

    rerun = snakemake(workdir, "--configfile", "grid.yaml")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert jobs_of_last_run(workdir, "bench_cell") == [{"config": "D_q8_0_n0", "depth": "256"}]
    assert not (workdir / "results/failures/D_q8_0_n0/depth_256.json").exists()
    frame = pd.read_csv(workdir / "dataset/dataset.csv")
    assert list(frame["status"]) == ["ok", "ok", "ok"]
