"""Where a sweep's files go, relative to the working directory.

The one place these patterns are spelled: the workflow's rules name their outputs with
these constants (workflow/rules/*.smk), and the package fills them in. A cell kind's own
files (result, provenance, failure record, log) are its module's patterns
(gridbench.cells.kinds.<kind>.patterns), in the same tree.
"""

from __future__ import annotations

from dataclasses import dataclass

# an engine's check (image, command, mounts), which gates its cells
ENGINE_CHECK = "results/preflight/{engine}.json"
# A running cell's scratch folder, SCRATCH/SCRATCH_PREFIX + 8 characters of tempfile.mkdtemp,
# names the cell (its kind's cell_id pattern) and its start (Unix seconds), and holds its load
# generator's progress file.
SCRATCH = "results/.tmp"
SCRATCH_PREFIX = "{config}-{cell_id}-{started_s}-"
ENGINE_EVENTS = "logs/engines/events.jsonl"
ENGINE_LOG = "logs/engines/{config}.log"  # every start of the config's engine appended
# an engine's compile cache (engines/compile_cache.py), one folder per key: its kind, then a hash
# of its start's fingerprint and its build (image id, or the command's file); under resources/,
# which a study keeps between commands and carries between loans of a machine
ENGINE_CACHE = "resources/engine-cache/{kind}/{key}"
# where a container sees that folder
ENGINE_CACHE_IN_CONTAINER = "/gridbench-engine-cache"
# a trained draft head (gridbench.drafts, workflow/rules/drafts.smk): each step's output in its
# folder, the heads as vLLM loads them, and the recipe's record (data, steps, loss curve, times)
DRAFT_DIR = "resources/drafts/{draft}"
DRAFT_PROMPTS = DRAFT_DIR + "/prompts.jsonl"
DRAFT_ANSWERS = DRAFT_DIR + "/answers.jsonl"
DRAFT_PREPARED = DRAFT_DIR + "/prepared"  # speculators' dataset, its hidden states beside it
DRAFT_STEP = DRAFT_DIR + "/steps/{step}.json"  # what a step did: counts, device, wall time
DRAFT_STEPS = ("prompts", "answers", "dataset", "hidden-states", "train")  # in the order they run
DRAFT_HEAD = DRAFT_DIR + "/head"
DRAFT_UNTRAINED_HEAD = DRAFT_DIR + "/untrained"
DRAFT_HEAD_FILES = ("config.json", "model.safetensors")
DRAFT_TRAIN_METRICS = DRAFT_DIR + "/train_metrics.jsonl"
DRAFT_RECORD = DRAFT_DIR + "/RECIPE.json"
# the recipe as its steps read it, written by the workflow where the grid files are: its path,
# unlike a grid file's, names no content, so filtering a sweep reruns no step
DRAFT_RECIPE_FILE = ".gridbench/drafts/{draft}.json"
# a cell's GPU telemetry series (cells.telemetry), beside its provenance record
PROVENANCE_SUFFIX = ".provenance.json"
TELEMETRY_SUFFIX = ".telemetry.jsonl"


def telemetry_series(provenance: str) -> str:
    """The telemetry series file of a cell, from its provenance record's path (or pattern)."""
    return provenance.removesuffix(PROVENANCE_SUFFIX) + TELEMETRY_SUFFIX


# a study run over several loans of a machine keeps each earlier loan's logs under logs/<loan>/
# (studies/h200-vllm/logs/loan-1/): their engine events count in the study's GPU time ledger
EARLIER_ENGINE_EVENTS = "logs/*/engines/events.jsonl"
DATASET_CSV = "dataset/dataset.csv"
DATASET_JSON = "dataset/dataset.json"
DATASET_PARQUET = "dataset/dataset.parquet"
NATURAL_CSV = "dataset/natural.csv"
NATURAL_PARQUET = "dataset/natural.parquet"
QUALITY_CSV = "dataset/quality.csv"
QUALITY_PARQUET = "dataset/quality.parquet"
LOAD_CSV = "dataset/load.csv"
LOAD_PARQUET = "dataset/load.parquet"
SESSIONS_CSV = "dataset/sessions.csv"
SESSIONS_PARQUET = "dataset/sessions.parquet"
GRAPH = "graphs/{graph}.png"
REPORT = "dataset/comparison.md"
EXPLORER = "dataset/explorer.html"
# Snakemake's lock of the working directory (what `snakemake --unlock` removes), and the sweep
# that took it: a sweep killed with SIGKILL leaves the lock behind
SNAKEMAKE_LOCKS = ".snakemake/locks"
LOCK_HOLDER = ".snakemake/gridbench-lock-holder"
# graph names, in report order (gridbench.aggregate.plots draws them)
DEPTH_GRAPHS = (
    "decode_vs_context",
    "ttft_vs_context",
    "prefill_vs_context",
    "decode_grouped",
    "ttft_grouped",
    "ttft_cached_vs_context",
    "speedup_vs_context",
    "acceptance_per_position",
)
NATURAL_GRAPHS = (
    "natural_tok_s_vs_concurrency",
    "natural_ttft_vs_concurrency",
    "natural_tpot_vs_concurrency",
    "natural_pareto",
)
QUALITY_GRAPHS = ("quality_frontier",)
LOAD_GRAPHS = ("load_slo_vs_rate",)
SESSION_GRAPHS = ("session_ttft_by_turn",)
# the report's heading of each graph
GRAPH_TITLES = {
    "decode_vs_context": "Decode throughput vs context depth",
    "ttft_vs_context": "Time to first token vs context depth (log scale)",
    "prefill_vs_context": "Prefill throughput vs context depth",
    "decode_grouped": "Decode tok/s by config across context depths",
    "ttft_grouped": "TTFT by config across context depths (log scale)",
    "ttft_cached_vs_context": "TTFT cold vs cached context by depth",
    "speedup_vs_context": "Decode speedup over each config's baseline",
    "acceptance_per_position": "Speculative decoding acceptance, per draft position and per depth",
    "natural_tok_s_vs_concurrency": "Natural prompts: aggregate output tok/s vs concurrency",
    "natural_ttft_vs_concurrency": "Natural prompts: TTFT p50 and p95 vs concurrency",
    "natural_tpot_vs_concurrency": "Natural prompts: TPOT p50 and p95 vs concurrency",
    "natural_pareto": "Natural prompts: throughput per GPU against per-user speed (Pareto frontier)",
    "quality_frontier": "Quality against speed: greedy agreement with the reference over decode speed-up",
    "load_slo_vs_rate": "Open-loop load: SLO attainment and goodput vs offered rate",
    "session_ttft_by_turn": "Multi-turn sessions: TTFT and the prefix cache's share of the prompt by turn",
}


@dataclass(frozen=True)
class CellFiles:
    """One cell's files: its result, its provenance, its failure record and its log."""

    raw: str
    provenance: str
    failure: str
    log: str
