"""Which GPUs a cell may use inside a cluster job, and who owns the engines it starts."""

from __future__ import annotations

from pathlib import Path

from gridbench.engines.allocation import allocated_gpus, cuda_visible_devices, sweep_owner
from gridbench.provenance import gpus_of_slots


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
    assert gpus_of_slots(rows, ["1"]) == [{"index": "1", "uuid": "GPU-bbbb", "name": "NVIDIA H200"}]
    assert [g["index"] for g in gpus_of_slots(rows, ["GPU-aaaa", "1"])] == ["0", "1"]
    assert gpus_of_slots([], ["0"]) == []  # no NVIDIA GPU: nothing to name
