import dataclasses
import json
import re
import sys
from pathlib import Path

from snakemake.logging import logger

from gridbench import layout
from gridbench.cells.context import write_context
from gridbench.cells.kinds import CELL_KINDS, wildcard_patterns
from gridbench.cells.plan import run_order, sweep_plan
from gridbench.config.loading import load_grid
from gridbench.drafts.recipe import unserved_head_files, write_recipe_files
from gridbench.engines.manager import detect_gpus
from gridbench.errors import GridbenchError
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
PLAN = sweep_plan(GRID)
GPU_SLOTS = list(GRID.gpu_slots or detect_gpus()) or ["cpu"]
ORDER = run_order(GRID)


wildcard_constraints:
    **wildcard_patterns(GRID),
    config="|".join(PLAN.configs) or "NO_CONFIG",
    engine="|".join(GRID.configs[c].engine.name for c in PLAN.configs) or "NO_ENGINE",
    draft="|".join(map(re.escape, GRID.drafts)) or "NO_DRAFT",


def get_final_outputs():
    """The datasets, graphs, report and explorer (the depth dataset is empty in a study without a
    llama-benchy sweep; the natural dataset exists when the study has a natural matrix, the
    quality dataset when it has a quality section, the load dataset when it has a load section,
    the sessions dataset when it has a sessions section).
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
    if GRID.load:
        outputs += [layout.LOAD_CSV, layout.LOAD_PARQUET]
    if GRID.sessions:
        outputs += [layout.SESSIONS_CSV, layout.SESSIONS_PARQUET]
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


def get_load_results(wildcards):
    return _results_of("load")


def get_session_results(wildcards):
    return _results_of("sessions")


def get_graphs(wildcards):
    """Every graph of the study, in report order (natural ones with a natural matrix, the
    quality, load and session ones with those sections)."""
    names = layout.DEPTH_GRAPHS + (layout.NATURAL_GRAPHS if GRID.natural else ())
    names += layout.QUALITY_GRAPHS if GRID.quality else ()
    names += layout.LOAD_GRAPHS if GRID.load else ()
    names += layout.SESSION_GRAPHS if GRID.sessions else ()
    return [layout.GRAPH.format(graph=name) for name in names]


def get_datasets(wildcards):
    """The Parquet datasets of the study: depth, and natural with a natural matrix."""
    inputs = {"dataset": layout.DATASET_PARQUET}
    if GRID.natural:
        inputs["natural"] = layout.NATURAL_PARQUET
    return inputs


def get_explorer_inputs(wildcards):
    """The datasets, and the quality dataset where the study has a quality section."""
    quality = {"quality": layout.QUALITY_PARQUET} if GRID.quality else {}
    return {**get_datasets(wildcards), **quality}


def get_report_inputs(wildcards):
    """The explorer's inputs, the graphs, and the load and sessions datasets where the study
    has those sections."""
    load = {"load": layout.LOAD_PARQUET} if GRID.load else {}
    sessions = {"sessions": layout.SESSIONS_PARQUET} if GRID.sessions else {}
    return {
        **get_explorer_inputs(wildcards),
        **load,
        **sessions,
        "graphs": get_graphs(wildcards),
    }


def get_report_natural_option(wildcards):
    return f"--natural {layout.NATURAL_PARQUET}" if GRID.natural else ""


def get_explorer_dataset_options(wildcards):
    """The explorer's --natural and --quality options, each where the study has the dataset:
    a study without a quality section keeps the command line as it was."""
    quality = f" --quality {layout.QUALITY_PARQUET}" if GRID.quality else ""
    return get_report_natural_option(wildcards) + quality


def get_report_dataset_options(wildcards):
    """The explorer's options and the report's --load and --sessions where the study has
    those sections: a study without them keeps the report's command line as it was."""
    load = f" --load {layout.LOAD_PARQUET}" if GRID.load else ""
    sessions = f" --sessions {layout.SESSIONS_PARQUET}" if GRID.sessions else ""
    return get_explorer_dataset_options(wildcards) + load + sessions


def get_engine_files(wildcards):
    """Every host file the engine's cells need. Its check then finds the paths its
    volumes mount, and once it has passed, all of the engine's cells are ready at once:
    the priorities keep each config's cells back to back on one warm engine (natural
    cells would otherwise run first, before the corpus exists). A draft head that no config
    of this run serves is left out: training it would spend the run's GPU time on a head
    nothing measures (a sweep filtered to a DFlash config trained
    the EAGLE-3 and DSpark heads first: studies/h100-speculation, loan 8)."""
    unserved = unserved_head_files(GRID, PLAN.configs)
    files = {}
    for (
        name,
        cfg,
    ) in GRID.configs.items():  # every config on the engine: see ENGINE_CHECK_GRID_FILE
        if cfg.engine.name == wildcards.engine:
            for kind in CELL_KINDS.values():
                files.update(
                    dict.fromkeys(
                        f for f in kind.host_files(GRID, name) if f not in unserved
                    )
                )
    return list(files)


def _engine_check(config_name):
    """The check of the config's engine, as a gate: the check runs again whenever the grid
    changes (it reads all of it), and its newer file must not re-measure the cells. The check
    is a checkpoint (preflight.smk): once it has run, Snakemake decides anew which cells
    run; without that it looks at no job below an ancient input whose job runs."""
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


write_recipe_files(GRID)


def draft_recipe_file(wildcards):
    """Where a draft's steps read its recipe: a path that names no content (unlike a grid
    file's), so a filtered sweep reruns no step."""
    return layout.DRAFT_RECIPE_FILE.format(draft=wildcards.draft)


def draft_settings(wildcards):
    """A draft's recipe as its steps' param: changing the recipe reruns them."""
    recipe = GRID.drafts[wildcards.draft]
    return json.dumps(dataclasses.asdict(recipe), sort_keys=True)


def draft_hidden_states_step(wildcards):
    """The hidden states a draft trains on: its own, or those of the draft it names in data_from."""
    data_draft = GRID.drafts[wildcards.draft].data_draft
    return layout.DRAFT_STEP.format(draft=data_draft, step="hidden-states")


def draft_target_files(wildcards):
    """The target's files a draft's answers need: built first where a rule can."""
    return list(GRID.drafts[wildcards.draft].files)


# On a cluster the light rules run where Snakemake runs (the login node), not as jobs.
localrules:
    make_corpus,
    make_demo_models,
    make_vllm_models,
    build_dataset,
    build_natural_dataset,
    build_quality_dataset,
    build_load_dataset,
    build_sessions_dataset,
    plot_depth_graphs,
    plot_natural_graphs,
    plot_quality_graph,
    plot_load_graph,
    plot_session_graph,
    render_report,
    render_explorer,


# a cluster job's cells go on after one fails, as on the login node
SWEEP.keep_going_in_cluster_jobs(workflow)
