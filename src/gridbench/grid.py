"""The grid as typed, validated data: configs resolved from engines, checkpoints and
speculations, and the cells a sweep runs.

Pure: no I/O beyond reading the schema and YAML files handed in by the caller.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gridbench.engines.kinds import engine_kind
from gridbench.errors import ConfigError
from gridbench.harness.prompts import NaturalSettings
from gridbench.provenance import SECRET_NAME

FILTER_KEYS = {
    "engine": "engines",
    "checkpoint": "checkpoints",
    "speculation": "speculations",
    "config": "configs",
}


@cache
def schema() -> dict[str, Any]:
    text = resources.files("gridbench").joinpath("data/config.schema.yaml").read_text()
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


@cache
def _validator_class() -> Any:  # a jsonschema validator class, made at run time
    """A 2020-12 validator that fills in schema defaults as it descends, as
    snakemake.utils.validate does (imported lazily: cells never validate)."""
    import jsonschema

    validator_class = jsonschema.Draft202012Validator
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(
        validator: Any, properties: dict[str, Any], instance: Any, schema_: Any
    ) -> Iterator[Any]:
        if isinstance(instance, dict):
            for name, subschema in properties.items():
                if "default" in subschema and name not in instance:
                    instance[name] = copy.deepcopy(subschema["default"])
        yield from validate_properties(validator, properties, instance, schema_)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


def _key_path(error: Any) -> str:  # a jsonschema ValidationError
    return ".".join(str(part) for part in error.absolute_path) or "(top level)"


def _explain(error: Any) -> str:
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        return f"{error.message}; allowed keys: {', '.join(allowed)}"
    if (
        error.validator == "type"
        and error.validator_value == "boolean"
        and str(error.instance).lower()
        in (
            "true",
            "false",
        )
    ):
        return f"{error.message} (snakemake --config reads only True and False as booleans)"
    if error.validator == "enum":
        return (
            f"{error.instance!r} is not allowed; allowed values: {', '.join(map(str, error.validator_value))}"
        )
    return str(error.message)


def _validate(document: dict[str, Any], source: str) -> None:
    """Check against the schema, filling its defaults into ``document`` in place."""
    errors = sorted(_validator_class()(schema()).iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        error = min(errors, key=lambda e: len(e.absolute_path))  # the outermost is the clearest
        raise ConfigError(
            f"{source}: key {_key_path(error)}: {_explain(error)}",
            hint=f"fix {_key_path(error)} in {source} (see config/README.md for every key)",
        )


def load_grid(config: Mapping[str, Any], source: str, files: Iterable[Path] = ()) -> Grid:
    """The one way from a config to a Grid, for the rules and the CLI alike: the config is
    validated against the schema (the only home of its defaults, filled into a copy), its
    references and per-kind rules checked. ``files`` are the YAML files it was merged from,
    read again for what YAML loading lets pass (a key given twice). A hand-written config
    either loads or fails with a ConfigError naming the key."""
    for path in files:
        read_config_file(path)
    document = copy.deepcopy(dict(config))
    _validate(document, source)
    return Grid.from_document(document, source)


def load_grid_json(path: Path) -> Grid:
    """A grid file: the validated config the workflow wrote (or one written by hand)."""
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise ConfigError(
            f"grid file {path} does not exist", hint="the workflow writes it; run snakemake, not this by hand"
        ) from err
    except json.JSONDecodeError as err:
        raise ConfigError(f"grid file {path} is not JSON: {err}") from err
    if not isinstance(document, dict):
        raise ConfigError(f"grid file {path} must hold a JSON object")
    return load_grid(document, str(path))


class _StrictLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no types
    """YAML that refuses a key given twice in one mapping (plain YAML keeps the last)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` merges, and may then be overridden on purpose
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(
                    f"key {key!r} is given twice (line {key_node.start_mark.line + 1})",
                    hint="names must be unique: rename or remove one of them",
                )
            seen.add(key)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def read_config_file(path: Path) -> dict[str, Any]:
    """One config file, strictly parsed: syntax errors and duplicate keys name the file."""
    try:
        data = yaml.load(path.read_text(), Loader=_StrictLoader) or {}
    except FileNotFoundError as err:
        raise ConfigError(f"config file {path} does not exist") from err
    except ConfigError as err:
        raise ConfigError(f"{path}: {err.message}", hint=err.hint) from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping at the top level")
    return data


def load_grid_files(paths: Iterable[str | Path], overrides: Mapping[str, Any] | None = None) -> Grid:
    """Config files merged as Snakemake merges them (later files win, then ``--config``)."""
    files = [Path(p) for p in paths]
    merged: dict[str, Any] = {}
    for path in files:
        _merge(merged, read_config_file(path))
    if overrides:
        _merge(merged, dict(overrides))
    return load_grid(merged, " + ".join(map(str, files)) or "config")


def _merge(into: dict[str, Any], update: Mapping[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


@dataclass(frozen=True)
class Volume:
    host: str
    container: str
    read_only: bool = True


@dataclass(frozen=True)
class Engine:
    name: str
    kind: str
    runtime: str
    label: str
    image: str | None
    entrypoint: tuple[str, ...] | None
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
class Checkpoint:
    name: str
    model: str
    quantization: str
    weights: str  # shared by checkpoints of the same weights; the engine comparison pairs on it
    quantization_flag: str | None
    dtype: str | None
    served_model_name: str
    tokenizer: str | None
    active_weight_gb: float | None
    files: tuple[str, ...]
    volumes: tuple[Volume, ...]


@dataclass(frozen=True)
class Speculation:
    name: str
    method: str
    label: str
    draft_model: str | None
    num_speculative_tokens: int | None
    extra: dict[str, Any]
    cli_form: str
    extra_args: tuple[str, ...]
    files: tuple[str, ...]
    volumes: tuple[Volume, ...]

    @property
    def enabled(self) -> bool:
        return self.method != "none"


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
    extra_body: dict[str, Any]
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
    bench_extra_body: dict[str, Any]

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_prefix_cache(self) -> ServingConfig:
        """The config as its prefix-cache pass serves it: the engine's prefix cache on. A
        config that has it off gets a second engine (another fingerprint), so its cold cells
        keep measuring an engine without the cache's bookkeeping."""
        return replace(self, serving=replace(self.serving, prefix_caching=True))

    def fingerprint(self) -> str:
        """Hash of everything that decides how the engine is started."""
        data = self.to_dict()
        data.pop("label")
        data.pop("bench_extra_body")
        data["engine"].pop("label")
        data["checkpoint"].pop("weights")
        data["speculation"].pop("label")
        encoded = json.dumps(data, sort_keys=True, default=str).encode()
        return hashlib.sha256(encoded).hexdigest()[:16]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServingConfig:
        def volumes(items: Iterable[Mapping[str, Any]]) -> tuple[Volume, ...]:
            return tuple(Volume(**v) for v in items)

        def tupled(d: Mapping[str, Any], cls_: type[Any], **extra: Any) -> Any:
            d = dict(d)
            for key, value in list(d.items()):
                if key == "volumes":
                    d[key] = volumes(value)
                elif isinstance(value, list):
                    d[key] = tuple(value)
            return cls_(**d, **extra)

        return cls(
            name=data["name"],
            label=data["label"],
            engine=tupled(data["engine"], Engine),
            checkpoint=tupled(data["checkpoint"], Checkpoint),
            speculation=tupled(data["speculation"], Speculation),
            serving=Serving(**data["serving"]),
            extra_args=tuple(data["extra_args"]),
            env=dict(data["env"]),
            volumes=volumes(data["volumes"]),
            bench_extra_body=dict(data["bench_extra_body"]),
        )


@dataclass(frozen=True)
class Hardware:
    name: str | None = None
    memory_bandwidth_gb_s: float | None = None  # the decode roofline's numerator


@dataclass(frozen=True)
class CapacityTargets:
    ttft_ms_p50: float | None = None
    tpot_ms_p50: float | None = None


@dataclass(frozen=True)
class StudyInfo:
    """The ``study:`` section: what the report says the study is, and the facts its analyses
    use (baselines, the machine's bandwidth, latency targets)."""

    title: str | None = None
    description: str | None = None
    baseline: Mapping[str, str] = field(default_factory=dict)  # config -> its baseline config
    hardware: Hardware = Hardware()
    capacity: CapacityTargets = CapacityTargets()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StudyInfo:
        return cls(
            title=data.get("title"),
            description=data.get("description"),
            baseline=dict(data.get("baseline") or {}),
            hardware=Hardware(**data.get("hardware", {})),
            capacity=CapacityTargets(**data.get("capacity", {})),
        )


@dataclass(frozen=True)
class PlannedDepthCell:
    """A llama-benchy cell of the grid, by its coordinates (cell.DepthCell runs one)."""

    config: str
    depth: int


@dataclass(frozen=True)
class PlannedNaturalCell:
    """A natural-prompt cell of the grid, by its coordinates (cell.NaturalCell runs one)."""

    config: str
    prompt_class: str
    concurrency: int


@dataclass(frozen=True)
class SkippedDepthCell:
    config: str
    depth: int
    reason: str


@dataclass
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
    filters: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # the validated config with its defaults filled: what the workflow writes as its grid file
    document: dict[str, Any] = field(default_factory=dict, repr=False)
    _dicts: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

    @classmethod
    def from_document(cls, config: dict[str, Any], source: str) -> Grid:
        """Build from a schema-validated config (defaults filled in); checks references.
        Only load_grid calls this: a config that skipped the schema would fail here."""
        engines = {n: _engine(n, e) for n, e in config["engines"].items()}
        checkpoints = {n: _checkpoint(n, c) for n, c in config["checkpoints"].items()}
        speculations = {n: _speculation(n, s) for n, s in config["speculations"].items()}
        configs = {}
        for name, entry in config["configs"].items():
            for key, table in (
                ("engine", engines),
                ("checkpoint", checkpoints),
                ("speculation", speculations),
            ):
                if entry[key] not in table:
                    raise ConfigError(
                        f"{source}: key configs.{name}.{key}: unknown {key} {entry[key]!r}; "
                        f"allowed values: {', '.join(table)}",
                        hint=f"declare {entry[key]!r} under {FILTER_KEYS[key]} or fix the name",
                    )
            _check_no_literal_secrets(f"configs.{name}", entry.get("env", {}))
            _check_no_secrets_in_arguments(
                f"configs.{name}",
                [*entry.get("extra_args", []), *_volume_paths(entry.get("volumes", []))],
            )
            engine = engines[entry["engine"]]
            speculation = speculations[entry["speculation"]]
            _check_speculation(source, name, engine, speculation)
            serving = Serving(**{**config["serving"], **entry.get("serving", {})})
            checkpoint = checkpoints[entry["checkpoint"]]
            configs[name] = ServingConfig(
                name=name,
                label=entry.get("label")
                or f"{checkpoint.quantization} · {engine.label} · {speculation.label}",
                engine=engine,
                checkpoint=checkpoint,
                speculation=speculation,
                serving=serving,
                extra_args=tuple(map(str, entry.get("extra_args", []))),
                env={k: str(v) for k, v in entry.get("env", {}).items()},
                volumes=tuple(Volume(**v) for v in entry.get("volumes", [])),
                bench_extra_body=dict(entry.get("bench", {}).get("extra_body", {})),
            )
        benchy_settings = dict(config["benchy"])
        prefix_cache_pass = tuple(benchy_settings.pop("prefix_cache_pass", ()))
        unknown = [name for name in prefix_cache_pass if name not in configs]
        if unknown:
            raise ConfigError(
                f"{source}: key benchy.prefix_cache_pass: unknown config {', '.join(map(repr, unknown))}; "
                f"allowed values: {', '.join(configs)}",
                hint="list config names declared under configs",
            )
        benchy = BenchySettings(**benchy_settings)
        for name, cfg in configs.items():
            if benchy.pp + benchy.tg > cfg.serving.max_model_len:
                raise ConfigError(
                    f"{source}: key benchy.pp + benchy.tg = {benchy.pp + benchy.tg} exceeds "
                    f"configs.{name}'s max_model_len {cfg.serving.max_model_len}: no cell could run",
                    hint="lower benchy.pp/tg or raise serving.max_model_len",
                )
        grid = cls(
            source=source,
            configs=configs,
            depths=tuple(sorted(config.get("depths", ()))),
            benchy=benchy,
            natural=NaturalSettings.from_dict(config["natural"]) if "natural" in config else None,
            study=StudyInfo.from_dict(config.get("study", {})),
            gpu_slots=tuple(map(str, config["gpu_slots"])) if config.get("gpu_slots") else None,
            prefix_cache_pass=prefix_cache_pass,
            document=config,
        )
        if not grid.depths and grid.natural is None:
            raise ConfigError(
                f"{source}: the study measures nothing: depths is empty and there is no natural section",
                hint="list llama-benchy depths, or add a natural: section (or both)",
            )
        grid.filters = grid._parse_filters(config)
        return grid

    def _parse_filters(self, config: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
        allowed = {
            "config": list(self.configs),
            "engine": list(dict.fromkeys(c.engine.name for c in self.configs.values())),
            "checkpoint": list(dict.fromkeys(c.checkpoint.name for c in self.configs.values())),
            "speculation": list(dict.fromkeys(c.speculation.name for c in self.configs.values())),
        }
        filters = {}
        for key in FILTER_KEYS:
            raw = config.get(key)
            if raw is None:
                continue
            values = tuple(v.strip() for v in str(raw).split(",") if v.strip())
            unknown = [v for v in values if v not in allowed[key]]
            if unknown or not values:
                raise ConfigError(
                    f"--config {key}={raw}: unknown {key} {', '.join(unknown) or '(empty)'}; "
                    f"allowed values: {', '.join(allowed[key])}",
                    hint=f"pick {key}s used by the configs of {self.source}",
                )
            filters[key] = values
        return filters

    def config_dict(self, name: str) -> dict[str, Any]:
        """``configs[name].to_dict()``, computed once: the workflow asks for it per cell."""
        if name not in self._dicts:
            self._dicts[name] = self.configs[name].to_dict()
        return self._dicts[name]

    def selected(self) -> list[ServingConfig]:
        """Configs that pass every filter, in declaration order."""

        def keep(c: ServingConfig) -> bool:
            names = {
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

    def cells(self) -> tuple[list[PlannedDepthCell], list[SkippedDepthCell]]:
        """Scheduled cells in run order (config-major), and the cells too long to run."""
        scheduled, skipped = [], []
        for cfg in self.selected():
            for depth in self.depths:
                needed = depth + self.benchy.pp + self.benchy.tg
                if needed > cfg.serving.max_model_len:
                    skipped.append(
                        SkippedDepthCell(
                            cfg.name,
                            depth,
                            f"depth {depth} + pp {self.benchy.pp} + tg {self.benchy.tg} = {needed} "
                            f"exceeds max_model_len {cfg.serving.max_model_len}",
                        )
                    )
                else:
                    scheduled.append(PlannedDepthCell(cfg.name, depth))
        return scheduled, skipped

    def prefix_cache_cells(self) -> list[PlannedDepthCell]:
        """The prefix-cache pass's cells, one per scheduled cell with context of a config in
        benchy.prefix_cache_pass (at depth 0 there is no context to cache)."""
        return [c for c in self.cells()[0] if c.config in self.prefix_cache_pass and c.depth > 0]

    def natural_cells(self) -> list[PlannedNaturalCell]:
        """Natural-prompt cells in run order: config, then prompt class, then concurrency."""
        if self.natural is None:
            return []
        return [
            PlannedNaturalCell(cfg.name, prompt_class, concurrency)
            for cfg in self.selected()
            for prompt_class in self.natural.prompt_classes
            for concurrency in self.natural.concurrency
        ]


def _label(entry: Mapping[str, Any], fallback: str) -> str:
    return entry.get("label") or fallback


def _check_no_literal_secrets(where: str, env: Mapping[str, Any]) -> None:
    for name in env:
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


def _check_no_secrets_in_arguments(where: str, values: Iterable[Any]) -> None:
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


def _volume_paths(volumes: Iterable[Mapping[str, Any]]) -> list[str]:
    return [path for v in volumes for path in (v["host"], v["container"])]


def _engine(name: str, e: Mapping[str, Any]) -> Engine:
    _check_no_literal_secrets(f"engines.{name}", e["env"])
    _check_no_secrets_in_arguments(
        f"engines.{name}",
        [*e.get("command", []), *(e.get("entrypoint") or []), *e["extra_args"], *_volume_paths(e["volumes"])],
    )
    if e["runtime"] == "docker" and not e.get("image"):
        raise ConfigError(
            f"key engines.{name}.image: the docker runtime needs an image",
            hint=f"set engines.{name}.image or use runtime: process",
        )
    if e["runtime"] == "process" and not e.get("command"):
        raise ConfigError(
            f"key engines.{name}.command: the process runtime needs a command",
            hint="e.g. command: [vllm, serve] or [llama-server]",
        )
    return Engine(
        name=name,
        kind=e["kind"],
        runtime=e["runtime"],
        label=_label(e, name),
        image=e.get("image"),
        entrypoint=tuple(map(str, e["entrypoint"])) if e.get("entrypoint") is not None else None,
        command=tuple(map(str, e["command"])),
        env={k: str(v) for k, v in e["env"].items()},
        volumes=tuple(Volume(**v) for v in e["volumes"]),
        files=tuple(e["files"]),
        extra_args=tuple(map(str, e["extra_args"])),
        host=e["host"],
        port=e["port"],
        port_in_use=e["port_in_use"],
        network=e["network"],
        gpus=e["gpus"],
        ipc=e["ipc"],
        shm_size=e["shm_size"],
        ulimits=dict(e["ulimits"]),
        privileged=e["privileged"],
        health_path=e["health_path"],
        startup_timeout_s=float(e["startup_timeout_s"]),
        fatal_log_patterns=tuple(e["fatal_log_patterns"]),
        api_key_env=e["api_key_env"],
        pass_env=tuple(e["pass_env"]),
    )


def _checkpoint(name: str, c: Mapping[str, Any]) -> Checkpoint:
    _check_no_secrets_in_arguments(f"checkpoints.{name}", [c["model"], *_volume_paths(c["volumes"])])
    return Checkpoint(
        name=name,
        model=c["model"],
        quantization=c["quantization"],
        weights=c["weights"] or name,
        quantization_flag=c["quantization_flag"],
        dtype=c["dtype"],
        served_model_name=c.get("served_model_name") or name,
        tokenizer=c.get("tokenizer"),
        active_weight_gb=c.get("active_weight_gb"),
        files=tuple(c["files"]),
        volumes=tuple(Volume(**v) for v in c["volumes"]),
    )


def _speculation(name: str, s: Mapping[str, Any]) -> Speculation:
    _check_no_secrets_in_arguments(
        f"speculations.{name}",
        [*s["extra_args"], *map(json.dumps, s["extra"].values()), *_volume_paths(s["volumes"])],
    )
    method = s["method"]
    if method == "none":
        label = _label(s, "none")
    else:
        k = s.get("num_speculative_tokens")
        label = _label(s, f"{method} n={k}" if k else method)
    return Speculation(
        name=name,
        method=method,
        label=label,
        draft_model=s["draft_model"],
        num_speculative_tokens=s.get("num_speculative_tokens"),
        extra=dict(s["extra"]),
        cli_form=s["cli_form"],
        extra_args=tuple(map(str, s["extra_args"])),
        files=tuple(s["files"]),
        volumes=tuple(Volume(**v) for v in s["volumes"]),
    )


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
