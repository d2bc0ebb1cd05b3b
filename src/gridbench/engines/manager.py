"""Engine slots: which engine runs on which GPU, warm reuse, and stopping.

A slot is one GPU (or the CPU, on a machine without one); a config with
tensor_parallel_size k takes k. Slot state lives in a host-wide directory, so two sweeps
(or cluster jobs) on one host see each other: a slot's flock is held by the cell using it,
a holder file names that cell's config, and the slot's JSON file names the engine on it
and who owns it (the working directory, and the SLURM job in it). A cell reuses its
config's engine when one runs, waits for it while another cell of the config uses it,
and otherwise starts one on free slots, stopping what ran there first: never two engines
on one slot, never two engines of one config.

An engine never outlives the sweep that owns it by more than a few seconds: the slot's
JSON file also names the sweep's process (see allocation.claim_sweep), a watchdog started
with each engine stops it once that process is gone, and a cell that finds a slot whose
owner process is gone stops that engine at once (a ``reclaim`` event) instead of waiting.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import socket
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gridbench.engines import probe, watchdog
from gridbench.engines.allocation import (
    allocated_gpus,
    process_gone,
    process_identity,
    sweep_owner,
    sweep_process,
)
from gridbench.engines.commands import LaunchPlan, launch_plan
from gridbench.engines.events import log_event, now_iso
from gridbench.engines.kinds import engine_kind
from gridbench.engines.policy import SlotView, choose_slots
from gridbench.engines.runtime import DockerRuntime, ImageInfo, RuntimeHandle, runtime_for, runtime_of
from gridbench.engines.slots import OwnedEngine, SlotHolder, SlotState, SlotStore, slot_dir
from gridbench.errors import EngineError, PortInUseError, SlotBusyError
from gridbench.grid import ServingConfig
from gridbench.provenance import query_gpus

log = logging.getLogger(__name__)

ENGINE_LOG_DIR = Path("logs/engines")
ORPHAN_GRACE_S = 3.0  # an engine whose sweep is gone gets this long to stop before SIGKILL


def detect_gpus() -> list[str]:
    """GPU indices from nvidia-smi; empty on a machine without NVIDIA GPUs."""
    return [row[0] for row in query_gpus("index")]


@dataclass
class EngineLease:
    """An engine that is ready, held for one cell."""

    config: str
    fingerprint: str
    slot: str  # the first of ``slots``: the engine's port and container name follow it
    slots: tuple[str, ...]
    plan: LaunchPlan
    handle: RuntimeHandle
    started_at: str
    ready_s: float | None  # None for an engine reused before it was seen ready (its cell was killed)
    reused: bool
    version: str | None
    image: ImageInfo
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return self.plan.base_url


@dataclass(frozen=True)
class SlotStatus:
    """A slot with an engine record, as ``gridbench engine status`` shows it."""

    slot: str
    config: str
    owner: str
    alive: bool
    base_url: str


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def api_key(cfg: ServingConfig) -> str | None:
    """The engine's API key, from the environment only; it is never written anywhere."""
    name = cfg.engine.api_key_env
    if not name:
        return None
    if not os.environ.get(name):
        raise EngineError(
            f"engine {cfg.engine.name}: api_key_env names {name}, which is not set",
            hint=f"export {name}=<the key> before running the sweep",
        )
    return os.environ[name]


def api_headers(cfg: ServingConfig) -> dict[str, str]:
    key = api_key(cfg)
    return {"Authorization": f"Bearer {key}"} if key else {}


