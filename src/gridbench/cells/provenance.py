"""Where a number came from: host, GPU, versions and the exact command lines of a cell."""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cache

import gridbench
from gridbench.config.grid import ServingConfig
from gridbench.util import codec

# a format name, not the module path; cells.records.current_provenance upgrades older ones
SCHEMA = "gridbench.provenance.v2"
# a variable name with one of these words in it holds a secret (HF_TOKEN, VLLM_API_KEY, ...)
SECRET_NAME = re.compile(r"(^|_)(TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?)(_|$)", re.IGNORECASE)
REDACTED = "<redacted>"


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if SECRET_NAME.search(k) else v) for k, v in env.items()}


def redact_config(config: ServingConfig) -> ServingConfig:
    """The config with its and its engine's secret-looking env values redacted."""
    return replace(
        config, env=redact_env(config.env), engine=replace(config.engine, env=redact_env(config.engine.env))
    )


def scrub(text: str) -> str:
    """Remove the values of secret-looking environment variables from text (logs, errors)."""
    for name, value in os.environ.items():
        if SECRET_NAME.search(name) and len(value) >= 6:
            text = text.replace(value, REDACTED)
    return text


def query_gpus(fields: str) -> list[list[str]]:
    """One row per GPU of ``nvidia-smi --query-gpu=FIELDS``; none without NVIDIA GPUs."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [[part.strip() for part in line.split(",")] for line in out.splitlines() if line.strip()]


@dataclass(frozen=True)
class SlotGpu:
    """A GPU an engine's slot gives it, as nvidia-smi names it."""

    index: str
    uuid: str
    name: str


def gpus_of_slots(rows: Sequence[Sequence[str]], slots: Sequence[str]) -> list[SlotGpu]:
    """The rows of ``nvidia-smi --query-gpu=index,uuid,name`` that the slots name: a slot
    names its GPU by index or by UUID, as CUDA_VISIBLE_DEVICES and Docker do."""
    wanted = {str(slot) for slot in slots}
    return [SlotGpu(index, uuid, name) for index, uuid, name in rows if index in wanted or uuid in wanted]


def slot_gpus(slots: Sequence[str]) -> list[SlotGpu]:
    """The GPUs an engine's slots give it; none on a machine without NVIDIA GPUs."""
    return gpus_of_slots(query_gpus("index,uuid,name"), slots)


@dataclass(frozen=True)
class GpuInfo:
    """The host's first GPU and the driver, from nvidia-smi; None on a machine without one."""

    gpu: str | None
    gpu_count: int
    driver: str | None
    gpu_memory: str | None


@cache
def gpu_info() -> GpuInfo:
    rows = query_gpus("name,driver_version,memory.total")
    if not rows:
        return GpuInfo(gpu=None, gpu_count=0, driver=None, gpu_memory=None)
    first = rows[0]
    return GpuInfo(gpu=first[0], gpu_count=len(rows), driver=first[1], gpu_memory=first[2])


@dataclass(frozen=True)
class HostInfo:
    hostname: str
    platform: str
    machine: str
    cpu_count: int | None
    python: str
    gpus: GpuInfo = field(metadata=codec.INLINE)  # the GPU's keys among the host's
    # the cluster job that measured the cell, when one did
    slurm_job_id: str | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)


@cache
def host_info() -> HostInfo:
    return HostInfo(
        hostname=socket.gethostname(),
        platform=platform.platform(),
        machine=platform.machine(),
        cpu_count=os.cpu_count(),
        python=platform.python_version(),
        gpus=gpu_info(),
        slurm_job_id=os.environ.get("SLURM_JOB_ID"),
    )


@dataclass(frozen=True)
class Versions:
    """What measured a cell: gridbench and its load generator."""

    gridbench: str
    load_generator: str
    load_generator_version: str | None


def versions(load_generator: str, load_generator_version: str | None) -> Versions:
    return Versions(gridbench.__version__, load_generator, load_generator_version)
