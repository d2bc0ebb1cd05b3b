import hashlib
import json
import re
from pathlib import Path

from snakemake.utils import validate

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
    return [
        "dataset/dataset.csv",
        "dataset/dataset.json",
        "dataset/dataset.parquet",
    ]


def get_raw_results(wildcards):
    return [cell["raw"] for cell in PLAN["cells"]]


def get_cell_files(wildcards):
    """Host files the cell's engine needs: built by a rule when one makes them."""
    cfg = GRID.configs[wildcards.config]
    return [*cfg.files, GRID.benchy.corpus]


def get_cell_spec(wildcards):
    spec = benchy_cell_spec(GRID, wildcards.config, int(wildcards.depth), GPU_SLOTS)
    return spec.to_json()


def get_cell_priority(wildcards):
    """Cells of one config run back to back, so they share one warm engine; in depth
    order, so that ties never leave the order to the scheduler."""
    config_rank = len(_CONFIG_RANK) - _CONFIG_RANK[wildcards.config]
    depth_rank = GRID.depths.index(int(wildcards.depth))
    return config_rank * (len(GRID.depths) + 1) - depth_rank


def get_cell_gpus(wildcards):
    """GPU slots a cell's engine takes (--resources gpu=N caps how many run at once)."""
    return GRID.configs[wildcards.config].serving.tensor_parallel_size


# --- Scale-out (multi-GPU hosts, clusters): one engine per config, several configs at once.


def _cells_of(config_name):
    def takes_engine(wildcards):
        return int(wildcards.config == config_name)

    return takes_engine


def cells_may_run_at_once():
    """More than one cell at a time: --resources gpu=N with N > 1, no GPU limit, or a cluster."""
    gpu_limit = workflow.global_resources.get("gpu").value
    return gpu_limit is None or gpu_limit > 1


def get_engine_mutexes():
    """One resource per config, capped at 1 and taken by each of its cells.

    With -j N --resources gpu=N, Snakemake then runs cells of N different configs at
    once, each on its own warm engine, and never two cells of one config (the second
    would only wait for the first one's engine). A cluster's group job runs its cells one
    after another for the same reason. One cell at a time needs none (and DAGs of
    thousands of cells build faster without them)."""
    if not cells_may_run_at_once():
        return {}
    mutexes = {}
    for name in PLAN["configs"]:
        safe_name = re.sub(r"\W", "_", name)
        key = f"engine_{safe_name}"
        key = key if key not in mutexes else f"{key}_{len(mutexes)}"
        workflow.register_resource(key, 1)
        mutexes[key] = _cells_of(name)
    return mutexes


ENGINE_MUTEXES = get_engine_mutexes()


# On a cluster the light rules run where Snakemake runs (the login node), not as jobs.
localrules:
    make_corpus,
    make_demo_models,
    build_dataset,


def keep_going_in_cluster_jobs():
    """A cluster job runs all cells of one config (a group job), and Snakemake runs a
    group's jobs without --keep-going (snakemake/snakemake#2508): one failed cell would
    leave the config's later cells unrun. In a cluster job, keep going as the profile
    says to on the login node; the settings exist only once the run starts."""
    if not workflow.remote_exec:
        return
    execute = workflow.execute

    def execute_keeping_going(*args, **kwargs):
        workflow.execution_settings.keep_going = True
        return execute(*args, **kwargs)

    workflow.execute = execute_keeping_going


keep_going_in_cluster_jobs()
