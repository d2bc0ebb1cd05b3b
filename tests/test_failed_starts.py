"""A start that failed in a sweep is refused for the sweep's later cells of the same engine
(gridbench.engines.failed_starts); tests/test_faults.py checks it in a real sweep."""

from __future__ import annotations

import pytest

from gridbench.engines.allocation import SWEEP_VARIABLE
from gridbench.engines.events import EngineEvent, read_events
from gridbench.engines.failed_starts import earlier_failure, note_failed_start, refuse_failed_start
from gridbench.errors import EngineStartError


def failed(fingerprint: str, sweep: str, ts: str) -> EngineEvent:
    return EngineEvent(
        ts=ts, event="start_failed", config="C", slot="0", fingerprint=fingerprint, sweep=sweep, reason="r"
    )


def test_only_a_failure_of_the_same_engine_in_the_same_sweep_counts():
    events = [
        EngineEvent(event="start", config="C", slot="0", fingerprint="a"),
        failed("a", "sweep-1", "2026-12-08T00:00:01"),
        failed("a", "sweep-1", "2026-12-08T00:00:02"),
    ]
    assert earlier_failure(events, "a", "sweep-1") == events[1]  # the first, which the message names
    assert earlier_failure(events, "a", "sweep-2") is None
    assert earlier_failure(events, "b", "sweep-1") is None


def test_a_failed_start_refuses_the_sweeps_next_start_of_that_engine_and_no_other(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(SWEEP_VARIABLE, "41:7:host:boot")
    exited = EngineStartError("engine vllm: the engine exited during start-up")
    note_failed_start("R_dfl_k15", "0", "f1", exited)
    with pytest.raises(EngineStartError) as info:
        refuse_failed_start("R_dfl_k15", "f1", tmp_path / "logs/engines/R_dfl_k15.log")
    message = str(info.value)
    assert "R_dfl_k15: its engine was not started again: its start failed earlier in this sweep" in message
    assert "(engine vllm: the engine exited during start-up)" in message
    assert "logs/engines/R_dfl_k15.log" in info.value.hint
    refuse_failed_start("R_none", "f2", tmp_path / "logs/engines/R_none.log")  # another engine starts
    monkeypatch.setenv(SWEEP_VARIABLE, "42:9:host:boot")
    refuse_failed_start("R_dfl_k15", "f1", tmp_path / "logs/engines/R_dfl_k15.log")  # a new sweep tries again


def test_outside_a_sweep_nothing_is_noted_and_every_start_is_tried(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(SWEEP_VARIABLE, raising=False)
    note_failed_start("C", "0", "f1", EngineStartError("the engine exited during start-up"))
    assert read_events(tmp_path / "logs/engines/events.jsonl") == []
    refuse_failed_start("C", "f1", tmp_path / "logs/engines/C.log")
