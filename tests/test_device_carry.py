"""scripts/device_carry.sh: a carry folder cut into pieces, stashed one at a time in any
order, comes back whole; a damaged or missing piece is named, never unpacked."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import REPO

SCRIPT = REPO / "scripts/device_carry.sh"


def carry(
    *args: str, piece_mib: int | None = 1, transfer_mib: int | None = None
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PIECE_MIB", "TRANSFER_MIB")}
    env |= {"PIECE_MIB": str(piece_mib)} if piece_mib else {}
    env |= {"TRANSFER_MIB": str(transfer_mib)} if transfer_mib else {}
    return subprocess.run(["bash", SCRIPT, *map(str, args)], capture_output=True, text=True, env=env)


def working_tree_bytes() -> int:
    """What travels with every transfer: the checkout's tracked and untracked, not ignored, files."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, check=True
    ).stdout
    return sum(
        (REPO / name).stat().st_size for name in listed.decode().split("\0") if (REPO / name).is_file()
    )


@pytest.fixture
def folder(tmp_path):
    """A carry folder of 2.5 MiB: a wheel-like file, a nested one and a small text."""
    root = tmp_path / "carry"
    (root / "whl").mkdir(parents=True)
    (root / "whl/pkg-1.0-py3-none-any.whl").write_bytes(os.urandom(2 * 1024 * 1024))
    (root / "vllm-hopper.tar.xz").write_bytes(os.urandom(512 * 1024))
    (root / "notes.txt").write_text("carried\n")
    return root


def _files(root):
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and "pieces" not in p.parts and p.name != ".carry-stream"
    }


def test_pieces_stashed_in_any_order_unpack_to_the_same_folder(folder, tmp_path):
    assert carry("cut", folder).returncode == 0
    pieces = sorted((folder / "pieces").iterdir())
    assert [p.name for p in pieces] == ["c1", "c2", "c3"]  # 2.5 MiB of files and tar headers
    assert all(sum(f.stat().st_size for f in p.iterdir() if f.name != "MANIFEST") <= 1024**2 for p in pieces)
    stash, target = tmp_path / "stash", tmp_path / "there"
    for piece in reversed(pieces):
        result = carry("stash", piece, stash)
        assert result.returncode == 0, result.stderr
    assert "3 of 3 pieces" in result.stdout
    result = carry("unpack", target, stash)
    assert result.returncode == 0, result.stderr
    assert _files(target) == _files(folder)
    again = carry("unpack", target, stash)
    assert again.returncode == 0 and "already holds" in again.stdout


def test_cutting_unchanged_content_again_keeps_the_pieces(folder):
    carry("cut", folder)
    manifest = (folder / "pieces/c1/MANIFEST").read_text()
    os.utime(folder / "notes.txt", (1, 1))  # a new time alone changes nothing
    carry("cut", folder)
    assert (folder / "pieces/c1/MANIFEST").read_text() == manifest
    (folder / "notes.txt").write_text("changed\n")
    carry("cut", folder)
    assert (folder / "pieces/c1/MANIFEST").read_text() != manifest


def test_a_missing_piece_is_reported_and_nothing_is_unpacked(folder, tmp_path):
    carry("cut", folder)
    stash, target = tmp_path / "stash", tmp_path / "there"
    carry("stash", folder / "pieces/c1", stash)
    carry("stash", folder / "pieces/c3", stash)
    result = carry("unpack", target, stash)
    assert result.returncode == 3
    assert "2 of 3 pieces" in result.stderr
    assert not target.exists()


def test_a_damaged_piece_is_refused_when_stashed(folder, tmp_path):
    carry("cut", folder)
    part = next((folder / "pieces/c2").glob("part-*"))
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    result = carry("stash", folder / "pieces/c2", tmp_path / "stash")
    assert result.returncode == 1
    assert "arrived damaged: send" in result.stderr
    assert not list((tmp_path / "stash").glob("part-*"))


def test_pieces_of_another_carry_start_the_stash_over(folder, tmp_path):
    carry("cut", folder)
    stash = tmp_path / "stash"
    carry("stash", folder / "pieces/c1", stash)
    (folder / "notes.txt").write_text("a newer carry\n")
    carry("cut", folder)
    result = carry("stash", folder / "pieces/c2", stash)
    assert result.returncode == 0
    assert "another carry: starting over" in result.stderr
    assert "1 of 3 pieces" in result.stdout


def test_a_new_piece_size_cuts_the_pieces_again(folder):
    carry("cut", folder, piece_mib=1)
    carry("cut", folder, piece_mib=2)
    assert sorted(p.name for p in (folder / "pieces").iterdir()) == ["c1", "c2"]
    assert "piece_bytes 2097152" in (folder / "pieces/c1/MANIFEST").read_text()


def test_without_a_piece_size_each_piece_fits_one_transfer_beside_the_working_tree(folder):
    tree_mib = working_tree_bytes() / 1024**2
    transfer_mib = int(tree_mib) + 3  # room for a piece of 1 MiB, and the 1 MiB margin
    result = carry("cut", folder, piece_mib=None, transfer_mib=transfer_mib)
    assert result.returncode == 0, result.stderr
    for piece in (folder / "pieces").iterdir():
        size = sum(f.stat().st_size for f in piece.iterdir())
        assert working_tree_bytes() + size <= transfer_mib * 1024**2
    too_small = carry("cut", folder, piece_mib=None, transfer_mib=int(tree_mib))
    assert too_small.returncode == 1
    assert "leaves no room for a piece" in too_small.stderr
