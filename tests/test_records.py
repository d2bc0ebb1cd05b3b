"""One record per file format: what a cell writes is what the datasets read back (its
provenance and failure records, the natural harness's result), and the one upgrade step of
each reads every such file gridbench has committed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import synthetic
from conftest import REPO, load_yaml
from gridbench import layout
from gridbench.aggregate import natural
from gridbench.aggregate.records import CellFailure, ProvenanceRecord, read_cells
from gridbench.cells import provenance
from gridbench.cells.records import (
    PROVENANCE_V1,
    CellProvenance,
    FailureRecord,
    current_failure,
    current_provenance,
)
from gridbench.config.loading import load_grid
from gridbench.engines import events
from gridbench.errors import ResultFileError
from gridbench.util import codec

COMMITTED = sorted(
    [*REPO.glob("studies/*/results/**/*.provenance.json"), *REPO.glob("tests/fixtures/**/*.provenance.json")]
)
# the failure records of the studies' cells and of their earlier loans (logs/loan-N/)
COMMITTED_FAILURES = sorted(
    p
    for root in ("studies/*/results/failures", "studies/*/logs/*/failures")
    for p in REPO.glob(f"{root}/**/*.json")
)


def a_provenance() -> CellProvenance:
    grid = load_grid(load_yaml(REPO / "config/mechanism.yaml"), "mechanism.yaml")
    return synthetic.provenance_record(grid.configs["D_f16_draft4"], "cell D_f16_draft4 depth 0")


def test_the_reader_reads_the_writers_record_back_as_it_was():
    record = a_provenance()
    document = json.loads(json.dumps(codec.to_json(record)))
    assert document["schema"] == provenance.SCHEMA
    assert codec.from_json(CellProvenance, current_provenance(document)) == record
    # the effective config stays the document it was written as
    assert document["effective_config"]["name"] == "D_f16_draft4"


def test_a_v1_record_is_upgraded_in_one_place_and_an_unknown_format_is_refused():
    document = codec.to_json(a_provenance())
    v1 = {**document, "schema": PROVENANCE_V1, "engine": dict(document["engine"])}
    del v1["engine"]["slots"], v1["engine"]["gpus"]
    upgraded = codec.from_json(CellProvenance, current_provenance(v1))
    assert upgraded.engine.slots == ("0",) and upgraded.engine.gpus is None
    assert upgraded.schema == provenance.SCHEMA
    with pytest.raises(ResultFileError, match=r"schema 'gridbench\.provenance\.v9'"):
        current_provenance({**document, "schema": "gridbench.provenance.v9"})


def test_every_committed_provenance_file_reads():
    assert len(COMMITTED) >= 285  # v1 records of all three GPU studies and the fixtures among them
    for path in COMMITTED:
        record = codec.from_json(CellProvenance, current_provenance(json.loads(path.read_text())))
        assert ProvenanceRecord.from_record(record).provenance.fingerprint == record.fingerprint, path


def test_every_committed_failure_record_reads():
    assert len(COMMITTED_FAILURES) >= 9  # h200-vllm's, before the prefix-cache pass, among them
    for path in COMMITTED_FAILURES:
        record = codec.from_json(FailureRecord, current_failure(json.loads(path.read_text())))
        assert CellFailure.from_record(record).recorded and record.reason


def test_a_provenance_of_an_unknown_format_makes_its_cell_a_failure_that_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    record = codec.to_json(a_provenance())

    class Files:
        raw, provenance, failure = "raw.json", "prov.json", "failure.json"

    class Cell:
        files = Files()

    Path("raw.json").write_text("{}")
    Path("prov.json").write_text(json.dumps({**record, "schema": "gridbench.provenance.v9"}))
    results, failures = read_cells([Cell()], lambda cell: "cell", lambda raw, cell: raw)
    assert not results and "not a provenance record this gridbench reads" in str(failures["cell"].reason)


def test_every_committed_natural_result_reads_as_the_harness_wrote_it():
    """The natural dataset reads the harness's own LevelResult, the studies' files included."""
    found = sorted(
        p
        for root in ("studies/*/results/natural", "tests/fixtures")
        for p in REPO.glob(f"{root}/**/*.json")
        if not p.name.endswith(".provenance.json") and '"gridbench.natural.v1"' in p.read_text()[:200]
    )
    assert len(found) >= 160
    for path in found:
        result = natural.result_from_json(json.loads(path.read_text()))
        assert len(result.requests) == result.summary.requests, path
        assert natural.Summary.of(result.summary).ttft_ms_p50 == result.summary.ttft_ms.p50


def test_an_engine_event_is_written_and_read_back_as_one_record(tmp_path, monkeypatch):
    """log_event writes the keys its event has, in the record's order; the ledger and the
    progress view read the line back as the same record, older lines (no slots) too."""
    monkeypatch.chdir(tmp_path)
    start = events.EngineEvent(
        event="start", config="A", slot="0", slots=("0", "1"), fingerprint="f", port=1, owner="o"
    )
    events.log_event(start)
    events.log_event(events.EngineEvent(event="stop", config="A", slot="0", fingerprint="f"))
    lines = Path(layout.ENGINE_EVENTS).read_text().splitlines()
    assert list(json.loads(lines[0])) == [
        "ts",
        "event",
        "config",
        "slot",
        "slots",
        "fingerprint",
        "port",
        "owner",
    ]
    assert list(json.loads(lines[1])) == ["ts", "event", "config", "slot", "fingerprint"]
    assert events.read_events(Path(layout.ENGINE_EVENTS))[0] == start
    committed = [p for p in REPO.glob("studies/*/logs/**/events.jsonl")]
    assert len(committed) >= 4
    read = [event for path in committed for event in events.read_events(path)]
    older = [e for e in read if e.event == "reuse" and e.slots is None]
    assert older and all(e.held_slots == (e.slot,) for e in older)
