"""Where a number came from: host, GPU, versions and the exact command lines of a cell."""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
from collections.abc import Sequence
from functools import cache
from typing import Any

import gridbench

SCHEMA = "gridbench.provenance.v1"
# a variable name with one of these words in it holds a secret (HF_TOKEN, VLLM_API_KEY, ...)
SECRET_NAME = re.compile(r"(^|_)(TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?)(_|$)", re.IGNORECASE)
REDACTED = "<redacted>"


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if SECRET_NAME.search(k) else v) for k, v in env.items()}


def redact_config(data: dict[str, Any]) -> dict[str, Any]:
    """A config dict (ServingConfig.to_dict) with secret-looking env values redacted."""
    out = dict(data)
    out["env"] = redact_env(data.get("env", {}))
    out["engine"] = {**data["engine"], "env": redact_env(data["engine"].get("env", {}))}
    return out


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


def gpus_of_slots(rows: Sequence[Sequence[str]], slots: Sequence[str]) -> list[dict[str, str]]:
    """The rows of ``nvidia-smi --query-gpu=index,uuid,name`` that the slots name: a slot
    names its GPU by index or by UUID, as CUDA_VISIBLE_DEVICES and Docker do."""
    wanted = {str(slot) for slot in slots}
    return [
        {"index": index, "uuid": uuid, "name": name}
        for index, uuid, name in rows
        if index in wanted or uuid in wanted
    ]


def slot_gpus(slots: Sequence[str]) -> list[dict[str, str]]:
    """The GPUs an engine's slots give it; none on a machine without NVIDIA GPUs."""
    return gpus_of_slots(query_gpus("index,uuid,name"), slots)


@cache
def gpu_info() -> dict[str, Any]:
    """GPU names and the driver from nvidia-smi; nulls on a machine without one."""
    rows = query_gpus("name,driver_version,memory.total")
    return {
        "gpu": rows[0][0] if rows else None,
        "gpu_count": len(rows),
        "driver": rows[0][1] if rows else None,
        "gpu_memory": rows[0][2] if rows else None,
    }


@cache
def host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        **gpu_info(),
        # the cluster job that measured the cell, when one did
        **({"slurm_job_id": os.environ["SLURM_JOB_ID"]} if "SLURM_JOB_ID" in os.environ else {}),
    }


def versions(load_generator: str, load_generator_version: str | None) -> dict[str, Any]:
    return {
        "gridbench": gridbench.__version__,
        "load_generator": load_generator,
        "load_generator_version": load_generator_version,
    }
