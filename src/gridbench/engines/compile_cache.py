"""An engine's compile cache: a study-scoped folder per engine build and start, kept between
starts so that a later start of the same engine loads what an earlier one compiled.

The folder is ``layout.ENGINE_CACHE``, keyed by the start's fingerprint (its command, env,
model, speculation, serving settings and serve flags: ``ServingConfig.fingerprint``) and the
engine's build: a container's image id, or a process's command file (its real path and content)
with, for a Python engine, the installed version of its distribution as the command's own
interpreter finds it. A cache is therefore never offered to another engine version, model or set
of serve flags, and a launcher written again with the same content (a GPU runner sets up its
environment anew on each run and each loan) keeps its key. The compiled files a start finds there
are counted before the launch, those it left once it is ready; whether it used them is read
from the engine's own log lines since its launch (a warm folder is no hit: vLLM may find the
files and still compile again). The engine still starts and is warmed in full either way:
the cache only shortens its compilation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gridbench import layout
from gridbench.config.grid import ServingConfig
from gridbench.engines.kinds import engine_kind
from gridbench.engines.kinds.base import EngineKind
from gridbench.engines.runtime import ImageInfo

HIT = "hit"  # the engine loaded what an earlier start compiled, and compiled nothing
MISS = "miss"  # it compiled: an empty folder, or what it found did not load
UNKNOWN = "unknown"  # the folder held compiled files, and the log says neither


@dataclass(frozen=True)
class CompileCache:
    """One start's compile cache: its folder on the host, its key, and what the start made of it."""

    folder: str  # on the host, relative to the working directory
    key: str
    artifacts_before: int  # compiled files the start found there
    found: str | None = None  # HIT, MISS or UNKNOWN once it is ready; None before
    artifacts_after: int | None = None  # compiled files there once it was ready; None before


@dataclass(frozen=True)
class CacheUse:
    """The folder of a start's cache and how the engine is pointed at it."""

    cache: CompileCache
    env: Mapping[str, str]  # the kind's variable, as the engine sees the folder
    mounts: Mapping[str, str]  # host folder -> container path; none for a local process


def build_identity(image: ImageInfo, distribution: str | None = None) -> str:
    """What names the engine's build before it runs: a container's image id, or the command's
    file (real path, content hash) of a local process, with the version of ``distribution``
    that the file's interpreter has installed where the file is a Python script."""
    if image.image_id:
        return image.image_id
    command = image.command[0] if image.command else ""
    found = Path(shutil.which(command) or command).resolve()
    try:
        content = found.read_bytes()
    except OSError:
        return f"{found}:absent"
    identity = f"{found}:{hashlib.sha256(content).hexdigest()[:16]}"
    if distribution is None:
        return identity
    return f"{identity}:{distribution}=={_installed_version(content, distribution)}"


def _installed_version(script: bytes, distribution: str) -> str:
    """The version of ``distribution`` installed for the interpreter on the script's ``#!``
    line (in this environment: PYTHONPATH counts), or what kept it from being read."""
    shebang = script.split(b"\n", 1)[0]
    if not shebang.startswith(b"#!") or b"python" not in shebang:
        return "not a Python script"
    interpreter = shebang[2:].decode(errors="replace").split()
    probe = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"
    try:
        done = subprocess.run(
            [*interpreter, "-c", probe, distribution], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"unread ({type(error).__name__})"
    return done.stdout.strip() if done.returncode == 0 else "not installed"


def cache_key(fingerprint: str, build: str) -> str:
    """The folder name of a start's cache: its fingerprint and build, hashed (pure)."""
    return hashlib.sha256(json.dumps([fingerprint, build]).encode()).hexdigest()[:16]


def count_artifacts(folder: Path, artifact_dirs: tuple[str, ...]) -> int:
    """The files under the artifact folders of ``folder``; 0 where there are none."""
    return sum(1 for sub in artifact_dirs for path in (folder / sub).rglob("*") if path.is_file())


def prepare(cfg: ServingConfig, fingerprint: str, image: ImageInfo) -> CacheUse | None:
    """The cache folder of this start, made and looked into, or None for a kind that keeps no
    compile cache."""
    kind = engine_kind(cfg.engine.kind)
    if kind.compile_cache_variable is None:
        return None
    key = cache_key(fingerprint, build_identity(image, kind.distribution))
    folder = Path(layout.ENGINE_CACHE.format(kind=kind.name, key=key))
    folder.mkdir(parents=True, exist_ok=True)
    before = count_artifacts(folder, kind.compile_cache_artifacts)
    cache = CompileCache(folder=str(folder), key=key, artifacts_before=before)
    if cfg.engine.runtime == "docker":
        inside = layout.ENGINE_CACHE_IN_CONTAINER
        return CacheUse(cache, {kind.compile_cache_variable: inside}, {str(folder.resolve()): inside})
    return CacheUse(cache, {kind.compile_cache_variable: str(folder.resolve())}, {})


def outcome(kind: EngineKind, log: str, artifacts_before: int) -> str:
    """What a start made of its cache, by the engine's log since its launch (pure): any
    compilation is a miss, loading without compiling a hit; a log that says neither is a miss
    where the folder held nothing to load, else unknown."""
    if kind.compile_cache_miss_line and re.search(kind.compile_cache_miss_line, log, re.MULTILINE):
        return MISS
    if kind.compile_cache_hit_line and re.search(kind.compile_cache_hit_line, log, re.MULTILINE):
        return HIT
    return MISS if artifacts_before == 0 else UNKNOWN


def after_ready(cfg: ServingConfig, cache: CompileCache, log: str) -> CompileCache:
    """The cache once the start is ready: what its log says it made of it, and the compiled
    files its folder holds then."""
    kind = engine_kind(cfg.engine.kind)
    after = count_artifacts(Path(cache.folder), kind.compile_cache_artifacts)
    return dataclasses.replace(cache, found=outcome(kind, log, cache.artifacts_before), artifacts_after=after)
