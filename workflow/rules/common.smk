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
from gridbench.cells.context import write_context
from gridbench.cells.kinds import CELL_KINDS
from gridbench.engines.allocation import (
    claim_sweep,
    record_lock_holder,
    release_stale_lock,
)
from gridbench.engines.manager import detect_gpus
from gridbench.errors import GridbenchError
from gridbench.util.files import atomic_write_text
from gridbench.config.loading import load_grid
from gridbench.cells.plan import run_order, sweep_plan
from gridbench.cells.progress import sweep_follower

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
PLAN = sweep_plan(GRID)
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
ORDER = run_order(GRID)


wildcard_constraints:
    **{
        name: pattern
        for kind in CELL_KINDS.values()
        for name, pattern in kind.wildcard_patterns(GRID).items()
    },
    config="|".join(PLAN.configs) or "NO_CONFIG",
    engine="|".join(GRID.configs[c].engine.name for c in PLAN.configs) or "NO_ENGINE",


def get_final_outputs():
    """The datasets, graphs, report and explorer (the depth dataset is empty in a study without a
    llama-benchy sweep; the natural dataset exists when the study has a natural matrix, the
    quality dataset when it has a quality section).
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
    if GRID.quality:
        outputs += [layout.QUALITY_CSV, layout.QUALITY_PARQUET]
    return outputs


def _results_of(dataset):
    """The results of the cells whose rows the dataset holds."""
    return [
        cell.files.raw
        for name, kind in CELL_KINDS.items()
        if kind.dataset == dataset
        for cell in PLAN.kinds[name].cells
    ]


def get_raw_results(wildcards):
    return _results_of("depth")


def get_natural_results(wildcards):
    return _results_of("natural")


def get_quality_results(wildcards):
    return _results_of("quality")


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
    quality = {"quality": layout.QUALITY_PARQUET} if GRID.quality else {}
    return {**get_datasets(wildcards), **quality, "graphs": get_graphs(wildcards)}


def get_report_natural_option(wildcards):
    return f"--natural {layout.NATURAL_PARQUET}" if GRID.natural else ""


def get_report_dataset_options(wildcards):
    """The report's --natural and --quality options, each where the study has the dataset:
    a study without a quality section keeps the report's command line as it was."""
    quality = f" --quality {layout.QUALITY_PARQUET}" if GRID.quality else ""
    return get_report_natural_option(wildcards) + quality


def get_engine_files(wildcards):
    """Every host file the engine's cells need. Its check then finds the paths its
    volumes mount, and once it has passed, all of the engine's cells are ready at once:
    the priorities keep each config's cells back to back on one warm engine (natural
    cells would otherwise run first, before the corpus exists)."""
    files = {}
    for (
        name,
        cfg,
    ) in GRID.configs.items():  # every config on the engine: see ENGINE_CHECK_GRID_FILE
        if cfg.engine.name == wildcards.engine:
            for kind in CELL_KINDS.values():
                files.update(dict.fromkeys(kind.host_files(GRID, name)))
    return list(files)


def _engine_check(config_name):
    """The check of the config's engine, as a gate: the check runs again whenever the grid
    changes (it reads all of it), and its newer file must not re-measure the cells."""
    engine = GRID.configs[config_name].engine.name
    return ancient(layout.ENGINE_CHECK.format(engine=engine))


def cell_inputs(kind):
    """A kind's cell's inputs: its engine's preflight check and the host files it reads."""

    def inputs(wildcards):
        host_files = CELL_KINDS[kind].host_files(GRID, wildcards.config)
        return [_engine_check(wildcards.config), *host_files]

    return inputs


_CONTEXTS = {}


def cell_context(kind):
    """A kind's cell's context file: what the config's cells of the kind share, named by its
    content."""

    def context(wildcards):
        if (wildcards.config, kind) not in _CONTEXTS:
            _CONTEXTS[wildcards.config, kind] = str(
                write_context(GRID, wildcards.config, GPU_SLOTS, kind)
            )
        return _CONTEXTS[wildcards.config, kind]

    return context


def cell_priority(kind):
    """A kind's cell's priority: a config's cells run back to back on one warm engine."""
    names = CELL_KINDS[kind].wildcard_names

    def priority(wildcards):
        coordinates = tuple(str(wildcards[name]) for name in names)
        return ORDER.priority(wildcards.config, kind, coordinates)

    return priority


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
    build_quality_dataset,
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
    """Say where the sweep stands while it runs (see gridbench.cells.progress.Follower)."""
    follower = sweep_follower(GRID, logger.info)
    if follower:
        follower.start()
        _PROGRESS.append(follower)


def stop_progress():
    """Say the final line; the follower's thread would end with Snakemake anyway."""
    while _PROGRESS:
        _PROGRESS.pop().stop()
