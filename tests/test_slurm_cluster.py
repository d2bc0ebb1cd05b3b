"""scripts/start_slurm.sh, the test cluster's own script: a cluster left running by another
checkout (its state folder since deleted) is replaced, not reused by accident."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import REPO

pytestmark = pytest.mark.slurm


def start_slurm(state=None, *args: str) -> subprocess.CompletedProcess:
    env = None if state is None else {**os.environ, "GRIDBENCH_SLURM_DIR": str(state)}
    return subprocess.run(
        ["bash", str(REPO / "scripts/start_slurm.sh"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_a_cluster_left_by_a_deleted_checkout_is_replaced(tmp_path):
    other = tmp_path / "other-checkout"
    try:
        assert start_slurm(None, "--stop").returncode == 0  # this checkout's cluster
        started = start_slurm(other)
        assert started.returncode == 0, started.stdout + started.stderr
        other.rename(tmp_path / "moved-away")  # that checkout is gone; its daemons are not
        restarted = start_slurm(tmp_path / "this-checkout")
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        job = subprocess.run(
            ["sbatch", "--wait", "--output=/dev/null", "--wrap", "true"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert job.returncode == 0, job.stdout + job.stderr  # it failed: "I/O error writing script"
    finally:
        start_slurm()  # this checkout's cluster again, for the other SLURM tests
