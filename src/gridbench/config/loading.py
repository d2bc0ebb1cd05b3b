"""The one way from a config to a Grid, for the rules and the CLI alike: YAML files read
strictly and merged as Snakemake merges them, the schema's check filling its defaults into a
copy, its sections structured into records, then resolve.resolve_grid. A hand-written config
either loads or fails with a ConfigError naming the key.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import cattrs
import yaml

from gridbench.config.grid import Grid
from gridbench.config.resolve import TABLES, ConfigSections, resolve_grid
from gridbench.errors import ConfigError
from gridbench.util import codec
from gridbench.util.files import JsonObject


@cache
def schema() -> JsonObject:
    text = resources.files("gridbench").joinpath("data/config.schema.yaml").read_text()
    loaded: JsonObject = yaml.safe_load(text)
    return loaded


@cache
def _validator_class() -> Any:  # a jsonschema validator class, made at run time
    """A 2020-12 validator that fills in schema defaults as it descends, as
    snakemake.utils.validate does (imported lazily: cells never validate)."""
    import jsonschema

    validator_class = jsonschema.Draft202012Validator
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator: Any, properties: JsonObject, instance: Any, schema_: Any) -> Iterator[Any]:
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


def load_grid(config: JsonObject, source: str, files: Iterable[Path] = ()) -> Grid:
    """The one way from a config to a Grid, for the rules and the CLI alike: the config is
    validated against the schema (the only home of its defaults, filled into a copy), its
    references and per-kind rules checked. ``files`` are the YAML files it was merged from,
    read again for what YAML loading lets pass (a key given twice). A hand-written config
    either loads or fails with a ConfigError naming the key."""
    for path in files:
        read_config_file(path)
    document = copy.deepcopy(dict(config))
    # checking fills in the schema's defaults, as snakemake.utils.validate does
    errors = sorted(_validator_class()(schema()).iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        error = min(errors, key=lambda e: len(e.absolute_path))  # the outermost is the clearest
        raise ConfigError(
            f"{source}: key {_key_path(error)}: {_explain(error)}",
            hint=f"fix {_key_path(error)} in {source} (see docs/config-reference.md for every key)",
        )
    # the records of the document's sections; each table entry is named by its key
    named = {
        table: {name: {**entry, "name": name} for name, entry in document[table].items()} for table in TABLES
    }
    try:
        sections = codec.from_json(ConfigSections, {**document, **named})
    except cattrs.BaseValidationError as err:  # a schema that lets through what no record holds
        raise ConfigError(f"{source}: {'; '.join(cattrs.transform_error(err, path='config'))}") from err
    return replace(resolve_grid(sections, source), document=document)


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


def read_config_file(path: Path) -> JsonObject:
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


def load_grid_files(paths: Iterable[str | Path], overrides: JsonObject | None = None) -> Grid:
    """Config files merged as Snakemake merges them (later files win, then ``--config``)."""
    files = [Path(p) for p in paths]
    merged: JsonObject = {}
    for path in files:
        _merge(merged, read_config_file(path))
    if overrides:
        _merge(merged, overrides)
    return load_grid(merged, " + ".join(map(str, files)) or "config")


def _merge(into: JsonObject, update: JsonObject) -> None:
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], dict(value))
        else:
            into[key] = copy.deepcopy(value)
