"""The workflow on a real SLURM cluster (scripts/start_slurm.sh: munge, slurmctld and
slurmd on this machine, two placeholder GPUs): one cluster job per serving config, results
on the shared file system, engines stopped with their job, a failed cell rerun alone, and
the dataset the local run's, cell for cell.

One sweep of the demo grid serves every test here (a cluster run costs minutes): run
locally, run through SLURM with one cell's engine killed on the node, then rerun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, free_port, load_yaml, write_config
from test_scale import assert_same_cells, events, new_workdir, snakemake

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]
PROFILE = str(REPO / "profiles/slurm-ci")
VICTIM = ("D_q8_0_n0", 256)


def slurm_is_up() -> bool:
    try:
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return states.returncode == 0 and any(s in ("idle", "mixed", "allocated") for s in states.stdout.split())


def log_of_run(workdir: Path, index: int) -> str:
    return sorted((workdir / ".snakemake/log").glob("*.snakemake.log"))[index].read_text()


def slurm_run_id(log: str) -> str:
    return next(line.split(": ", 1)[1].strip() for line in log.splitlines() if "SLURM run ID:" in line)


def cluster_jobs(run_id: str) -> list[dict[str, str]]:
    """The SLURM jobs of one Snakemake run, as squeue lists them (finished ones included)."""
    fields = "JobID:|,State:|,TimeLimit:|,tres-per-job"
    out = subprocess.run(
        ["squeue", "--states=all", "--noheader", "--name", run_id, "-O", fields],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [[field.strip() for field in line.split("|")] for line in out.splitlines()]
    return [dict(zip(("id", "state", "time_limit", "tres"), row, strict=True)) for row in rows]


def cells_run(log: str) -> list[dict[str, str]]:
    """The wildcards of every bench_cell job in a Snakemake log (a group job lists its
    cells one after another, indented)."""
    lines = log.splitlines()
    cells = []
    for i, line in enumerate(lines):
        if line.strip() == "rule bench_cell:":
            wildcards = next(w for w in lines[i + 1 :] if "wildcards:" in w).split("wildcards:")[1]
            cells.append(dict(p.split("=") for p in wildcards.strip().split(", ")))
    return cells


@dataclass
class Sweep:
    local: Path
    cluster: Path
    configs: list[str]
    port: int
    first_run: subprocess.CompletedProcess
    rerun: subprocess.CompletedProcess
    # what the first run left: engine events, results, the victim's failure record
    first_events: list[dict]
    first_results: list[str]
    first_failure: dict


def run_killing_one_cell(workdir: Path, slot_dir: Path) -> subprocess.CompletedProcess:
    """The sweep through SLURM; the engine of VICTIM's cell is killed on the node mid-cell."""
    argv = [str(Path(sys.executable).parent / "snakemake"), "-s", str(REPO / "Snakefile")]
    argv += ["--workflow-profile", PROFILE, "--configfile", "grid.yaml"]
    proc = subprocess.Popen(argv, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    config, depth = VICTIM
    victim_log = workdir / f"logs/cells/{config}/depth_{depth}.log"
    deadline = time.monotonic() + 600
    while "llama-benchy (0.4.0)" not in (victim_log.read_text() if victim_log.exists() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.05)
    states = [json.loads(p.read_text()) for p in slot_dir.glob("slot-*.json")]
    engine = next(s for s in states if s["config"] == config)
    os.killpg(engine["handle"]["pid"], signal.SIGKILL)
    output, _ = proc.communicate(timeout=900)
    return subprocess.CompletedProcess(argv, proc.returncode, output, "")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, demo_assets) -> Sweep:
    if not slurm_is_up():
        message = "no SLURM cluster answers sinfo: start one with `bash scripts/start_slurm.sh`"
        if os.environ.get("GRIDBENCH_SLURM") == "required":  # CI: the cluster must be there
            pytest.fail(message)
        pytest.skip(message)
    root = tmp_path_factory.mktemp("slurm")
    config = load_yaml(REPO / "config/mechanism.yaml")  # the demo grid: every config and depth
    config["benchy"].pop("prefix_cache_pass")  # one engine per config job (the pass adds a second)
    # the depth cells alone: a config's natural cells join its job the same way, and would
    # double the three sweeps' time without a check of their own here
    config.pop("natural")
    # two jobs share this machine's two cores: one thread per engine, and no latency
    # subtraction, so load cannot fail a measurement
    config["engines"]["llamacpp"].update(port=free_port(), extra_args=["--threads", "1"])
    config["benchy"]["latency_mode"] = "none"
    local, cluster = new_workdir(root / "local", demo_assets), new_workdir(root / "cluster", demo_assets)
    for workdir in (local, cluster):
        write_config(workdir / "grid.yaml", config)
    slot_dir = root / "slots"
    with pytest.MonkeyPatch.context() as env:  # the cluster's jobs inherit the environment
        env.setenv("GRIDBENCH_SLOT_DIR", str(slot_dir))
        env.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
        result = snakemake(local, "-j1", "--configfile", "grid.yaml")
        assert result.returncode == 0, result.stdout + result.stderr
        first_run = run_killing_one_cell(cluster, slot_dir)
        assert not list(slot_dir.glob("slot-*.json")), "an engine outlived its cluster job"
        first_events = events(cluster)
        raw = cluster.glob("results/raw/*/depth_*[0-9].json")  # results, not provenance
        first_results = sorted(str(p.relative_to(cluster)) for p in raw)
        failure = cluster / "results/failures/{}/depth_{}.json".format(*VICTIM)
        first_failure = json.loads(failure.read_text()) if failure.exists() else {}
        rerun = snakemake(cluster, "--workflow-profile", PROFILE, "--configfile", "grid.yaml", timeout=900)
    assert not list(slot_dir.glob("slot-*.json")), "an engine outlived its cluster job"
    port = config["engines"]["llamacpp"]["port"]
    configs = list(config["configs"])
    return Sweep(local, cluster, configs, port, first_run, rerun, first_events, first_results, first_failure)


