"""ARCHITECTURE.md, held to the code where it can be: every module is in its index, every path
it names exists, the package never imports Snakemake, and only an engine kind's own module
names that kind."""

from __future__ import annotations

import ast
import re

from conftest import REPO

PACKAGE = REPO / "src/gridbench"
DOC = (REPO / "ARCHITECTURE.md").read_text()
ENGINE_KINDS = ("llamacpp", "vllm")


def modules() -> set[str]:
    """The package's modules as the index names them (a registry's __init__ counts)."""
    return {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "benchy_site" not in path.parts
        and (path.name not in ("__init__.py", "__main__.py") or path.parent.name == "kinds")
    }


def test_every_module_is_in_the_index_and_the_index_names_only_modules():
    index = DOC[DOC.index("## Every module") :]
    listed = set(re.findall(r"^  - `([\w/]+\.py)`", index, re.M))
    assert listed == modules(), (
        f"missing from ARCHITECTURE.md: {sorted(modules() - listed)}; "
        f"no such module: {sorted(listed - modules())}"
    )


def test_every_path_the_document_names_exists():
    named = set(re.findall(r"(?<![\w./-])((?:[\w.-]+/)+[\w.-]+\.(?:py|smk|yaml|md|sh))\b", DOC))
    roots = (REPO, PACKAGE, PACKAGE / "aggregate", PACKAGE / "cells", PACKAGE / "engines")
    outputs = ("dataset/", "graphs/", "results/", "logs/")  # what a sweep writes
    dangling = sorted(
        p for p in named if not p.startswith(outputs) and not any((root / p).exists() for root in roots)
    )
    assert not dangling, f"ARCHITECTURE.md names files that do not exist: {dangling}"


def test_the_package_never_imports_snakemake():
    importers = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n == "snakemake" or n.startswith("snakemake.") for n in names):
                importers.append(path.relative_to(PACKAGE).as_posix())
    assert not importers


def test_only_an_engine_kinds_module_names_the_kind():
    """Anything else asks the kind (gridbench.engines.kinds) what it needs to know."""
    naming = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent == PACKAGE / "engines/kinds":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in ENGINE_KINDS:
                naming.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value!r}")
    assert not naming, naming
