"""The chaos soak at a small size: faults injected into a real demo sweep leave every cell
ok or with a failure record that says why, no process, no partial file, no lost result,
and one clean rerun redoes exactly the failed cells (benchmarks/soak.py)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from conftest import REPO, free_port

pytestmark = pytest.mark.soak


@pytest.fixture
def soak(monkeypatch):
    spec = importlib.util.spec_from_file_location("benchmark_soak", REPO / "benchmarks/soak.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_small_chaos_soak_keeps_every_invariant(soak, tmp_path, demo_assets, capsys):
    options = soak.SoakOptions(
        cells=16,
        seed=7,
        rate=0.06,
        benchy_kill_rate=0.08,
        workdir=tmp_path / "soak",
        port=free_port(),
        assets=demo_assets,
    )
    report = soak.run_soak(options)
    report.print()
    print(capsys.readouterr().out, file=sys.__stdout__)  # the figures, also under -q
    assert report.problems == []
    assert report.cells == 16
    assert sum(report.faults.values()) > 0 and report.failed_after_chaos
    assert report.faults_survived == sum(report.faults.values()) - report.faults_outside_cells
    assert report.ok_after_rerun == 16 and report.data_lost == [] and report.orphans == []
