"""MANIFEST.json: what an asset step wrote into a model folder, file by file (package,
version, sha256, how it was derived). A cell's provenance record copies the entries of the
files it served; reading it needs neither gguf nor numpy, so a cell's start stays light.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from gridbench.util import codec

MANIFEST = "MANIFEST.json"


@dataclass(frozen=True)
class ModelFile:
    """One file an asset step wrote, as MANIFEST.json and the provenance records name it."""

    file: str  # its name in the folder
    sha256: str
    bytes: int
    weights: str  # the weights' own source
    package: str
    package_version: str
    derived: str  # what was done to the shipped file ("as shipped", "... stored as Q4_0")


@dataclass(frozen=True)
class Manifest:
    model: str
    files: tuple[ModelFile, ...]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _read(folder: Path) -> tuple[ModelFile, ...]:
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return ()
    return codec.from_json(Manifest, json.loads(manifest.read_text())).files


def manifest_entries(paths: tuple[str, ...]) -> tuple[ModelFile, ...]:
    """The MANIFEST.json entries of ``paths`` (host paths) that an asset step wrote: a file's
    entry in its folder's manifest, or every entry of a checkpoint folder's own manifest."""
    entries: dict[ModelFile, None] = {}
    for path in map(Path, paths):
        if path.is_dir():
            entries.update(dict.fromkeys(_read(path)))
        else:
            entries.update(dict.fromkeys(e for e in _read(path.parent) if e.file == path.name))
    return tuple(entries)
