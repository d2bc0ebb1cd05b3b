"""Records to and from their JSON documents, by one converter (cattrs): a record's fields,
in order, are its document's keys, so no record writes its format out by hand.

Two field markers cover the formats' few irregular keys:
- ``OMITTED_WHEN_DEFAULT``: the key is left out while the field holds its default (a
  ``traceback`` only failures with one have);
- ``INLINE``: a nested record's keys sit among its parent's (an engine record lists its
  image's keys beside its own); ``INLINE_PREFIXED`` puts them there as ``<field>_<key>``
  (a summary's ``ttft_ms_p50``).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from gridbench.files import JsonObject

OMITTED_WHEN_DEFAULT: Mapping[str, bool] = {"gridbench.omitted_when_default": True}
INLINE: Mapping[str, bool] = {"gridbench.inline": True}
INLINE_PREFIXED: Mapping[str, bool] = {"gridbench.inline": True, "gridbench.prefixed": True}

Record = TypeVar("Record")

# tuples as lists: what json.dumps writes anyway, and what a document read back holds
converter = cattrs.Converter(unstruct_collection_overrides={tuple: list})
converter.register_unstructure_hook(Path, str)
converter.register_structure_hook(Path, lambda value, _: Path(value))
# a whole number stays as written (0, not 0.0): what reads back is what the file or config says
converter.register_structure_hook(
    float,
    lambda value, _: (
        value if isinstance(value, int | float) and not isinstance(value, bool) else float(value)
    ),
)


def to_json(record: object) -> JsonObject:
    """The record's document: its fields' values, by its fields' names, in their order."""
    document: JsonObject = converter.unstructure(record)
    return document


def from_json(cls: type[Record], document: JsonObject) -> Record:
    """The ``cls`` record that ``document`` holds; keys it does not name are ignored."""
    return converter.structure(document, cls)


def _marked(cls: type, marker: Mapping[str, bool]) -> list[dataclasses.Field[Any]]:
    key = next(iter(marker))
    return [f for f in dataclasses.fields(cls) if f.metadata.get(key)]


def _is_marked_record(cls: Any) -> bool:
    return (
        isinstance(cls, type)
        and dataclasses.is_dataclass(cls)
        and bool(_marked(cls, OMITTED_WHEN_DEFAULT) or _marked(cls, INLINE))
    )


@cache
def _inline_keys(cls: type) -> dict[str, dict[str, str]]:
    """Each inline field of ``cls``: its record's fields and the parent's key for each."""
    hints = typing.get_type_hints(cls)
    inline = {}
    for f in _marked(cls, INLINE):
        prefix = f"{f.name}_" if f.metadata.get("gridbench.prefixed") else ""
        inline[f.name] = {g.name: prefix + g.name for g in dataclasses.fields(hints[f.name])}
    return inline


def _unstructure_fn(cls: type) -> Callable[[Any], JsonObject]:
    omitted = {f.name: override(omit_if_default=True) for f in _marked(cls, OMITTED_WHEN_DEFAULT)}
    # cattrs takes each field's override as a keyword; mypy matches them against its flags too
    plain: Callable[[Any], JsonObject] = make_dict_unstructure_fn(cls, converter, **omitted)  # type: ignore[arg-type]
    inline = _inline_keys(cls)
    if not inline:
        return plain

    def unstructure(record: Any) -> JsonObject:
        document: JsonObject = {}
        for key, value in plain(record).items():
            if key in inline:
                document.update((inline[key][inner], v) for inner, v in value.items())
            else:
                document[key] = value
        return document

    return unstructure


def _structure_fn(cls: type) -> Callable[[JsonObject, Any], Any]:
    plain: Callable[[JsonObject, Any], Any] = make_dict_structure_fn(cls, converter)
    inline = _inline_keys(cls)
    if not inline:
        return plain

    def structure(document: JsonObject, _: Any) -> Any:
        nested = dict(document)
        for name, keys in inline.items():
            nested[name] = {inner: nested.pop(key) for inner, key in keys.items() if key in nested}
        return plain(nested, cls)

    return structure


converter.register_unstructure_hook_factory(_is_marked_record, _unstructure_fn)
converter.register_structure_hook_factory(_is_marked_record, _structure_fn)
