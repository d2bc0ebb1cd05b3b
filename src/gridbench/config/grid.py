"""The grid as typed data: configs resolved from engines, checkpoints and speculations,
the benchmark settings, and the filters that select configs (cells/plan.py enumerates the cells).

Pure: loading.load_grid is the one way from a config to a Grid (resolve.py builds it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from gridbench.errors import ConfigError
from gridbench.harness.arrivals import LoadSettings
from gridbench.harness.prompts import NaturalSettings, QualitySettings, SessionSettings
from gridbench.util import codec
from gridbench.util.files import JsonObject

# `--config engine=a,b` and its kin: the name a filter matches on
FilterKey = Literal["engine", "checkpoint", "speculation", "config"]


@dataclass(frozen=True)
class Volume:
    host: str
    container: str
    read_only: bool = True


# Engines, checkpoints and speculations: an entry's keys as the schema fills them in, and
# its name (the table's key). A key the schema gives no default may be left out: None, or ""
# where resolve.resolve_grid puts a value derived from the name. Keyword-only, so that the
# fields keep the schema's key order (provenance records hold it) with defaults among them.


@dataclass(frozen=True, kw_only=True)
class Engine:
    name: str
    kind: str
    runtime: str
    label: str = ""  # the engine's name when not given
    image: str | None = None
    entrypoint: tuple[str, ...] | None = None
    command: tuple[str, ...]
    env: dict[str, str]
    volumes: tuple[Volume, ...]
    files: tuple[str, ...]
    extra_args: tuple[str, ...]
    host: str
    port: int
    port_in_use: str
    network: str
    gpus: bool
    ipc: str | None
    shm_size: str | None
    ulimits: dict[str, int]
    privileged: bool
    health_path: str
    startup_timeout_s: float
    fatal_log_patterns: tuple[str, ...]
    api_key_env: str | None
    pass_env: tuple[str, ...]


@dataclass(frozen=True)
class WeightsOrigin:
    """A checkpoint's declaration of what its weights are."""

    kind: Literal["real", "random"]
    source: str | None = None

    @property
    def real(self) -> bool:
        return self.kind == "real"


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    name: str
    model: str
    quantization: str
    # shared by checkpoints of the same weights; the engine comparison pairs on it. null in
    # the config: resolve.resolve_grid puts the checkpoint's name
    weights: str | None
    # left out of a context file while undeclared, so declaring none reruns no cell
    origin: WeightsOrigin | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)
    quantization_flag: str | None
    dtype: str | None
    served_model_name: str = ""  # the checkpoint's name when not given
    tokenizer: str | None = None
    active_weight_gb: float | None = None
    files: tuple[str, ...]
    volumes: tuple[Volume, ...]


@dataclass(frozen=True, kw_only=True)
class Speculation:
    name: str
    method: str
    label: str = ""  # from the method and its token count when not given
    draft_model: str | None
    num_speculative_tokens: int | None = None
    extra: JsonObject
    cli_form: str
    extra_args: tuple[str, ...]
    files: tuple[str, ...]
    volumes: tuple[Volume, ...]

    @property
    def enabled(self) -> bool:
        return self.method != "none"


@dataclass(frozen=True, kw_only=True)
class DraftRecipe:
    """A ``drafts:`` entry: a head the workflow trains for a target (gridbench.drafts)."""

    name: str
    method: str
    model: str  # the target's Hugging Face folder on the host
    files: tuple[str, ...]
    python: str  # the interpreter of the heavy steps (vLLM, torch, speculators)
    env: dict[str, str]
    llm_args: JsonObject
    prompts: int
    max_tokens: int
    seq_length: int
    epochs: int
    lr: float
    draft_vocab_size: int
    total_seq_len: int
    seed: int
    threads: int
    # None: speculators' default for the method (EAGLE-3 1 layer; DFlash 5, blocks of 16, 512
    # anchors; DSpark 5, blocks of 8)
    draft_layers: int | None = None
    block_size: int | None = None
    max_anchors: int | None = None
    data_from: str | None = None  # another draft whose prompts, answers and hidden states this one trains on
    # of the hidden states and the training; left out of RECIPE.json at bfloat16, so that a
    # recipe recorded before the setting existed reads, and is written, as it was
    dtype: str = field(default="bfloat16", metadata=codec.OMITTED_WHEN_DEFAULT)

    @property
    def data_draft(self) -> str:
        """The draft whose data steps this one's training reads: its own, or data_from's."""
        return self.data_from or self.name

    @property
    def block_tokens(self) -> int | None:
        """The tokens a block drafter's head drafts a step, the k vLLM must serve it at: DFlash's
        block begins with the bonus token, DSpark's drafts from it too (None: no block drafter)."""
        if self.method not in SPECULATORS_BLOCK_SIZE:
            return None
        block = self.block_size or SPECULATORS_BLOCK_SIZE[self.method]
        return block - 1 if self.method == "dflash" else block


# speculators 0.9's block when a recipe leaves block_size unset (its TrainConfig defaults)
SPECULATORS_BLOCK_SIZE = {"dflash": 16, "dspark": 8}


# what a draft's data steps (prompts, answers, dataset, hidden states) depend on: a draft that
# trains on another's data must have the same
DRAFT_DATA_SETTINGS = (
    *("model", "files", "python", "env", "llm_args"),
    *("prompts", "max_tokens", "seq_length", "seed", "dtype"),
)


