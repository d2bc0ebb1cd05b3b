"""What a cell may use on its host: the GPUs a cluster job was given, and who owns engines.

Inside a SLURM job the engines may only use the GPUs SLURM allocated to the job, and they
belong to that job: several jobs of one sweep share the working directory (on the shared
file system) and a node's slot directory, so the working directory alone would let one
job's end stop another job's engines.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def _ids(value: str | None) -> list[str]:
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def allocated_gpus(environ: Mapping[str, str] = os.environ) -> list[str]:
    """Global ids of the GPUs a SLURM job (step) was given; empty outside a GPU job.

    These are the ids ``nvidia-smi`` and Docker's device requests use on the node."""
    return _ids(environ.get("SLURM_STEP_GPUS")) or _ids(environ.get("SLURM_JOB_GPUS"))


def cuda_visible_devices(gpus: list[str], environ: Mapping[str, str] = os.environ) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a process engine on ``gpus`` (global ids).

    Where SLURM constrains devices it numbers the job's GPUs from 0 in its own
    CUDA_VISIBLE_DEVICES; the n-th allocated GPU is the n-th entry there."""
    allocated = allocated_gpus(environ)
    visible = _ids(environ.get("CUDA_VISIBLE_DEVICES"))
    if allocated and len(visible) == len(allocated):
        return ",".join(visible[allocated.index(g)] if g in allocated else g for g in gpus)
    return ",".join(gpus)


def sweep_owner(environ: Mapping[str, str] = os.environ, cwd: Path | None = None) -> str:
    """Who owns the engines this process starts: the working directory, and the job in it."""
    workdir = str((cwd or Path.cwd()).resolve())
    job = environ.get("SLURM_JOB_ID")
    return f"{workdir} (SLURM job {job})" if job else workdir
