import hashlib
import json
from pathlib import Path

from snakemake.utils import validate

from gridbench import layout
from gridbench.aggregate.natural_plan import natural_plan
from gridbench.cell import benchy_cell_spec
from gridbench.engines.manager import detect_gpus
from gridbench.files import atomic_write_text
from gridbench.grid import validate_config, Grid
from gridbench.plan import benchy_plan

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


wildcard_constraints:
    config="|".join(PLAN["configs"]) or "NO_CONFIG",
    depth=r"\d+",


def get_final_outputs():
    outputs = [
        "dataset/dataset.csv",
        "dataset/dataset.json",
        "dataset/dataset.parquet",
        "dataset/comparison.md",
        *get_graphs(None),
    ]
    if GRID.natural:
        outputs += ["dataset/natural.csv", "dataset/natural.parquet"]
    return outputs


def get_raw_results(wildcards):
    return [cell["raw"] for cell in PLAN["cells"]]


def get_natural_results(wildcards):
    return [cell["raw"] for cell in NATURAL_PLAN["cells"]]


def get_graphs(wildcards):
    """Every graph of the study, in report order (natural ones with a natural matrix)."""
    names = layout.DEPTH_GRAPHS + (layout.NATURAL_GRAPHS if GRID.natural else ())
    return [layout.GRAPH.format(graph=name) for name in names]


def get_report_inputs(wildcards):
    inputs = {"dataset": "dataset/dataset.parquet", "graphs": get_graphs(wildcards)}
    if GRID.natural:
        inputs["natural"] = "dataset/natural.parquet"
    return inputs


def get_report_natural_option(wildcards):
    return "--natural dataset/natural.parquet" if GRID.natural else ""


def get_cell_files(wildcards):
    """Host files the cell's engine needs: built by a rule when one makes them."""
    cfg = GRID.configs[wildcards.config]
    return [*cfg.files, GRID.benchy.corpus]


def get_cell_spec(wildcards):
    spec = benchy_cell_spec(GRID, wildcards.config, int(wildcards.depth), GPU_SLOTS)
    return spec.to_json()


def get_cell_priority(wildcards):
    """Cells of one config run back to back, so they share one warm engine."""
    return 1000 * (len(_CONFIG_RANK) - _CONFIG_RANK[wildcards.config])


def get_cell_gpus(wildcards):
    """GPU slots a cell's engine takes (--resources gpu=N caps how many run at once)."""
    return GRID.configs[wildcards.config].serving.tensor_parallel_size
