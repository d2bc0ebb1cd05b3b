"""Behaviour on fixed raw sets: each committed study's dataset, natural dataset and report, and
those of one demo sweep (tests/fixtures/demo_run: llama.cpp on the CPU, with the prefix-cache
pass), are exactly what `gridbench finalize` builds from their raw files today.

The raw files are real measurements that no refactoring may reinterpret: a change that alters a
derived value, a column or a line of the report fails here. A deliberate change re-renders
them (`gridbench finalize --grid grid.json --outdir .` in each folder) and is reviewed in the
diff.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gridbench import layout
from gridbench.cli import main

REPO = Path(__file__).resolve().parents[1]
STUDIES = sorted(path.parent for path in (REPO / "studies").glob("*/grid.json"))
RAW_SETS = [*STUDIES, REPO / "tests/fixtures/demo_run"]
# the text outputs: the parquet files and graphs are binary renderings of the same frames
OUTPUTS = (layout.DATASET_CSV, layout.DATASET_JSON, layout.NATURAL_CSV, layout.REPORT)


def test_every_committed_study_is_covered():
    assert {study.name for study in STUDIES} >= {"h200-llamacpp", "h200-vllm"}


@pytest.mark.parametrize("study", RAW_SETS, ids=lambda path: path.name)
def test_a_study_rebuilds_from_its_raw_files_unchanged(study, tmp_path, monkeypatch):
    shutil.copytree(study / "results", tmp_path / "results")
    shutil.copy(study / "grid.json", tmp_path / "grid.json")
    # the engines' events and logs, every loan's: the report's GPU time ledger reads the events,
    # its cross-check of the acceptance the logs beside them
    for events in [study / layout.ENGINE_EVENTS, *study.glob(layout.EARLIER_ENGINE_EVENTS)]:
        if events.exists():
            (tmp_path / events.relative_to(study)).parent.mkdir(parents=True, exist_ok=True)
            for path in [events, *events.parent.glob("*.log")]:
                shutil.copy(path, tmp_path / path.relative_to(study))
    monkeypatch.chdir(tmp_path)
    assert main(["finalize", "--grid", "grid.json", "--outdir", "."]) == 0
    changed = [
        str(name)
        for name in OUTPUTS
        if (study / name).exists() and (tmp_path / name).read_text() != (study / name).read_text()
    ]
    assert not changed, (
        f"{study.name}: {', '.join(changed)} no longer what its raw files give; if the change is "
        f"deliberate, re-render the study (gridbench finalize --grid grid.json --outdir . in {study})"
    )
    assert (study / layout.DATASET_CSV).exists() and (study / layout.REPORT).exists()
