"""The config is declared once, in the schema (src/gridbench/data/config.schema.yaml: keys,
types, defaults, descriptions); everything else that names its keys is generated from it or
checked against it here, so that a key added, renamed or dropped in one place fails:

- docs/config-reference.md is rendered from the schema (`gridbench config-reference`);
- the records loading.load_grid structures the validated document into (resolve.ConfigSections
  and every record under it) have one field per schema key of the object they mirror;
- the filter keys (`--config engine=…`) of the records, the workflow and the CLI, and every
  `--config KEY=` the docs and scripts write, are schema keys.

Grid and ServingConfig are not mirrors: resolve.resolve_grid builds them from the records.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path

from gridbench import sweep
from gridbench.cli import build_parser, main
from gridbench.config.grid import (
    CapacityTargets,
    Checkpoint,
    DraftRecipe,
    Engine,
    FilterKey,
    Hardware,
    Serving,
    Speculation,
    StudyInfo,
    Volume,
    WeightsOrigin,
)
from gridbench.config.loading import schema
from gridbench.config.reference import (
    ELEMENT,
    ENTRY,
    REFERENCE_PATH,
    REGENERATE,
    config_reference,
    reference_keys,
    render_reference,
)
from gridbench.config.resolve import (
    FILTER_KEYS,
    BenchOverrides,
    BenchySection,
    ConfigEntry,
    ConfigSections,
    QualitySection,
    ServingOverrides,
)
from gridbench.harness.arrivals import Arrival, LoadSettings, Slo
from gridbench.harness.prompts import NaturalSettings, SessionSettings

ROOT = Path(__file__).resolve().parents[1]

# Record fields no schema key declares, each with the reason.
RECORD_ONLY = {
    (Engine, "name"): "the entry's key under engines",
    (Checkpoint, "name"): "the entry's key under checkpoints",
    (Speculation, "name"): "the entry's key under speculations",
    (ConfigEntry, "name"): "the entry's key under configs",
    (DraftRecipe, "name"): "the entry's key under drafts",
}
# Schema keys no record holds, each with the reason.
SCHEMA_ONLY = {
    "progress": "how a run is shown, not what it measures: progress.py reads it from Grid.document, "
    "and the workflow keeps it out of the grid files (gridbench.sweep.DISPLAY_KEYS), so turning it "
    "off reruns nothing",
    "progress_interval_s": "as progress",
}
# Every record the schema's objects are structured into; the walk from ConfigSections must
# reach each one, or the check below would pass without looking at it. (Filters and
# BenchySettings are inline: their fields are checked among ConfigSections' and BenchySection's.)
MIRRORS = {
    ConfigSections,
    StudyInfo,
    Hardware,
    CapacityTargets,
    Engine,
    Volume,
    Checkpoint,
    DraftRecipe,
    WeightsOrigin,
    Speculation,
    Serving,
    ConfigEntry,
    ServingOverrides,
    BenchOverrides,
    BenchySection,
    NaturalSettings,
    QualitySection,
    LoadSettings,
    Arrival,
    Slo,
    SessionSettings,
}


def _reference_keys() -> set[str]:
    return {key.path for key in reference_keys(config_reference(schema()))}


def test_the_committed_config_reference_is_the_one_the_schema_renders():
    committed = (ROOT / REFERENCE_PATH).read_text()
    assert committed == render_reference(config_reference(schema())), (
        f"{REFERENCE_PATH} differs from the schema: regenerate it with `{REGENERATE}`"
    )


def test_the_command_writes_the_reference(tmp_path):
    out = tmp_path / "config-reference.md"
    assert main(["config-reference", "--out", str(out)]) == 0
    assert out.read_text() == render_reference(config_reference(schema()))


def test_every_schema_key_has_a_description():
    undescribed = [k.path for k in reference_keys(config_reference(schema())) if not k.description.strip()]
    assert not undescribed, f"describe these keys in the schema: {', '.join(undescribed)}"


def test_the_reference_walks_into_tables_lists_and_references():
    keys = _reference_keys()
    # a table entry's keys, a list element's keys through a $ref, a $ref'd object's keys
    assert {
        "engines.<name>.kind",
        "configs.<name>.volumes[].host",
        "configs.<name>.serving.max_model_len",
    } <= keys


def _children(keys: set[str], path: str) -> set[str]:
    """The names of the keys right under ``path`` (the top level for "")."""
    prefix = f"{path}." if path else ""
    rest = (key[len(prefix) :] for key in keys if key.startswith(prefix))
    return {name for name in rest if "." not in name and ELEMENT not in name and name != ENTRY}


def _fields(record: type) -> dict[str, object]:
    """A record's document keys and their types: an inline record's fields among its own."""
    hints = typing.get_type_hints(record)
    fields: dict[str, object] = {}
    for field in dataclasses.fields(record):
        if field.metadata.get("gridbench.inline"):
            fields |= _fields(hints[field.name])
        else:
            fields[field.name] = hints[field.name]
    return fields


def _nested(hint: object) -> tuple[type, str] | None:
    """The record a field holds, and how its key path goes on: into it, into each entry of
    a table of them (``.<name>``), into each element of a tuple of them (``[]``)."""
    args = [a for a in typing.get_args(hint) if a is not type(None) and a is not Ellipsis]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _nested(args[0])
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint, ""
    if origin in (dict, Mapping) and dataclasses.is_dataclass(args[-1]):
        return args[-1], f".{ENTRY}"
    if origin is tuple and args and dataclasses.is_dataclass(args[0]):
        return args[0], ELEMENT
    return None


def _mirrors(record: type, path: str) -> Iterator[tuple[type, str, set[str]]]:
    """Each record under ``record`` (itself first), the schema path it mirrors, its keys."""
    fields = _fields(record)
    yield record, path, set(fields)
    for name, hint in fields.items():
        if nested := _nested(hint):
            inner, suffix = nested
            yield from _mirrors(inner, f"{path}.{name}{suffix}" if path else f"{name}{suffix}")


def test_each_config_record_has_a_field_per_key_of_the_schema_object_it_mirrors():
    keys = _reference_keys()
    drift = []
    for record, path, fields in _mirrors(ConfigSections, ""):
        declared = _children(keys, path) - {
            key.rsplit(".", 1)[-1] for key in SCHEMA_ONLY if _parent(key) == path
        }
        held = fields - {name for (cls, name) in RECORD_ONLY if cls is record}
        if declared != held:
            drift.append(
                f"{record.__name__} mirrors {path or 'the top level'}: fields without a schema key "
                f"{sorted(held - declared)}, schema keys without a field {sorted(declared - held)}"
            )
    assert not drift, "\n".join(drift) + "\n(a deliberate difference goes into RECORD_ONLY or SCHEMA_ONLY)"


def _parent(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ""


def test_the_record_walk_reaches_every_mirror_and_each_exception_still_exists():
    reached = {record: fields for record, _, fields in _mirrors(ConfigSections, "")}
    assert set(reached) >= MIRRORS, f"not reached: {MIRRORS - set(reached)}"
    assert all(name in reached[record] for record, name in RECORD_ONLY), "a RECORD_ONLY field is gone"
    assert set(SCHEMA_ONLY) <= _reference_keys(), "a SCHEMA_ONLY key is gone from the schema"


def test_the_filter_keys_are_the_schemas_filters_everywhere():
    filters = {
        name for name, node in schema()["properties"].items() if node["description"].startswith("Filter")
    }
    assert set(typing.get_args(FilterKey)) == set(FILTER_KEYS) == filters
    assert set(sweep.FILTERS) == filters


def test_the_workflows_display_keys_are_the_schema_keys_no_record_holds():
    assert set(sweep.DISPLAY_KEYS) == set(SCHEMA_ONLY)


# `--config key=value` (snakemake's and the CLI's), as commands and help texts write it;
# upper case is a placeholder (`--config KEY=VALUE`)
CONFIG_OPTION = re.compile(r"--config[ =]([a-z_][a-z0-9_]*)=")
# where commands are written for people and scripts to run
COMMAND_TEXTS = (
    "README.md",
    "ARCHITECTURE.md",
    "Snakefile",
    "docs/*.md",
    "config/**/*.md",
    "config/**/*.yaml",
    "studies/**/*.md",
    "scripts/*.sh",
    "workflow/**/*.smk",
    "src/gridbench/**/*.py",
    "src/gridbench/data/*.yaml",
)


def test_every_config_option_written_in_the_cli_docs_and_scripts_names_a_schema_key():
    top_level = set(schema()["properties"])
    written = {
        f"{path.relative_to(ROOT)}: --config {key}="
        for pattern in COMMAND_TEXTS
        for path in sorted(ROOT.glob(pattern))
        for key in CONFIG_OPTION.findall(path.read_text())
        if key not in top_level
    }
    assert not written, "not a key of the schema:\n" + "\n".join(sorted(written))
    helps = [
        action.help or ""
        for command in _subcommands()
        for action in command._actions
        if "--config" in action.option_strings
    ]
    assert helps, "no gridbench command takes --config any more"
    examples = [key for text in helps for key in re.findall(r"\b([a-z_][a-z0-9_]*)=", text)]
    assert examples, "--config's help gives no key=value example"
    assert set(examples) <= top_level, f"--config's help names {set(examples) - top_level}: not schema keys"


def _subcommands() -> Iterator[typing.Any]:  # argparse's parsers, nested
    pending = [build_parser()]
    while pending:
        parser = pending.pop()
        yield parser
        for action in parser._actions:
            if action.choices and isinstance(action.choices, dict):
                pending.extend(action.choices.values())