class SlotManager:
    """Hands out ready engines on slots; one instance per cell process.

    The slot files and locks are SlotStore's (slots.py), the choice of slots is policy.py's;
    this class runs the lease (survey, choose, wait) and starts, reuses and stops engines."""

    def __init__(self, slots: list[str], *, workdir: Path | None = None, wait_s: float | None = None) -> None:
        # inside a cluster job only the GPUs the job was given are ours, whatever the config says
        self.slots = allocated_gpus() or slots or ["cpu"]
        self.owner = sweep_owner(cwd=workdir)
        self.owner_process = sweep_process()  # the engines this cell starts end with it
        self.wait_s = float(os.environ.get("GRIDBENCH_SLOT_WAIT_S", 600)) if wait_s is None else wait_s
        self.dir = slot_dir()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.store = SlotStore(self.dir)

    def _alive(self, state: SlotState | None) -> bool:
        if not state:
            return False
        try:
            return runtime_of(state.handle).is_running(state.handle)
        except EngineError:
            return False

    def _survey(self) -> list[SlotView]:
        views = []
        for slot in self.slots:
            lock = self.store.try_lock(slot)
            state = self.store.read_state(slot)
            holder = None if lock else self.store.read_holder(slot)
            alive = self._alive(state)
            if state and alive and process_gone(state.owner_process):
                # its sweep was killed without stopping it (and its watchdog did not yet)
                by = f"a cell of the sweep in {self.owner}"
                stop_orphan(state, self.dir, by=by, held=[slot] if lock else [])
                alive = False
                state = self.store.read_state(slot)
            views.append(SlotView(slot, lock, state, alive, holder))
        return views

    @contextlib.contextmanager
    def lease(self, cfg: ServingConfig) -> Iterator[EngineLease]:
        """A ready engine for ``cfg`` on slots held for the duration of the block.

        A config with tensor_parallel_size k takes k slots."""
        need = cfg.serving.tensor_parallel_size
        if need > len(self.slots):
            raise SlotBusyError(
                f"{cfg.name} needs {need} GPU slots (tensor_parallel_size) but only "
                f"{len(self.slots)} are available: {', '.join(self.slots)}",
                hint="list more GPUs in gpu_slots (or request more per job on a cluster), "
                "or lower serving.tensor_parallel_size",
            )
        fingerprint = cfg.fingerprint()
        deadline = time.monotonic() + self.wait_s
        announced = False
        while True:
            if process_gone(self.owner_process):  # its engine would be stopped at once
                gone_pid = self.owner_process["pid"] if self.owner_process else None
                raise EngineError(
                    f"{cfg.name}: the sweep that runs this cell (process "
                    f"{gone_pid}) is gone; no engine is started for it",
                    hint="run the sweep again: the cells it did not finish are redone",
                )
            with self.store.flock("select.lock", blocking=True):
                views = self._survey()
                try:
                    choice = choose_slots(views, fingerprint, need, owner=self.owner, order=self.slots)
                    chosen = choice.slots if choice else ()
                    holder = SlotHolder(config=cfg.name, fingerprint=fingerprint, owner=self.owner)
                    for slot in chosen:
                        self.store.write_holder(slot, holder)
                except BaseException:
                    chosen = ()
                    raise
                finally:
                    for view in views:
                        if view.lock and view.name not in chosen:
                            view.lock.close()
            if choice:
                locks = [view.lock for view in views if view.name in chosen and view.lock]
                try:
                    yield self._ensure(cfg, chosen, fingerprint, reuse=choice.warm)
                finally:
                    for slot in chosen:
                        self.store.remove_holder(slot)
                    for lock in locks:
                        lock.close()
                return
            if time.monotonic() > deadline:
                raise SlotBusyError(self._busy_message(cfg), hint=self._busy_hint())
            if not announced:
                log.info(f"waiting for a free engine slot for {cfg.name}: {self._busy_message(cfg)}")
                announced = True
            time.sleep(1.0)

    def _busy_message(self, cfg: ServingConfig) -> str:
        owners = []
        for slot in self.slots:
            state = self.store.read_state(slot)
            holder = self.store.read_holder(slot)
            if holder and holder.fingerprint == cfg.fingerprint():
                owners.append(f"slot {slot}: a cell of {cfg.name} uses its engine")
            elif state and self._alive(state):
                owners.append(f"slot {slot}: engine {state.config} of the sweep in {state.owner}")
            else:
                owners.append(f"slot {slot}: in use by a running cell")
        return f"no engine slot free for {cfg.name} within {self.wait_s:g} s ({'; '.join(owners)})"

    def _busy_hint(self) -> str:
        return (
            "wait for the other sweep to finish, or stop its engines with "
            "`gridbench engine stop --all` in its working directory"
        )

    def _ensure(
        self, cfg: ServingConfig, slots: tuple[str, ...], fingerprint: str, *, reuse: bool
    ) -> EngineLease:
        state = self.store.read_state(slots[0])
        if reuse and state and runtime_of(state.handle).is_running(state.handle):
            log_event("reuse", cfg.name, slot=slots[0], slots=list(slots), fingerprint=fingerprint)
            if process_gone(state.watchdog):  # killed by hand: the engine needs one
                self._watch(state)
            return EngineLease(
                config=cfg.name,
                fingerprint=fingerprint,
                slot=slots[0],
                slots=slots,
                plan=state.plan,
                handle=state.handle,
                started_at=state.started_at,
                ready_s=state.ready_s,
                reused=True,
                version=state.version,
                image=state.image,
                headers=api_headers(cfg),
            )
        for slot in slots:  # whatever ran on the chosen slots goes first
            if state := self.store.read_state(slot):
                self._stop_state(slot, state)
        return self._start(cfg, slots, fingerprint)

    def _port_for(self, cfg: ServingConfig, slot: str) -> int:
        # GPU ids are host-wide, so jobs on one node that hold different GPUs get different ports
        port = cfg.engine.port + (int(slot) if slot.isdigit() else self.slots.index(slot))
        if _port_free(cfg.engine.host, port):
            return port
        if cfg.engine.port_in_use == "pick_free":
            return _free_port(cfg.engine.host)
        raise PortInUseError(
            f"engine {cfg.engine.name} for {cfg.name}: port {cfg.engine.host}:{port} is already "
            "in use by something gridbench did not start",
            hint=f"stop what listens there, change engines.{cfg.engine.name}.port, or set "
            "port_in_use: pick_free",
        )

    def _start(self, cfg: ServingConfig, slots: tuple[str, ...], fingerprint: str) -> EngineLease:
        slot = slots[0]
        runtime = runtime_for(cfg.engine.runtime)
        image = runtime.image_info(cfg)
        plan = launch_plan(cfg, self._port_for(cfg, slot))
        log_path = ENGINE_LOG_DIR / f"{cfg.name}.log"
        gpus = [s for s in slots if s != "cpu"] if cfg.engine.gpus else []
        # unique per owner: two sweeps (or cluster jobs) on one host never touch each other's container
        owner = hashlib.sha256(self.owner.encode()).hexdigest()[:8]
        name = f"gridbench-{owner}-{'-'.join(slots)}-{cfg.name}".lower()
        started_at = now_iso()
        log_event(
            "start",
            cfg.name,
            slot=slot,
            slots=list(slots),
            fingerprint=fingerprint,
            port=plan.port,
            owner=self.owner,
        )
        with Path(log_path).open("a") as log:
            log.write(
                f"\n=== gridbench: starting {cfg.name} on slot {','.join(slots)} at {started_at}: "
                f"{plan.shell_line()}\n"
            )
        key = api_key(cfg)
        env = {engine_kind(cfg.engine.kind).api_key_variable: key} if key else {}
        handle = runtime.start(cfg, plan, name=name, gpus=gpus, log_path=log_path, env=env)
        state = SlotState(
            owner=self.owner,
            owner_process=self.owner_process,
            config=cfg.name,
            fingerprint=fingerprint,
            slots=slots,
            handle=handle,
            plan=plan,
            started_at=started_at,
            ready_s=None,
            version=None,
            image=image,
        )
        self._write_everywhere(state)
        headers = api_headers(cfg)
        what = f"engine {cfg.engine.name} for config {cfg.name}"
        try:
            state = self._watch(state)  # from now on, the engine ends with its sweep
            ready_s = probe.wait_ready(
                base_url=plan.base_url,
                health_path=cfg.engine.health_path,
                served_model_name=plan.served_model_name,
                timeout_s=cfg.engine.startup_timeout_s,
                is_running=lambda: runtime.is_running(handle),
                log_text=lambda: runtime.log_tail(handle, 200),
                fatal_patterns=cfg.engine.fatal_log_patterns,
                what=what,
                headers=headers,
            )
        except BaseException:
            self._stop_state(slot, state)  # never leave a half-started engine holding the GPU
            raise
        state = dataclasses.replace(
            state,
            ready_s=round(ready_s, 3),
            version=engine_kind(cfg.engine.kind).version(plan.base_url, headers),
        )
        self._write_everywhere(state)
        log_event("ready", cfg.name, slot=slot, fingerprint=fingerprint, ready_s=state.ready_s)
        return EngineLease(
            config=cfg.name,
            fingerprint=fingerprint,
            slot=slot,
            slots=slots,
            plan=plan,
            handle=handle,
            started_at=started_at,
            ready_s=round(ready_s, 3),
            reused=False,
            version=state.version,
            image=image,
            headers=headers,
        )

    def _write_everywhere(self, state: SlotState) -> None:
        for member in state.slots:  # an engine on several GPUs is recorded in each
            self.store.write_state(member, state)

    def _watch(self, state: SlotState) -> SlotState:
        """Start the engine's watchdog and record it with the engine in its slots."""
        proc = watchdog.start(state, self.dir, state.handle.log_path)
        state = dataclasses.replace(state, watchdog=process_identity(proc.pid))
        self._write_everywhere(state)
        return state

    def _stop_state(self, slot: str, state: SlotState) -> None:
        runtime_of(state.handle).stop(state.handle)
        log_event("stop", state.config, slot=slot, fingerprint=state.fingerprint)
        for member in state.slots:  # an engine on several GPUs frees them all
            current = self.store.read_state(member)
            if current and current.handle == state.handle:
                self.store.write_state(member, None)

    def is_alive(self, engine: EngineLease) -> bool:
        return runtime_of(engine.handle).is_running(engine.handle)

    def log_tail(self, engine: EngineLease, lines: int = 40) -> str:
        return runtime_of(engine.handle).log_tail(engine.handle, lines)

    def discard(self, engine: EngineLease) -> None:
        """Stop an engine that failed its cell, so the next cell starts a fresh one."""
        state = self.store.read_state(engine.slot)
        if state and state.fingerprint == engine.fingerprint:
            self._stop_state(engine.slot, state)

    def stop_all(self) -> list[str]:
        """Stop every engine this owner (working directory, or cluster job) started; returns the configs."""
        stopped = []
        for slot in self.store.recorded_slots():
            with self.store.flock(f"slot-{slot}.lock", blocking=True):
                state = self.store.read_state(slot)
                if state and state.owner == self.owner:
                    self._stop_state(slot, state)
                    stopped.append(state.config)
        return stopped

    def status(self) -> list[SlotStatus]:
        rows = []
        for slot in self.store.recorded_slots():
            state = self.store.read_state(slot)
            if state:
                rows.append(
                    SlotStatus(slot, state.config, state.owner, self._alive(state), state.plan.base_url)
                )
        return rows


