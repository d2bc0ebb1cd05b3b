"""A trained draft carried to another machine (a later GPU loan, another node): its heads, its
data's and steps' records and RECIPE.json in one archive (``gridbench draft export``),
unpacked there (``gridbench draft import``) so that the workflow finds every step of it done
and trains nothing again. The hidden states stay behind: gigabytes, read only by a training.

An archive is refused where its head would not be the one the config asks for: another
recipe (other than where it ran: python, env, threads), another target (the target's files
are compared by checksum), or files that differ from the checksums its RECIPE.json lists.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path

from gridbench import layout
from gridbench.assets.manifest import sha256_of
from gridbench.config.grid import DraftRecipe
from gridbench.drafts.recipe import DraftPaths, RecipeRecord, read_recipe
from gridbench.errors import ConfigError, DraftStepError
from gridbench.util import codec

MANIFEST = "CARRY.json"  # the archive's first member
# where and how a recipe ran, not what its head learnt: a carried head may have run elsewhere
RUN_SETTINGS = ("python", "env", "threads")


@dataclass(frozen=True)
class CarryManifest:
    """What an archive holds: one draft's files, and the target it was trained for."""

    draft: str
    target_sha256: dict[str, str]  # the recipe's files, as the training read them
    members: tuple[str, ...]  # the draft's files, in the order its steps write them


def carried_files(paths: DraftPaths) -> tuple[Path, ...]:
    """A trained draft's files, each after those it was made from: its own data steps' files
    and records (none where it trains on another's data), then the training's outputs."""
    data = {"prompts": (paths.prompts,), "answers": (paths.answers,)}
    steps = [path for step in paths.own_steps for path in (*data.get(step, ()), paths.step(step))]
    heads = [
        folder / name for folder in (paths.head, paths.untrained_head) for name in layout.DRAFT_HEAD_FILES
    ]
    return (*steps[:-1], *heads, paths.train_metrics, steps[-1], paths.record)


def export_draft(recipe: DraftRecipe, archive: Path) -> CarryManifest:
    """Write the trained draft's files, and its manifest first, into a gzipped tar."""
    paths = DraftPaths.of(recipe)
    files = carried_files(paths)
    missing = [str(path) for path in files if not path.is_file()]
    if missing:
        raise DraftStepError(
            f"draft {recipe.name} is not trained here: {', '.join(missing)} missing",
            hint=f"train it first: snakemake -j1 --until draft_train (its record is {paths.record})",
        )
    manifest = CarryManifest(
        draft=recipe.name,
        target_sha256={name: sha256_of(Path(name)) for name in recipe.files},
        members=tuple(str(path) for path in files),
    )
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w:gz") as tar:
        text = json.dumps(codec.to_json(manifest), indent=1).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mtime = len(text), int(time.time())
        tar.addfile(info, io.BytesIO(text))
        for path in files:
            tar.add(path, arcname=str(path))
    partial.replace(archive)
    return manifest


@contextmanager
def _opened(parts: Sequence[Path]) -> Iterator[tarfile.TarFile]:
    """An archive, whole or in pieces (``split``'s, given in order), read as one stream."""
    if not parts:
        raise ConfigError("no archive given", hint="name the archive, or all its pieces in order")
    stream = (
        io.BytesIO(b"".join(part.read_bytes() for part in parts)) if len(parts) > 1 else parts[0].open("rb")
    )
    try:
        with tarfile.open(fileobj=stream, mode="r:gz") as tar:
            yield tar
    except (tarfile.TarError, EOFError, OSError) as err:
        raise DraftStepError(
            f"{', '.join(map(str, parts))}: not a whole draft archive ({err})",
            hint="bring every piece of it, in order (part-00, part-01, …), or export it again",
        ) from err
    finally:
        stream.close()


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    extracted = tar.extractfile(name) if name in tar.getnames() else None
    if extracted is None:
        raise DraftStepError(f"the draft archive has no {name}", hint="export the draft again")
    return extracted.read()


def _manifest(tar: tarfile.TarFile) -> CarryManifest:
    return codec.from_json(CarryManifest, json.loads(_member(tar, MANIFEST)))


