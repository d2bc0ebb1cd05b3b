"""Shared fixtures: generated demo assets, isolated engine slots, free ports, configs."""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(autouse=True)
def isolated_slots(tmp_path_factory, monkeypatch):
    """Each test sees its own slot directory, so tests never wait for one another."""
    monkeypatch.setenv("GRIDBENCH_SLOT_DIR", str(tmp_path_factory.mktemp("slots")))
    monkeypatch.setenv("GRIDBENCH_SLOT_WAIT_S", "30")
    # engines and the CLI are started by name, as the workflow does: from this interpreter's venv
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture(scope="session")
def demo_assets(tmp_path_factory) -> Path:
    """The demo's models, tokenizer and corpus, generated once per test session."""
    from gridbench.assets.corpus import write_corpus
    from gridbench.assets.demo import write_demo_models

    root = tmp_path_factory.mktemp("assets")
    write_demo_models(root / "resources/models/demo")
    write_corpus(root / "resources/corpus/book.txt")
    return root


SMOLLM2_COPIES = ("q8_0", "f16", "q4_0")  # every copy a test of SmolLM2's real weights reads


def real_model_folder(tmp_path_factory, name: str, file_types: tuple[str, ...]) -> Path:
    """write_real_model's folder, written once per test run. scripts/test.sh points
    GRIDBENCH_TEST_ASSETS at a folder of its own run, so its second pytest session reads what
    the first wrote (the same checkout: never stale; Gemma 3's alone takes about 40 s); without
    it, each session writes its own."""
    from gridbench.assets.real_models import write_real_model

    shared = os.environ.get("GRIDBENCH_TEST_ASSETS")
    if not shared:
        outdir = tmp_path_factory.mktemp(name)
        write_real_model(name, outdir, file_types)
        return outdir
    outdir = Path(shared) / "-".join((name, *file_types))
    if not outdir.is_dir():  # written aside and renamed: a folder there is a whole one
        Path(shared).mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=shared))
        write_real_model(name, partial, file_types)
        partial.rename(outdir)
    return outdir


def real_hf_checkpoint(model_folder: Path, name: str, file_type: str) -> Path:
    """write_real_hf's vLLM checkpoint of a real_model_folder's GGUF, written once per test run
    as that folder is (Gemma 3's takes about 30 s): beside it, then renamed into it whole."""
    from gridbench.assets.real_models import REAL_MODELS, write_real_hf

    outdir = model_folder / f"hf-{file_type}"
    if not outdir.is_dir():
        aside = Path(tempfile.mkdtemp(prefix=f".{outdir.name}-", dir=model_folder))
        source = model_folder / REAL_MODELS[name].gguf_name(file_type)
        (aside / source.name).symlink_to(source)
        write_real_hf(name, file_type, aside)
        (aside / outdir.name).rename(outdir)
        shutil.rmtree(aside)
    return outdir


def cpu_has_bfloat16() -> bool:
    """bfloat16 instructions: AVX512-BF16 or AMX on x86, BF16 on Arm. Without them torch and vLLM
    emulate bfloat16 (on AVX2 kernels a matmul takes 51 times float32's: benchmarks/cpu_bfloat16.py),
    and the CI's vLLM engines and draft training would run past CI's hour."""
    flags = Path("/proc/cpuinfo").read_text().split()
    return any(flag in flags for flag in ("avx512_bf16", "amx_bf16", "bf16"))


# the precision the CI's CPU grids (config/ci-vllm.yaml, config/ci-drafts.yaml) run at here
CPU_DTYPE = "bfloat16" if cpu_has_bfloat16() else "float32"


def pytest_report_header() -> str:
    return f"the CI grids' vLLM and draft training run in {CPU_DTYPE} on this CPU"


def at_cpu_dtype(config: dict) -> dict:
    """A CI grid (as read from its YAML) with its bfloat16 work at CPU_DTYPE: the checkpoints vLLM
    serves, the drafts' answers (vLLM) and their hidden states and training."""
    for checkpoint in config.get("checkpoints", {}).values():
        if checkpoint.get("dtype") == "bfloat16":
            checkpoint["dtype"] = CPU_DTYPE
    for recipe in config.get("drafts", {}).values():
        recipe["dtype"] = CPU_DTYPE
        recipe.setdefault("llm_args", {})["dtype"] = CPU_DTYPE
    return config


@pytest.fixture
def workdir(tmp_path, demo_assets, monkeypatch):
    """A working directory holding the demo assets (linked), as a sweep would have."""
    shutil.copytree(demo_assets / "resources", tmp_path / "resources", symlinks=True)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    from gridbench.engines.manager import SlotManager

    SlotManager([], workdir=tmp_path).stop_all()  # no engine outlives its test


def load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.fixture
def demo_config() -> dict:
    """config/mechanism.yaml with a free port, as a dict a test may change; without its
    prefix-cache pass (a test that wants it names its configs), so any configs may go."""
    config = copy.deepcopy(load_yaml(REPO / "config/mechanism.yaml"))
    config["benchy"].pop("prefix_cache_pass")
    config["engines"]["llamacpp"]["port"] = free_port()
    return config


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def gridbench(*args: str, cwd: Path | None = None, check: bool = True, env=None):
    """Run the installed CLI as the workflow's rules do."""
    exe = Path(sys.executable).parent / "gridbench"
    return subprocess.run(
        [str(exe), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=check,
        env={**os.environ, **(env or {})},
    )


def snakemake_argv(workdir: Path, *args: str) -> list[str]:
    """The project's workflow in ``workdir``, run by this interpreter's Snakemake."""
    snakemake = Path(sys.executable).parent / "snakemake"
    return [str(snakemake), "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]


def snakemake(workdir: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """The workflow in ``workdir``; past ``timeout`` it is stopped as Ctrl-C would, its jobs'
    processes and engines too. (subprocess.run's timeout kills Snakemake alone: its jobs, a
    draft training say, would go on taking the cores from the tests after it.)"""
    argv = snakemake_argv(workdir, *args)
    proc = subprocess.Popen(
        argv,
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # Snakemake stops its jobs and runs onerror
        try:
            proc.communicate(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            gridbench("engine", "stop", "--all", cwd=workdir, check=False)
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def sweep_logs(workdir: Path, tail_lines: int = 60) -> str:
    """The cell logs, failure records and engine logs of a sweep, to append to an assertion
    message: when a sweep fails on a loaded machine, its stdout alone does not say why."""
    parts = []
    for pattern in ("logs/cells/**/*.log", "results/failures/**/*.json", "logs/engines/*.log"):
        for path in sorted(workdir.glob(pattern)):
            lines = path.read_text(errors="replace").splitlines()[-tail_lines:]
            parts.append(f"--- {path.relative_to(workdir)}\n" + "\n".join(lines))
    return "\n".join(parts)
