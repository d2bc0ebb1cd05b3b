"""A schema-validated config document resolved into a Grid: each config's engine, checkpoint
and speculation looked up by name, and what the schema cannot say checked (references,
secrets kept off command lines, a speculation method the engine's kind serves, filters).

Pure. Only loading.load_grid calls resolve_grid, with the sections it structured from the
document the schema checked and filled with its defaults.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from gridbench import layout
from gridbench.cells.provenance import SECRET_NAME
from gridbench.config.grid import (
    DRAFT_DATA_SETTINGS,
    BenchySettings,
    Checkpoint,
    DraftRecipe,
    Engine,
    FilterKey,
    Grid,
    Serving,
    ServingConfig,
    Speculation,
    StudyInfo,
    Volume,
)
from gridbench.engines.kinds import engine_kind
from gridbench.errors import ConfigError
from gridbench.harness.arrivals import GAMMA, TRACE, LoadSettings
from gridbench.harness.prompts import NaturalSettings, QualitySettings, SessionSettings, load_prompts
from gridbench.util import codec
from gridbench.util.files import JsonObject

# each filter key and the config section that declares its names
FILTER_KEYS: dict[FilterKey, str] = {
    "engine": "engines",
    "checkpoint": "checkpoints",
    "speculation": "speculations",
    "config": "configs",
}


@dataclass(frozen=True)
class ServingOverrides:
    """A config's ``serving:``: the serving defaults it changes (None: the default)."""

    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    prefix_caching: bool | None = None
    chunked_prefill: bool | None = None
    tensor_parallel_size: int | None = None
    parallel_slots: int | None = None


@dataclass(frozen=True)
class BenchOverrides:
    """A config's ``bench:``: what it merges into every llama-benchy request."""

    extra_body: JsonObject = field(default_factory=dict)


@dataclass(frozen=True)
class ConfigEntry:
    """One ``configs:`` entry: the names of its engine, checkpoint and speculation, and its
    own settings."""

    name: str  # its key
    engine: str
    checkpoint: str
    speculation: str
    serving: ServingOverrides
    extra_args: tuple[str, ...]
    env: dict[str, str]
    volumes: tuple[Volume, ...]
    bench: BenchOverrides
    label: str = ""  # built from its parts' labels when not given


@dataclass(frozen=True)
class BenchySection:
    """The ``benchy:`` section: the settings of every depth cell, and the configs with a
    prefix-cache pass (kept out of the settings, which every cell's context holds)."""

    settings: BenchySettings = field(metadata=codec.INLINE)
    prefix_cache_pass: tuple[str, ...] = ()


@dataclass(frozen=True)
class QualitySection:
    """The ``quality:`` section as written (None: the default resolve_grid fills in)."""

    prompt_classes: tuple[str, ...] | None = None
    max_tokens: int = 64
    reference: str | None = None
    extra_body: JsonObject = field(default_factory=dict)
    teacher_forced_tokens: int = 256
    teacher_forced_top_k: int = 20


@dataclass(frozen=True)
class Filters:
    """``--config engine=a,b`` and its kin, as given (None: no filter)."""

    engine: str | None = None
    checkpoint: str | None = None
    speculation: str | None = None
    config: str | None = None

    def given(self) -> dict[FilterKey, str]:
        values: dict[FilterKey, str | None] = {
            "engine": self.engine,
            "checkpoint": self.checkpoint,
            "speculation": self.speculation,
            "config": self.config,
        }
        return {key: value for key, value in values.items() if value is not None}


@dataclass(frozen=True)
class ConfigSections:
    """A schema-validated config (defaults filled in) as records, each table entry named by
    its key: what resolve_grid resolves (loading.load_grid structures it)."""

    engines: dict[str, Engine]
    checkpoints: dict[str, Checkpoint]
    speculations: dict[str, Speculation]
    configs: dict[str, ConfigEntry]
    serving: Serving
    benchy: BenchySection
    depths: tuple[int, ...]
    gpu_slots: tuple[str, ...] | None
    natural: NaturalSettings | None = None
    quality: QualitySection | None = None
    load: LoadSettings | None = None
    sessions: SessionSettings | None = None
    drafts: dict[str, DraftRecipe] = field(default_factory=dict)
    study: StudyInfo = field(default_factory=StudyInfo)
    filters: Filters = field(default_factory=Filters, metadata=codec.INLINE)


