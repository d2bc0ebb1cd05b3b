"""Which GPUs a cell may use inside a cluster job, and who owns the engines it starts."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from gridbench.cells.provenance import SlotGpu, gpus_of_slots
from gridbench.engines.allocation import (
    SWEEP_VARIABLE,
    allocated_gpus,
    claim_sweep,
    cuda_visible_devices,
    process_gone,
    process_identity,
    record_lock_holder,
    release_stale_lock,
    sweep_owner,
    sweep_process,
)


def test_outside_a_cluster_job_nothing_is_allocated_and_the_workdir_owns_engines(tmp_path):
    assert allocated_gpus({}) == []
    assert cuda_visible_devices(["2", "3"], {}) == "2,3"
    assert sweep_owner({}, tmp_path) == str(tmp_path.resolve())


def test_a_slurm_step_uses_the_gpus_slurm_gave_it():
    assert allocated_gpus({"SLURM_JOB_GPUS": "4,5"}) == ["4", "5"]
    # a step's own allocation wins over the job's
    assert allocated_gpus({"SLURM_JOB_GPUS": "4,5", "SLURM_STEP_GPUS": "5"}) == ["5"]


def test_process_engines_see_the_gpu_as_slurm_numbers_it_for_the_job():
    constrained = {"SLURM_STEP_GPUS": "4,6", "CUDA_VISIBLE_DEVICES": "0,1"}  # cgroup-constrained
    assert cuda_visible_devices(["6"], constrained) == "1"
    assert cuda_visible_devices(["4", "6"], constrained) == "0,1"
    plain = {"SLURM_STEP_GPUS": "4,6", "CUDA_VISIBLE_DEVICES": "4,6"}
    assert cuda_visible_devices(["6"], plain) == "6"


def test_engines_of_two_jobs_in_one_workdir_have_different_owners(tmp_path):
    first = sweep_owner({"SLURM_JOB_ID": "17"}, tmp_path)
    second = sweep_owner({"SLURM_JOB_ID": "18"}, tmp_path)
    assert first != second and first.startswith(str(Path(tmp_path).resolve()))


def test_provenance_names_each_slot_gpu_by_index_and_uuid():
    """A two-GPU run's check that each engine ran on its slot's GPU reads these."""
    rows = [["0", "GPU-aaaa", "NVIDIA H200"], ["1", "GPU-bbbb", "NVIDIA H200"]]
    assert gpus_of_slots(rows, ["1"]) == [SlotGpu(index="1", uuid="GPU-bbbb", name="NVIDIA H200")]
    assert [g.index for g in gpus_of_slots(rows, ["GPU-aaaa", "1"])] == ["0", "1"]
    assert gpus_of_slots([], ["0"]) == []  # no NVIDIA GPU: nothing to name


def test_a_sweep_claims_its_engines_unless_it_runs_inside_a_live_sweep_on_this_host():

    environ: dict[str, str] = {}
    me = claim_sweep(environ)
    assert me["pid"] == os.getpid() and sweep_process(environ) == me
    # a Snakemake started by the sweep on this host (a group job, a job step) keeps its owner
    parent = process_identity(os.getppid())
    inherited = f"{parent['pid']}:{parent['start_time']}:{parent['host']}:{parent['boot_id']}"
    environ = {SWEEP_VARIABLE: inherited}
    assert claim_sweep(environ) == parent and environ[SWEEP_VARIABLE] == inherited
    # a cluster job inherits the login node's sweep: there, the job's Snakemake owns the engines
    elsewhere = f"{parent['pid']}:{parent['start_time']}:not-{socket.gethostname()}:{parent['boot_id']}"
    assert claim_sweep({SWEEP_VARIABLE: elsewhere})["pid"] == os.getpid()
    # a dead sweep's value (its pid reused, or gone) is not inherited
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = f"{dead.pid}:{parent['start_time']}:{parent['host']}:{parent['boot_id']}"
    assert claim_sweep({SWEEP_VARIABLE: gone})["pid"] == os.getpid()
    # a cell run by hand belongs to the shell (or script) that ran it
    assert sweep_process({}) == parent


def test_a_process_is_gone_when_exited_or_a_zombie_and_never_judged_on_another_host():

    child = subprocess.Popen(["sleep", "60"])
    identity = process_identity(child.pid)
    assert not process_gone(identity)
    assert process_gone({**identity, "start_time": identity["start_time"] + 1})  # the pid reused
    assert process_gone({**identity, "boot_id": "another boot"})  # the host rebooted
    child.kill()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
    assert process_gone(identity)  # a zombie
    child.wait()
    assert process_gone(identity)
    assert not process_gone({**identity, "host": "another-host"})  # not ours to judge
    assert not process_gone(None)


def _snakemake_lock(workdir: Path) -> Path:
    """What Snakemake leaves in a working directory it has locked."""
    locks = workdir / ".snakemake/locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text("results/raw/a.json\n")
    return locks


def test_the_lock_of_a_sweep_that_is_gone_is_released_and_a_live_ones_kept(tmp_path):
    sweep = subprocess.Popen(["sleep", "600"])
    holder = process_identity(sweep.pid)
    record_lock_holder(holder, tmp_path)
    locks = _snakemake_lock(tmp_path)
    assert release_stale_lock(tmp_path) is None  # its sweep still runs: the lock is its
    assert (locks / "0.input.lock").exists()
    sweep.kill()
    sweep.wait()
    assert release_stale_lock(tmp_path) == holder
    assert not locks.exists()
    assert release_stale_lock(tmp_path) is None  # nothing left to release


def test_a_gone_holder_that_released_its_lock_is_forgotten(tmp_path):
    """The next sweep takes the lock before it notes itself: in between, a third must not
    take that lock for the gone holder's and remove it."""
    sweep = subprocess.Popen(["sleep", "600"])
    holder = process_identity(sweep.pid)
    sweep.kill()
    sweep.wait()
    record_lock_holder(holder, tmp_path)
    assert release_stale_lock(tmp_path) is None  # its Snakemake ended cleanly: no lock left
    assert not (tmp_path / ".snakemake/gridbench-lock-holder").exists()
    locks = _snakemake_lock(tmp_path)  # the next sweep's lock, before its onstart
    assert release_stale_lock(tmp_path) is None
    assert (locks / "0.input.lock").exists()


def test_a_lock_without_a_known_holder_is_left_to_snakemake(tmp_path):
    """A lock taken by a Snakemake gridbench never saw take it (or by hand) is not judged."""
    locks = _snakemake_lock(tmp_path)
    assert release_stale_lock(tmp_path) is None
    assert (locks / "0.input.lock").exists()
