"""The fault matrix: each fault against real engine processes or containers, and what the
user is promised when it happens."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, free_port, gridbench
from gridbench.cells.context import write_context
from gridbench.config.grid import Grid
from gridbench.config.loading import load_grid
from gridbench.engines.manager import SlotManager
from gridbench.errors import SlotBusyError
from gridbench.util.files import atomic_write_json

pytestmark = pytest.mark.integration
FAULT_ENGINE = [sys.executable, str(REPO / "tests/fault_engine.py")]


def one_cell_grid(config: dict, **engine_changes) -> Grid:
    config["configs"] = {"D_f16_n0": config["configs"]["D_f16_n0"]}
    config["engines"]["llamacpp"].update(engine_changes)
    return load_grid(config, "test.yaml")


def run_cell(grid: Grid, depth: int = 0, timeout: float = 300):
    context = write_context(grid, "D_f16_n0", ["cpu"], "benchy")
    raw = Path(f"results/raw/D_f16_n0/depth_{depth}.json")
    started = time.monotonic()
    result = gridbench(
        "bench",
        "--context",
        str(context),
        "--depth",
        str(depth),
        "--raw",
        str(raw),
        "--provenance",
        str(raw.with_suffix(".provenance.json")),
        check=False,
    )
    elapsed = time.monotonic() - started
    failure = Path(f"results/failures/D_f16_n0/depth_{depth}.json")
    record = json.loads(failure.read_text()) if failure.exists() else None
    return result, record, elapsed, raw


def assert_failed_cleanly(result, record, raw: Path) -> None:
    assert result.returncode != 0, result.stdout
    assert record is not None and record["config"] == "D_f16_n0"
    assert not raw.exists() and not raw.with_suffix(".provenance.json").exists()
    assert not list(Path("results/.tmp").iterdir())  # scratch removed


def test_a_healthy_cell_writes_its_results_and_no_failure(workdir, demo_config):
    result, record, _, raw = run_cell(one_cell_grid(demo_config))
    assert result.returncode == 0, result.stdout
    assert record is None and raw.exists()
    assert json.loads(raw.with_suffix(".provenance.json").read_text())["engine"]["reused"] is False


def test_engine_exiting_at_start_fails_the_cell_in_seconds_with_its_log(workdir, demo_config):
    result, record, elapsed, raw = run_cell(one_cell_grid(demo_config, extra_args=["--no-such-flag"]))
    assert_failed_cleanly(result, record, raw)
    assert elapsed < 20
    assert record["error_type"] == "EngineStartError"
    assert "unrecognized arguments: --no-such-flag" in record["engine_log_tail"]


def test_engine_never_ready_fails_at_the_startup_timeout(workdir, demo_config):
    grid = one_cell_grid(
        demo_config, command=["python3", "-c", "import time; time.sleep(120)"], startup_timeout_s=3
    )
    result, record, elapsed, raw = run_cell(grid)
    assert_failed_cleanly(result, record, raw)
    assert record["error_type"] == "EngineTimeoutError" and 3 <= elapsed < 20
    assert SlotManager(["cpu"]).status() == []  # the stuck engine was stopped


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (["--status-every", "4", "--status", "500"], "HTTP 500"),
        (["--status-every", "4", "--status", "429"], "HTTP 429"),
        (["--drop-after", "5"], ""),
        (["--truncate"], ""),
    ],
    ids=["http500", "http429", "dropped-stream", "truncated-stream"],
)
def test_request_faults_fail_a_benchy_cell(workdir, demo_config, fault, expected):
    """llama-benchy drops failed requests from its statistics, so a benchy cell needs every
    request: any errored, dropped or short request fails it (natural cells have a threshold)."""
    demo_config["benchy"]["tg"] = 16
    grid = one_cell_grid(demo_config, command=[*FAULT_ENGINE, *fault], extra_args=[])
    result, record, _, raw = run_cell(grid)
    assert_failed_cleanly(result, record, raw)
    assert record["error_type"] in ("BenchmarkError", "TransportError")
    assert expected in result.stdout + record["reason"]  # the cell's log names the server's answer


def test_hanging_load_generator_is_killed_at_the_cell_timeout(workdir, demo_config):
    demo_config["benchy"]["timeout_s"] = 8
    grid = one_cell_grid(demo_config, command=[*FAULT_ENGINE, "--hang"], extra_args=[])
    result, record, elapsed, raw = run_cell(grid)
    assert_failed_cleanly(result, record, raw)
    assert "still running after 8 s; killed" in record["reason"] and elapsed < 40
    leftovers = subprocess.run(["pgrep", "-f", f"llama-benchy.*{workdir}"], capture_output=True)
    assert leftovers.returncode == 1  # no llama-benchy process left behind


def test_a_second_sweep_on_the_same_gpu_waits_then_refuses_clearly(workdir, demo_config, tmp_path):
    grid = one_cell_grid(demo_config)
    cfg = grid.configs["D_f16_n0"]
    first = SlotManager(["0"])
    with first.lease(cfg):
        pass  # the first sweep's engine stays on GPU 0 between its cells
    other_dir = tmp_path / "other-sweep"
    other_dir.mkdir()
    second = SlotManager(["0"], workdir=other_dir, wait_s=2)
    started = time.monotonic()
    with pytest.raises(SlotBusyError, match=f"slot 0: engine D_f16_n0 of the sweep in {workdir}"):
        with second.lease(cfg):
            pass
    assert time.monotonic() - started >= 2
    first.stop_all()
    with second.lease(cfg) as engine:  # free again: the second sweep goes ahead
        assert not engine.reused
    second.stop_all()


def test_an_interrupted_write_leaves_no_file(tmp_path, monkeypatch):
    target = tmp_path / "result.json"

    def crash(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_json(target, {"a": 1})
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def port() -> int:
    return free_port()


def test_free_port_option_moves_a_started_engine(workdir, demo_config, port):
    """port_in_use: pick_free works for a whole cell, not only a lease."""
    import socket

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        result, _record, _, raw = run_cell(one_cell_grid(demo_config, port=port, port_in_use="pick_free"))
        assert result.returncode == 0 and raw.exists(), result.stdout
        prov = json.loads(raw.with_suffix(".provenance.json").read_text())
        assert not prov["engine"]["base_url"].endswith(f":{port}")


@pytest.mark.docker
@pytest.mark.workflow
def test_a_missing_image_stops_only_its_engines_cells(workdir, demo_config):
    from conftest import write_config
    from test_workflow import snakemake

    ghost = {**demo_config["engines"]["llamacpp"], "runtime": "docker", "image": "local/not-built:never"}
    demo_config["engines"]["ghost"] = ghost
    demo_config["configs"] = {
        "D_f16_n0": demo_config["configs"]["D_f16_n0"],
        "G_f16_n0": {"engine": "ghost", "checkpoint": "f16", "speculation": "none"},
    }
    demo_config["depths"] = [0]
    write_config(workdir / "grid.yaml", demo_config)
    result = snakemake(workdir, "--configfile", "grid.yaml")
    assert result.returncode != 0
    preflight = (workdir / "logs/preflight/ghost.log").read_text()
    assert "image local/not-built:never is not present locally; gridbench never pulls images" in preflight
    assert "docker pull local/not-built:never" in preflight  # how to get it
    assert not (workdir / "logs/cells/G_f16_n0").exists()  # no cell ran on that engine
    assert (workdir / "results/raw/D_f16_n0/depth_0.json").exists()


@pytest.mark.workflow
def test_a_sweep_starts_a_refusing_engine_once_and_the_next_sweep_tries_again(workdir, demo_config):
    """Each of the config's cells would otherwise start the refusing engine again, holding the
    GPU for a start-up each time (loan 9: nine vLLM starts of one config, 230 s)."""
    from conftest import snakemake, write_config

    demo_config["engines"]["llamacpp"]["extra_args"] = ["--no-such-flag"]
    demo_config["configs"] = {"D_f16_n0": demo_config["configs"]["D_f16_n0"]}
    demo_config["depths"] = [0, 128, 256]
    demo_config.pop("natural", None)
    write_config(workdir / "grid.yaml", demo_config)

    def starts() -> list[dict]:
        lines = (workdir / "logs/engines/events.jsonl").read_text().splitlines()
        events = [json.loads(line) for line in lines]
        return [e for e in events if e["event"] in ("start", "start_failed")]

    result = snakemake(workdir, "-j1", "--configfile", "grid.yaml")
    assert result.returncode != 0 and (workdir / "logs/engines/events.jsonl").exists(), result.stderr[-4000:]
    assert [e["event"] for e in starts()] == ["start", "start_failed"]
    failed_cells = sorted((workdir / "results/failures/D_f16_n0").glob("depth_*.json"))
    failures = [json.loads(path.read_text()) for path in failed_cells]
    assert len(failures) == 3 and {f["error_type"] for f in failures} == {"EngineStartError"}
    first_failure = starts()[1]
    assert "exited during start-up" in first_failure["reason"]
    again = [f for f in failures if "its start failed earlier in this sweep" in f["reason"]]
    assert len(again) == 2 and all(first_failure["ts"] in f["reason"] for f in again)

    snakemake(workdir, "-j1", "--configfile", "grid.yaml")  # a new sweep: one start again, for 3 cells
    assert [e["event"] for e in starts()] == ["start", "start_failed"] * 2
    assert starts()[1]["sweep"] != starts()[3]["sweep"]