# the sections whose entries are named by their key
TABLES = ("engines", "checkpoints", "speculations", "configs", "drafts")


def resolve_grid(sections: ConfigSections, source: str) -> Grid:
    """The Grid of a schema-validated config; a ConfigError names the key of any broken
    reference or rule. The Grid's ``document`` is left to the caller, which holds it."""
    declared = _Declared(
        engines={name: _engine(e) for name, e in sections.engines.items()},
        checkpoints={name: _checkpoint(c) for name, c in sections.checkpoints.items()},
        speculations={name: _speculation(s) for name, s in sections.speculations.items()},
    )
    configs = {
        name: _serving_config(source, name, entry, declared, sections.serving)
        for name, entry in sections.configs.items()
    }
    prefix_cache_pass = sections.benchy.prefix_cache_pass
    _check_prefix_cache_pass(source, prefix_cache_pass, configs)
    benchy = sections.benchy.settings
    _check_every_config_fits_a_cell(source, benchy, configs)
    if (
        not sections.depths
        and sections.natural is None
        and sections.quality is None
        and sections.load is None
        and sections.sessions is None
    ):
        raise ConfigError(
            f"{source}: the study measures nothing: depths is empty and there is no natural section "
            "(nor a quality, load or sessions section)",
            hint="list llama-benchy depths, or add a natural:, quality:, load: or sessions: section",
        )
    _check_load(sections.load, source)
    _check_draft_data(sections.drafts, source)
    _check_block_draft_k(sections.drafts, configs, source)
    allowed: dict[FilterKey, list[str]] = {
        "config": list(configs),
        "engine": list(dict.fromkeys(c.engine.name for c in configs.values())),
        "checkpoint": list(dict.fromkeys(c.checkpoint.name for c in configs.values())),
        "speculation": list(dict.fromkeys(c.speculation.name for c in configs.values())),
    }
    return Grid(
        source=source,
        configs=configs,
        depths=tuple(sorted(sections.depths)),
        benchy=benchy,
        natural=sections.natural,
        quality=_quality(sections.quality, sections.natural, configs, source),
        load=sections.load,
        sessions=sections.sessions,
        drafts=sections.drafts,
        study=sections.study,
        gpu_slots=sections.gpu_slots or None,
        prefix_cache_pass=prefix_cache_pass,
        filters={
            key: _filter_values(key, raw, allowed[key], source)
            for key, raw in sections.filters.given().items()
        },
    )


@dataclass(frozen=True)
class _Declared:
    """The engines, checkpoints and speculations the configs name, resolved."""

    engines: dict[str, Engine]
    checkpoints: dict[str, Checkpoint]
    speculations: dict[str, Speculation]

    def tables(self) -> dict[FilterKey, Mapping[str, Engine | Checkpoint | Speculation]]:
        return {"engine": self.engines, "checkpoint": self.checkpoints, "speculation": self.speculations}


def _serving_config(
    source: str, name: str, entry: ConfigEntry, declared: _Declared, serving: Serving
) -> ServingConfig:
    """One ``configs:`` entry with its parts looked up, once its references and rules hold."""
    _check_references(source, name, entry, declared)
    _check_no_literal_secrets(f"configs.{name}", entry.env)
    _check_no_secrets_in_arguments(f"configs.{name}", [*entry.extra_args, *_volume_paths(entry.volumes)])
    engine = declared.engines[entry.engine]
    speculation = declared.speculations[entry.speculation]
    _check_speculation(source, name, engine, speculation)
    overrides = {k: v for k, v in vars(entry.serving).items() if v is not None}
    checkpoint = declared.checkpoints[entry.checkpoint]
    return ServingConfig(
        name=name,
        label=entry.label or f"{checkpoint.quantization} · {engine.label} · {speculation.label}",
        engine=engine,
        checkpoint=checkpoint,
        speculation=speculation,
        serving=replace(serving, **overrides),
        extra_args=entry.extra_args,
        env=entry.env,
        volumes=entry.volumes,
        bench_extra_body=entry.bench.extra_body,
    )


