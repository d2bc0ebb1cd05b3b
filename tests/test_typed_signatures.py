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
ALIAS = ("util/files.py", "JsonObject")


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


# The functions that take or return a raw JSON document, each at an edge where no record can
# say its shape yet (or any more); every other function takes and returns records.
JSON_EDGES = {
    # the one converter between records and their documents, and its hooks
    "util/codec.py": {"to_json", "from_json", "_unstructure_fn", "unstructure", "_structure_fn", "structure"},
    # a JSON file of any shape, for a reader that only asks whether it is there and whole
    "util/files.py": {"read_json"},
    # the config as YAML and Snakemake give it, before the schema has checked it, and the
    # schema document that checks it (set_defaults: jsonschema's callback on its properties)
    "config/loading.py": {
        "schema",
        "set_defaults",
        "load_grid",
        "read_config_file",
        "load_grid_files",
        "_merge",
    },
    # the chat request as sent: the config's free-form extra_body merged in
    "harness/natural.py": {"payload"},
    # the schema document walked into the config reference's records (ConfigKey, Section)
    "config/reference.py": {"config_reference", "_keys", "_resolved", "_merged", "_type", "_type_word"},
}


def json_signatures(source: str) -> set[str]:
    """Names of the functions in ``source`` with a JSON object in their signature."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            annotations = [a.annotation for a in arguments if a.annotation] + [node.returns] * bool(
                node.returns
            )
            if any("JsonObject" in ast.unparse(a) for a in annotations):
                found.add(node.name)
    return found


def test_json_documents_pass_only_through_the_edges_that_read_and_write_them():
    found = {
        path.relative_to(PACKAGE).as_posix(): names
        for path in sorted(PACKAGE.rglob("*.py"))
        if (names := json_signatures(path.read_text()))
    }
    assert found == JSON_EDGES, "take or return a record (gridbench.util.codec reads and writes it)"


def _line(path: Path, line: int) -> str:
    return path.read_text().splitlines()[line - 1]
