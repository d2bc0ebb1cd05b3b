"""The build that names a local engine's compile cache (engines/compile_cache.build_identity):
its launcher's content and the installed version of its distribution, never when the launcher
was written. On the H100 (studies/h100-real, loan 2) the GPU runner wrote vLLM's launcher anew
at each run with the same content, and the key, which named the file's modification time, gave
each run an empty cache folder: a second start of a config compiled again."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gridbench.engines.compile_cache import build_identity, cache_key
from gridbench.engines.runtime import ImageInfo

DISTRIBUTION = "gridbench-probe-engine"


def _launcher(path: Path, body: str = "from probe_engine import main\n") -> ImageInfo:
    path.write_text(f"#!{sys.executable}\nimport sys\n{body}")
    path.chmod(0o755)
    return ImageInfo(None, None, None, (str(path), "serve"))


def _installed(site: Path, version: str) -> Path:
    """A folder that installs ``DISTRIBUTION`` at ``version`` for whoever has it on its path."""
    info = site / f"gridbench_probe_engine-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: {version}\n")
    return site


def _key(image: ImageInfo) -> str:
    return cache_key("fingerprint", build_identity(image, DISTRIBUTION))


def test_a_launcher_written_again_with_the_same_content_keeps_its_key(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(_installed(tmp_path / "site", "1.0")))
    image = _launcher(tmp_path / "vllm")
    before = _key(image)
    os.utime(tmp_path / "vllm", ns=(1, 1))  # as an earlier run (or loan) left it
    assert _key(image) == before
    _launcher(tmp_path / "vllm")  # written again, as the GPU runner does at each run
    assert _key(image) == before


def test_another_launcher_or_another_installed_version_is_another_key(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(_installed(tmp_path / "one", "1.0")))
    image = _launcher(tmp_path / "vllm")
    first = _key(image)
    assert build_identity(image, DISTRIBUTION).endswith(f":{DISTRIBUTION}==1.0")
    monkeypatch.setenv("PYTHONPATH", str(_installed(tmp_path / "two", "2.0")))
    assert build_identity(image, DISTRIBUTION).endswith(f":{DISTRIBUTION}==2.0")
    upgraded = _key(image)
    assert upgraded != first
    _launcher(tmp_path / "vllm", body="from probe_engine.v2 import main\n")
    assert _key(image) not in (first, upgraded)


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("#!/bin/sh\nexec true\n", "not a Python script"),
        (f"#!{sys.executable}\n", "not installed"),
    ],
)
def test_what_the_key_says_when_no_version_can_be_read(tmp_path, monkeypatch, script, expected):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    (tmp_path / "engine").write_text(script)
    image = ImageInfo(None, None, None, (str(tmp_path / "engine"),))
    assert build_identity(image, DISTRIBUTION).endswith(f"{DISTRIBUTION}=={expected}")


def test_a_container_is_named_by_its_image_and_a_missing_command_says_so(tmp_path):
    assert build_identity(ImageInfo("img", "sha256:abc", None), DISTRIBUTION) == "sha256:abc"
    missing = tmp_path / "nowhere"
    assert build_identity(ImageInfo(None, None, None, (str(missing),))) == f"{missing}:absent"
