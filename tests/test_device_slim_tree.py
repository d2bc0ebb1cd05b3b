"""scripts/device_slim_tree.sh: the committed studies leave the device's transfer and come back
exactly as they were, the files on disk untouched throughout."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from conftest import REPO


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def test_the_studies_leave_the_transfer_but_the_kept_one_and_come_back(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts/device_slim_tree.sh", repo / "scripts")
    for study in ("big", "kept"):
        (repo / "studies" / study).mkdir(parents=True)
        (repo / "studies" / study / "data.csv").write_text(study * 1000)
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "studies")
    exclude = repo / ".git/info/exclude"
    before = exclude.read_text()
    slim = ["bash", "scripts/device_slim_tree.sh"]

    on = subprocess.run([*slim, "on", "kept"], cwd=repo, check=True, capture_output=True, text=True)
    assert "the tree that travels" in on.stdout
    travels = git(repo, "ls-files", "-co", "--exclude-standard").split()
    assert "studies/kept/data.csv" in travels and "studies/big/data.csv" not in travels
    assert (repo / "studies/big/data.csv").read_text() == "big" * 1000
    assert subprocess.run([*slim, "status"], cwd=repo, capture_output=True, text=True).stdout.startswith("on")

    subprocess.run([*slim, "off"], cwd=repo, check=True, capture_output=True)
    assert git(repo, "status", "--porcelain") == ""
    assert exclude.read_text() == before
