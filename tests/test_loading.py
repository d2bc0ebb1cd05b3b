"""Loading a config: a hand-written one either loads, its defaults filled from the schema, or
fails with a ConfigError naming the file, the key and what is allowed."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import yaml

from conftest import REPO, load_yaml
from gridbench.config import grid, loading, resolve
from gridbench.config.loading import load_grid, schema
from gridbench.errors import ConfigError
from gridbench.harness.prompts import NaturalSettings


def bad(mutate) -> str:
    config = copy.deepcopy(load_yaml(REPO / "config/mechanism.yaml"))
    mutate(config)
    with pytest.raises(ConfigError) as info:
        load_grid(config, "mechanism.yaml")
    return str(info.value)


def test_typo_is_an_error_naming_the_file_key_and_allowed_keys():
    message = bad(lambda c: c["benchy"].update(rnus=3))
    assert message.startswith("mechanism.yaml: key benchy:")
    assert "'rnus' was unexpected" in message and "allowed keys:" in message and "runs" in message


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # the whole-sweep switch it replaced is gone, not kept beside it
        (lambda c: c["benchy"].update(prefix_caching_pass=True), "'prefix_caching_pass' was unexpected"),
        (
            lambda c: c["benchy"].update(prefix_cache_pass=True),
            "key benchy.prefix_cache_pass: True is not of type",
        ),
        (
            lambda c: c["benchy"].update(prefix_cache_pass=["D_q8_0_n1"]),
            "key benchy.prefix_cache_pass: unknown config 'D_q8_0_n1'; allowed values: D_f16_n0,",
        ),
    ],
)
def test_the_prefix_cache_pass_names_configs_and_a_typo_is_an_error(change, expected):
    assert expected in bad(change)


def test_enum_errors_list_the_allowed_values():
    message = bad(lambda c: c["engines"]["llamacpp"].update(kind="sglang"))
    assert "key engines.llamacpp.kind" in message and "allowed values: vllm, llamacpp" in message


def test_unknown_reference_is_an_error():
    message = bad(lambda c: c["configs"]["D_f16_n0"].update(checkpoint="fp8"))
    assert "configs.D_f16_n0.checkpoint: unknown checkpoint 'fp8'; allowed values: f16, q8_0" in message


def test_speculation_method_must_suit_the_engine_kind():
    message = bad(lambda c: c["speculations"]["draft4"].update(method="dflash"))
    assert "'dflash' is not a llamacpp method" in message


def test_defaults_are_filled_from_the_schema():
    config = load_yaml(REPO / "config/mechanism.yaml")
    document = load_grid(config, "mechanism.yaml").document
    assert document["engines"]["llamacpp"]["health_path"] == "/health"
    assert document["benchy"]["corpus"] == "resources/corpus/book.txt"
    assert document["serving"]["prefix_caching"] is False
    assert "health_path" not in config["engines"]["llamacpp"], "the caller's config is left as it was"


def test_every_schema_key_has_a_description():
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    defs = schema["$defs"]
    missing = []

    def described(node) -> bool:
        target = defs[node["$ref"].rsplit("/", 1)[1]] if "$ref" in node else {}
        return "description" in node or "description" in target

    def walk(node, path):
        if isinstance(node, dict):
            for key, sub in node.get("properties", {}).items():
                if not described(sub):
                    missing.append(f"{path}.{key}")
            for key, value in node.items():
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for value in node:
                walk(value, path)

    walk(schema, "")
    assert schema["additionalProperties"] is False
    assert not missing


def test_a_typo_beside_weights_is_still_an_error():
    message = bad(lambda c: c["checkpoints"]["f16"].update(weights="demo", wieghts="demo"))
    assert message.startswith("mechanism.yaml: key checkpoints.f16:")
    assert "'wieghts' was unexpected" in message and "weights" in message.split("allowed keys:")[1]


def _section_keys(section: dict) -> set[str]:
    """A schema section's keys, or those of each entry of a named table (engines: {name: …})."""
    entry = section.get("additionalProperties")
    return set((entry if isinstance(entry, dict) else section)["properties"])


# The model is built from the schema's keys and nothing else: a key the schema gains and no
# record holds would be validated, defaulted and then silently dropped.
@pytest.mark.parametrize(
    ("section", "record", "renamed"),
    [
        ("engines", grid.Engine, {}),
        ("checkpoints", grid.Checkpoint, {}),
        ("speculations", grid.Speculation, {}),
        ("serving", grid.Serving, {}),
        # the pass's config list lives on the Grid, out of every cell's context
        ("benchy", grid.BenchySettings, {"prefix_cache_pass": None}),
        ("natural", NaturalSettings, {}),
        ("study", grid.StudyInfo, {}),
        # a config's bench overrides hold only extra_body; its section and the engine,
        # checkpoint and speculation names resolve into records
        ("configs", grid.ServingConfig, {"bench": "bench_extra_body"}),
        # and as written, before its names are resolved
        ("configs", resolve.ConfigEntry, {}),
    ],
)
def test_each_record_holds_exactly_its_schema_sections_keys(section, record, renamed):
    in_schema = {renamed.get(key, key) for key in _section_keys(schema()["properties"][section])} - {None}
    in_record = {f.name for f in dataclasses.fields(record)} - {"name"}  # the table's key
    assert in_schema == in_record


def test_the_bench_overrides_hold_only_the_extra_body():
    assert set(schema()["$defs"]["bench_overrides"]["properties"]) == {"extra_body"}


def test_the_sections_record_holds_every_top_level_key():
    """Each top-level key reaches a record (the filters among the sections' own keys), but
    the display switches, which progress.py reads from the document."""
    in_schema = set(schema()["properties"]) - {"progress", "progress_interval_s"}
    filters = {f.name for f in dataclasses.fields(resolve.Filters)}
    in_record = {f.name for f in dataclasses.fields(resolve.ConfigSections)} - {"filters"} | filters
    assert in_schema == in_record
    overrides = {f.name for f in dataclasses.fields(resolve.ServingOverrides)}
    assert (
        overrides
        == {f.name for f in dataclasses.fields(grid.Serving)}
        == set(schema()["$defs"]["serving"]["properties"])
    )


def test_a_value_the_schema_lets_through_and_no_record_holds_is_an_error_naming_the_key(monkeypatch):
    """Structuring the checked document into records fails only where schema and records
    disagree; even then the config's author reads which key, not a traceback."""
    lax = copy.deepcopy(schema())
    lax["properties"]["engines"]["additionalProperties"]["properties"]["port"]["type"] = ["integer", "string"]
    monkeypatch.setattr(loading, "schema", lambda: lax)
    message = bad(lambda c: c["engines"]["llamacpp"].update(port="eighty"))
    assert message.startswith("mechanism.yaml: ") and "engines['llamacpp'].port" in message
