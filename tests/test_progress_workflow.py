"""A real demo sweep's console says where the sweep stands, and nothing of it outlives the
sweep, whether it succeeds or fails."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import psutil
import pytest

from conftest import write_config
from test_workflow import jobs_of_last_run, snakemake

pytestmark = pytest.mark.workflow


def progress_lines(console: str) -> list[str]:
    return [line for line in console.splitlines() if line.startswith("progress ")]


def processes_in(workdir: Path) -> list[str]:
    """Processes other than this test's whose working directory is the sweep's."""
    found = []
    for proc in psutil.process_iter(["pid", "cwd", "cmdline"]):
        if proc.info["pid"] != os.getpid() and proc.info["cwd"] == str(workdir):
            found.append(" ".join(proc.info["cmdline"] or []))
    return found


def nothing_left_in(workdir: Path, timeout_s: float = 15) -> list[str]:
    """What still runs in the working directory once engines and watchdogs had time to end."""
    deadline = time.monotonic() + timeout_s
    while (left := processes_in(workdir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def small_sweep(config: dict) -> dict:
    config["configs"] = {"D_f16_n0": config["configs"]["D_f16_n0"]}
    config["depths"] = [0, 256]
    config["natural"] = {  # long enough (seconds) for a line while it runs
        "prompt_classes": ["code"],
        "concurrency": [2],
        "requests": 16,
        "max_tokens": 128,
        "warmup": 1,
    }
    return config


def test_the_console_says_where_the_sweep_stands_and_nothing_outlives_it(workdir, demo_config):
    write_config(workdir / "grid.yaml", small_sweep(demo_config))
    # a look four times a second: a cell of a second or two cannot start and end unseen, even
    # on a loaded machine
    result = snakemake(workdir, "--configfile", "grid.yaml", "--config", "progress_interval_s=0.25")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = progress_lines(result.stderr)  # Snakemake's console
    assert lines[0] == "progress 0/3 cells (0 %), ETA unknown until a cell finishes", result.stderr
    assert lines[-1] == "progress 3/3 cells (100 %), all cells ended", lines
    assert lines.count(lines[-1]) == 2, lines  # as the last cell ended, and the final line: no repeats
    done = [int(re.match(r"progress (\d)/3 cells", line).group(1)) for line in lines]
    assert done == sorted(done) and {0, 1, 2, 3} <= set(done), lines  # a line as each cell ended
    assert any(
        re.search(r"progress [12]/3 cells \(\d+ %\), ETA (at least )?\d+ s", line) for line in lines
    ), lines
    running = " ".join(lines)
    assert "running D_f16_n0 depth 256 (" in running and "engine warm (reused)" in running, lines
    assert "running D_f16_n0 code c=2 (" in running, lines
    # the same lines in Snakemake's own log of the run
    log = sorted((workdir / ".snakemake/log").glob("*.snakemake.log"))[-1].read_text()
    assert lines[-1] in log
    assert nothing_left_in(workdir) == []

    # switching it off reruns nothing (the display keys stay out of the grid files) ...
    unchanged = snakemake(workdir, "--configfile", "grid.yaml", "--config", "progress=False")
    assert "Nothing to be done" in unchanged.stderr, unchanged.stderr
    # ... and a run without it says nothing
    (workdir / "results/raw/D_f16_n0/depth_0.json").unlink()
    target = "results/raw/D_f16_n0/depth_0.json"
    quiet = snakemake(workdir, target, "--configfile", "grid.yaml", "--config", "progress=False")
    assert quiet.returncode == 0, quiet.stderr
    assert jobs_of_last_run(workdir, "bench_cell") == [{"config": "D_f16_n0", "depth": "0"}]
    assert progress_lines(quiet.stderr) == []


def test_a_failed_sweep_ends_with_its_progress_line_and_leaves_nothing_running(workdir, demo_config):
    config = small_sweep(demo_config)
    config.pop("natural")
    config["benchy"]["timeout_s"] = 0.001  # llama-benchy is killed at once: every cell fails
    write_config(workdir / "grid.yaml", config)
    result = snakemake(workdir, "--configfile", "grid.yaml", "--config", "progress_interval_s=0.25")
    assert result.returncode != 0
    lines = progress_lines(result.stderr)
    assert lines[0] == "progress 0/2 cells (0 %), ETA unknown until a cell finishes", result.stderr
    assert lines[-1] == "progress 0/2 cells (0 %), 2 failed, all cells ended"
    assert nothing_left_in(workdir) == []


def test_with_the_rich_logger_plugin_the_lines_print_above_its_panel(workdir, demo_config):
    pytest.importorskip("snakemake_logger_plugin_rich")
    config = small_sweep(demo_config)
    config.pop("natural")
    write_config(workdir / "grid.yaml", config)
    result = snakemake(workdir, "--configfile", "grid.yaml", "--logger", "rich")
    assert result.returncode == 0, result.stderr
    lines = progress_lines(result.stderr)
    assert lines[0] == "progress 0/2 cells (0 %), ETA unknown until a cell finishes", result.stderr
    assert lines[-1] == "progress 2/2 cells (100 %), all cells ended"
