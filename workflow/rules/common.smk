import re
import sys
from pathlib import Path

from snakemake.logging import logger

from gridbench import layout
from gridbench.cell import write_context
from gridbench.engines.manager import detect_gpus
from gridbench.errors import GridbenchError
from gridbench.loading import load_grid
from gridbench.plan import depth_plan, natural_plan
from gridbench.sweep import Sweep

CONFIG_FILES = [
    Path(p) for p in workflow.config_settings.configfiles or ["config/config.yaml"]
]
CONFIG_SOURCE = " + ".join(map(str, CONFIG_FILES))
try:
    # the schema's check, its defaults, the references: one message naming the file and key
    GRID = load_grid(config, CONFIG_SOURCE, files=CONFIG_FILES)
except GridbenchError as err:
    sys.exit(f"gridbench: invalid config: {err}")
# whatever acts on the host (engines' owner, lock, grid files, signals): gridbench.sweep
SWEEP = Sweep.claim(GRID, remote_exec=workflow.remote_exec)
if _released := SWEEP.release_dead_lock():
    logger.warning(_released)
# the grid, content-addressed, for the rules that need all of it; and as engine checks read it
GRID_FILE, ENGINE_CHECK_GRID_FILE = SWEEP.write_grid_files()
PLAN = depth_plan(GRID)
NATURAL_PLAN = natural_plan(GRID)
GPU_SLOTS = list(GRID.gpu_slots or detect_gpus()) or ["cpu"]
_CONFIG_RANK = {name: rank for rank, name in enumerate(PLAN.configs)}
_DEPTH_RANK = {depth: rank for rank, depth in enumerate(GRID.depths)}
_PROMPT_CLASSES = GRID.natural.prompt_classes if GRID.natural else ()
_NATURAL_RANK = {
    (cls, c): rank
    for rank, (cls, c) in enumerate(
        (cls, c) for cls in _PROMPT_CLASSES for c in GRID.natural.concurrency
    )
}
# a config's cells in run order: depths, natural matrix, then the prefix-cache pass
_PER_CONFIG = 2 * len(_DEPTH_RANK) + len(_NATURAL_RANK) + 1


wildcard_constraints:
    config="|".join(PLAN.configs) or "NO_CONFIG",
    engine="|".join(GRID.configs[c].engine.name for c in PLAN.configs) or "NO_ENGINE",
    depth=r"\d+",
    prompt_class="|".join(map(re.escape, _PROMPT_CLASSES)) or "NO_CLASS",
    concurrency=r"\d+",


def get_final_outputs():
    """The datasets, graphs, report and explorer (the depth dataset is empty in a study without a
    llama-benchy sweep; the natural dataset exists when the study has a natural matrix).
    """
    outputs = [
        layout.DATASET_CSV,
        layout.DATASET_JSON,
        layout.DATASET_PARQUET,
        layout.REPORT,
        layout.EXPLORER,
        *get_graphs(None),
    ]
    if GRID.natural:
        outputs += [layout.NATURAL_CSV, layout.NATURAL_PARQUET]
    return outputs


def get_raw_results(wildcards):
    return [cell.files.raw for cell in PLAN.cells + PLAN.cached_cells]


def get_natural_results(wildcards):
    return [cell.files.raw for cell in NATURAL_PLAN.cells]


def get_graphs(wildcards):
    """Every graph of the study, in report order (natural ones with a natural matrix)."""
    names = layout.DEPTH_GRAPHS + (layout.NATURAL_GRAPHS if GRID.natural else ())
    return [layout.GRAPH.format(graph=name) for name in names]


def get_datasets(wildcards):
    """The Parquet datasets of the study: depth, and natural with a natural matrix."""
    inputs = {"dataset": layout.DATASET_PARQUET}
    if GRID.natural:
        inputs["natural"] = layout.NATURAL_PARQUET
    return inputs


def get_report_inputs(wildcards):
    return {**get_datasets(wildcards), "graphs": get_graphs(wildcards)}


def get_report_natural_option(wildcards):
    return f"--natural {layout.NATURAL_PARQUET}" if GRID.natural else ""


