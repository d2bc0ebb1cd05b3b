"""The sweep's deadline (gridbench.engines.deadline): how long a start is expected to take, and
a start refused only where the deadline is set and comes first. tests/test_engines.py checks it
with a real engine."""

from __future__ import annotations

import json

import pytest

from gridbench.engines.deadline import DEADLINE_VARIABLE, expected_start_s, refuse_late_start
from gridbench.engines.events import EngineEvent
from gridbench.errors import EngineDeadlineError


def ready(fingerprint: str, seconds: float) -> EngineEvent:
    return EngineEvent(
        event="ready", config=f"C_{fingerprint}", slot="0", fingerprint=fingerprint, ready_s=seconds
    )


def test_a_start_is_expected_to_take_what_its_own_last_start_took_else_the_slowest_start():
    events = [ready("a", 120.0), ready("b", 80.0), ready("a", 65.0)]
    assert expected_start_s(events, "a") == (65.0, "its last start")
    assert expected_start_s(events, "new") == (120.0, "the slowest start so far")
    assert expected_start_s([EngineEvent(event="start", config="C", slot="0", fingerprint="a")], "a") is None


@pytest.fixture
def history(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs/engines").mkdir(parents=True)
    lines = [{"event": "ready", "config": "R_e3_k4", "slot": "0", "fingerprint": "f1", "ready_s": 120.7}]
    (tmp_path / "logs/engines/events.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_a_start_that_would_end_after_the_deadline_is_refused_saying_why(history, monkeypatch):
    monkeypatch.setenv(DEADLINE_VARIABLE, "1000")
    with pytest.raises(EngineDeadlineError) as info:
        refuse_late_start("R_e3_k15", "f2", now=902.0)
    assert str(info.value).startswith(
        "R_e3_k15: its engine was not started: 98 s are left before the sweep's deadline, and a "
        "start takes 121 s (the slowest start so far)\n  what to do: run the same command again"
    )
    refuse_late_start("R_e3_k15", "f2", now=870.0)  # 130 s left: it starts


def test_without_a_deadline_or_a_start_to_judge_by_every_start_goes_ahead(history, monkeypatch, tmp_path):
    refuse_late_start("R_e3_k15", "f2", now=1e12)  # no deadline set
    monkeypatch.setenv(DEADLINE_VARIABLE, "1000")
    (tmp_path / "logs/engines/events.jsonl").unlink()
    refuse_late_start("R_e3_k15", "f2", now=999.0)  # no start has got ready here yet


def test_a_deadline_that_is_no_time_is_a_clear_error(history, monkeypatch):
    monkeypatch.setenv(DEADLINE_VARIABLE, "in ten minutes")
    with pytest.raises(EngineDeadlineError, match="GRIDBENCH_DEADLINE='in ten minutes' is not a time"):
        refuse_late_start("R_none", "f1")
