"""Several engine slots (GPUs) on one host, against real llama.cpp server processes:
one engine per config, configs side by side, tensor parallelism, cluster-job slots."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, free_port, load_yaml
from gridbench.config.grid import Grid
from gridbench.config.loading import load_grid
from gridbench.engines.manager import SlotManager
from gridbench.errors import SlotBusyError

pytestmark = pytest.mark.integration


def demo_grid(*, gpus: bool = False, tensor_parallel: int = 1) -> Grid:
    config = load_yaml(REPO / "config/mechanism.yaml")
    config["engines"]["llamacpp"].update(port=free_port(), gpus=gpus, extra_args=["--threads", "1"])
    config["configs"]["D_f16_n0"]["serving"] = {"tensor_parallel_size": tensor_parallel}
    return load_grid(config, "mechanism.yaml")


def engine_environ(engine) -> dict[str, str]:
    raw = Path(f"/proc/{engine.handle.pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def events(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "logs/engines/events.jsonl").read_text().splitlines()]


def test_a_cell_waits_for_its_configs_engine_while_another_config_runs_beside_it(workdir, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    grid = demo_grid()
    f16, q8 = grid.configs["D_f16_n0"], grid.configs["D_q8_0_n0"]
    second: dict = {}

    def second_cell_of_f16():
        with SlotManager(["0", "1"]).lease(f16) as engine:
            second["engine"] = engine
            second["at"] = time.monotonic()

    try:
        with SlotManager(["0", "1"]).lease(f16) as first:
            waiting = threading.Thread(target=second_cell_of_f16)
            waiting.start()
            with SlotManager(["0", "1"]).lease(q8) as beside:  # another config: the other slot, now
                assert (first.slot, beside.slot) == ("0", "1")
                assert beside.plan.port == first.plan.port + 1 and not beside.reused
            time.sleep(2.5)  # the waiting cell polls every second
            assert waiting.is_alive(), "a second cell of one config must wait, not start an engine"
            released = time.monotonic()
        waiting.join(timeout=30)
        assert second["at"] >= released
        assert second["engine"].reused and second["engine"].handle == first.handle
        # a CPU engine (gpus: false) on a named slot is not pinned to any GPU
        assert "CUDA_VISIBLE_DEVICES" not in engine_environ(first)
    finally:
        SlotManager(["0", "1"]).stop_all()
    starts = [(e["config"], e["slot"]) for e in events(workdir) if e["event"] == "start"]
    assert starts == [("D_f16_n0", "0"), ("D_q8_0_n0", "1")]


def test_tensor_parallel_engine_takes_two_slots_and_frees_both(workdir):
    grid = demo_grid(gpus=True, tensor_parallel=2)
    wide, narrow = grid.configs["D_f16_n0"], grid.configs["D_q8_0_n0"]
    manager = SlotManager(["0", "1"], wait_s=2)
    try:
        with manager.lease(wide) as engine:
            assert engine.slots == ("0", "1")
            assert engine_environ(engine)["CUDA_VISIBLE_DEVICES"] == "0,1"
            with pytest.raises(SlotBusyError, match="no engine slot free for D_q8_0_n0"):
                with SlotManager(["0", "1"], wait_s=2).lease(narrow):
                    pass
        with manager.lease(narrow) as other:  # replaces the wide engine; both of its slots free up
            assert other.slots == ("0",) and not manager.is_alive(engine)
            assert [row.config for row in manager.status()] == ["D_q8_0_n0"]
        with pytest.raises(SlotBusyError, match="needs 2 GPU slots"):
            with SlotManager(["0"]).lease(wide):
                pass
    finally:
        manager.stop_all()


def test_in_a_slurm_job_the_allocated_gpus_and_the_job_own_the_engine(workdir, monkeypatch):
    grid = demo_grid(gpus=True)
    cfg = grid.configs["D_f16_n0"]
    # SLURM gave this job GPU 5 of the node and, constraining devices, calls it 0 in the job
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_STEP_GPUS", "5")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    job_manager = SlotManager(["0", "1"])  # the config's gpu_slots do not apply inside the job
    try:
        with job_manager.lease(cfg) as engine:
            assert engine.slots == ("5",) and engine.plan.port == cfg.engine.port + 5
            assert engine_environ(engine)["CUDA_VISIBLE_DEVICES"] == "0"
        with monkeypatch.context() as outside:  # the same working directory, outside the job
            for name in ("SLURM_JOB_ID", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES"):
                outside.delenv(name)
            assert SlotManager([]).stop_all() == []  # not its engine
        assert job_manager.is_alive(engine)
        assert job_manager.stop_all() == ["D_f16_n0"]  # what the job's end runs
    finally:
        job_manager.stop_all()
