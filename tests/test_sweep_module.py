"""What a sweep's Snakemake does on its host (gridbench.sweep), without Snakemake: the grid
files' names and content, the lock a killed sweep left, SIGTERM, keep-going in cluster
jobs, and the onstart/onsuccess pair."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO, load_yaml
from gridbench import layout
from gridbench.config.grid import Grid
from gridbench.config.loading import load_grid
from gridbench.engines.allocation import SWEEP_VARIABLE, process_identity, record_lock_holder
from gridbench.sweep import Sweep, engine_check_grid_file, grid_file, interrupt


def mechanism_grid(**overrides: object) -> Grid:
    return load_grid({**load_yaml(REPO / "config/mechanism.yaml"), **overrides}, "mechanism.yaml")


def a_sweep(tmp_path: Path, *, remote_exec: bool = False, **overrides: object) -> Sweep:
    me = process_identity(os.getpid())
    assert me is not None
    return Sweep(mechanism_grid(**overrides), me, remote_exec, tmp_path)


def test_a_grid_file_is_named_by_its_content_and_leaves_out_how_a_run_is_shown():
    grid = mechanism_grid()
    file = grid_file(grid)
    digest = hashlib.sha256(file.text.encode()).hexdigest()[:16]
    assert file.path == f".gridbench/grid-{digest}.json"
    document = json.loads(file.text)
    assert list(document) == [k for k in grid.document if k not in ("progress", "progress_interval_s")]
    # turning the progress lines off reruns nothing
    assert grid_file(mechanism_grid(progress=False, progress_interval_s=5)) == file


def test_a_filter_changes_the_grid_file_but_not_the_engine_checks():
    whole, filtered = mechanism_grid(), mechanism_grid(config="D_f16_n0")
    assert grid_file(filtered).path != grid_file(whole).path
    assert engine_check_grid_file(filtered) == engine_check_grid_file(whole)
    document = json.loads(engine_check_grid_file(filtered).text)
    assert {k: document[k] for k in ("engine", "checkpoint", "speculation", "config")} == dict.fromkeys(
        ("engine", "checkpoint", "speculation", "config")
    )
    assert "progress" not in document
    assert re.fullmatch(r"\.gridbench/grid-[0-9a-f]{16}\.json", engine_check_grid_file(whole).path)


def test_grid_files_are_written_once_and_named_relative_to_the_workdir(tmp_path):
    sweep = a_sweep(tmp_path)
    paths = sweep.write_grid_files()
    assert paths == (grid_file(sweep.grid).path, engine_check_grid_file(sweep.grid).path)
    assert (tmp_path / paths[0]).read_text() == grid_file(sweep.grid).text
    # an existing file of that name holds that content: it is left as it is (no new mtime)
    os.utime(tmp_path / paths[0], (0, 0))
    assert sweep.write_grid_files() == paths
    assert (tmp_path / paths[0]).stat().st_mtime == 0


def _dead_sweeps_lock(workdir: Path) -> int:
    """A lock with its holder noted, whose Snakemake was killed; its pid."""
    killed = subprocess.Popen(["sleep", "600"])
    holder = process_identity(killed.pid)
    assert holder is not None
    record_lock_holder(holder, workdir)
    killed.kill()
    killed.wait()
    (workdir / layout.SNAKEMAKE_LOCKS).mkdir(parents=True)
    (workdir / layout.SNAKEMAKE_LOCKS / "0.input.lock").write_text("results/raw/a.json\n")
    return killed.pid


def test_the_sweep_releases_a_killed_sweeps_lock_and_says_so(tmp_path):
    pid = _dead_sweeps_lock(tmp_path)
    said = a_sweep(tmp_path).release_dead_lock()
    assert said == (
        f"gridbench: removed the lock that sweep {pid} left when it was killed (it is gone); "
        "its unfinished cells run again"
    )
    assert not (tmp_path / layout.SNAKEMAKE_LOCKS).exists()
    assert a_sweep(tmp_path).release_dead_lock() is None  # nothing left to release


def test_jobs_inside_a_sweep_leave_the_lock_alone(tmp_path):
    """A cluster job, or a Snakemake its sweep started on this host, runs unlocked."""
    _dead_sweeps_lock(tmp_path)
    assert a_sweep(tmp_path, remote_exec=True).release_dead_lock() is None
    parent = process_identity(os.getppid())
    assert parent is not None
    inner = Sweep(mechanism_grid(), parent, False, tmp_path)
    assert not inner.is_the_sweep and inner.release_dead_lock() is None
    assert (tmp_path / layout.SNAKEMAKE_LOCKS / "0.input.lock").exists()


def test_claiming_makes_this_process_own_the_engines():
    environ: dict[str, str] = {}
    sweep = Sweep.claim(mechanism_grid(), remote_exec=False, environ=environ)
    assert sweep.process["pid"] == os.getpid() and sweep.is_the_sweep
    assert environ[SWEEP_VARIABLE].startswith(f"{os.getpid()}:")


def test_sigterm_goes_on_to_the_running_cells_and_interrupts():
    cell = subprocess.Popen(["sleep", "600"])
    try:
        with pytest.raises(KeyboardInterrupt):
            interrupt(signal.SIGTERM, None)
        assert cell.wait(timeout=10) == -signal.SIGTERM
    finally:
        cell.kill()
        cell.wait()


class FakeWorkflow:
    def __init__(self) -> None:
        self.execution_settings = SimpleNamespace(keep_going=False)
        self.calls: list[tuple[tuple[object, ...], dict[str, object]]] = []

    def execute(self, *args: object, **kwargs: object) -> str:
        self.calls.append((args, kwargs))
        return "ran"


def test_a_cluster_job_keeps_going_after_a_failed_cell(tmp_path):
    workflow = FakeWorkflow()
    a_sweep(tmp_path, remote_exec=True).keep_going_in_cluster_jobs(workflow)
    assert workflow.execute(1, dryrun=False) == "ran"
    assert workflow.execution_settings.keep_going and workflow.calls == [((1,), {"dryrun": False})]


def test_the_sweep_itself_keeps_its_own_keep_going(tmp_path):
    workflow = FakeWorkflow()
    a_sweep(tmp_path).keep_going_in_cluster_jobs(workflow)
    workflow.execute()
    assert not workflow.execution_settings.keep_going


@pytest.fixture
def sigterm_restored():
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def test_onstart_notes_the_lock_holder_lets_sigterm_interrupt_and_follows_progress(
    tmp_path, monkeypatch, sigterm_restored
):
    monkeypatch.chdir(tmp_path)  # the follower reads the working directory
    sweep = a_sweep(tmp_path, progress_interval_s=3600)
    lines: list[str] = []
    sweep.start(lines.append)
    assert (tmp_path / layout.LOCK_HOLDER).read_text().startswith(f"{os.getpid()}:")
    assert signal.getsignal(signal.SIGTERM) is interrupt
    sweep.stop()
    assert lines and lines[-1].startswith("progress")
    said = len(lines)
    sweep.stop()  # stopped once: a second stop says nothing more
    assert len(lines) == said


def test_no_progress_lines_when_the_config_turns_them_off(tmp_path, monkeypatch, sigterm_restored):
    monkeypatch.chdir(tmp_path)
    lines: list[str] = []
    sweep = a_sweep(tmp_path, progress=False)
    sweep.start(lines.append)
    sweep.stop()
    assert lines == []