def _host_files(config_name, kind):
    """What a cell of this config and kind (benchy or natural) reads on the host."""
    cfg = GRID.configs[config_name]
    if kind == "benchy":
        return [*cfg.files, GRID.benchy.corpus]
    prompt_file = GRID.natural.prompt_file
    return [*cfg.files, *([prompt_file] if prompt_file else [])]


def get_engine_files(wildcards):
    """Every host file the engine's cells need. Its check then finds the paths its
    volumes mount, and once it has passed, all of the engine's cells are ready at once:
    the priorities keep each config's cells back to back on one warm engine (natural
    cells would otherwise run first, before the corpus exists)."""
    files = {}
    kinds = ("benchy", "natural") if GRID.natural else ("benchy",)
    for (
        name,
        cfg,
    ) in GRID.configs.items():  # every config on the engine: see ENGINE_CHECK_GRID_FILE
        if cfg.engine.name == wildcards.engine:
            for kind in kinds:
                files.update(dict.fromkeys(_host_files(name, kind)))
    return list(files)


def _engine_check(config_name):
    """The check of the config's engine, as a gate: the check runs again whenever the grid
    changes (it reads all of it), and its newer file must not re-measure the cells."""
    engine = GRID.configs[config_name].engine.name
    return ancient(layout.ENGINE_CHECK.format(engine=engine))


def get_cell_files(wildcards):
    """The engine's preflight check and the host files the cell needs."""
    return [_engine_check(wildcards.config), *_host_files(wildcards.config, "benchy")]


_CONTEXTS = {}


def _context(config_name, kind):
    if (config_name, kind) not in _CONTEXTS:
        _CONTEXTS[config_name, kind] = str(
            write_context(GRID, config_name, GPU_SLOTS, kind)
        )
    return _CONTEXTS[config_name, kind]


def get_cell_context(wildcards):
    """The config's llama-benchy cell context file (named by its content)."""
    return _context(wildcards.config, "benchy")


def get_natural_cell_files(wildcards):
    """As get_cell_files, with the study's prompt file instead of llama-benchy's corpus."""
    return [_engine_check(wildcards.config), *_host_files(wildcards.config, "natural")]


def get_natural_cell_context(wildcards):
    """The config's natural-cell context file (prompts included)."""
    return _context(wildcards.config, "natural")


def get_cell_priority(wildcards):
    """Cells of one config (llama-benchy and natural alike) run back to back, so they
    share one warm engine: configs in the config file's order, then shallow depths first,
    then the natural matrix."""
    config_rank = len(_CONFIG_RANK) - _CONFIG_RANK[wildcards.config]
    if "depth" in wildcards.keys():
        within = _DEPTH_RANK[int(wildcards.depth)]
    else:
        within = (
            len(_DEPTH_RANK)
            + _NATURAL_RANK[(wildcards.prompt_class, int(wildcards.concurrency))]
        )
    return _PER_CONFIG * config_rank - within


def get_cached_cell_priority(wildcards):
    """A config's prefix-cache cells run after all its other cells: their engine has the
    prefix cache on, so (unless the config has it on already) it replaces the config's cold
    engine once, and the cold cells never wait for a restart back."""
    config_rank = len(_CONFIG_RANK) - _CONFIG_RANK[wildcards.config]
    within = len(_DEPTH_RANK) + len(_NATURAL_RANK) + _DEPTH_RANK[int(wildcards.depth)]
    return _PER_CONFIG * config_rank - within


# An engine's check runs as soon as its files are there, before any cell: a check left at
# the default priority waits behind every ready cell of the other engines, so a sweep cut
# short (a GPU loan's end) never reached the later engines' cells at all.
ENGINE_CHECK_PRIORITY = _PER_CONFIG * (len(_CONFIG_RANK) + 1)


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
    for name in PLAN.configs:
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
    make_vllm_models,
    build_dataset,
    build_natural_dataset,
    plot_depth_graphs,
    plot_natural_graphs,
    render_report,
    render_explorer,


# a cluster job's cells go on after one fails, as on the login node
SWEEP.keep_going_in_cluster_jobs(workflow)
