"""Aggregation of 2,000 cells: target <= 5 s (issue 4).

Writes 2,000 synthetic depth cells (llama-benchy JSON + provenance record, shaped like
real ones by tests/synthetic.py), every config's prefix-cache cells (one per
depth above 0: 1,900 more) and 2,000 natural-prompt cells into a
temporary folder, then times building each dataset (read, check, rows, CSV + JSON +
Parquet) against a reference measured in the same run: reading and json-parsing the same
files and nothing else. Also prints the report's render time over the same frames.

    python benchmarks/aggregation.py [--cells 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

# the synthetic cells the report tests also use (tests/synthetic.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import synthetic
from gridbench.aggregate import dataset, natural
from gridbench.aggregate.report import render_report
from gridbench.cells.plan import NaturalPlan, depth_plan, natural_plan
from gridbench.config.loading import load_grid

TARGET_S = 5.0
DEPTHS = 20
CLASSES = ("code", "reasoning", "dialogue", "prose")
LEVELS = (1, 2, 4, 8, 16)


def grid_config(configs: int) -> dict:
    """A grid of ``configs`` configs (engines x checkpoints x speculations) over DEPTHS depths."""
    engines = {f"e{i}": {"kind": "vllm", "runtime": "docker", "image": f"vllm/e{i}:1"} for i in range(5)}
    checkpoints = {
        f"c{i}": {"model": f"/models/c{i}", "quantization": f"Q{i}", "active_weight_gb": 10.0 + i}
        for i in range(5)
    }
    speculations = {"none": {"method": "none"}}
    speculations |= {
        f"s{i}": {"method": "dflash", "draft_model": "/draft", "num_speculative_tokens": i + 1}
        for i in range(4)
    }
    names = [(e, c, s) for e in engines for c in checkpoints for s in speculations][:configs]
    config = {
        "study": {"title": "aggregation benchmark", "hardware": {"memory_bandwidth_gb_s": 273}},
        "engines": engines,
        "checkpoints": checkpoints,
        "speculations": speculations,
        "serving": {"max_model_len": 1_000_000},
        "configs": {f"{e}_{c}_{s}": {"engine": e, "checkpoint": c, "speculation": s} for e, c, s in names},
        "depths": [1024 * i for i in range(DEPTHS)],
        "benchy": {"prefix_cache_pass": [f"{e}_{c}_{s}" for e, c, s in names]},
        "natural": {"prompt_classes": list(CLASSES), "concurrency": list(LEVELS)},
    }
    return load_grid(config, "benchmark grid").document


def write_cells(plan, nplan) -> None:
    host = synthetic.host_info(gpu="NVIDIA H200", gpu_count=1, driver="570.0")
    for cell in plan.cells:
        cfg = plan.configs[cell.config]
        depth = cell.depth
        spec = None
        if cfg.speculation.enabled and cfg.speculation.num_speculative_tokens:
            spec = synthetic.spec_decode(
                120, [0.8 * 0.7**i for i in range(cfg.speculation.num_speculative_tokens)]
            )
        raw = synthetic.benchy_raw(
            depth, decode=(20.0 - depth / 4096, 0.3), prefill=(2000.0, 30.0), ttft_ms=(300.0 + depth / 5, 6.0)
        )
        prov = synthetic.provenance_record(cfg, f"cell {cell.config} depth {depth}", host=host, spec=spec)
        synthetic.write_cell(cell, raw, prov, Path())
    for cell in plan.cached_cells:
        depth = cell.depth
        raw = synthetic.cached_benchy_raw(
            depth, load_ttft_ms=(300.0 + depth / 5, 6.0), ttft_ms=(150.0, 4.0), prefill=(3400.0, 40.0)
        )
        prov = synthetic.provenance_record(
            plan.configs[cell.config],
            f"cell {cell.config} depth {depth} (cached context)",
            host=host,
        )
        synthetic.write_cell(cell, raw, prov, Path())
    for cell in nplan.cells:
        cfg = nplan.configs[cell.config]
        raw = synthetic.natural_raw(
            cell.config,
            cell.prompt_class,
            cell.concurrency,
            output_tok_s=60.0 * cell.concurrency**0.7,
            ttft_ms=(550.0, 640.0),
            tpot_ms=(15.0, 17.0),
            output_tokens=512,
            wall_s=120.0,
        )
        prov = synthetic.provenance_record(
            cfg,
            "natural cell",
            host=host,
            load_generator="gridbench-natural",
            load_generator_version="0.1.0",
        )
        synthetic.write_cell(cell, raw, prov, Path())


def json_load_all(cells) -> float:
    started = time.perf_counter()
    for cell in cells:
        json.loads(Path(cell.files.raw).read_bytes())
        json.loads(Path(cell.files.provenance).read_bytes())
    return time.perf_counter() - started


def measure(name: str, cells, build):
    """Time ``build`` against json-loading the same files; print both and their ratio."""
    json_load_all(cells)  # warm the page cache for both measurements alike
    reference = json_load_all(cells)
    started = time.perf_counter()
    frame = build()
    elapsed = time.perf_counter() - started
    verdict = "ok" if elapsed <= TARGET_S else "OVER TARGET"
    print(
        f"{name}: {elapsed:.2f} s for {len(frame)} rows (target <= {TARGET_S:.0f} s: {verdict}); "
        f"json-loading the same {2 * len(cells)} files: {reference:.2f} s; ratio {elapsed / reference:.1f}x"
    )
    return frame


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=2000, help="depth cells, and as many natural cells")
    args = parser.parse_args()
    configs = args.cells // DEPTHS
    grid = load_grid(grid_config(configs), "benchmark grid")
    plan = depth_plan(grid)
    # as many natural cells as depth cells: the first configs' classes x levels
    natural_configs = dict(list(plan.configs.items())[: args.cells // (len(CLASSES) * len(LEVELS))])
    nplan = natural_plan(grid)
    nplan = NaturalPlan(natural_configs, tuple(c for c in nplan.cells if c.config in natural_configs))
    with tempfile.TemporaryDirectory(prefix="gridbench-aggregation-") as tmp:
        os.chdir(tmp)
        write_cells(plan, nplan)
        size = sum(p.stat().st_size for p in Path("results").rglob("*.json")) / 1e6
        print(
            f"{len(plan.cells)} depth cells ({configs} configs x {DEPTHS} depths), "
            f"{len(plan.cached_cells)} prefix-cache cells, "
            f"{len(nplan.cells)} natural cells; {size:.0f} MB of JSON"
        )
        depth_frame = measure(
            "depth dataset (with the prefix-cache cells)",
            plan.cells + plan.cached_cells,
            lambda: dataset.build_from_plan(
                plan, csv=Path("d.csv"), json_path=Path("d.json"), parquet=Path("d.parquet")
            ),
        )
        natural_frame = measure(
            "natural dataset",
            nplan.cells,
            lambda: natural.build_from_plan(nplan, csv=Path("n.csv"), parquet=Path("n.parquet")),
        )
        started = time.perf_counter()
        text = render_report(grid, depth_frame, natural_frame, [])
        elapsed = time.perf_counter() - started
        print(f"report: {elapsed:.2f} s to render {len(text) / 1e3:.0f} kB of markdown (informational)")


if __name__ == "__main__":
    main()
