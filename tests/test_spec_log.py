"""vLLM's SpecDecoding log lines (gridbench.aggregate.spec_log) parsed from real lines, compared
with the counters' acceptance, a disagreement reported, and the committed real-weight studies'
counters agreeing with their own engine logs within the tolerance."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from gridbench.aggregate.report import render_report
from gridbench.aggregate.report.spec_log import spec_log_section
from gridbench.aggregate.spec_log import (
    TOLERANCE,
    EngineRun,
    SpecLine,
    cell_counters,
    compare,
    parse_engine_log,
    read_engine_runs,
)
from gridbench.cli.common import grid_from_json

REPO = Path(__file__).resolve().parents[1]
STUDIES = REPO / "studies"

# studies/h200-real/logs/engines/R_bf16_ngram4.log (its second start, shortened), one line of
# R_bf16_draft4.log's first, and one of studies/h200-vllm's V_bf16_ngram8.log (k = 8)
REAL_LOG = """
=== gridbench: starting R_bf16_ngram4 on slot 0 at 2026-12-04T21:18:04.092+00:00: vllm serve resources/models/h200-real/smollm2-135m-instruct/hf-q4_1 --served-model-name smollm2-bf16
(APIServer pid=27773) INFO 12-04 21:19:16 [loggers.py:310] Engine 000: Avg prompt throughput: 1536.1 tokens/s, Avg generation throughput: 57.9 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%
(APIServer pid=27773) INFO 12-04 21:19:16 [metrics.py:120] SpecDecoding metrics: Mean acceptance length: 3.58, Accepted throughput: 22.52 tokens/s, Drafted throughput: 34.62 tokens/s, Accepted: 253 tokens, Drafted: 389 tokens, Per-position acceptance rate: 0.714, 0.643, 0.633, 0.592, Avg Draft acceptance rate: 65.0%
(APIServer pid=27773) INFO 12-04 21:20:46 [metrics.py:120] SpecDecoding metrics: Mean acceptance length: 2.67, Accepted throughput: 288.17 tokens/s, Drafted throughput: 691.34 tokens/s, Accepted: 2882 tokens, Drafted: 6914 tokens, Per-position acceptance rate: 0.560, 0.432, 0.358, 0.317, Avg Draft acceptance rate: 41.7%
(APIServer pid=27773) INFO 12-04 21:20:47 [launcher.py:125] [shutdown] API server: engine client stopped
(APIServer pid=27773) INFO:     Application shutdown complete.

=== gridbench: starting R_bf16_draft4 on slot 0 at 2026-12-04T21:02:38.297+00:00: vllm serve resources/models/h200-real/smollm2-135m-instruct/hf-q4_1 --served-model-name smollm2-bf16
(APIServer pid=5945) INFO 12-04 21:04:38 [metrics.py:120] SpecDecoding metrics: Mean acceptance length: 3.87, Accepted throughput: 30.39 tokens/s, Drafted throughput: 42.39 tokens/s, Accepted: 304 tokens, Drafted: 424 tokens, Per-position acceptance rate: 0.830, 0.745, 0.651, 0.642, Avg Draft acceptance rate: 71.7%

=== gridbench: starting V_bf16_ngram8 on slot 0 at 2026-12-03T10:20:15.902+00:00: vllm serve resources/models/h200-vllm/rand3b --served-model-name rand3b-bf16
(APIServer pid=31545) INFO 12-03 10:21:19 [metrics.py:120] SpecDecoding metrics: Mean acceptance length: 7.82, Accepted throughput: 98.52 tokens/s, Drafted throughput: 98.52 tokens/s, Accepted: 1044 tokens, Drafted: 1044 tokens, Per-position acceptance rate: 1.000, 0.882, 0.882, 0.824, 0.824, 0.824, 0.824, 0.765, Avg Draft acceptance rate: 100.0%
"""  # noqa: E501


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_real_lines_parse_into_runs_with_their_drafts():
    ngram, draft, ngram8 = parse_engine_log(REAL_LOG)
    assert (ngram.config, ngram.started_at) == ("R_bf16_ngram4", _at("2026-12-04T21:18:04.092"))
    assert ngram.last_stamp == _at("2026-12-04T21:20:47")  # the shutdown's stamp: any line's counts
    first, second = ngram.lines
    assert first == SpecLine(_at("2026-12-04T21:19:16"), 253, 389, 3.58, (0.714, 0.643, 0.633, 0.592))
    # 389 draft tokens are no whole number of 4-token drafts: n-gram drafts can be shorter, and
    # Accepted ÷ the rates' sum and the mean acceptance length both say 98
    assert first.drafts == 98
    # at least 6914 ÷ 4 = 1728.5 drafts (none holds more than 4 tokens), at most 2882 ÷ 1.665
    # = 1730.9 (the rates' sum 1.667 to its rounding): the middle
    assert second.drafts == 1730
    assert draft.lines[0].drafts == 424 / 4  # a draft model always drafts k tokens
    assert ngram8.lines[0].drafts == 153  # every token drafted was accepted, in drafts of 6.8 on average
    for line in (*ngram.lines, *draft.lines, *ngram8.lines):  # the drafts give back Accepted
        accepted = sum(rate * line.drafts for rate in line.per_position)
        assert accepted == pytest.approx(line.accepted, abs=len(line.per_position) * 0.0005 * line.drafts)


def test_a_stamp_past_new_year_is_the_next_year():
    log = (
        "=== gridbench: starting c on slot 0 at 2026-12-31T23:59:50+00:00: vllm serve m\n"
        "(APIServer pid=1) INFO 01-01 00:00:05 [metrics.py:120] SpecDecoding metrics: Mean "
        "acceptance length: 2.00, Accepted throughput: 1.00 tokens/s, Drafted throughput: 2.00 "
        "tokens/s, Accepted: 10 tokens, Drafted: 20 tokens, Per-position acceptance rate: 0.600, "
        "0.400, Avg Draft acceptance rate: 50.0%\n"
    )
    (run,) = parse_engine_log(log)
    assert run.lines[0].at == _at("2027-01-01T00:00:05")


def _frame(config: str, cells: list[tuple[str, float, list[float]]]) -> pd.DataFrame:
    """A dataset's rows as the comparison reads them: (finished_at, drafts, per-position rates)."""
    return pd.DataFrame(
        {
            "config": config,
            "status": "ok",
            "finished_at": [f for f, _, _ in cells],
            "spec_drafts": [d for _, d, _ in cells],
            "acceptance_per_position": [json.dumps(r) for _, _, r in cells],
        }
    )


