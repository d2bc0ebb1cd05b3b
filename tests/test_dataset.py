"""The datasets from raw files: every cell a row (ok, failed, skipped), provenance and
acceptance columns, strict JSON in the seeds' shape, and no crash on missing or foreign files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

import report_fixtures as rf
from conftest import gridbench
from gridbench import layout
from gridbench.aggregate import dataset, natural
from gridbench.aggregate.records import load_json
from gridbench.cells.kinds.natural import NaturalCellPlan
from gridbench.cells.plan import natural_plan
from gridbench.errors import ResultFileError
from gridbench.layout import CellFiles
from gridbench.util import codec


@pytest.fixture
def seed002_files(tmp_path, monkeypatch):
    grid, plan, results, failures = rf.seed002()
    victim = ("Q_nvfp4_dfl8", 12288)
    del results[victim]
    cell = next(c for c in plan.cells if c.key == victim)
    failures[victim] = codec.to_json(
        rf.synthetic.failure_record(
            cell,
            "cell Q_nvfp4_dfl8 depth 12288",
            "cell Q_nvfp4_dfl8 depth 12288: the engine died while the cell was measuring",
        )
    )
    del results[("Q_bf16_stock_n0", 65536)]  # no failure record either: the cell never ran
    rf.write_files(tmp_path, plan, results, failures)
    monkeypatch.chdir(tmp_path)
    return grid, plan


def build(plan, root: Path):
    return dataset.build_from_plan(
        plan,
        csv=root / "dataset/dataset.csv",
        json_path=root / "dataset/dataset.json",
        parquet=root / "dataset/dataset.parquet",
    )


def test_every_cell_is_a_row_with_its_status(seed002_files, tmp_path):
    _, plan = seed002_files
    frame = build(plan, tmp_path)
    assert len(frame) == 126
    assert frame["status"].value_counts().to_dict() == {"ok": 124, "failed": 2}
    died = frame[(frame["config"] == "Q_nvfp4_dfl8") & (frame["context_tokens"] == 12288)].iloc[0]
    assert died["reason"] == "cell Q_nvfp4_dfl8 depth 12288: the engine died while the cell was measuring"
    assert died["failure_path"] == "results/failures/Q_nvfp4_dfl8/depth_12288.json"
    assert died["log_path"] == "logs/cells/Q_nvfp4_dfl8/depth_12288.log"
    assert died["error_type"] == "EngineDiedError" and died["exit_code"] == 1
    assert pd.isna(died["decode_tps"]) and died["speculation_label"] == "DSpark-DFlash n=8"
    never = frame[(frame["config"] == "Q_bf16_stock_n0") & (frame["context_tokens"] == 65536)].iloc[0]
    assert never["reason"] == dataset.NOT_RUN and pd.isna(never["failure_path"])


def test_measured_rows_carry_units_provenance_and_acceptance(seed002_files, tmp_path):
    _, plan = seed002_files
    frame = build(plan, tmp_path).set_index(["config", "context_tokens"])
    row = frame.loc[("Q_nvfp4_dfl8", 8192)]
    assert row["decode_tps"] == 21.0 and row["decode_tps_std"] == pytest.approx(0.63)
    raw = json.loads(Path(row["raw_path"]).read_text())
    per_request = next(b for b in raw["benchmarks"] if b["context_size"] == 8192)["tg_req_throughput"]
    assert row["decode_req_tps"] == per_request["mean"] and row["decode_req_tps_std"] == per_request["std"]
    assert row["prefill_req_tps"] > 0 and row["peak_req_tps"] > 0
    assert row["runs"] == 2 and row["prompt_tokens"] == 512 and row["gen_tokens"] == 256
    assert row["engine_version"] == "0.23.0+aeon.sm121a.dflash"
    assert row["image_digest"].startswith("ghcr.io/aeon-7/aeon-vllm-ultimate@sha256:")
    assert (row["gpu"], row["driver"]) == ("NVIDIA GB10", "580.159.03")
    assert (row["load_generator"], row["load_generator_version"]) == ("llama-benchy", "0.4.0")
    assert row["fingerprint"] and row["raw_path"] == "results/raw/Q_nvfp4_dfl8/depth_8192.json"
    assert row["acceptance_rate"] == pytest.approx(
        sum(json.loads(row["acceptance_per_position"])) / 8, abs=0.01
    )
    assert row["mean_acceptance_length"] > 3 and row["spec_drafts"] == 121
    plain = frame.loc[("Q_nvfp4_aeon_n0", 0)]
    assert pd.isna(plain["acceptance_rate"]) and pd.isna(plain["num_speculative_tokens"])
    for column in frame.columns:
        if column.endswith(("_tps", "_ms")):
            assert f"{column}_std" in frame.columns  # every measure has its spread


def test_json_is_strict_and_in_the_seeds_shape(seed002_files, tmp_path):
    _, plan = seed002_files
    build(plan, tmp_path)
    text = (tmp_path / "dataset/dataset.json").read_text()
    document = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in strict JSON"))
    assert list(document)[:3] == ["Q_bf16_stock_n0", "Q_bf16_eugr_n0", "Q_bf16_aeon_n0"]
    entry = document["Q_nvfp4_dfl8"]
    assert set(entry) >= {"meta", "version", "rows"} and entry["version"] == "0.4.0"
    assert entry["meta"]["quantization"] == "NVFP4" and entry["partial"] is True
    assert entry["cells"] == {"ok": 13, "failed": 1, "skipped": 0}
    failed = next(r for r in entry["rows"] if r["status"] == "failed")
    assert failed["decode_tps"] is None and failed["reason"].endswith("measuring")
    assert isinstance(entry["rows"][0]["acceptance_per_position"], list)
    assert document["Q_bf16_aeon_n0"]["partial"] is False


def test_parquet_keeps_types_and_csv_the_same_rows(seed002_files, tmp_path):
    _, plan = seed002_files
    frame = build(plan, tmp_path)
    parquet = pd.read_parquet(tmp_path / "dataset/dataset.parquet")
    pd.testing.assert_frame_equal(parquet, frame)
    assert str(parquet["context_tokens"].dtype) == "Int64" and str(parquet["decode_tps"].dtype) == "Float64"
    csv = pd.read_csv(tmp_path / "dataset/dataset.csv")
    assert list(csv.columns) == dataset.COLUMNS and len(csv) == len(frame)


def test_skipped_cells_are_rows_too(tmp_path, monkeypatch):
    _, plan, results, failures = rf.seed000()[:4]
    rf.write_files(tmp_path, plan, results, failures)
    monkeypatch.chdir(tmp_path)
    frame = build(plan, tmp_path)
    skipped = frame[frame["status"] == "skipped"]
    assert list(skipped["context_tokens"]) == [262144] * 3
    assert skipped["reason"].str.contains("exceeds max_model_len 262144").all()
    assert list(frame["context_tokens"]) == [0, 262144] * 3  # each config's rows together


def test_a_raw_file_reads_as_the_standard_library_reads_it_nan_included(tmp_path):
    """The fast reader (orjson) refuses NaN and Infinity, which llama-benchy's json.dump writes
    for a statistic it could not compute: such a file still reads, as json.loads reads it."""
    written = {"benchmarks": [{"tg_throughput": {"mean": 12.5, "std": math.nan}, "peak": math.inf}]}
    path = tmp_path / "depth_0.json"
    path.write_text(json.dumps(written))
    assert "NaN" in path.read_text()
    read = load_json(path)
    assert read["benchmarks"][0]["tg_throughput"]["mean"] == 12.5
    assert math.isnan(read["benchmarks"][0]["tg_throughput"]["std"])
    assert read["benchmarks"][0]["peak"] == math.inf
    assert load_json(tmp_path / "absent.json") is None
    path.write_bytes(b"\xff{")
    with pytest.raises(ResultFileError, match="not valid JSON"):
        load_json(path)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("{not json", "not valid JSON"),
        ('{"benchmarks": []}', "0 llama-benchy results for depth 0"),
        ('{"something": "else"}', "not a llama-benchy result"),
        (
            '{"benchmarks": [{"context_size": 0, "tg_throughput": null, "e2e_ttft": {"mean": 5}}]}',
            "llama-benchy measured no tg_throughput (null)",
        ),
    ],
)
def test_a_foreign_result_file_is_a_failed_cell_that_says_what_to_do(tmp_path, monkeypatch, content, reason):
    _, plan, results, failures = rf.seed000()[:4]
    rf.write_files(tmp_path, plan, results, failures)
    (tmp_path / "results/raw/Q_fp8_mtp1/depth_0.json").write_text(content)
    monkeypatch.chdir(tmp_path)
    frame = build(plan, tmp_path)
    row = frame[(frame["config"] == "Q_fp8_mtp1") & (frame["context_tokens"] == 0)].iloc[0]
    assert row["status"] == "failed"
    assert reason in row["reason"] and "delete it and rerun" in row["reason"]


def test_no_result_files_at_all_still_gives_a_dataset(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, plan = rf.seed002()[:2]
    frame = build(plan, tmp_path)
    assert (frame["status"] == "failed").all() and len(frame) == 126
    assert "NaN" not in (tmp_path / "dataset/dataset.json").read_text()


# --- natural ----------------------------------------------------------------------------


@pytest.fixture
def seed000_natural_files(tmp_path, monkeypatch):
    grid, _, _, _, nplan, nresults, nfailures = rf.seed000()
    rf.write_files(tmp_path, nplan, nresults, nfailures)
    monkeypatch.chdir(tmp_path)
    return grid, nplan


def test_natural_plan_follows_the_contract():
    grid = rf.seed000()[0]
    plan = natural_plan(grid)
    assert len(plan.cells) == 3 * 4 * 4
    cell = plan.cells[1]
    assert cell == NaturalCellPlan(
        config="Q_fp8_mtp1",
        prompt_class="code",
        concurrency=4,
        files=CellFiles(
            raw="results/natural/Q_fp8_mtp1/code_c4.json",
            provenance="results/natural/Q_fp8_mtp1/code_c4.provenance.json",
            failure="results/failures/natural/Q_fp8_mtp1/code_c4.json",
            log="logs/cells/Q_fp8_mtp1/natural_code_c4.log",
        ),
        expected_requests=plan.cells[1].expected_requests,
    )
    assert natural_plan(rf.seed002()[0]).cells == ()  # no natural matrix declared


def test_natural_dataset_rows(seed000_natural_files, tmp_path):
    _, nplan = seed000_natural_files
    frame = natural.build_from_plan(
        nplan, csv=tmp_path / "dataset/natural.csv", parquet=tmp_path / "dataset/natural.parquet"
    )
    assert len(frame) == 48 and frame["status"].value_counts().to_dict() == {"ok": 47, "failed": 1}
    row = frame[
        (frame["config"] == "Q_nvfp4_dflash_k5")
        & (frame["prompt_class"] == "code")
        & (frame["concurrency"] == 8)
    ].iloc[0]
    assert row["output_tok_s"] == 194.1 and row["ttft_ms_p50"] == 883 and row["tpot_ms_p95"] == 40.5
    assert row["output_tokens_p50"] == 512 and row["req_tok_s_p50"] == 25.8 and row["ok"] == 16
    assert row["max_tokens"] == 512 and row["temperature"] == 0
    assert row["acceptance_rate"] == pytest.approx(0.308, abs=0.002)
    assert (row["load_generator"], row["engine_version"]) == (
        "gridbench-natural",
        "0.1.dev1+gbfde49e28.d20260418",
    )
    assert "p99 from 16 requests" in row["percentile_warnings"]
    failed = frame[frame["status"] == "failed"].iloc[0]
    assert (failed["config"], failed["prompt_class"], failed["concurrency"]) == ("Q_fp8_mtp1", "prose", 16)
    assert "error rate 0.25" in failed["reason"]
    assert failed["failure_path"] == "results/failures/natural/Q_fp8_mtp1/prose_c16.json"
    parquet = pd.read_parquet(tmp_path / "dataset/natural.parquet")
    pd.testing.assert_frame_equal(parquet, frame)


def test_a_natural_file_of_another_cell_does_not_count(seed000_natural_files, tmp_path):
    _, nplan = seed000_natural_files
    path = tmp_path / "results/natural/Q_fp8_mtp1/code_c4.json"
    raw = json.loads(path.read_text())
    raw["concurrency"] = 8
    path.write_text(json.dumps(raw))
    frame = natural.build_from_plan(nplan, csv=tmp_path / "n.csv", parquet=tmp_path / "n.parquet")
    row = frame[
        (frame["config"] == "Q_fp8_mtp1") & (frame["concurrency"] == 4) & (frame["prompt_class"] == "code")
    ].iloc[0]
    assert row["status"] == "failed" and "expected ('Q_fp8_mtp1', 'code', 4)" in row["reason"]


def test_cli_finalize_marks_a_partial_run(seed002_files, tmp_path):
    grid_file = tmp_path / "grid.json"
    grid_file.write_text(json.dumps(rf.load_config_dict(rf.REPO / "config/config.yaml")))
    result = gridbench("finalize", "--grid", str(grid_file), cwd=tmp_path)
    assert "PARTIAL" in result.stdout, result.stdout + result.stderr
    # each check that triggers is a warning in the run's log, as in the report's Checks
    assert "gridbench: warning: errors or incomplete requests: 2 cells failed" in result.stderr
    report = (tmp_path / "dataset/comparison.md").read_text()
    assert "- **warning** — errors or incomplete requests: 2 cells failed" in report
    assert "> **Partial results.** 2 of 126 depth cells failed" in report
    assert (
        "| `Q_nvfp4_dfl8` | depth 12288 | failed | cell Q_nvfp4_dfl8 depth 12288: the engine died" in report
    )
    assert sorted(p.name for p in (tmp_path / "graphs").iterdir()) == sorted(
        f"{name}.png" for name in layout.DEPTH_GRAPHS
    )
    assert "Q_nvfp4_dfl8: " in (tmp_path / layout.EXPLORER).read_text()
    document = json.loads((tmp_path / "dataset/dataset.json").read_text())
    assert document["Q_nvfp4_dfl8"]["partial"] is True
    assert not any(
        isinstance(v, float) and math.isnan(v) for r in document["Q_nvfp4_dfl8"]["rows"] for v in r.values()
    )


def test_a_stray_file_in_results_is_named_and_left_out(tmp_path, monkeypatch, caplog):
    _, plan, results, failures = rf.seed000()[:4]
    rf.write_files(tmp_path, plan, results, failures)
    stray = tmp_path / "results/raw/Q_fp8_mtp1/notes.json"
    stray.write_text('{"benchmarks": []}')
    monkeypatch.chdir(tmp_path)
    with caplog.at_level("WARNING"):
        frame = build(plan, tmp_path)
    assert "results/raw/Q_fp8_mtp1/notes.json: not a result file of any cell" in caplog.text
    assert len(frame) == len(plan.cells) + len(plan.skipped)
