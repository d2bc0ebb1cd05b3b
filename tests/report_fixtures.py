"""Cells shaped like the seeds' published results, as records and as files.

Seed 002 (config/config.yaml): NVFP4 decodes 8.9 tok/s against BF16's 4.5; DSpark-DFlash
n=8 on NVFP4 runs 21–26 tok/s through 8k, then 7.5 against 8.6 at 12k and 5.7 against
7.7 at 64k (tests/fixtures/report/seed002_cells.csv; values between the published ones
are smooth). Seed 000 (tests/fixtures/report/seed000.yaml): the 4 x 4 natural-prompt
matrix of NVFP4 + DFlash k=5 verbatim, with k=15 and FP8 + MTP-1 shaped like the seed's
comparisons (seed000_natural.csv).
"""

from __future__ import annotations

import csv
import hashlib
from dataclasses import replace
from pathlib import Path

import yaml

import synthetic
from conftest import REPO
from gridbench.aggregate import dataset, natural
from gridbench.aggregate.records import CellFailure, MeasuredCell, ProvenanceRecord
from gridbench.cells.plan import depth_plan, natural_plan
from gridbench.cells.records import CellProvenance, FailureRecord
from gridbench.config.grid import ServingConfig
from gridbench.config.loading import load_grid, load_grid_files
from gridbench.harness.benchy import BenchyResult
from gridbench.util import codec
from gridbench.util.files import atomic_write_json

FIXTURES = Path(__file__).parent / "fixtures/report"
SEED002_VERSIONS = {
    "stock": "0.24.0",
    "eugr": "0.23.1rc1.dev899",
    "aeon": "0.23.0+aeon.sm121a.dflash",
}
SEED002_HOST = synthetic.host_info(hostname="zgx-5457", gpu="NVIDIA GB10", gpu_count=1, driver="580.159.03")
SEED000_HOST = synthetic.host_info(hostname="spark", gpu="NVIDIA GB10", gpu_count=1, driver="580.142")
# depth-0 decode of seed 000's configs: 77 tok/s realises 42 % of 273 GB/s ÷ 1.5 GB
SEED000_DECODE = {
    "Q_fp8_mtp1": (29.0, 0.6),
    "Q_nvfp4_dflash_k5": (77.0, 1.2),
    "Q_nvfp4_dflash_k15": (74.0, 2.0),
}
SEED000_PER_POSITION = {
    "Q_nvfp4_dflash_k5": [0.60, 0.40, 0.28, 0.15, 0.11],
    "Q_nvfp4_dflash_k15": [
        0.518,
        0.323,
        0.204,
        0.124,
        0.081,
        0.054,
        0.040,
        0.030,
        0.023,
        0.018,
        0.014,
        0.011,
        0.009,
        0.007,
        0.006,
    ],
    "Q_fp8_mtp1": [0.45],
}


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _engine(config: ServingConfig, version: str) -> dict:
    """provenance_record's engine arguments: the image's id and digest, the engine's version."""
    image = config.engine.image
    return {
        "image_id": _digest(image)[:19],
        "image_digest": f"{image.split(':')[0]}@{_digest(image)}",
        "engine_version": version,
    }


def seed002():
    """(grid, plan, results, failures) for every cell of seed 002."""
    grid = load_grid_files([REPO / "config/config.yaml"])
    plan = depth_plan(grid)
    results = {}
    with (FIXTURES / "seed002_cells.csv").open() as f:
        for row in csv.DictReader(f):
            config, depth = row["config"], int(row["depth"])
            cfg = plan.configs[config]
            spec = None
            if row["acceptance_per_position"]:
                rates = [float(r) for r in row["acceptance_per_position"].split()]
                spec = synthetic.spec_decode(int(row["spec_drafts"]), rates)
            raw = synthetic.benchy_raw(
                depth,
                decode=(float(row["decode_tps"]), float(row["decode_tps_std"])),
                prefill=(float(row["prefill_tps"]), float(row["prefill_tps_std"])),
                ttft_ms=(float(row["ttft_ms"]), float(row["ttft_ms_std"])),
            )
            prov = synthetic.provenance_record(
                cfg,
                f"cell {config} depth {depth}",
                host=SEED002_HOST,
                **_engine(cfg, SEED002_VERSIONS[cfg.engine.name]),
                spec=spec,
                started_at=f"2026-07-09T{8 + depth // 16384:02d}:00:00.000+00:00",
                finished_at=f"2026-07-10T{8 + depth // 16384:02d}:01:00.000+00:00",
            )
            results[(config, depth)] = (raw, prov)
    return grid, plan, results, {}