@dataclass(frozen=True)
class Serving:
    max_model_len: int
    gpu_memory_utilization: float
    prefix_caching: bool
    chunked_prefill: bool
    tensor_parallel_size: int
    parallel_slots: int


@dataclass(frozen=True)
class BenchySettings:
    pp: int
    tg: int
    exact_tg: bool
    runs: int
    concurrency: int
    latency_mode: str
    warmup: bool
    skip_coherence: bool
    extra_body: JsonObject
    corpus: str
    timeout_s: float
    transport_retries: int


@dataclass(frozen=True)
class ServingConfig:
    """One named config with everything resolved: what an engine start and a cell need."""

    name: str
    label: str
    engine: Engine
    checkpoint: Checkpoint
    speculation: Speculation
    serving: Serving
    extra_args: tuple[str, ...]
    env: dict[str, str]
    volumes: tuple[Volume, ...]
    bench_extra_body: JsonObject

    @property
    def serve_args(self) -> tuple[str, ...]:
        return self.engine.extra_args + self.speculation.extra_args + self.extra_args

    @property
    def all_env(self) -> dict[str, str]:
        return {**self.engine.env, **self.env}

    @property
    def all_volumes(self) -> tuple[Volume, ...]:
        return self.engine.volumes + self.checkpoint.volumes + self.speculation.volumes + self.volumes

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.engine.files + self.checkpoint.files + self.speculation.files))

    @property
    def weight_files(self) -> tuple[str, ...]:
        """Paths that may hold its weights: the model, the draft and the declared files."""
        paths = (self.checkpoint.model, self.speculation.draft_model, *self.files)
        return tuple(dict.fromkeys(p for p in paths if p))

    def with_prefix_cache(self) -> ServingConfig:
        """The config as its prefix-cache pass serves it: the engine's prefix cache on. A
        config that has it off gets a second engine (another fingerprint), so its cold cells
        keep measuring an engine without the cache's bookkeeping."""
        return replace(self, serving=replace(self.serving, prefix_caching=True))

    def fingerprint(self) -> str:
        """Hash of everything that decides how the engine is started."""
        data = codec.to_json(self)
        data.pop("label")
        data.pop("bench_extra_body")
        data["engine"].pop("label")
        data["checkpoint"].pop("weights")
        data["checkpoint"].pop("origin", None)  # what the weights are, not how they are served
        data["speculation"].pop("label")
        encoded = json.dumps(data, sort_keys=True, default=str).encode()
        return hashlib.sha256(encoded).hexdigest()[:16]


@dataclass(frozen=True)
class Hardware:
    name: str | None = None
    memory_bandwidth_gb_s: float | None = None  # the decode roofline's numerator
    gpu_hour_usd: float | None = None  # one GPU for one hour: the cost per token's price


@dataclass(frozen=True)
class CapacityTargets:
    ttft_ms_p50: float | None = None
    tpot_ms_p50: float | None = None


@dataclass(frozen=True)
class StudyInfo:
    """The ``study:`` section: what the report says the study is, and the facts its analyses
    use (baselines, the machine's bandwidth and GPU-hour price, latency targets)."""

    title: str | None = None
    description: str | None = None
    baseline: Mapping[str, str] = field(default_factory=dict)  # config -> its baseline config
    hardware: Hardware = Hardware()
    capacity: CapacityTargets = CapacityTargets()


@dataclass(frozen=True)
class Grid:
    """Every config of a study, the benchmark settings and the active filters."""

    source: str
    configs: dict[str, ServingConfig]
    depths: tuple[int, ...]
    benchy: BenchySettings
    natural: NaturalSettings | None
    study: StudyInfo
    gpu_slots: tuple[str, ...] | None
    # configs with a prefix-cache pass; kept out of BenchySettings, which every cell's context
    # holds: adding a config to the pass must not rerun the cold cells
    prefix_cache_pass: tuple[str, ...] = ()
    quality: QualitySettings | None = None  # the greedy-agreement cells' settings; None: none
    load: LoadSettings | None = None  # the open-loop load cells' settings; None: none
    sessions: SessionSettings | None = None  # the multi-turn session cells' settings; None: none
    drafts: Mapping[str, DraftRecipe] = field(default_factory=dict)  # heads the workflow trains
    filters: dict[FilterKey, tuple[str, ...]] = field(default_factory=dict)
    # the validated config with its defaults filled: what the workflow writes as its grid file
    document: JsonObject = field(default_factory=dict, repr=False)

    def selected(self) -> list[ServingConfig]:
        """Configs that pass every filter, in declaration order."""

        def keep(c: ServingConfig) -> bool:
            names: dict[FilterKey, str] = {
                "config": c.name,
                "engine": c.engine.name,
                "checkpoint": c.checkpoint.name,
                "speculation": c.speculation.name,
            }
            return all(names[key] in values for key, values in self.filters.items())

        chosen = [c for c in self.configs.values() if keep(c)]
        if not chosen:
            described = ", ".join(f"{k}={','.join(v)}" for k, v in self.filters.items())
            raise ConfigError(
                f"{self.source}: no config matches {described}",
                hint="loosen the filters; `gridbench cells --configfile ...` lists the grid",
            )
        return chosen
