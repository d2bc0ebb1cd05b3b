"""A multi-GPU host: `-j N --resources gpu=N` runs N configs at once, each engine on its
own slot and port, and the dataset is the serial run's, cell for cell. Two slots here are
two CPU engines (gpus: false) on the slots a GPU box would call 0 and 1."""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest

from conftest import snakemake, write_config

pytestmark = pytest.mark.workflow

# what must be equal between two runs of one grid; the measurements may only agree on presence
STRUCTURE = [
    "config",
    "engine",
    "engine_label",
    "checkpoint",
    "quantization",
    "speculation",
    "speculation_label",
    "num_speculative_tokens",
    "status",
    "reason",
    "context_tokens",
    "prompt_tokens",
    "gen_tokens",
    "image",
    "engine_version",
    "gridbench_version",
    "load_generator",
    "load_generator_version",
    "fingerprint",
    "raw_path",
    "log_path",
]
MEASURED = ["prefill_tps", "decode_tps", "peak_tps", "ttft_ms", "acceptance_rate"]


def assert_same_cells(frame: pd.DataFrame, reference: pd.DataFrame) -> None:
    """The same rows, statuses and configs, and a measurement wherever the reference has one."""
    assert list(frame.columns) == list(reference.columns)
    pd.testing.assert_frame_equal(frame[STRUCTURE], reference[STRUCTURE], check_dtype=False)
    pd.testing.assert_frame_equal(frame[MEASURED].notna(), reference[MEASURED].notna())


def new_workdir(path: Path, demo_assets: Path) -> Path:
    path.mkdir()
    shutil.copytree(demo_assets / "resources", path / "resources", symlinks=True)
    return path


def events(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "logs/engines/events.jsonl").read_text().splitlines()]


def cell_records(workdir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(workdir.glob("results/raw/*/*.provenance.json"))]


def interval(record: dict) -> tuple[datetime, datetime]:
    return datetime.fromisoformat(record["started_at"]), datetime.fromisoformat(record["finished_at"])


def two_slot_grid(demo_config: dict) -> dict:
    demo_config["configs"] = {k: demo_config["configs"][k] for k in ("D_f16_n0", "D_q8_0_n0")}
    demo_config["depths"] = [0, 256]
    demo_config["gpu_slots"] = ["0", "1"]
    # two engines share this machine's two cores; no latency subtraction, so load cannot
    # push a prefill measurement below the latency it subtracts
    demo_config["engines"]["llamacpp"]["extra_args"] = ["--threads", "1"]
    demo_config["benchy"]["latency_mode"] = "none"
    # answers long enough to be read while they decode: the demo model writes 64 tokens in
    # ~40 ms, and with two engines and two clients on two cores a client descheduled that
    # long read a whole answer in one burst, twice in a row (CI, 2026-12-07)
    demo_config["benchy"]["tg"] = 256
    return demo_config


def test_two_slots_run_two_configs_at_once_and_match_the_serial_run(tmp_path, demo_assets, demo_config):
    grid = two_slot_grid(demo_config)
    port = grid["engines"]["llamacpp"]["port"]
    serial = new_workdir(tmp_path / "serial", demo_assets)
    parallel = new_workdir(tmp_path / "parallel", demo_assets)
    for workdir in (serial, parallel):
        write_config(workdir / "grid.yaml", grid)
    result = snakemake(serial, "-j1", "--configfile", "grid.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    result = snakemake(parallel, "-j2", "--resources", "gpu=2", "--configfile", "grid.yaml")
    assert result.returncode == 0, result.stdout + result.stderr

    starts = {e["config"]: e for e in events(parallel) if e["event"] == "start"}
    assert len([e for e in events(parallel) if e["event"] == "start"]) == 2  # one engine per config
    assert {e["slot"] for e in starts.values()} == {"0", "1"}
    assert {e["port"] for e in starts.values()} == {port, port + 1}
    records = cell_records(parallel)
    assert len(records) == 4
    for record in records:  # every cell measured on its own config's engine
        start = starts[record["config"]]
        assert record["engine"]["slot"] == start["slot"]
        assert record["engine"]["base_url"] == f"http://127.0.0.1:{start['port']}"
    by_config = {name: [interval(r) for r in records if r["config"] == name] for name in starts}
    for spans in by_config.values():  # a config's cells one after another, on its warm engine
        first, second = sorted(spans)
        assert first[1] <= second[0]
    f16, q8 = by_config["D_f16_n0"], by_config["D_q8_0_n0"]
    assert any(a0 < b1 and b0 < a1 for a0, a1 in f16 for b0, b1 in q8), "the two configs never overlapped"
    assert [e["event"] for e in events(parallel)][-2:] == ["stop", "stop"]

    dataset = "dataset/dataset.parquet"
    assert_same_cells(pd.read_parquet(parallel / dataset), pd.read_parquet(serial / dataset))