def _check_references(source: str, name: str, entry: ConfigEntry, declared: _Declared) -> None:
    parts: dict[FilterKey, str] = {
        "engine": entry.engine,
        "checkpoint": entry.checkpoint,
        "speculation": entry.speculation,
    }
    for key, table in declared.tables().items():
        if (part := parts[key]) not in table:
            raise ConfigError(
                f"{source}: key configs.{name}.{key}: unknown {key} {part!r}; "
                f"allowed values: {', '.join(table)}",
                hint=f"declare {part!r} under {FILTER_KEYS[key]} or fix the name",
            )


def _check_prefix_cache_pass(
    source: str, prefix_cache_pass: tuple[str, ...], configs: Mapping[str, ServingConfig]
) -> None:
    unknown = [name for name in prefix_cache_pass if name not in configs]
    if unknown:
        raise ConfigError(
            f"{source}: key benchy.prefix_cache_pass: unknown config {', '.join(map(repr, unknown))}; "
            f"allowed values: {', '.join(configs)}",
            hint="list config names declared under configs",
        )


def _check_every_config_fits_a_cell(
    source: str, benchy: BenchySettings, configs: Mapping[str, ServingConfig]
) -> None:
    """Every config's context holds a llama-benchy request's prompt and generation."""
    for name, cfg in configs.items():
        if benchy.pp + benchy.tg > cfg.serving.max_model_len:
            raise ConfigError(
                f"{source}: key benchy.pp + benchy.tg = {benchy.pp + benchy.tg} exceeds "
                f"configs.{name}'s max_model_len {cfg.serving.max_model_len}: no cell could run",
                hint="lower benchy.pp/tg or raise serving.max_model_len",
            )


def _check_draft_data(drafts: Mapping[str, DraftRecipe], source: str) -> None:
    """A draft that trains on another's data names a draft that owns its data, with the same
    data settings: a setting that differed would be silently ignored."""
    for name, recipe in drafts.items():
        if recipe.data_from is None:
            continue
        key = f"{source}: key drafts.{name}.data_from"
        owner = drafts.get(recipe.data_from)
        if owner is None or owner.data_from is not None:
            owners = [n for n, r in drafts.items() if r.data_from is None and n != name]
            raise ConfigError(
                f"{key}: {recipe.data_from!r} is not a draft with data of its own; "
                f"allowed values: {', '.join(owners) or 'none'}",
                hint="name a draft that builds its own prompts, answers and hidden states",
            )
        differing = [s for s in DRAFT_DATA_SETTINGS if getattr(recipe, s) != getattr(owner, s)]
        if differing:
            settings = ", ".join(differing)
            raise ConfigError(
                f"{key}: draft {name} trains on {owner.name}'s data, but its {settings} "
                f"differ from {owner.name}'s",
                hint=f"give both drafts the same {settings}, or drop data_from to build its own data",
            )


def _check_block_draft_k(
    drafts: Mapping[str, DraftRecipe], configs: Mapping[str, ServingConfig], source: str
) -> None:
    """A trained block drafter's head is served at its block's k: vLLM takes any k and then
    drafts past the block the head was trained for, or fails inside the engine."""
    heads = {
        folder.format(draft=name): recipe
        for name, recipe in drafts.items()
        for folder in (layout.DRAFT_HEAD, layout.DRAFT_UNTRAINED_HEAD)
    }
    for name, config in configs.items():
        spec = config.speculation
        recipe = heads.get(spec.draft_model or "")
        if recipe is None or recipe.block_tokens in (None, spec.num_speculative_tokens):
            continue
        raise ConfigError(
            f"{source}: key speculations.{spec.name}.num_speculative_tokens (used by configs.{name}): "
            f"{spec.num_speculative_tokens}, but draft {recipe.name}'s {recipe.method} head drafts "
            f"{recipe.block_tokens} tokens a block",
            hint=f"serve it at num_speculative_tokens: {recipe.block_tokens}, or train it with the "
            f"block you want (drafts.{recipe.name}.block_size)",
        )