def test_each_config_runs_as_one_cluster_job_on_one_engine(sweep):
    all_jobs = cluster_jobs(slurm_run_id(log_of_run(sweep.cluster, 0)))
    jobs = [job for job in all_jobs if "gpu:1" in job["tres"]]  # each asked SLURM for one GPU
    assert len(jobs) == len(sweep.configs)  # one cluster job per serving config
    # and before them the engine's check, a short job on a node without a GPU; nothing else
    checks = [(job["state"], job["tres"], job["time_limit"]) for job in all_jobs if job not in jobs]
    assert checks == [("COMPLETED", "N/A", "5:00")]
    assert sorted(job["state"] for job in jobs) == ["COMPLETED"] * 3 + ["FAILED"]  # the victim's
    job_of: dict[str, set[str]] = {}
    for path in sweep.cluster.glob("results/raw/*/*.provenance.json"):
        record = json.loads(path.read_text())
        if record["config"] != VICTIM[0]:  # the victim's config has a rerun job too
            job_of.setdefault(record["config"], set()).add(record["host"]["slurm_job_id"])
    assert all(len(ids) == 1 for ids in job_of.values()), job_of  # a config's cells in one job
    assert set.union(*job_of.values()) < {job["id"] for job in jobs}
    starts = [e for e in sweep.first_events if e["event"] == "start"]
    # one warm engine per job, and a fresh one after the victim's engine was killed
    assert sorted(e["config"] for e in starts) == sorted([*sweep.configs, VICTIM[0]])
    assert len({e["owner"] for e in starts}) == len(sweep.configs)  # owned by their jobs
    for start in starts:  # on the GPU SLURM gave the job, on that GPU's port
        assert start["slot"] in ("0", "1") and start["port"] == sweep.port + int(start["slot"])
    stops = [e for e in sweep.first_events if e["event"] == "stop"]
    assert len(stops) == len(starts)  # every engine stopped, the last ones when their job ended


def test_a_cell_that_fails_on_a_node_reruns_alone(sweep):
    config, depth = VICTIM
    assert sweep.first_run.returncode != 0, sweep.first_run.stdout
    assert sweep.first_failure["config"] == config and sweep.first_failure["depth"] == depth
    victim = f"results/raw/{config}/depth_{depth}.json"
    assert victim not in sweep.first_results
    assert len(sweep.first_results) == 15, sweep.first_results  # its job went on with the others
    assert sweep.rerun.returncode == 0, sweep.rerun.stdout + sweep.rerun.stderr
    assert cells_run(log_of_run(sweep.cluster, -1)) == [{"config": config, "depth": str(depth)}]
    assert len(cluster_jobs(slurm_run_id(log_of_run(sweep.cluster, -1)))) == 1
    assert not (sweep.cluster / f"results/failures/{config}/depth_{depth}.json").exists()


def test_the_dataset_is_the_local_runs_cell_for_cell(sweep):
    dataset = "dataset/dataset.parquet"
    cluster, local = pd.read_parquet(sweep.cluster / dataset), pd.read_parquet(sweep.local / dataset)
    assert (cluster["status"] == "ok").all() and len(cluster) == 16
    assert_same_cells(cluster, local)
