import hashlib
import json
import contextlib
import os
import re
import signal
import sys
from pathlib import Path

import psutil
from snakemake.logging import logger

from gridbench import layout
from gridbench.cell import write_context
from gridbench.engines.allocation import (
    claim_sweep,
    record_lock_holder,
    release_stale_lock,
)
from gridbench.engines.manager import detect_gpus
from gridbench.errors import GridbenchError
from gridbench.files import atomic_write_text
from gridbench.loading import load_grid
from gridbench.plan import depth_plan, natural_plan
from gridbench.progress import sweep_follower

# This Snakemake (or the one that started it on this host) owns the engines its cells start:
# a watchdog stops each engine once this process is gone, also after a kill -9.
SWEEP = claim_sweep()
# the sweep itself, not a group or cluster job inside it (those run unlocked)
if SWEEP["pid"] == os.getpid() and not workflow.remote_exec:
    _gone = release_stale_lock()
    if _gone:
        logger.warning(
            f"gridbench: removed the lock that sweep {_gone['pid']} left when it was killed "
            "(it is gone); its unfinished cells run again"
        )
CONFIG_FILES = [
    Path(p) for p in workflow.config_settings.configfiles or ["config/config.yaml"]
]
CONFIG_SOURCE = " + ".join(map(str, CONFIG_FILES))
try:
    # the schema's check, its defaults, the references: one message naming the file and key
    GRID = load_grid(config, CONFIG_SOURCE, files=CONFIG_FILES)
except GridbenchError as err:
    sys.exit(f"gridbench: invalid config: {err}")
PLAN = depth_plan(GRID)
NATURAL_PLAN = natural_plan(GRID)
GPU_SLOTS = list(GRID.gpu_slots or detect_gpus()) or ["cpu"]
# How a run is shown, not what it measures: kept out of the grid files, so that
# `--config progress=False` reruns nothing.
_DISPLAY_KEYS = ("progress", "progress_interval_s")
# The effective grid, content-addressed, for the rules that need all of it.
_GRID_JSON = json.dumps(
    {k: v for k, v in GRID.document.items() if k not in _DISPLAY_KEYS}, default=str
)  # key order is the report order
GRID_FILE = (
    f".gridbench/grid-{hashlib.sha256(_GRID_JSON.encode()).hexdigest()[:16]}.json"
)
if not Path(GRID_FILE).exists():
    atomic_write_text(Path(GRID_FILE), _GRID_JSON)
# An engine's check covers every config on it, whatever a run's filter (--config
# config=…) selects: a filter then leaves the check, and every cell that depends on it, as
# it was, so a few configs run first and the whole grid later measure each cell once.
_FILTERS = ("engine", "checkpoint", "speculation", "config")
_UNFILTERED_JSON = json.dumps(
    {k: v for k, v in GRID.document.items() if k not in _FILTERS + _DISPLAY_KEYS}
    | dict.fromkeys(_FILTERS),
    default=str,
)
ENGINE_CHECK_GRID_FILE = (
    f".gridbench/grid-{hashlib.sha256(_UNFILTERED_JSON.encode()).hexdigest()[:16]}.json"
)
if not Path(ENGINE_CHECK_GRID_FILE).exists():
    atomic_write_text(Path(ENGINE_CHECK_GRID_FILE), _UNFILTERED_JSON)
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


def interrupt_on_sigterm():
    """SIGTERM to Snakemake (`kill`, a batch system, a service manager) acts as Ctrl-C:
    the running cells are interrupted, record it and leave no result, then onerror stops
    every engine. Snakemake's own handler waits for the running cells instead, which can
    outlast the grace period before SIGKILL and leave engines running on the GPU."""

    def interrupt(signum, frame):
        for job in psutil.Process().children():  # the cell rules exec their command
            with contextlib.suppress(psutil.NoSuchProcess):
                job.send_signal(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


_PROGRESS = []


def start_progress():
    """Say where the sweep stands while it runs (see gridbench.progress.Follower)."""
    follower = sweep_follower(GRID, logger.info)
    if follower:
        follower.start()
        _PROGRESS.append(follower)


def stop_progress():
    """Say the final line; the follower's thread would end with Snakemake anyway."""
    while _PROGRESS:
        _PROGRESS.pop().stop()