def stop_orphan(engine: OwnedEngine, slots_dir: Path, *, by: str, held: Collection[str] = ()) -> None:
    """Stop an engine whose sweep is gone, free its slots and log a ``reclaim`` event.

    A slot's record is removed only where no cell holds the slot (or the caller does: the
    slots in ``held``); a cell that holds one finds the engine dead and cleans up itself."""
    owner_pid = engine.owner_process["pid"] if engine.owner_process else None
    log.warning(
        f"engine {engine.config} on slot {','.join(engine.slots)} outlived the sweep in "
        f"{engine.owner} (its process {owner_pid} is gone): stopping it"
    )
    # nobody waits for its answers any more: a short grace, as a busy engine may ignore SIGTERM
    runtime_of(engine.handle).stop(engine.handle, grace_s=ORPHAN_GRACE_S)
    log_event(
        "reclaim",
        engine.config,
        slot=engine.slots[0],
        slots=list(engine.slots),
        fingerprint=engine.fingerprint,
        owner=engine.owner,
        owner_pid=owner_pid,
        by=by,
    )
    SlotStore(slots_dir).forget(engine, held=held)


def remove_leftover_containers() -> list[str]:
    """Containers of this working directory without a slot record (a killed run's)."""
    try:
        return DockerRuntime().remove_labelled()
    except EngineError:
        return []  # no daemon: nothing can be left over
