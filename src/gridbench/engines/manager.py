"""The lease of engine slots: which engine runs on which GPU, and warm reuse.

A slot is one GPU (or the CPU, on a machine without one); a config with
tensor_parallel_size k takes k. Slot state lives in a host-wide directory, so two sweeps
(or cluster jobs) on one host see each other: a slot's flock is held by the cell using it,
a holder file names that cell's config, and the slot's JSON file names the engine on it
and who owns it (the working directory, and the SLURM job in it). A cell reuses its
config's engine when one runs, waits for it while another cell of the config uses it,
and otherwise starts one on free slots, stopping what ran there first: never two engines
on one slot, never two engines of one config.

This module runs that lease (survey, choose, wait, reuse); starting, watching and stopping
one engine is lifecycle.py's, the choice of slots policy.py's, the slot files slots.py's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gridbench.cells.provenance import query_gpus
from gridbench.config.grid import ServingConfig
from gridbench.engines.allocation import allocated_gpus, process_gone, sweep_owner, sweep_process
from gridbench.engines.commands import LaunchPlan
from gridbench.engines.compile_cache import CompileCache
from gridbench.engines.events import EngineEvent, log_event
from gridbench.engines.lifecycle import (
    EngineOwner,
    api_headers,
    is_running,
    start_engine,
    stop_engine,
    watch,
)
from gridbench.engines.policy import SlotView, choose_slots
from gridbench.engines.runtime import DockerRuntime, ImageInfo, RuntimeHandle, runtime_of
from gridbench.engines.slots import SlotHolder, SlotState, SlotStore, slot_dir
from gridbench.engines.watchdog import stop_orphan
from gridbench.errors import EngineError, SlotBusyError

log = logging.getLogger(__name__)


def detect_gpus() -> list[str]:
    """GPU indices from nvidia-smi; empty on a machine without NVIDIA GPUs."""
    return [row[0] for row in query_gpus("index")]


@dataclass(frozen=True)
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
    headers: dict[str, str]
    compile_cache: CompileCache | None = None

    @classmethod
    def of(cls, state: SlotState, *, reused: bool, headers: dict[str, str]) -> EngineLease:
        """The lease of the engine that ``state`` records."""
        return cls(
            config=state.config,
            fingerprint=state.fingerprint,
            slot=state.slots[0],
            slots=state.slots,
            plan=state.plan,
            handle=state.handle,
            started_at=state.started_at,
            ready_s=state.ready_s,
            reused=reused,
            version=state.version,
            image=state.image,
            headers=headers,
            compile_cache=state.compile_cache,
        )

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


class SlotManager:
    """Hands out ready engines on slots; one instance per cell process.

    The slot files and locks are SlotStore's (slots.py), the choice of slots is policy.py's,
    an engine's start and stop lifecycle.py's; this class runs the lease (survey, choose,
    wait) and decides to reuse, start or stop."""

    def __init__(self, slots: list[str], *, workdir: Path | None = None, wait_s: float | None = None) -> None:
        # inside a cluster job only the GPUs the job was given are ours, whatever the config says
        self.slots = allocated_gpus() or slots or ["cpu"]
        # the engines this cell starts belong to its sweep, and end with the sweep's process
        self.owner = EngineOwner(sweep_owner(cwd=workdir), sweep_process())
        self.wait_s = float(os.environ.get("GRIDBENCH_SLOT_WAIT_S", 600)) if wait_s is None else wait_s
        self.dir = slot_dir()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.store = SlotStore(self.dir)

    def _survey(self) -> list[SlotView]:
        views = []
        for slot in self.slots:
            lock = self.store.try_lock(slot)
            state = self.store.read_state(slot)
            holder = None if lock else self.store.read_holder(slot)
            alive = state is not None and is_running(state.handle)
            if state and alive and process_gone(state.owner_process):
                # its sweep was killed without stopping it (and its watchdog did not yet)
                by = f"a cell of the sweep in {self.owner.name}"
                stop_orphan(state, self.store, by=by, held=[slot] if lock else [])
                alive = False
                state = self.store.read_state(slot)
            views.append(SlotView(slot, lock, state, alive, holder))
        return views

    @contextlib.contextmanager
    def lease(self, cfg: ServingConfig, *, fresh: bool = False) -> Iterator[EngineLease]:
        """A ready engine for ``cfg`` on slots held for the duration of the block: a warm
        one, or with ``fresh`` one started for it, which has served nothing before.

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
            if process_gone(self.owner.process):  # its engine would be stopped at once
                gone_pid = self.owner.process["pid"] if self.owner.process else None
                raise EngineError(
                    f"{cfg.name}: the sweep that runs this cell (process "
                    f"{gone_pid}) is gone; no engine is started for it",
                    hint="run the sweep again: the cells it did not finish are redone",
                )
            with self.store.flock("select.lock", blocking=True):
                views = self._survey()
                try:
                    choice = choose_slots(views, fingerprint, need, owner=self.owner.name, order=self.slots)
                    chosen = choice.slots if choice else ()
                    holder = SlotHolder(config=cfg.name, fingerprint=fingerprint, owner=self.owner.name)
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
                    yield self._ensure(cfg, chosen, fingerprint, reuse=choice.warm, fresh=fresh)
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
            elif state and is_running(state.handle):
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
        self, cfg: ServingConfig, slots: tuple[str, ...], fingerprint: str, *, reuse: bool, fresh: bool
    ) -> EngineLease:
        """The engine of ``cfg`` on the held ``slots``: the warm one unless ``fresh``, or one
        started there."""
        state = self.store.read_state(slots[0])
        if reuse and not fresh and state and runtime_of(state.handle).is_running(state.handle):
            log_event(
                EngineEvent(
                    event="reuse", config=cfg.name, slot=slots[0], slots=slots, fingerprint=fingerprint
                )
            )
            if process_gone(state.watchdog):  # killed by hand: the engine needs one
                watch(state, self.store)
            return EngineLease.of(state, reused=True, headers=api_headers(cfg))
        for slot in slots:  # whatever ran on the chosen slots goes first
            if state := self.store.read_state(slot):
                stop_engine(state, self.store, slot=slot)
        started = start_engine(
            cfg, slots, fingerprint, owner=self.owner, store=self.store, all_slots=self.slots, fresh=fresh
        )
        return EngineLease.of(started, reused=False, headers=api_headers(cfg))

    def is_alive(self, engine: EngineLease) -> bool:
        return runtime_of(engine.handle).is_running(engine.handle)

    def log_tail(self, engine: EngineLease, lines: int = 40) -> str:
        return runtime_of(engine.handle).log_tail(engine.handle, lines)

    def discard(self, engine: EngineLease) -> None:
        """Stop an engine that failed its cell, so the next cell starts a fresh one."""
        state = self.store.read_state(engine.slot)
        if state and state.fingerprint == engine.fingerprint:
            stop_engine(state, self.store, slot=engine.slot)

    def stop_all(self) -> list[str]:
        """Stop every engine this owner (working directory, or cluster job) started; returns the configs."""
        stopped = []
        for slot in self.store.recorded_slots():
            with self.store.flock(f"slot-{slot}.lock", blocking=True):
                state = self.store.read_state(slot)
                if state and state.owner == self.owner.name:
                    stop_engine(state, self.store, slot=slot)
                    stopped.append(state.config)
        return stopped

    def status(self) -> list[SlotStatus]:
        rows = []
        for slot in self.store.recorded_slots():
            state = self.store.read_state(slot)
            if state:
                alive = is_running(state.handle)
                rows.append(SlotStatus(slot, state.config, state.owner, alive, state.plan.base_url))
        return rows


def remove_leftover_containers() -> list[str]:
    """Containers of this working directory without a slot record (a killed run's)."""
    try:
        return DockerRuntime().remove_labelled()
    except EngineError:
        return []  # no daemon: nothing can be left over
