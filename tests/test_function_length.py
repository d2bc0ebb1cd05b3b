"""No function in the package runs over 60 lines: a longer one does several things, each of
which gets a name of its own (issue 30).

The CLI's ``add_commands`` parser builders are exempt: they are declarations, one option
after another, with no steps to name.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src/gridbench"
MAX_LINES = 60
DECLARATIVE = {"add_commands"}


def long_functions(source: str, limit: int = MAX_LINES) -> list[tuple[int, str, int]]:
    """(line, name, length) of each function or method in ``source`` longer than ``limit``
    lines, from its ``def`` (decorators not counted) to its last line."""
    return sorted(
        (node.lineno, node.name, length)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name not in DECLARATIVE
        and (length := (node.end_lineno or node.lineno) - node.lineno + 1) > limit
    )


def test_the_check_measures_functions_methods_and_nested_functions():
    source = textwrap.dedent(
        """\
        def short():
            return 1
        class C:
            async def method(self):
                a = 1
                b = 2
                return a + b
        def outer():
            def inner():
                a = 1
                b = 2
                return a + b
            return inner
        def add_commands():
            a = 1
            b = 2
            c = 3
            return a + b + c
        """
    )
    assert long_functions(source, limit=3) == [(4, "method", 4), (8, "outer", 6), (9, "inner", 4)]


def test_no_function_in_the_package_is_over_60_lines():
    offenders = [
        f"{path.relative_to(PACKAGE)}:{line}: {name} has {length} lines"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, name, length in long_functions(path.read_text())
    ]
    assert not offenders, f"split these into named steps of at most {MAX_LINES} lines:\n" + "\n".join(
        offenders
    )
