"""The benchmark scripts stay runnable: each imports against the package as it is now
(running them takes minutes, so the tests only load them)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from conftest import REPO

SCRIPTS = sorted((REPO / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_benchmark_script_loads(script, monkeypatch):
    spec = importlib.util.spec_from_file_location(f"benchmark_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)  # imports only: main() runs under __main__
    assert callable(module.main)
