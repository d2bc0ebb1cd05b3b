"""A schema-validated config document resolved into a Grid: each config's engine, checkpoint
and speculation looked up by name, and what the schema cannot say checked (references,
secrets kept off command lines, a speculation method the engine's kind serves, filters).

Pure. Only loading.load_grid calls resolve_grid: a document that skipped the schema (and
its defaults) would fail here on a missing key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

from gridbench import codec
from gridbench.engines.kinds import engine_kind
from gridbench.errors import ConfigError
from gridbench.files import JsonObject
from gridbench.grid import (
    BenchySettings,
    Checkpoint,
    Engine,
    FilterKey,
    Grid,
    Serving,
    ServingConfig,
    Speculation,
    StudyInfo,
    Volume,
)
from gridbench.harness.prompts import NaturalSettings
from gridbench.provenance import SECRET_NAME

# each filter key and the config section that declares its names
FILTER_KEYS: dict[FilterKey, str] = {
    "engine": "engines",
    "checkpoint": "checkpoints",
    "speculation": "speculations",
    "config": "configs",
}


def resolve_grid(document: JsonObject, source: str) -> Grid:
    """The Grid of a schema-validated config (defaults filled in), which it keeps as its
    ``document``; a ConfigError names the key of any broken reference or rule."""
    engines = {n: _engine(n, e) for n, e in document["engines"].items()}
    checkpoints = {n: _checkpoint(n, c) for n, c in document["checkpoints"].items()}
    speculations = {n: _speculation(n, s) for n, s in document["speculations"].items()}
    declared: dict[FilterKey, Mapping[str, Engine | Checkpoint | Speculation]] = {
        "engine": engines,
        "checkpoint": checkpoints,
        "speculation": speculations,
    }
    configs = {}
    for name, entry in document["configs"].items():
        for key, table in declared.items():
            if entry[key] not in table:
                raise ConfigError(
                    f"{source}: key configs.{name}.{key}: unknown {key} {entry[key]!r}; "
                    f"allowed values: {', '.join(table)}",
                    hint=f"declare {entry[key]!r} under {FILTER_KEYS[key]} or fix the name",
                )
        volumes = tuple(Volume(**v) for v in entry.get("volumes", []))
        _check_no_literal_secrets(f"configs.{name}", entry.get("env", {}))
        _check_no_secrets_in_arguments(
            f"configs.{name}", [*entry.get("extra_args", []), *_volume_paths(volumes)]
        )
        engine = engines[entry["engine"]]
        speculation = speculations[entry["speculation"]]
        _check_speculation(source, name, engine, speculation)
        serving = Serving(**{**document["serving"], **entry.get("serving", {})})
        checkpoint = checkpoints[entry["checkpoint"]]
        configs[name] = ServingConfig(
            name=name,
            label=entry.get("label") or f"{checkpoint.quantization} · {engine.label} · {speculation.label}",
            engine=engine,
            checkpoint=checkpoint,
            speculation=speculation,
            serving=serving,
            extra_args=tuple(map(str, entry.get("extra_args", []))),
            env={k: str(v) for k, v in entry.get("env", {}).items()},
            volumes=volumes,
            bench_extra_body=dict(entry.get("bench", {}).get("extra_body", {})),
        )
    benchy_settings = dict(document["benchy"])
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
    depths = tuple(sorted(document.get("depths", ())))
    natural = codec.from_json(NaturalSettings, document["natural"]) if "natural" in document else None
    study = codec.from_json(StudyInfo, document.get("study", {}))
    if not depths and natural is None:
        raise ConfigError(
            f"{source}: the study measures nothing: depths is empty and there is no natural section",
            hint="list llama-benchy depths, or add a natural: section (or both)",
        )
    allowed: dict[FilterKey, list[str]] = {
        "config": list(configs),
        "engine": list(dict.fromkeys(c.engine.name for c in configs.values())),
        "checkpoint": list(dict.fromkeys(c.checkpoint.name for c in configs.values())),
        "speculation": list(dict.fromkeys(c.speculation.name for c in configs.values())),
    }
    return Grid(
        source=source,
        configs=configs,
        depths=depths,
        benchy=benchy,
        natural=natural,
        study=study,
        gpu_slots=tuple(map(str, document["gpu_slots"])) if document.get("gpu_slots") else None,
        prefix_cache_pass=prefix_cache_pass,
        filters={
            key: _filter_values(key, document[key], allowed[key], source)
            for key in FILTER_KEYS
            if document.get(key) is not None
        },
        document=document,
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


def _engine(name: str, e: JsonObject) -> Engine:
    volumes = tuple(Volume(**v) for v in e["volumes"])
    _check_no_literal_secrets(f"engines.{name}", e["env"])
    _check_no_secrets_in_arguments(
        f"engines.{name}",
        [*e.get("command", []), *(e.get("entrypoint") or []), *e["extra_args"], *_volume_paths(volumes)],
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
        label=e.get("label") or name,
        image=e.get("image"),
        entrypoint=tuple(map(str, e["entrypoint"])) if e.get("entrypoint") is not None else None,
        command=tuple(map(str, e["command"])),
        env={k: str(v) for k, v in e["env"].items()},
        volumes=volumes,
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


def _checkpoint(name: str, c: JsonObject) -> Checkpoint:
    volumes = tuple(Volume(**v) for v in c["volumes"])
    _check_no_secrets_in_arguments(f"checkpoints.{name}", [c["model"], *_volume_paths(volumes)])
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
        volumes=volumes,
    )


def _speculation(name: str, s: JsonObject) -> Speculation:
    volumes = tuple(Volume(**v) for v in s["volumes"])
    _check_no_secrets_in_arguments(
        f"speculations.{name}",
        [*s["extra_args"], *map(json.dumps, s["extra"].values()), *_volume_paths(volumes)],
    )
    method = s["method"]
    k = s.get("num_speculative_tokens")
    fallback_label = "none" if method == "none" else (f"{method} n={k}" if k else method)
    return Speculation(
        name=name,
        method=method,
        label=s.get("label") or fallback_label,
        draft_model=s["draft_model"],
        num_speculative_tokens=k,
        extra=dict(s["extra"]),
        cli_form=s["cli_form"],
        extra_args=tuple(map(str, s["extra_args"])),
        files=tuple(s["files"]),
        volumes=volumes,
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