def _check_load(load: LoadSettings | None, source: str) -> None:
    """A gamma process states its shape, a trace its file, the others neither, and no process
    is listed twice."""
    if load is None:
        return
    for index, arrival in enumerate(load.arrivals):
        if (arrival.process == GAMMA) != (arrival.shape is not None):
            raise ConfigError(
                f"{source}: key load.arrivals.{index}: {arrival.process} "
                + ("needs a shape" if arrival.process == GAMMA else "takes no shape"),
                hint="give gamma a shape (e.g. shape: 0.5 for bursts), and poisson and trace none",
            )
        if (arrival.process == TRACE) != (arrival.trace is not None):
            raise ConfigError(
                f"{source}: key load.arrivals.{index}: {arrival.process} "
                + ("needs a trace file" if arrival.process == TRACE else "takes no trace file"),
                hint="name a trace file (gridbench load-trace writes one) for trace, and none otherwise",
            )
    names = [a.name for a in load.arrivals]
    if len(set(names)) != len(names):
        raise ConfigError(
            f"{source}: key load.arrivals: a process is listed twice ({', '.join(names)})",
            hint="list each arrival process (and gamma shape) once",
        )


def _quality(
    section: QualitySection | None,
    natural: NaturalSettings | None,
    configs: Mapping[str, ServingConfig],
    source: str,
) -> QualitySettings | None:
    """The quality section with its classes and prompt file filled in: the natural section's,
    else every packaged class; a declared reference must be a config."""
    if section is None:
        return None
    if section.reference is not None and section.reference not in configs:
        raise ConfigError(
            f"{source}: key quality.reference: unknown config {section.reference!r}; "
            f"allowed values: {', '.join(configs)}",
            hint="name a config declared under configs, or drop quality.reference",
        )
    prompt_file = natural.prompt_file if natural else None
    classes = section.prompt_classes or (
        natural.prompt_classes if natural else tuple(load_prompts(prompt_file))
    )
    return QualitySettings(
        prompt_classes=classes,
        prompt_file=prompt_file,
        max_tokens=section.max_tokens,
        reference=section.reference,
        extra_body=section.extra_body,
        teacher_forced_tokens=section.teacher_forced_tokens,
        teacher_forced_top_k=section.teacher_forced_top_k,
    )


def _filter_values(key: FilterKey, raw: object, allowed: list[str], source: str) -> tuple[str, ...]:
    """The names of one filter (``--config engine=a,b``), each one the grid declares."""
    values = tuple(v.strip() for v in str(raw).split(",") if v.strip())
    unknown = [v for v in values if v not in allowed]
    if unknown or not values:
        raise ConfigError(
            f"--config {key}={raw}: unknown {key} {', '.join(unknown) or '(empty)'}; "
            f"allowed values: {', '.join(allowed)}",
            hint=f"pick {key}s used by the configs of {source}",
        )
    return values


def _check_no_literal_secrets(where: str, env_names: Iterable[str]) -> None:
    for name in env_names:
        if SECRET_NAME.search(name):
            raise ConfigError(
                f"key {where}.env.{name}: a secret may not be written in a config file",
                hint=f"export {name} in the environment and list it under the engine's pass_env "
                "(or use api_key_env for the engine's API key)",
            )


# A credential flag of an engine's command line (--api-key, --hf-token, --token,
# --password, ...; --api-key-file names a file, not a secret), and values that look like a
# credential wherever they are written (OpenAI-style and Hugging Face keys, bearer headers).
_CREDENTIAL_FLAG = re.compile(r"^--?(api[-_]?key|(hf[-_])?token|password|secret|authorization)(=|$)", re.I)
_CREDENTIAL_VALUE = re.compile(
    r"\b(sk-[A-Za-z0-9_-]{12,}|hf_[A-Za-z0-9]{12,})|\bbearer\s+\S|authorization\s*:", re.I
)


