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
import types
import typing
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from gridbench.util.files import JsonObject

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
    float, lambda value, _: value if type(value) in (int, float) else float(value)
)


# Optional values and homogeneous tuples, read by their element's hook found once: cattrs'
# generic paths look it up per value, most of the time the datasets take to read result files
def _optional(cls: Any) -> Any:
    args = typing.get_args(cls)
    if typing.get_origin(cls) in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        return args[0] if args[1] is type(None) else args[1]
    return None


def _tuple_element(cls: Any) -> Any:
    args = typing.get_args(cls)
    return args[0] if typing.get_origin(cls) is tuple and len(args) == 2 and args[1] is Ellipsis else None


def _structure_optional(cls: Any) -> Callable[[Any, Any], Any]:
    inner, read = _optional(cls), converter.get_structure_hook(_optional(cls))
    if inner is float:
        return lambda value, _: value if value is None or type(value) in (int, float) else float(value)
    if inner in (int, str, bool):
        return lambda value, _: value if value is None or type(value) is inner else inner(value)
    return lambda value, _: None if value is None else read(value, inner)


def _structure_tuple(cls: Any) -> Callable[[Any, Any], Any]:
    inner, read = _tuple_element(cls), converter.get_structure_hook(_tuple_element(cls))
    if inner is float:  # a result's values: checked as numbers in one pass, kept as written
        return lambda value, _: _numbers(tuple(value))
    if inner is str:  # command lines: kept as they are when every item is text already
        return lambda value, _: _texts(tuple(value)) or tuple(read(item, inner) for item in value)
    return lambda value, _: tuple(read(item, inner) for item in value)


def _texts(items: tuple[Any, ...]) -> tuple[str, ...] | None:
    return items if all(type(item) is str for item in items) else None


def _numbers(items: tuple[Any, ...]) -> tuple[Any, ...]:
    sum(items)  # a TypeError for anything but numbers (plain sum: a quarter of fsum's time)
    return items


converter.register_structure_hook_factory(lambda cls: _optional(cls) is not None, _structure_optional)
converter.register_structure_hook_factory(lambda cls: _tuple_element(cls) is not None, _structure_tuple)


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
