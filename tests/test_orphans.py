"""A sweep killed without warning (kill -9, the OOM killer, a batch system's hard kill)
leaves no engine behind: the engine's watchdog stops it within seconds, and a sweep that
finds a slot held by a dead sweep's engine reclaims it at once instead of waiting."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from conftest import write_config
from gridbench.engines.allocation import SWEEP_VARIABLE, process_gone, process_identity
from gridbench.engines.manager import SlotManager
from gridbench.engines.runtime import RuntimeHandle, runtime_of
from gridbench.errors import EngineError
from test_engines import grid_for
from test_workflow import engine_alive, in_runtime, slot_state, snakemake, wait_for_measuring

pytestmark = pytest.mark.integration
RUNTIMES = ["process", pytest.param("docker", marks=pytest.mark.docker)]
# the watchdog polls every second; stopping a llama.cpp server takes a second or two more
GONE_WITHIN_S = 15


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``condition`` until it holds; the seconds it took."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"{what}: not within {timeout} s"
        time.sleep(0.1)
    return time.monotonic() - started


def events(workdir: Path) -> list[dict]:
    path = workdir / "logs/engines/events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def stand_in_sweep(monkeypatch):
    """A process standing in for a sweep's Snakemake: the engines leased here belong to it."""
    proc = subprocess.Popen(["sleep", "600"])
    identity = process_identity(proc.pid)
    value = f"{identity['pid']}:{identity['start_time']}:{identity['host']}:{identity['boot_id']}"
    monkeypatch.setenv(SWEEP_VARIABLE, value)
    yield proc
    proc.kill()
    proc.wait()


