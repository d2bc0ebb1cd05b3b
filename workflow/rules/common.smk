import hashlib
import json
import re
from pathlib import Path

from snakemake.utils import validate

from gridbench.cell import benchy_cell_spec, natural_cell_spec
from gridbench.engines.manager import detect_gpus
from gridbench.files import atomic_write_text
from gridbench.grid import validate_config, Grid
from gridbench.plan import benchy_plan, natural_plan

validate(config, schema="../schemas/config.schema.yaml")
CONFIG_SOURCE = " + ".join(
    map(str, workflow.config_settings.configfiles or ["config/config.yaml"])
)
validate_config(config, CONFIG_SOURCE)
GRID = Grid.from_config(config, CONFIG_SOURCE)
PLAN = benchy_plan(GRID)
NATURAL_PLAN = natural_plan(GRID)
GPU_SLOTS = list(GRID.gpu_slots or detect_gpus()) or ["cpu"]
# The effective grid, content-addressed, for the rules that need all of it.
_GRID_JSON = json.dumps(config, default=str)  # key order is the report order
GRID_FILE = (
    f".gridbench/grid-{hashlib.sha256(_GRID_JSON.encode()).hexdigest()[:16]}.json"
)
if not Path(GRID_FILE).exists():
    atomic_write_text(Path(GRID_FILE), _GRID_JSON)
_CONFIG_RANK = {name: rank for rank, name in enumerate(PLAN["configs"])}
_PROMPT_CLASSES = (GRID.natural or {}).get("prompt_classes", [])


wildcard_constraints:
    config="|".join(PLAN["configs"]) or "NO_CONFIG",
    depth=r"\d+",
    prompt_class="|".join(map(re.escape, _PROMPT_CLASSES)) or "NO_CLASS",
    concurrency=r"\d+",


def get_final_outputs():
    """The llama-benchy dataset when the study sweeps depths, and every natural cell."""
    outputs = []
    if GRID.depths:
        outputs += [
            "dataset/dataset.csv",
            "dataset/dataset.json",
            "dataset/dataset.parquet",
        ]
    return outputs + [cell["raw"] for cell in NATURAL_PLAN["cells"]]


def get_raw_results(wildcards):
    return [cell["raw"] for cell in PLAN["cells"]]


def get_cell_files(wildcards):
    """Host files the cell's engine needs: built by a rule when one makes them."""
    cfg = GRID.configs[wildcards.config]
    return [*cfg.files, GRID.benchy.corpus]


def get_cell_spec(wildcards):
    spec = benchy_cell_spec(GRID, wildcards.config, int(wildcards.depth), GPU_SLOTS)
    return spec.to_json()


def get_natural_cell_files(wildcards):
    cfg = GRID.configs[wildcards.config]
    prompt_file = GRID.natural["prompt_file"]
    return [*cfg.files, *([prompt_file] if prompt_file else [])]


def get_natural_cell_spec(wildcards):
    spec = natural_cell_spec(
        GRID,
        wildcards.config,
        wildcards.prompt_class,
        int(wildcards.concurrency),
        GPU_SLOTS,
    )
    return spec.to_json()


def get_cell_priority(wildcards):
    """Cells of one config (llama-benchy and natural alike) run back to back, so they
    share one warm engine."""
    return 1000 * (len(_CONFIG_RANK) - _CONFIG_RANK[wildcards.config])


def get_cell_gpus(wildcards):
    """GPU slots a cell's engine takes (--resources gpu=N caps how many run at once)."""
    return GRID.configs[wildcards.config].serving.tensor_parallel_size