def _check_no_secrets_in_arguments(where: str, values: Iterable[object]) -> None:
    """Refuse a credential in arguments and paths: the serve command line is printed by
    `gridbench engine command` and recorded in every provenance file and the dataset."""
    for value in map(str, values):
        flag = _CREDENTIAL_FLAG.match(value)
        if flag or _CREDENTIAL_VALUE.search(value):
            what = f"the flag {value.split('=', 1)[0]}" if flag else "a value that looks like a credential"
            raise ConfigError(
                f"key {where}: {what} would put a secret on the engine's command line, into "
                "every provenance record and the dataset",
                hint="export the key in the environment and name that variable in the engine's "
                "api_key_env: gridbench hands it to the engine as VLLM_API_KEY or LLAMA_API_KEY, "
                "never as an argument (other secrets: the engine's pass_env)",
            )


def _volume_paths(volumes: Iterable[Volume]) -> list[str]:
    return [path for v in volumes for path in (v.host, v.container)]


def _engine(engine: Engine) -> Engine:
    where = f"engines.{engine.name}"
    _check_no_literal_secrets(where, engine.env)
    _check_no_secrets_in_arguments(
        where,
        [*engine.command, *(engine.entrypoint or ()), *engine.extra_args, *_volume_paths(engine.volumes)],
    )
    if engine.runtime == "docker" and not engine.image:
        raise ConfigError(
            f"key {where}.image: the docker runtime needs an image",
            hint=f"set {where}.image or use runtime: process",
        )
    if engine.runtime == "process" and not engine.command:
        raise ConfigError(
            f"key {where}.command: the process runtime needs a command",
            hint="e.g. command: [vllm, serve] or [llama-server]",
        )
    # a whole number of seconds (900) as a float, as cells' contexts and fingerprints hold it
    return replace(
        engine, label=engine.label or engine.name, startup_timeout_s=float(engine.startup_timeout_s)
    )


def _checkpoint(checkpoint: Checkpoint) -> Checkpoint:
    _check_no_secrets_in_arguments(
        f"checkpoints.{checkpoint.name}", [checkpoint.model, *_volume_paths(checkpoint.volumes)]
    )
    return replace(
        checkpoint,
        weights=checkpoint.weights or checkpoint.name,
        served_model_name=checkpoint.served_model_name or checkpoint.name,
    )


def _speculation(spec: Speculation) -> Speculation:
    _check_no_secrets_in_arguments(
        f"speculations.{spec.name}",
        [*spec.extra_args, *map(json.dumps, spec.extra.values()), *_volume_paths(spec.volumes)],
    )
    if spec.label:
        return spec
    method, k = spec.method, spec.num_speculative_tokens
    return replace(spec, label="none" if method == "none" else (f"{method} n={k}" if k else method))


def _check_speculation(source: str, config: str, engine: Engine, spec: Speculation) -> None:
    if not spec.enabled:
        return
    kind = engine_kind(engine.kind)
    allowed = kind.speculation_methods
    where = f"{source}: key speculations.{spec.name}.method (used by configs.{config})"
    if spec.method not in allowed:
        raise ConfigError(
            f"{where}: {spec.method!r} is not a {engine.kind} method; allowed values: "
            f"{', '.join(sorted(allowed))}",
            hint=f"use a {engine.kind} method or put the config on another engine",
        )
    if spec.method in kind.draft_model_methods and not spec.draft_model:
        raise ConfigError(
            f"{where}: method {spec.method} needs draft_model",
            hint=f"set speculations.{spec.name}.draft_model",
        )
    if spec.num_speculative_tokens is None and spec.method != "suffix":
        raise ConfigError(
            f"{where}: method {spec.method} needs num_speculative_tokens",
            hint=f"set speculations.{spec.name}.num_speculative_tokens",
        )
    try:
        json.dumps(spec.extra)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: extra is not JSON: {err}") from err
