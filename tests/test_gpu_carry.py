"""scripts/gpu-device-wheels.txt: the GPU study machine has everything gridbench and its tools
need once the carried wheels are installed. pip resolves, offline and for that machine's
Python, gridbench's own wheel and the study's tools from the carried wheels and empty stand-ins
of the packages its image already has (scripts/gpu-image-packages.txt): a dependency that
reaches neither fails here instead of as a ModuleNotFoundError there."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from conftest import REPO

pytestmark = pytest.mark.network

CARRY_LIST = REPO / "scripts/gpu-device-wheels.txt"
IMAGE_LIST = REPO / "scripts/gpu-image-packages.txt"
DEVICE_WHEELS = REPO / "scripts/device_wheels.sh"
# the folder scripts/prepare_device_carry.sh fills: each shares the other's downloads
CARRY_WHEELS = REPO / ".device-carry/whl"
# what scripts/run_gpu_study.sh runs of the `run` extra
GPU_STUDY_TOOLS = ("snakemake", "llama-benchy", "gguf")
PIP_ENV = {**os.environ, "PYTHON": sys.executable}


def _pins(lines: list[str]) -> dict[str, str]:
    """name -> version of `name==version` lines."""
    return dict(line.split("==") for line in lines)


def carry_pins() -> dict[str, str]:
    lines = CARRY_LIST.read_text().splitlines()
    return _pins([line for line in lines if line.strip() and not line.startswith("#")])


def left_out_pins() -> dict[str, str]:
    """The packages the carry leaves out on purpose (`# left-out: name==version  why`)."""
    return _pins(re.findall(r"^# left-out: (\S+)", CARRY_LIST.read_text(), flags=re.MULTILINE))


def image_pins() -> dict[str, str]:
    lines = IMAGE_LIST.read_text().splitlines()
    return _pins([line for line in lines if line.strip() and not line.startswith("#")])


def stub_wheel(into: Path, name: str, version: str) -> None:
    """An empty wheel of NAME VERSION that needs nothing: a package present there, as pip sees it."""
    dist = f"{re.sub(r'[-_.]+', '_', name)}-{version}"
    with zipfile.ZipFile(into / f"{dist}-py3-none-any.whl", "w") as wheel:
        metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        wheel.writestr(f"{dist}.dist-info/METADATA", metadata)
        wheel.writestr(
            f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )


def stub_folder(into: Path, without: str | None = None) -> Path:
    """Stand-ins for what the image has and the carry does not, and for what the carry leaves out."""
    into.mkdir()
    carried = {canonicalize_name(name) for name in carry_pins()}
    stubs = {name: v for name, v in image_pins().items() if canonicalize_name(name) not in carried}
    for name, version in {**stubs, **left_out_pins()}.items():
        if without is None or canonicalize_name(name) != canonicalize_name(without):
            stub_wheel(into, name, version)
    return into


@pytest.fixture(scope="module")
def carried_wheels() -> dict[str, Path]:
    """Each pinned package of the carry list -> its wheel, downloaded once into CARRY_WHEELS."""
    pins = carry_pins()
    download = subprocess.run(
        ["bash", DEVICE_WHEELS, "download", CARRY_WHEELS, *(f"{n}=={v}" for n, v in pins.items())],
        capture_output=True,
        text=True,
        env=PIP_ENV,
    )
    assert download.returncode == 0, download.stderr
    # only the listed versions: the folder may hold others (older lists, the vLLM carry)
    wanted = {(canonicalize_name(name), version) for name, version in pins.items()}
    wheels = {}
    for wheel in CARRY_WHEELS.glob("*.whl"):
        name, version, _, _ = parse_wheel_filename(wheel.name)
        if (name, str(version)) in wanted:
            wheels[(name, str(version))] = wheel
    assert set(wheels) == wanted, sorted(wanted - set(wheels))
    return {name: wheel for (name, _), wheel in wheels.items()}


@pytest.fixture(scope="module")
def gridbench_wheel(tmp_path_factory) -> Path:
    """gridbench's wheel, built from a copy: a build in the tree would leave build/ there."""
    tree = tmp_path_factory.mktemp("gridbench-tree")
    shutil.copy(REPO / "pyproject.toml", tree)
    shutil.copy(REPO / "README.md", tree)
    shutil.copytree(REPO / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("gridbench-wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, tree],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = out.glob("gridbench-*.whl")
    return wheel


@pytest.fixture(scope="module")
def image_stubs(tmp_path_factory) -> Path:
    return stub_folder(tmp_path_factory.mktemp("image") / "stubs")


def study_tools() -> list[str]:
    """The `run` extra's requirements of the tools the GPU study runs, as pyproject states them."""
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["run"]
    tools = [spec for spec in extra if canonicalize_name(Requirement(spec).name) in GPU_STUDY_TOOLS]
    assert len(tools) == len(GPU_STUDY_TOOLS), extra
    return tools


def resolve(wheels: list[Path], stubs: Path, gridbench: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """pip install --dry-run of gridbench and the study's tools on the GPU machine."""
    carry = tmp_path / "carry"
    carry.mkdir()
    for wheel in wheels:
        (carry / wheel.name).symlink_to(wheel)
    links = ["--find-links", carry, "--find-links", stubs]
    return subprocess.run(
        ["bash", DEVICE_WHEELS, "resolve", *links, gridbench, *study_tools()],
        capture_output=True,
        text=True,
        env=PIP_ENV,
    )


def test_gridbench_and_its_tools_resolve_from_the_carry_and_the_image(
    carried_wheels, image_stubs, gridbench_wheel, tmp_path
):
    result = resolve(list(carried_wheels.values()), image_stubs, gridbench_wheel, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    (would_install,) = re.findall(r"^Would install (.*)$", result.stdout, flags=re.MULTILINE)
    assert {"gridbench-0.1.0", "cattrs-26.2.1", "snakemake-9.27.1"} <= set(would_install.split())


def test_a_dependency_missing_from_the_carry_fails_naming_it(
    carried_wheels, image_stubs, gridbench_wheel, tmp_path
):
    without_cattrs = [wheel for name, wheel in carried_wheels.items() if name != "cattrs"]
    result = resolve(without_cattrs, image_stubs, gridbench_wheel, tmp_path)
    assert result.returncode != 0
    assert "No matching distribution found for cattrs>=24.1" in result.stderr, result.stderr


def test_a_package_missing_from_the_image_fails_naming_it(carried_wheels, gridbench_wheel, tmp_path):
    # cattrs needs typing-extensions, which only the image has
    stubs = stub_folder(tmp_path / "stubs", without="typing-extensions")
    result = resolve(list(carried_wheels.values()), stubs, gridbench_wheel, tmp_path)
    assert result.returncode != 0
    missing = re.search(r"No matching distribution found for typing[-_]extensions", result.stderr, re.I)
    assert missing, result.stderr
