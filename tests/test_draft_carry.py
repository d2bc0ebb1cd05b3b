"""A trained draft carried to another machine (gridbench.drafts.carry): exported with its
records, imported where the workflow then trains nothing again, and refused where its head
would not be the one the config asks for. The heads here are bytes the import only moves and
checks; a real head's serving is test_drafts' integration test."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import REPO, load_yaml, write_config
from gridbench import layout
from gridbench.config.loading import load_grid_files
from gridbench.drafts.carry import MANIFEST, carried_files, export_draft, import_draft, read_manifest
from gridbench.drafts.recipe import DraftPaths, read_recipe, run_step, write_recipe_files
from gridbench.errors import ConfigError, DraftStepError
from synthetic import trained_draft

DRAFT = "smollm2_eagle3_ci"
DFLASH = "smollm2_dflash_ci"
CONFIG = REPO / "config/ci-drafts.yaml"


def _recipe_files(overrides: dict | None = None) -> None:
    write_recipe_files(load_grid_files([CONFIG], overrides or {}))


def _targets(draft: str = DRAFT) -> list[str]:
    return list(load_grid_files([CONFIG]).drafts[draft].files)


@pytest.fixture
def trained(tmp_path, monkeypatch):
    """A workflow folder with the target's files, the recipes and a trained EAGLE-3 draft,
    exported to carried.tar.gz and then removed, as on a machine it was carried to."""
    monkeypatch.chdir(tmp_path)
    for name in _targets():
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        Path(name).write_text(f"target {name}")
    _recipe_files()
    paths = trained_draft(DRAFT)
    originals = {path: path.read_bytes() for path in carried_files(paths)}
    export_draft(read_recipe(Path(layout.DRAFT_RECIPE_FILE.format(draft=DRAFT))), tmp_path / "carried.tar.gz")
    for path in originals:
        path.unlink()
    return tmp_path / "carried.tar.gz", originals


def test_an_imported_draft_is_the_exported_one_dated_in_the_order_its_steps_wrote_it(trained):
    archive, originals = trained
    assert "trained on cpu" in import_draft([archive])
    assert {path: path.read_bytes() for path in originals} == originals
    files = list(originals)  # carried_files' order: each after what it was made from
    times = [path.stat().st_mtime_ns for path in files]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert min(times) > max(Path(name).stat().st_mtime_ns for name in _targets())
    assert files.index(layout_path("steps/hidden-states.json")) < files.index(
        layout_path("head/model.safetensors")
    )
    assert files[-2:] == [layout_path("steps/train.json"), layout_path("RECIPE.json")]
    assert import_draft([archive]) == f"draft {DRAFT}: already here"


def layout_path(name: str) -> Path:
    return Path(layout.DRAFT_DIR.format(draft=DRAFT)) / name


def test_a_draft_archive_in_pieces_is_read_in_their_order_and_a_missing_piece_is_an_error(trained):
    archive, originals = trained
    data = archive.read_bytes()
    pieces = [archive.with_name(f"p-{i}") for i in range(3)]
    third = len(data) // 3 + 1
    for i, piece in enumerate(pieces):
        piece.write_bytes(data[i * third : (i + 1) * third])
    with pytest.raises(DraftStepError, match=r"(?s)not a whole draft archive.*bring every piece"):
        import_draft(pieces[:2])
    assert read_manifest(pieces).draft == DRAFT
    import_draft(pieces)
    assert {path: path.read_bytes() for path in originals} == originals


def test_a_head_trained_with_another_recipe_is_refused_naming_the_settings(trained):
    archive, originals = trained
    _recipe_files({"drafts": {DRAFT: {"epochs": 9, "lr": 0.5, "threads": 1}}})  # threads: where it ran
    with pytest.raises(
        ConfigError, match=rf"draft {DRAFT}: .*trained with other epochs, lr than the config's"
    ):
        import_draft([archive])
    assert not any(path.exists() for path in originals)


def test_a_head_trained_for_another_target_is_refused(trained):
    archive, _ = trained
    Path(_targets()[1]).write_text("another model")
    with pytest.raises(ConfigError, match=f"trained for another {_targets()[1]}"):
        import_draft([archive])
    Path(_targets()[1]).unlink()
    with pytest.raises(
        DraftStepError, match=r"(?s)not here to check.*build the target first \(snakemake -j1"
    ):
        import_draft([archive])


def test_a_damaged_head_in_the_archive_is_refused(trained, tmp_path):
    archive, originals = trained
    head = layout_path("head/model.safetensors")
    damaged = tmp_path / "damaged.tar.gz"
    with tarfile.open(archive) as source, tarfile.open(damaged, "w:gz") as target:
        for member in source.getmembers():
            data = source.extractfile(member).read()
            if member.name == str(head):
                data = data[:-1] + bytes([data[-1] ^ 1])
            target.addfile(member, fileobj=io.BytesIO(data))
    with pytest.raises(DraftStepError, match=f"archive's {head} is not the file its RECIPE.json names"):
        import_draft([damaged])
    assert not any(path.exists() for path in originals)
    assert not (head.parents[2] / f".{DRAFT}.carried").exists(), "the staged files were left"


def test_a_draft_trained_here_is_not_overwritten_by_a_carried_one(trained):
    archive, _ = trained
    trained_draft(DRAFT)  # another training here: other heads, another record
    with pytest.raises(DraftStepError, match=r"(?s)has a record of its own here.*not overwritten"):
        import_draft([archive])


def test_a_draft_trained_on_anothers_data_carries_only_its_training(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _recipe_files()
    for name in _targets():
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        Path(name).write_text(name)
    trained_draft(DRAFT)
    paths = trained_draft(DFLASH)
    manifest = export_draft(
        read_recipe(Path(layout.DRAFT_RECIPE_FILE.format(draft=DFLASH))), tmp_path / "d.tgz"
    )
    assert manifest.members == tuple(map(str, carried_files(paths)))
    assert not [m for m in manifest.members if "prompts" in m or "answers" in m or DRAFT + "/" in m]
    with tarfile.open(tmp_path / "d.tgz") as tar:
        assert tar.getnames()[0] == MANIFEST


def test_a_draft_not_trained_here_is_not_exported(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _recipe_files()
    with pytest.raises(DraftStepError, match=f"draft {DRAFT} is not trained here"):
        export_draft(read_recipe(Path(layout.DRAFT_RECIPE_FILE.format(draft=DRAFT))), tmp_path / "a.tgz")


@pytest.mark.workflow
def test_the_workflow_trains_nothing_again_after_a_carried_draft_is_imported(tmp_path):
    """On a machine with the target built by the workflow and the head carried in, a sweep
    plans no draft step; without the import it plans all of them."""
    write_config(tmp_path / "grid.yaml", load_yaml(CONFIG))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    snakemake = [
        str(Path(sys.executable).parent / "snakemake"),
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(tmp_path),
    ]

    def run(*args: str) -> str:
        result = subprocess.run(
            [*snakemake, *args, "--configfile", "grid.yaml"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result.stdout

    run("-j1", *_targets())  # the target, by its own rule
    assert {"draft_answers", "draft_train"} <= _jobs(run("-n", "--quiet", "rules"))

    os.chdir(tmp_path)
    try:
        for draft in (DRAFT, DFLASH):  # the draft whose data the other trains on first
            trained_draft(draft)
            recipe = read_recipe(Path(layout.DRAFT_RECIPE_FILE.format(draft=draft)))
            export_draft(recipe, tmp_path / f"{draft}.tar.gz")
        for draft in (DRAFT, DFLASH):
            shutil.rmtree(layout.DRAFT_DIR.format(draft=draft))
        for draft in (DRAFT, DFLASH):
            import_draft([tmp_path / f"{draft}.tar.gz"])
    finally:
        os.chdir(REPO)
    planned = _jobs(run("-n", "--quiet", "rules"))
    assert "natural_cell" in planned and not {job for job in planned if job.startswith("draft_")}, planned


def _jobs(plan: str) -> set[str]:
    """The rules a dry run's job table lists."""
    return {line.split()[0] for line in plan.splitlines() if re.match(r"^\w+\s+\d+$", line)}


def test_a_head_cannot_train_on_the_data_of_a_draft_carried_in_without_its_hidden_states(trained):
    archive, _ = trained
    import_draft([archive])
    recipe = read_recipe(Path(layout.DRAFT_RECIPE_FILE.format(draft=DFLASH)))
    with pytest.raises(
        DraftStepError, match=rf"(?s)hidden states of {DRAFT} are not in .*--forcerun draft_dataset"
    ):
        run_step(recipe, DraftPaths.of(recipe), "train")