def read_manifest(parts: Sequence[Path]) -> CarryManifest:
    with _opened(parts) as tar:
        return _manifest(tar)


def _refuse_another_recipe(carried: DraftRecipe, wanted: DraftRecipe) -> None:
    differing = [
        field.name
        for field in fields(DraftRecipe)
        if field.name not in RUN_SETTINGS and getattr(carried, field.name) != getattr(wanted, field.name)
    ]
    if differing:
        raise ConfigError(
            f"draft {wanted.name}: the carried head was trained with other {', '.join(differing)}"
            " than the config's",
            hint="leave the archive out and let the workflow train the head here, or set the recipe back",
        )


def _refuse_another_target(manifest: CarryManifest) -> None:
    for name, digest in manifest.target_sha256.items():
        path = Path(name)
        if not path.is_file():
            raise DraftStepError(
                f"draft {manifest.draft}: its target's {name} is not here to check the carried head against",
                hint=f"build the target first (snakemake -j1 {name}), then import the draft",
            )
        if sha256_of(path) != digest:
            raise ConfigError(
                f"draft {manifest.draft}: the carried head was trained for another {name} than this one",
                hint="leave the archive out and let the workflow train the head for this target",
            )


def import_draft(parts: Sequence[Path]) -> str:
    """Unpack a carried draft where the workflow's steps would have written it, each file dated
    after those it was made from (and after the target's), so that no step runs again. Returns
    what was done, for the log."""
    with _opened(parts) as tar:
        manifest = _manifest(tar)
        recipe = read_recipe(Path(layout.DRAFT_RECIPE_FILE.format(draft=manifest.draft)))
        paths = DraftPaths.of(recipe)
        expected = tuple(str(path) for path in carried_files(paths))
        if manifest.members != expected:
            raise DraftStepError(
                f"draft {recipe.name}: the archive holds other files than this recipe's"
                f" ({', '.join(manifest.members)})",
                hint="export the draft again with this gridbench",
            )
        record_text = _member(tar, str(paths.record))
        record = codec.from_json(RecipeRecord, json.loads(record_text))
        _refuse_another_recipe(record.recipe, recipe)
        _refuse_another_target(manifest)
        if paths.record.exists():
            if sha256_of(paths.record) == _sha256(record_text):
                return f"draft {recipe.name}: already here"
            raise DraftStepError(
                f"draft {recipe.name} has a record of its own here ({paths.record}): not overwritten",
                hint=f"remove {paths.folder} to use the carried head instead",
            )
        staging = paths.folder.with_name(f".{recipe.name}.carried")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            _stage(tar, manifest.members, staging, _carried_sha256(record, paths))
        except BaseException:  # a refused archive leaves nothing behind, staged files neither
            shutil.rmtree(staging, ignore_errors=True)
            raise
    _move_in_order(staging, manifest.members)
    return (
        f"draft {recipe.name}: {len(manifest.members)} files carried in, trained on {record.steps[-1].device}"
    )


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _carried_sha256(record: RecipeRecord, paths: DraftPaths) -> dict[str, str]:
    """The record's checksums by the file each names."""
    named = {"prompts": paths.prompts, "answers": paths.answers}
    for key, folder in (("head", paths.head), ("untrained", paths.untrained_head)):
        named |= {f"{key}/{name}": folder / name for name in layout.DRAFT_HEAD_FILES}
    return {str(named[key]): digest for key, digest in record.sha256.items()}


def _stage(tar: tarfile.TarFile, members: Sequence[str], staging: Path, sha256: dict[str, str]) -> None:
    for name in members:
        data = _member(tar, name)
        if name in sha256 and _sha256(data) != sha256[name]:
            raise DraftStepError(
                f"the draft archive's {name} is not the file its RECIPE.json names (sha256 differs)",
                hint="the archive is damaged: export the draft again",
            )
        target = staging / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def _move_in_order(staging: Path, members: Sequence[str]) -> None:
    """Each file into place, then all dated from now in the order the steps write them: newer
    than the target built before, older than nothing it was made from."""
    now = time.time()
    for name in members:
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).replace(name)
    for index, name in enumerate(members):
        os.utime(name, (now + index / 1000, now + index / 1000))
    shutil.rmtree(staging, ignore_errors=True)
