"""The package passes typed records between its layers: an untyped dict is named for what it is.

A free-form dict in an annotation (``dict[str, Any]``, ``Mapping[str, object]`` …) hides a
shape from the reader and from mypy. Where the data really is a JSON object (a file's parsed
document, an HTTP body, a record's to_json), its annotation says so with ``files.JsonObject``;
anything else gets a record.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src/gridbench"
FREE_FORM = {"dict", "Mapping", "MutableMapping"}
UNTYPED_VALUES = {"Any", "object"}
# the one place the free-form JSON object is spelled
ALIAS = ("files.py", "JsonObject")


def untyped_dicts(source: str) -> list[tuple[int, str]]:
    """(line, annotation) of each free-form dict in ``source``'s annotations and aliases."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and _name(node.value) in FREE_FORM:
            args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if len(args) == 2 and _name(args[0]) == "str" and _name(args[1]) in UNTYPED_VALUES:
                found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def test_the_check_finds_free_form_dicts_wherever_they_are_written():
    source = (
        "from typing import Any\n"
        "def f(a: dict[str, Any], b: typing.Mapping[str, object]) -> list[dict[str, Any]]: ...\n"
        "x: dict[str, int] = {}\n"
        "y = dict[str, Any]\n"
    )
    assert [line for line, _ in untyped_dicts(source)] == [2, 2, 2, 4]


def test_no_free_form_dict_outside_the_json_object_alias():
    offenders = [
        f"{path.relative_to(PACKAGE)}:{line}: {text}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, text in untyped_dicts(path.read_text())
        if not (path.relative_to(PACKAGE).as_posix() == ALIAS[0] and ALIAS[1] in _line(path, line))
    ]
    assert not offenders, "type these as records (or as files.JsonObject where they are JSON):\n" + "\n".join(
        offenders
    )


def _line(path: Path, line: int) -> str:
    return path.read_text().splitlines()[line - 1]