def kill_sweep(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def running(handle: RuntimeHandle) -> bool:
    return runtime_of(handle).is_running(handle)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_warm_engine_stops_within_seconds_of_its_sweep_being_killed(workdir, runtime, stand_in_sweep):
    grid = grid_for(runtime)
    manager = SlotManager(["cpu"])
    with manager.lease(grid.configs["D_f16_n0"]) as engine:
        pass
    watchdog = slot_state()["watchdog"]
    assert not process_gone(watchdog)
    with manager.lease(grid.configs["D_f16_n0"]) as again:  # warm across cells while the sweep lives
        assert again.reused and running(engine.handle)

    kill_sweep(stand_in_sweep)
    took = wait_until(lambda: not running(engine.handle), GONE_WITHIN_S, "the orphaned engine stopped")
    print(f"engine stopped {took:.1f} s after its sweep was killed")
    wait_until(lambda: process_gone(watchdog), 5, "the watchdog exited")
    assert not list(Path(os.environ["GRIDBENCH_SLOT_DIR"]).glob("slot-*.json"))  # the slot is free
    reclaims = [e for e in events(workdir) if e["event"] == "reclaim"]
    assert len(reclaims) == 1 and reclaims[0]["by"] == "watchdog"
    assert reclaims[0]["owner_pid"] == stand_in_sweep.pid and reclaims[0]["config"] == "D_f16_n0"


def test_a_watchdog_ends_with_its_engine_when_the_sweep_stops_it(workdir, stand_in_sweep):
    grid = grid_for("process")
    manager = SlotManager(["cpu"])
    with manager.lease(grid.configs["D_f16_n0"]):
        pass
    first = slot_state()["watchdog"]
    with manager.lease(grid.configs["D_q8_0_n0"]):  # a switch stops the first engine
        pass
    wait_until(lambda: process_gone(first), 5, "the first engine's watchdog exited")
    second = slot_state()["watchdog"]
    assert manager.stop_all() == ["D_q8_0_n0"]  # what the sweep's end runs
    wait_until(lambda: process_gone(second), 5, "the second engine's watchdog exited")
    assert "reclaim" not in [e["event"] for e in events(workdir)]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_sweep_reclaims_at_once_a_slot_whose_sweep_is_gone(workdir, runtime, stand_in_sweep, monkeypatch):
    """Even when the watchdog is gone too (killed with the sweep's process tree): the next
    sweep (another directory, another config) stops the orphan and goes ahead at once."""
    grid = grid_for(runtime)
    with SlotManager(["0"]).lease(grid.configs["D_q8_0_draft4"]) as orphan:
        pass
    os.kill(slot_state()["watchdog"]["pid"], signal.SIGKILL)
    kill_sweep(stand_in_sweep)
    assert running(orphan.handle)  # left on its own: only the next sweep can stop it (see "by")

    monkeypatch.delenv(SWEEP_VARIABLE)  # the next sweep: this test's process owns it
    other = workdir / "other-sweep"
    other.mkdir()
    started = time.monotonic()
    with SlotManager(["0"], workdir=other, wait_s=60).lease(grid.configs["D_f16_n0"]) as engine:
        took = time.monotonic() - started
        assert not engine.reused and engine.slot == "0"
    assert not running(orphan.handle)
    print(f"slot reclaimed and a new engine ready in {took:.1f} s")
    assert took < 30  # it did not wait for the slot (up to 60 s here, 600 s by default)
    reclaim = next(e for e in events(workdir) if e["event"] == "reclaim")
    assert reclaim["config"] == "D_q8_0_draft4" and reclaim["by"] == f"a cell of the sweep in {other}"
    assert reclaim["owner"] == str(workdir) and reclaim["owner_pid"] == stand_in_sweep.pid
    SlotManager(["0"], workdir=other).stop_all()


@pytest.mark.workflow
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_sigkill_to_a_sweep_mid_cell_stops_its_engine_within_seconds(workdir, demo_config, runtime):
    demo_config["configs"] = {"D_q8_0_n0": demo_config["configs"]["D_q8_0_n0"]}
    demo_config["depths"] = [0, 256]
    demo_config.pop("natural")
    write_config(workdir / "grid.yaml", in_runtime(demo_config, runtime))
    proc = snakemake(workdir, "--configfile", "grid.yaml", background=True)
    wait_for_measuring(proc, workdir / "logs/cells/D_q8_0_n0/depth_256.log")
    handle = slot_state()["handle"]
    cells = psutil.Process(proc.pid).children()
    # The cell is held while its engine goes, so that it is certainly mid-measurement then: a
    # tiny model's cell ends within a second, and it did finish before its engine stopped
    # once in a CI run.
    held = [p for cell in cells for p in (cell, *cell.children(recursive=True))]
    for process in held:
        process.suspend()
    proc.send_signal(signal.SIGKILL)  # no onerror, no engine stop --all
    proc.communicate(timeout=30)

    took = wait_until(lambda: not engine_alive(handle), GONE_WITHIN_S, "the killed sweep's engine stopped")
    print(f"engine stopped {took:.1f} s after SIGKILL to its sweep")
    measured = workdir / "results/raw/D_q8_0_n0/depth_256.json"
    assert not measured.exists(), "the cell ended before it was held"
    for process in held:
        process.resume()
    # the cell that was measuring outlives Snakemake; without its engine it fails and ends
    psutil.wait_procs(cells, timeout=60)
    assert not [c for c in cells if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    failure = json.loads((workdir / "results/failures/D_q8_0_n0/depth_256.json").read_text())
    assert failure["config"] == "D_q8_0_n0"
    assert not measured.exists()
    assert [e["by"] for e in events(workdir) if e["event"] == "reclaim"] == ["watchdog"]

    # the same command again: the dead sweep's lock is released, the unfinished cell measured
    rerun = snakemake(workdir, "--configfile", "grid.yaml")
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert "removed the lock that sweep" in rerun.stdout + rerun.stderr
    assert measured.exists()


def test_a_reused_engine_whose_watchdog_was_killed_gets_a_new_one(workdir, stand_in_sweep):
    grid = grid_for("process")
    manager = SlotManager(["cpu"])
    with manager.lease(grid.configs["D_f16_n0"]) as engine:
        pass
    first = slot_state()["watchdog"]
    os.kill(first["pid"], signal.SIGKILL)
    wait_until(lambda: process_gone(first), 5, "the killed watchdog is gone")
    with manager.lease(grid.configs["D_f16_n0"]) as again:
        assert again.reused
    second = slot_state()["watchdog"]
    assert second != first and not process_gone(second)
    kill_sweep(stand_in_sweep)
    wait_until(lambda: not running(engine.handle), GONE_WITHIN_S, "the engine stopped by its new watchdog")


def test_a_cell_whose_sweep_is_gone_starts_no_engine(workdir, stand_in_sweep):
    """A cell that outlived its killed sweep (Snakemake's children survive it) would start
    an engine only for the watchdog to stop it: it fails at once and says so."""
    kill_sweep(stand_in_sweep)
    grid = grid_for("process")
    gone = f"the sweep that runs this cell \\(process {stand_in_sweep.pid}\\) is gone"
    with pytest.raises(EngineError, match=gone):
        with SlotManager(["cpu"]).lease(grid.configs["D_f16_n0"]):
            pass
    assert not list(Path(os.environ["GRIDBENCH_SLOT_DIR"]).glob("slot-*.json"))
