"""What a cell may use on its host: the GPUs a cluster job was given, and who owns engines.

Inside a SLURM job the engines may only use the GPUs SLURM allocated to the job, and they
belong to that job: several jobs of one sweep share the working directory (on the shared
file system) and a node's slot directory, so the working directory alone would let one
job's end stop another job's engines.

The owner is also a process: the sweep's Snakemake (or, inside a cluster job, the job's
Snakemake). An engine must not outlive it, so each engine records that process (pid,
start time, host and boot) and a watchdog stops the engine once the process is gone; a
sweep finding a slot whose owner process is gone reclaims it at once.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import TypedDict

from gridbench import layout
from gridbench.util.files import atomic_write_text

SWEEP_VARIABLE = "GRIDBENCH_SWEEP_PROCESS"  # pid:start_time:host:boot_id of the sweep's Snakemake


class ProcessIdentity(TypedDict):
    """One process, recognisable later and elsewhere: its pid is reused, its start time is not.

    A TypedDict, not a dataclass: it is stored as this very JSON object in slot files and
    watchdog specs, and read back as it is."""

    pid: int
    start_time: int  # clock ticks since boot
    host: str
    boot_id: str


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


def process_start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), None when there is no such process:
    with the pid it names one process, even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_identity(pid: int) -> ProcessIdentity | None:
    """The process ``pid`` as a later process, on this host or not, can recognise it."""
    start = process_start_time(pid)
    if start is None:
        return None
    return ProcessIdentity(pid=pid, start_time=start, host=socket.gethostname(), boot_id=_boot_id())


def _format(identity: ProcessIdentity) -> str:
    return f"{identity['pid']}:{identity['start_time']}:{identity['host']}:{identity['boot_id']}"


def _parse(value: str | None) -> ProcessIdentity | None:
    try:
        pid, start, host, boot = (value or "").split(":", 3)
        return ProcessIdentity(pid=int(pid), start_time=int(start), host=host, boot_id=boot)
    except ValueError:
        return None


def process_gone(identity: ProcessIdentity | None) -> bool:
    """Whether the process is known to be gone: on this host and boot, with no process of its
    pid and start time (a zombie counts as gone). Another host's process is never judged."""
    if not identity or identity.get("host") != socket.gethostname():
        return False
    if identity.get("boot_id") != _boot_id():
        return True  # the host rebooted since: none of its processes survived
    if process_start_time(identity["pid"]) != identity["start_time"]:
        return True
    try:
        state = Path(f"/proc/{identity['pid']}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def claim_sweep(environ: MutableMapping[str, str] = os.environ) -> ProcessIdentity:
    """Make the calling process (a sweep's Snakemake) the owner of the engines its cells start.

    A Snakemake started by another one on this host (a group job, a cluster job's step) keeps
    the sweep it inherits while that process lives; one started on another node (a cluster
    job inherits the login node's environment) or after its sweep died becomes the owner."""
    inherited = _parse(environ.get(SWEEP_VARIABLE))
    if inherited and inherited.get("host") == socket.gethostname() and not process_gone(inherited):
        return inherited
    identity = process_identity(os.getpid())
    assert identity is not None  # this very process
    environ[SWEEP_VARIABLE] = _format(identity)
    return identity


def sweep_process(environ: Mapping[str, str] = os.environ) -> ProcessIdentity | None:
    """The process whose end ends the engines this process starts: the sweep that claimed it
    (see claim_sweep), else the parent (the shell or script that ran a cell by hand)."""
    return _parse(environ.get(SWEEP_VARIABLE)) or process_identity(os.getppid())


def record_lock_holder(sweep: ProcessIdentity, workdir: Path = Path()) -> None:
    """Note ``sweep`` as the holder of Snakemake's lock of ``workdir`` (called once Snakemake
    holds it: a dry run, which takes no lock, never becomes the holder)."""
    atomic_write_text(workdir / layout.LOCK_HOLDER, _format(sweep) + "\n")


def release_stale_lock(workdir: Path = Path()) -> ProcessIdentity | None:
    """Snakemake's lock of ``workdir``, removed when the sweep that took it is gone: Snakemake
    releases it on any exit it sees, a SIGKILL (the OOM killer, a batch system's hard kill)
    leaves it, and the next sweep would stop at "Directory cannot be locked". The gone holder,
    or None when there was no lock, no known holder, or a holder still running."""
    holder_file = workdir / layout.LOCK_HOLDER
    try:
        holder = _parse(holder_file.read_text().strip())
    except FileNotFoundError:
        return None
    if holder is None or not process_gone(holder):
        return None
    # a gone holder's note goes in any case: a sweep that takes the lock after this one
    # must not be taken for it before it notes itself
    holder_file.unlink()
    locks = workdir / layout.SNAKEMAKE_LOCKS
    if not any(locks.glob("*")):
        return None  # its Snakemake released the lock on its way out
    shutil.rmtree(locks)  # as `snakemake --unlock` does
    return holder
