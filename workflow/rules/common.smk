import hashlib
import json
import sys
from pathlib import Path

from snakemake.utils import validate

from gridbench.cell import write_context
from gridbench.engines.manager import detect_gpus
from gridbench.errors import GridbenchError
from gridbench.files import atomic_write_text
from gridbench.grid import Grid, read_config_file, validate_config
from gridbench.plan import benchy_plan

CONFIG_FILES = [
    Path(p) for p in workflow.config_settings.configfiles or ["config/config.yaml"]
]
CONFIG_SOURCE = " + ".join(map(str, CONFIG_FILES))
try:
    # gridbench's check first: one message naming the file, the key and what is allowed
    for path in CONFIG_FILES:
        read_config_file(
            path
        )  # duplicate keys, which Snakemake's YAML loading lets pass
    validate_config(config, CONFIG_SOURCE)
    GRID = Grid.from_config(config, CONFIG_SOURCE)
except GridbenchError as err:
    sys.exit(f"gridbench: invalid config: {err}")
validate(config, schema="../schemas/config.schema.yaml")
PLAN = benchy_plan(GRID)
GPU_SLOTS = list(GRID.gpu_slots or detect_gpus()) or ["cpu"]
# The effective grid, content-addressed, for the rules that need all of it.
_GRID_JSON = json.dumps(config, default=str)  # key order is the report order
GRID_FILE = (
    f".gridbench/grid-{hashlib.sha256(_GRID_JSON.encode()).hexdigest()[:16]}.json"
)
if not Path(GRID_FILE).exists():
    atomic_write_text(Path(GRID_FILE), _GRID_JSON)
_CONFIG_RANK = {name: rank for rank, name in enumerate(PLAN["configs"])}
_DEPTH_RANK = {depth: rank for rank, depth in enumerate(GRID.depths)}


wildcard_constraints:
    config="|".join(PLAN["configs"]) or "NO_CONFIG",
    engine="|".join(GRID.configs[c].engine.name for c in PLAN["configs"]) or "NO_ENGINE",
    depth=r"\d+",


def get_final_outputs():
    return [
        "dataset/dataset.csv",
        "dataset/dataset.json",
        "dataset/dataset.parquet",
    ]


def get_raw_results(wildcards):
    return [cell["raw"] for cell in PLAN["cells"]]


def get_cell_files(wildcards):
    """The engine's preflight check and the host files the cell needs (built by a rule
    when one makes them)."""
    cfg = GRID.configs[wildcards.config]
    return [f"results/preflight/{cfg.engine.name}.json", *cfg.files, GRID.benchy.corpus]


_CONTEXTS = {}


def get_cell_context(wildcards):
    """The config's cell context file (its name changes when the config does)."""
    if wildcards.config not in _CONTEXTS:
        _CONTEXTS[wildcards.config] = str(
            write_context(GRID, wildcards.config, GPU_SLOTS)
        )
    return _CONTEXTS[wildcards.config]


def get_cell_priority(wildcards):
    """Cells of one config run back to back, so they share one warm engine, in the order
    of the config file, shallow depths first."""
    per_config = len(_DEPTH_RANK) + 1
    config_rank = len(_CONFIG_RANK) - _CONFIG_RANK[wildcards.config]
    return per_config * config_rank - _DEPTH_RANK[int(wildcards.depth)]


def get_cell_gpus(wildcards):
    """GPU slots a cell's engine takes (--resources gpu=N caps how many run at once)."""
    return GRID.configs[wildcards.config].serving.tensor_parallel_size