def _line(at: str, drafts: int, rates: tuple[float, ...]) -> SpecLine:
    accepted = round(sum(r * drafts for r in rates))
    return SpecLine(_at(at), accepted, drafts * len(rates), 1 + accepted / drafts, rates)


RUN = EngineRun(
    "c",
    _at("2026-12-04T10:00:00"),
    _at("2026-12-04T10:01:00"),
    (_line("2026-12-04T10:00:20", 100, (0.8, 0.6)), _line("2026-12-04T10:00:30", 300, (0.7, 0.5))),
)


def test_counters_that_match_the_lines_agree():
    cells = _frame(
        "c", [("2026-12-04T10:00:25+00:00", 100, [0.8, 0.6]), ("2026-12-04T10:00:40+00:00", 300, [0.7, 0.5])]
    )
    (comparison,) = compare([RUN], cell_counters(cells))
    assert comparison.agrees and comparison.difference == pytest.approx(0.0)
    assert (comparison.runs, comparison.lines, comparison.cells) == (1, 2, 2)
    section = spec_log_section([RUN], cells, None)
    assert "1 of 1 configs' counters agree with it within 0.02" in section
    assert "| `c` | 1 / 2 | 0.725 0.525 | 0.725 0.525 | 1.00 | 0.000 |" in section
    assert "A difference beyond" not in section


def test_a_disagreement_is_reported_as_one():
    # the counters' positions swapped: what a mislabelled position label would give
    cells = _frame("c", [("2026-12-04T10:00:40+00:00", 400, [0.525, 0.725])])
    (comparison,) = compare([RUN], cell_counters(cells))
    assert not comparison.agrees
    assert comparison.difference == pytest.approx(0.2)
    assert comparison.difference > TOLERANCE
    section = spec_log_section([RUN], cells, None)
    assert "0 of 1 configs' counters agree" in section
    assert "| **0.200** (differs) |" in section
    assert "A difference beyond 0.02 says the log and the windows saw different requests" in section


def test_a_missing_position_counts_as_a_difference():
    cells = _frame("c", [("2026-12-04T10:00:40+00:00", 400, [0.725])])
    (comparison,) = compare([RUN], cell_counters(cells))
    assert comparison.difference == pytest.approx(0.525)


def test_cells_on_no_logged_run_and_runs_without_lines_are_left_out():
    elsewhere = _frame("c", [("2026-12-04T11:00:00+00:00", 100, [0.8, 0.6])])  # after the run's end
    other = _frame("d", [("2026-12-04T10:00:40+00:00", 100, [0.8, 0.6])])  # no run of its config
    assert compare([RUN], cell_counters(elsewhere) + cell_counters(other)) == []
    silent = EngineRun("c", RUN.started_at, RUN.last_stamp, ())
    inside = _frame("c", [("2026-12-04T10:00:40+00:00", 100, [0.8, 0.6])])
    assert spec_log_section([silent], inside, None) == ""  # no SpecDecoding line: nothing rendered


def _study(name: str) -> tuple[list[EngineRun], pd.DataFrame, pd.DataFrame]:
    study = STUDIES / name
    events = [study / "logs/engines/events.jsonl", *sorted(study.glob("logs/*/engines/events.jsonl"))]
    dataset = pd.read_parquet(study / "dataset/dataset.parquet")
    return read_engine_runs(events), dataset, pd.read_parquet(study / "dataset/natural.parquet")


@pytest.mark.parametrize(
    ("name", "configs"), [("h200-real", {"R_bf16_draft4", "R_bf16_ngram4"}), ("h100-real", {"R_bf16_draft4"})]
)
def test_the_real_weight_studies_counters_agree_with_their_engine_logs(name, configs):
    runs, dataset, natural = _study(name)
    comparisons = compare(runs, cell_counters(dataset) + cell_counters(natural))
    assert {c.config for c in comparisons} == configs
    for c in comparisons:
        assert c.agrees, (c.config, c.counters.rates, c.log.rates)
        assert c.difference < 0.007  # what these studies measured: 0.003, 0.004 and 0.006
        assert 0.9 < c.log.drafts / c.counters.drafts < 1.1  # the lines saw about the cells' drafts


def test_the_report_shows_the_cross_check_under_the_acceptance(monkeypatch):
    runs, dataset, natural = _study("h200-real")
    monkeypatch.chdir(STUDIES / "h200-real")
    grid = grid_from_json(Path("grid.json"))
    report = render_report(grid, dataset, natural, engine_runs=runs)
    acceptance = report.index("## Speculative decoding acceptance")
    cross_check = report.index("### Cross-check against vLLM's log")
    assert acceptance < cross_check < report.index("\n## ", acceptance)
    assert "2 of 2 configs' counters agree with it within 0.02" in report
    without_logs = render_report(grid, dataset, natural)
    assert "### Cross-check against vLLM's log" not in without_logs  # no logs given
    assert "### Cross-check against the stream" in without_logs  # the stream is the cells' own
