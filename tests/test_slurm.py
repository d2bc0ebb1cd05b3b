"""The workflow on a real SLURM cluster (scripts/start_slurm.sh: munge, slurmctld and
slurmd on this machine, two placeholder GPUs): one cluster job per serving config, results
on the shared file system, engines stopped with their job, failed cells rerun alone."""

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
from test_scale import assert_same_cells, events, new_workdir, snakemake

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]
PROFILE = str(REPO / "profiles/slurm-ci")


@pytest.fixture(scope="module")
def slurm_cluster() -> None:
    """The running cluster; CI (GRIDBENCH_SLURM=required) fails without one, others skip."""
    try:
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
        up = states.returncode == 0 and any(
            s in ("idle", "mixed", "allocated") for s in states.stdout.split()
        )
    except (OSError, subprocess.TimeoutExpired):
        up = False
    if not up:
        message = "no SLURM cluster answers sinfo: start one with `bash scripts/start_slurm.sh`"
        if os.environ.get("GRIDBENCH_SLURM") == "required":
            pytest.fail(message)
        pytest.skip(message)


def slurm_run_id(workdir: Path) -> str:
    log = sorted((workdir / ".snakemake/log").glob("*.snakemake.log"))[-1].read_text()
    return next(line.split(": ", 1)[1].strip() for line in log.splitlines() if "SLURM run ID:" in line)


def cluster_jobs(run_id: str) -> list[dict[str, str]]:
    """The SLURM jobs of one Snakemake run, as squeue lists them (finished ones included)."""
    out = subprocess.run(
        ["squeue", "--states=all", "--noheader", "--name", run_id, "-O", "JobID:|,State:|,tres-per-job"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [[field.strip() for field in line.split("|")] for line in out.splitlines()]
    return [dict(zip(("id", "state", "tres"), row, strict=True)) for row in rows]


def cells_of_last_run(workdir: Path) -> list[dict[str, str]]:
    """The wildcards of every bench_cell job in Snakemake's own log of its latest run
    (a group job lists its cells one after another, indented)."""
    lines = sorted((workdir / ".snakemake/log").glob("*.snakemake.log"))[-1].read_text().splitlines()
    cells = []
    for i, line in enumerate(lines):
        if line.strip() == "rule bench_cell:":
            wildcards = next(w for w in lines[i + 1 :] if "wildcards:" in w).split("wildcards:")[1]
            cells.append(dict(p.split("=") for p in wildcards.strip().split(", ")))
    return cells


def test_demo_grid_through_slurm_matches_the_local_run(tmp_path, demo_assets, demo_config, slurm_cluster):
    # the demo grid (every config and depth); two jobs share this machine's two cores, so
    # one thread per engine and no latency subtraction: load cannot fail a measurement
    demo_config["engines"]["llamacpp"]["extra_args"] = ["--threads", "1"]
    demo_config["benchy"]["latency_mode"] = "none"
    local = new_workdir(tmp_path / "local", demo_assets)
    cluster = new_workdir(tmp_path / "cluster", demo_assets)
    for workdir in (local, cluster):
        write_config(workdir / "grid.yaml", demo_config)
    result = snakemake(local, "-j1", "--configfile", "grid.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    result = snakemake(cluster, "--workflow-profile", PROFILE, "--configfile", "grid.yaml", timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr

    dataset = "dataset/dataset.parquet"
    assert_same_cells(pd.read_parquet(cluster / dataset), pd.read_parquet(local / dataset))
    configs = list(demo_config["configs"])
    jobs = cluster_jobs(slurm_run_id(cluster))
    assert len(jobs) == len(configs)  # one cluster job per serving config, nothing else
    assert all(job["state"] == "COMPLETED" and "gpu:1" in job["tres"] for job in jobs), jobs
    records = [json.loads(p.read_text()) for p in cluster.glob("results/raw/*/*.provenance.json")]
    job_of: dict[str, set[str]] = {}
    for record in records:
        job_of.setdefault(record["config"], set()).add(record["host"]["slurm_job_id"])
    assert all(len(ids) == 1 for ids in job_of.values()), job_of  # all cells of a config in one job
    assert set.union(*job_of.values()) == {job["id"] for job in jobs}
    starts = [e for e in events(cluster) if e["event"] == "start"]
    assert sorted(e["config"] for e in starts) == sorted(configs)  # one warm engine per job
    assert {e["slot"] for e in starts} <= {"0", "1"}  # on the GPU SLURM gave the job
    stops = [e for e in events(cluster) if e["event"] == "stop"]
    assert len(stops) == len(configs)  # each job stopped its engine when it ended
    assert not list(Path(os.environ["GRIDBENCH_SLOT_DIR"]).glob("slot-*.json"))


def test_a_cell_that_fails_on_a_node_reruns_alone(tmp_path, demo_assets, demo_config, slurm_cluster):
    workdir = new_workdir(tmp_path / "cluster", demo_assets)
    demo_config["configs"] = {"D_q8_0_n0": demo_config["configs"]["D_q8_0_n0"]}
    demo_config["depths"] = [0, 256, 512]
    write_config(workdir / "grid.yaml", demo_config)
    argv = [str(Path(sys.executable).parent / "snakemake"), "-s", str(REPO / "Snakefile")]
    argv += ["--workflow-profile", PROFILE, "--configfile", "grid.yaml"]
    proc = subprocess.Popen(argv, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    victim_log = workdir / "logs/cells/D_q8_0_n0/depth_256.log"
    deadline = time.monotonic() + 300
    while "llama-benchy (0.4.0)" not in (victim_log.read_text() if victim_log.exists() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.05)
    slot = json.loads(next(Path(os.environ["GRIDBENCH_SLOT_DIR"]).glob("slot-*.json")).read_text())
    os.killpg(slot["handle"]["pid"], signal.SIGKILL)  # the engine dies mid-cell, on the node
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode != 0, output

    failure = json.loads((workdir / "results/failures/D_q8_0_n0/depth_256.json").read_text())
    assert failure["config"] == "D_q8_0_n0" and failure["depth"] == 256
    assert not (workdir / "results/raw/D_q8_0_n0/depth_256.json").exists()
    for depth in (0, 512):  # the job went on with the other cells, and their results stay
        assert (workdir / f"results/raw/D_q8_0_n0/depth_{depth}.json").exists(), output
    assert len([e for e in events(workdir) if e["event"] == "start"]) == 2

    rerun = snakemake(workdir, "--workflow-profile", PROFILE, "--configfile", "grid.yaml", timeout=600)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert cells_of_last_run(workdir) == [{"config": "D_q8_0_n0", "depth": "256"}]
    assert not (workdir / "results/failures/D_q8_0_n0/depth_256.json").exists()
    assert list(pd.read_csv(workdir / "dataset/dataset.csv")["status"]) == ["ok", "ok", "ok"]
