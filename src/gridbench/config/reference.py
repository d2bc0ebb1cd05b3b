"""The config reference (every key: its type, default and description) rendered from the
schema, the one declaration of the config's keys: `gridbench config-reference` writes it to
docs/config-reference.md, and tests/test_config_declared_once.py fails while that file, or a
record that mirrors a schema object, says something else.

Pure: the schema document in, records and markdown out.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from gridbench.util.files import JsonObject

SCHEMA_PATH = "src/gridbench/data/config.schema.yaml"
REFERENCE_PATH = "docs/config-reference.md"
REGENERATE = f"gridbench config-reference --out {REFERENCE_PATH}"
# how a key path writes a table entry's name and a list's elements
ENTRY = "<name>"
ELEMENT = "[]"


@dataclass(frozen=True)
class ConfigKey:
    """One key of the config, as the schema declares it (a $ref's declaration merged in)."""

    path: str  # dotted from the top: engines.<name>.volumes[].host
    type: str  # in words: "integer ≥ 1", "list of string"
    default: str | None  # as YAML would write it; None: the key has none
    required: bool
    description: str


@dataclass(frozen=True)
class Section:
    """A top-level key and every key under it."""

    key: ConfigKey
    keys: tuple[ConfigKey, ...]


@dataclass(frozen=True)
class Reference:
    description: str
    name_rule: str  # what a table entry's name may hold
    sections: tuple[Section, ...]


def config_reference(schema: JsonObject) -> Reference:
    """Every key of the schema, section by section, in the schema's order."""
    defs: JsonObject = schema["$defs"]
    required = set(schema["required"])
    sections = []
    for name, node in schema["properties"].items():
        top, *nested = _keys(_resolved(node, defs), name, name in required, defs)
        sections.append(Section(key=top, keys=tuple(nested)))
    return Reference(
        description=schema["description"],
        name_rule=defs["name"]["description"],
        sections=tuple(sections),
    )


def render_reference(reference: Reference) -> str:
    """The reference as markdown: one heading per section, one table row per nested key."""
    lines = [
        "# Config reference",
        "",
        f"Generated from `{SCHEMA_PATH}` by `{REGENERATE}`.",
        "Edit the schema, then run that command: `tests/test_config_declared_once.py` fails while",
        "this file and the schema differ.",
        "",
        reference.description,
        "",
        f"`{ENTRY}` in a key stands for a table entry's name. {reference.name_rule}",
        f"`{ELEMENT}` stands for each element of a list.",
        "",
        "Sections: " + " · ".join(f"[{s.key.path}](#{s.key.path})" for s in reference.sections),
    ]
    for section in reference.sections:
        key = section.key
        facts = f"Type: {key.type}; default: {_default(key)}."
        lines += ["", f"## {key.path}", "", key.description, "", facts]
        if section.keys:
            lines += ["", "| key | type | default | description |", "|---|---|---|---|"]
            lines += [
                f"| `{_cell(k.path)}` | {_cell(k.type)} | {_cell(_default(k))} | {_cell(k.description)} |"
                for k in section.keys
            ]
    return "\n".join(lines) + "\n"


def reference_keys(reference: Reference) -> Sequence[ConfigKey]:
    """Every key of the reference, each section's own first."""
    return [k for s in reference.sections for k in (s.key, *s.keys)]


def _default(key: ConfigKey) -> str:
    if key.required:
        return "required"
    return "—" if key.default is None else f"`{key.default}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _keys(node: JsonObject, path: str, required: bool, defs: JsonObject) -> Iterator[ConfigKey]:
    """The key at ``path`` and every key under it: an object's properties, a table's entries
    (``<name>``) and a list's elements (``[]``) when they are objects with keys of their own."""
    yield ConfigKey(
        path=path,
        type=_type(node, defs),
        default=_literal(node["default"]) if "default" in node else None,
        required=required,
        description=node.get("description", ""),
    )
    own = set(node.get("required", ()))
    for name, child in node.get("properties", {}).items():
        yield from _keys(_resolved(child, defs), f"{path}.{name}", name in own, defs)
    for inner, suffix in ((node.get("additionalProperties"), f".{ENTRY}"), (node.get("items"), ELEMENT)):
        if isinstance(inner, dict) and "properties" in _resolved(inner, defs):
            yield from _keys(_resolved(inner, defs), path + suffix, False, defs)


def _resolved(node: JsonObject, defs: JsonObject) -> JsonObject:
    """``node`` with the definition its $ref names merged under it: a key's own words follow
    the definition's (the top-level serving adds each default's reason to its meaning)."""
    if "$ref" not in node:
        return node
    base = _resolved(defs[node["$ref"].removeprefix("#/$defs/")], defs)
    return _merged(base, {k: v for k, v in node.items() if k != "$ref"})


def _merged(base: JsonObject, overlay: JsonObject) -> JsonObject:
    merged = base | overlay
    if "description" in base and "description" in overlay:
        merged["description"] = f"{base['description']} {overlay['description']}"
    if "properties" in base and "properties" in overlay:
        names = [*base["properties"], *(n for n in overlay["properties"] if n not in base["properties"])]
        merged["properties"] = {
            n: _merged(base["properties"].get(n, {}), overlay["properties"].get(n, {})) for n in names
        }
    return merged


def _type(node: JsonObject, defs: JsonObject) -> str:
    """A key's type in words, with the bounds the schema checks."""
    if "const" in node:
        return f"`{_literal(node['const'])}`"
    if "enum" in node:
        return "one of " + ", ".join(f"`{_literal(v)}`" for v in node["enum"])
    if "oneOf" in node:
        return " or ".join(_type(_resolved(n, defs), defs) for n in node["oneOf"])
    types = node.get("type", [])
    words = [_type_word(t, node, defs) for t in ([types] if isinstance(types, str) else types)]
    return " or ".join(words) or "any"


def _type_word(kind: str, node: JsonObject, defs: JsonObject) -> str:
    if kind in ("integer", "number"):
        bounds = [
            f"{sign} {node[bound]}"
            for bound, sign in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"))
            if bound in node
        ]
        return " ".join([kind, " and ".join(bounds)]) if bounds else kind
    if kind == "string":
        word = "non-empty string" if node.get("minLength", 0) > 0 else "string"
        return f"{word} matching `{node['pattern']}`" if "pattern" in node else word
    if kind == "array":
        items = _grouped(_type(_resolved(node["items"], defs), defs)) if "items" in node else "any"
        word = f"{'non-empty list' if node.get('minItems', 0) > 0 else 'list'} of {items}"
        return f"{word}, no repeats" if node.get("uniqueItems") else word
    if kind == "object" and isinstance(values := node.get("additionalProperties"), dict):
        names = "name" if "propertyNames" in node else "string"
        word = f"map of {names} to {_grouped(_type(_resolved(values, defs), defs))}"
        return f"non-empty {word}" if node.get("minProperties", 0) > 0 else word
    return kind


def _grouped(type_words: str) -> str:
    """Alternatives in parentheses, so that "list of (string or integer) or null" reads right."""
    return f"({type_words})" if " or " in type_words else type_words


def _literal(value: object) -> str:
    """A value as YAML writes it in a config: strings bare, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