def seed000():
    """(grid, plan, results, failures, natural plan, natural results, natural failures)."""
    grid = load_grid_files([FIXTURES / "seed000.yaml"])
    plan = depth_plan(grid)
    results = {}
    for cell in plan.cells:
        config = cell.config
        cfg = plan.configs[config]
        decode = SEED000_DECODE[config]
        raw = synthetic.benchy_raw(0, decode=decode, prefill=(2100.0, 40.0), ttft_ms=(244.0, 5.0))
        prov = synthetic.provenance_record(
            cfg,
            f"cell {config} depth 0",
            host=SEED000_HOST,
            **_engine(cfg, "0.1.dev1+gbfde49e28.d20260418"),
            spec=synthetic.spec_decode(400, SEED000_PER_POSITION[config]),
        )
        results[(config, 0)] = (raw, prov)
    nplan = natural_plan(grid)
    nresults, nfailures = {}, {}
    with (FIXTURES / "seed000_natural.csv").open() as f:
        rows = {(r["config"], r["prompt_class"], int(r["concurrency"])): r for r in csv.DictReader(f)}
    for cell in nplan.cells:
        key = (cell.config, cell.prompt_class, cell.concurrency)
        row = rows[key]
        cfg = nplan.configs[cell.config]
        spec = synthetic.spec_decode(300, SEED000_PER_POSITION[cell.config])
        raw = synthetic.natural_raw(
            *key,
            output_tok_s=float(row["output_tok_s"]),
            ttft_ms=(float(row["ttft_ms_p50"]), float(row["ttft_ms_p95"])),
            tpot_ms=(float(row["tpot_ms_p50"]), float(row["tpot_ms_p95"])),
            output_tokens=int(row["output_tokens_p50"]),
            wall_s=float(row["wall_s"]),
            spec=spec,
        )
        req_tok_s = replace(raw.summary.req_tok_s, p50=float(row["req_tok_s_p50"]))
        raw = replace(raw, summary=replace(raw.summary, req_tok_s=req_tok_s))
        prov = synthetic.provenance_record(
            cfg,
            f"cell {key[0]} {key[1]} c={key[2]}",
            host=SEED000_HOST,
            **_engine(cfg, "0.1.dev1+gbfde49e28.d20260418"),
            load_generator="gridbench-natural",
            load_generator_version="0.1.0",
            spec=spec,
        )
        nresults[key] = (raw, prov)
    # one level failed: the harness's error-rate threshold
    failed = ("Q_fp8_mtp1", "prose", 16)
    del nresults[failed]
    cell = next(c for c in nplan.cells if c.key == failed)
    nfailures[failed] = codec.to_json(
        synthetic.failure_record(
            cell,
            "cell Q_fp8_mtp1 prose c=16",
            "cell Q_fp8_mtp1 prose c=16: 4 of 16 requests errored (error rate 0.25 > max_error_rate 0.1)",
        )
    )
    return grid, plan, results, {}, nplan, nresults, nfailures


# same_weights.yaml: (decode, ttft_ms) per depth 0, 4096, 65536, each (mean, std), and the
# engine's cold start to healthy
SAME_WEIGHTS_DECODE = {
    "V_bf16_n0": [(120.0, 2.0), (110.0, 2.0), (40.0, 1.0)],
    "V_fp8_n0": [(150.0, 3.0), (135.0, 3.0), (45.0, 1.0)],
    "L_f16_n0": [(60.0, 1.0), (55.0, 1.0), (22.0, 0.5)],
    "L_q8_0_n0": [(130.0, 1.5), (120.0, 1.5), (45.0, 1.0)],
}
SAME_WEIGHTS_TTFT = {
    "vllm": [(50.0, 2.0), (400.0, 10.0), (9000.0, 100.0)],
    "llamacpp": [(80.0, 3.0), (900.0, 20.0), (30000.0, 500.0)],
}
SAME_WEIGHTS_STARTUP_S = {"V_bf16_n0": 185.0, "V_fp8_n0": 172.5, "L_f16_n0": 4.2, "L_q8_0_n0": 3.9}


def same_weights():
    """(grid, plan, results, failures) for same_weights.yaml: one engine start per config,
    made by its depth-0 cell and reused by the others."""
    grid = load_grid_files([FIXTURES / "same_weights.yaml"])
    plan = depth_plan(grid)
    results = {}
    for cell in plan.cells:
        config, depth = cell.config, cell.depth
        cfg = plan.configs[config]
        i = list(grid.depths).index(depth)
        raw = synthetic.benchy_raw(
            depth,
            decode=SAME_WEIGHTS_DECODE[config][i],
            prefill=(2000.0, 20.0),
            ttft_ms=SAME_WEIGHTS_TTFT[cfg.engine.name][i],
        )
        prov = synthetic.provenance_record(
            cfg,
            f"cell {config} depth {depth}",
            host=SEED000_HOST,
            startup_s=SAME_WEIGHTS_STARTUP_S[config],
            reused=depth != 0,
        )
        results[(config, depth)] = (raw, prov)
    return grid, plan, results, {}


def read_back(results, failures, parse=BenchyResult.from_json):
    """The records as the read edge types their documents: (measured cells, cell failures);
    ``parse`` types a result document (llama-benchy's by default)."""
    measured = {
        key: MeasuredCell(
            parse(codec.to_json(raw)),
            ProvenanceRecord.from_record(codec.from_json(CellProvenance, codec.to_json(prov))),
        )
        for key, (raw, prov) in results.items()
    }
    return measured, {
        key: CellFailure.from_record(codec.from_json(FailureRecord, record))
        for key, record in failures.items()
    }


def depth_frame(plan, results, failures):
    return dataset.to_frame(dataset.rows_from_results(plan, *read_back(results, failures)))


def natural_frame(nplan, nresults, nfailures):
    measured = read_back(nresults, nfailures, natural.result_from_json)
    return natural.to_frame(natural.rows_from_results(nplan, *measured))


def write_files(root: Path, plan, results, failures) -> None:
    """The records as the files a sweep leaves (results, provenance, failure records)."""
    for cell in plan.cells:
        key = cell.key
        if key in results:
            synthetic.write_cell(cell, *results[key], root)
        elif key in failures:
            atomic_write_json(root / cell.files.failure, failures[key])


def load_config_dict(path: Path) -> dict:
    """A config file validated with its defaults filled in, as the workflow hands it to the CLI."""
    config = yaml.safe_load(Path(path).read_text())
    return load_grid(config, str(path)).document
