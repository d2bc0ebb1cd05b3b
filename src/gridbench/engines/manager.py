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
import fcntl
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from gridbench import layout
from gridbench.engines import probe, watchdog
from gridbench.engines.allocation import (
    allocated_gpus,
    process_gone,
    process_identity,
    sweep_owner,
    sweep_process,
)
from gridbench.engines.commands import LaunchPlan, launch_plan
from gridbench.engines.kinds import engine_kind
from gridbench.engines.runtime import DockerRuntime, runtime_for
from gridbench.errors import EngineError, PortInUseError, SlotBusyError
from gridbench.files import atomic_write_text
from gridbench.grid import ServingConfig
from gridbench.provenance import query_gpus

log = logging.getLogger(__name__)

ENGINE_LOG_DIR = Path("logs/engines")
ORPHAN_GRACE_S = 3.0  # an engine whose sweep is gone gets this long to stop before SIGKILL


def slot_dir() -> Path:
    return Path(os.environ.get("GRIDBENCH_SLOT_DIR", "/tmp/gridbench-slots"))


def detect_gpus() -> list[str]:
    """GPU indices from nvidia-smi; empty on a machine without NVIDIA GPUs."""
    return [row[0] for row in query_gpus("index")]


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class EngineLease:
    """An engine that is ready, held for one cell."""

    config: str
    fingerprint: str
    slot: str  # the first of ``slots``: the engine's port and container name follow it
    slots: tuple[str, ...]
    plan: LaunchPlan
    handle: dict[str, Any]
    started_at: str
    ready_s: float
    reused: bool
    version: str | None
    image: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return self.plan.base_url


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
        return sock.getsockname()[1]


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


@dataclass
class _SlotView:
    """One slot as a selecting cell sees it, under the selection lock."""

    name: str
    lock: IO[str] | None  # held by us: the slot is free; None: a running cell holds it
    state: dict[str, Any] | None  # the slot's engine record (alive or not)
    alive: bool
    holder: dict[str, Any] | None  # which cell holds it, when one does

    @property
    def free(self) -> bool:
        return self.lock is not None


class SlotManager:
    """Hands out ready engines on slots; one instance per cell process."""

    def __init__(self, slots: list[str], *, workdir: Path | None = None, wait_s: float | None = None) -> None:
        # inside a cluster job only the GPUs the job was given are ours, whatever the config says
        self.slots = allocated_gpus() or slots or ["cpu"]
        self.owner = sweep_owner(cwd=workdir)
        self.owner_process = sweep_process()  # the engines this cell starts end with it
        self.wait_s = float(os.environ.get("GRIDBENCH_SLOT_WAIT_S", 600)) if wait_s is None else wait_s
        self.dir = slot_dir()
        self.dir.mkdir(parents=True, exist_ok=True)

    def _state_path(self, slot: str) -> Path:
        return self.dir / f"slot-{slot}.json"

    def _holder_path(self, slot: str) -> Path:
        return self.dir / f"holder-{slot}.json"

    def _read_json(self, path: Path) -> dict[str, Any] | None:
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def _read_state(self, slot: str) -> dict[str, Any] | None:
        return self._read_json(self._state_path(slot))

    def _write_state(self, slot: str, state: dict[str, Any] | None) -> None:
        path = self._state_path(slot)
        if state is None:
            path.unlink(missing_ok=True)
        else:
            atomic_write_text(path, json.dumps(state, indent=2))

    @contextlib.contextmanager
    def _flock(self, name: str, *, blocking: bool) -> Iterator[bool]:
        with (self.dir / name).open("a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _try_lock(self, slot: str) -> IO[str] | None:
        """The slot's lock, held until the returned file is closed; None if a cell holds it."""
        f = (self.dir / f"slot-{slot}.lock").open("a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return None
        return f

    def _alive(self, state: dict[str, Any] | None) -> bool:
        if not state:
            return False
        try:
            return runtime_for(state["handle"]["runtime"]).is_running(state["handle"])
        except EngineError:
            return False

    def _survey(self) -> list[_SlotView]:
        views = []
        for slot in self.slots:
            lock = self._try_lock(slot)
            state = self._read_state(slot)
            holder = None if lock else self._read_json(self._holder_path(slot))
            alive = self._alive(state)
            if alive and process_gone(state.get("owner_process")):
                # its sweep was killed without stopping it (and its watchdog did not yet)
                by = f"a cell of the sweep in {self.owner}"
                stop_orphan(state, self.dir, by=by, held=[slot] if lock else [])
                alive = False
                state = self._read_state(slot)
            views.append(_SlotView(slot, lock, state, alive, holder))
        return views

    def _choose(
        self, views: list[_SlotView], fingerprint: str, need: int
    ) -> tuple[tuple[str, ...], bool] | None:
        """The slots to use and whether their engine is warm; None: wait.

        A config has one engine: a cell whose config's engine is busy (another cell of
        it measures, or starts it) waits for it instead of starting a second one."""
        if any(
            v.holder and v.holder["fingerprint"] == fingerprint and v.holder["owner"] == self.owner
            for v in views
        ):
            return None
        free = {v.name for v in views if v.free}
        for v in views:
            ours = v.alive and v.state["owner"] == self.owner
            if v.free and ours and v.state["fingerprint"] == fingerprint:
                engine_slots = tuple(v.state.get("slots", [v.name]))
                if free.issuperset(engine_slots):
                    return engine_slots, True
        # a new engine: empty slots first (other warm engines stay reusable), then ours to switch
        usable = [v for v in views if v.free and (not v.alive or v.state["owner"] == self.owner)]
        usable.sort(key=lambda v: (v.alive, self.slots.index(v.name)))
        if len(usable) < need:
            return None
        return tuple(v.name for v in usable[:need]), False

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
                raise EngineError(
                    f"{cfg.name}: the sweep that runs this cell (process "
                    f"{self.owner_process['pid']}) is gone; no engine is started for it",
                    hint="run the sweep again: the cells it did not finish are redone",
                )
            with self._flock("select.lock", blocking=True):
                views = self._survey()
                try:
                    choice = self._choose(views, fingerprint, need)
                    chosen = choice[0] if choice else ()
                    holder = {"config": cfg.name, "fingerprint": fingerprint, "owner": self.owner}
                    for slot in chosen:
                        atomic_write_text(self._holder_path(slot), json.dumps(holder))
                except BaseException:
                    chosen = ()
                    raise
                finally:
                    for view in views:
                        if view.lock and view.name not in chosen:
                            view.lock.close()
            if choice:
                locks = [view.lock for view in views if view.name in chosen]
                try:
                    yield self._ensure(cfg, chosen, fingerprint, reuse=choice[1])
                finally:
                    for slot in chosen:
                        self._holder_path(slot).unlink(missing_ok=True)
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
            state = self._read_state(slot)
            holder = self._read_json(self._holder_path(slot))
            if holder and holder["fingerprint"] == cfg.fingerprint():
                owners.append(f"slot {slot}: a cell of {cfg.name} uses its engine")
            elif self._alive(state):
                owners.append(f"slot {slot}: engine {state['config']} of the sweep in {state['owner']}")
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
        state = self._read_state(slots[0])
        if reuse and state:
            runtime = runtime_for(state["handle"]["runtime"])
            if runtime.is_running(state["handle"]):
                _log_event("reuse", cfg.name, slot=slots[0], slots=list(slots), fingerprint=fingerprint)
                if process_gone(state.get("watchdog")):  # killed by hand: the engine needs one
                    self._watch(state, Path(state["handle"]["log_path"]))
                return EngineLease(
                    config=cfg.name,
                    fingerprint=fingerprint,
                    slot=slots[0],
                    slots=slots,
                    plan=LaunchPlan(**{**state["plan"], "argv": tuple(state["plan"]["argv"])}),
                    handle=state["handle"],
                    started_at=state["started_at"],
                    ready_s=state["ready_s"],
                    reused=True,
                    version=state["version"],
                    image=state["image"],
                    headers=api_headers(cfg),
                )
        for slot in slots:  # whatever ran on the chosen slots goes first
            if state := self._read_state(slot):
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
        _log_event(
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
        state = {
            "owner": self.owner,
            "owner_process": self.owner_process,
            "config": cfg.name,
            "fingerprint": fingerprint,
            "slots": list(slots),
            "handle": handle,
            "plan": {**plan.__dict__, "argv": list(plan.argv)},
            "started_at": started_at,
            "ready_s": None,
            "version": None,
            "image": image,
        }
        for member in slots:
            self._write_state(member, state)
        headers = api_headers(cfg)
        what = f"engine {cfg.engine.name} for config {cfg.name}"
        try:
            self._watch(state, log_path)  # from now on, the engine ends with its sweep
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
        state["ready_s"] = round(ready_s, 3)
        state["version"] = engine_kind(cfg.engine.kind).version(plan.base_url, headers)
        for member in slots:
            self._write_state(member, state)
        _log_event("ready", cfg.name, slot=slot, fingerprint=fingerprint, ready_s=state["ready_s"])
        return EngineLease(
            config=cfg.name,
            fingerprint=fingerprint,
            slot=slot,
            slots=slots,
            plan=plan,
            handle=handle,
            started_at=started_at,
            ready_s=state["ready_s"],
            reused=False,
            version=state["version"],
            image=image,
            headers=headers,
        )

    def _watch(self, state: dict[str, Any], log_path: Path) -> None:
        """Start the engine's watchdog and record it with the engine in its slots."""
        proc = watchdog.start(state, self.dir, log_path)
        state["watchdog"] = process_identity(proc.pid)
        for member in state["slots"]:
            self._write_state(member, state)

    def _stop_state(self, slot: str, state: dict[str, Any]) -> None:
        runtime_for(state["handle"]["runtime"]).stop(state["handle"])
        _log_event("stop", state["config"], slot=slot, fingerprint=state["fingerprint"])
        for member in state.get("slots", [slot]):  # an engine on several GPUs frees them all
            current = self._read_state(member)
            if current and current["handle"] == state["handle"]:
                self._write_state(member, None)

    def is_alive(self, engine: EngineLease) -> bool:
        return runtime_for(engine.handle["runtime"]).is_running(engine.handle)

    def log_tail(self, engine: EngineLease, lines: int = 40) -> str:
        return runtime_for(engine.handle["runtime"]).log_tail(engine.handle, lines)

    def discard(self, engine: EngineLease) -> None:
        """Stop an engine that failed its cell, so the next cell starts a fresh one."""
        state = self._read_state(engine.slot)
        if state and state["fingerprint"] == engine.fingerprint:
            self._stop_state(engine.slot, state)

    def stop_all(self) -> list[str]:
        """Stop every engine this owner (working directory, or cluster job) started; returns the configs."""
        stopped = []
        for path in sorted(self.dir.glob("slot-*.json")):
            slot = path.stem.removeprefix("slot-")
            with self._flock(f"slot-{slot}.lock", blocking=True):
                state = self._read_state(slot)
                if state and state["owner"] == self.owner:
                    self._stop_state(slot, state)
                    stopped.append(state["config"])
        return stopped

    def status(self) -> list[dict[str, Any]]:
        rows = []
        for path in sorted(self.dir.glob("slot-*.json")):
            slot = path.stem.removeprefix("slot-")
            state = self._read_state(slot)
            if state:
                rows.append(
                    {
                        "slot": slot,
                        "config": state["config"],
                        "owner": state["owner"],
                        "alive": self._alive(state),
                        "base_url": LaunchPlan(
                            **{**state["plan"], "argv": tuple(state["plan"]["argv"])}
                        ).base_url,
                    }
                )
        return rows


def stop_orphan(state: dict[str, Any], slots_dir: Path, *, by: str, held: Collection[str] = ()) -> None:
    """Stop an engine whose sweep is gone, free its slots and log a ``reclaim`` event.

    A slot's record is removed only where no cell holds the slot (or the caller does: the
    slots in ``held``); a cell that holds one finds the engine dead and cleans up itself."""
    owner_pid = (state.get("owner_process") or {}).get("pid")
    log.warning(
        f"engine {state['config']} on slot {','.join(state['slots'])} outlived the sweep in "
        f"{state['owner']} (its process {owner_pid} is gone): stopping it"
    )
    # nobody waits for its answers any more: a short grace, as a busy engine may ignore SIGTERM
    runtime_for(state["handle"]["runtime"]).stop(state["handle"], grace_s=ORPHAN_GRACE_S)
    _log_event(
        "reclaim",
        state["config"],
        slot=state["slots"][0],
        slots=list(state["slots"]),
        fingerprint=state["fingerprint"],
        owner=state["owner"],
        owner_pid=owner_pid,
        by=by,
    )
    for member in state["slots"]:
        lock = None
        if member not in held:
            lock = (slots_dir / f"slot-{member}.lock").open("a")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
        try:
            path = slots_dir / f"slot-{member}.json"
            with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
                if json.loads(path.read_text())["handle"] == state["handle"]:
                    path.unlink(missing_ok=True)
        finally:
            if lock:
                lock.close()


def remove_leftover_containers() -> list[str]:
    """Containers of this working directory without a slot record (a killed run's)."""
    try:
        return DockerRuntime().remove_labelled()
    except EngineError:
        return []  # no daemon: nothing can be left over


def _log_event(event: str, config: str, **fields: Any) -> None:
    path = Path(layout.ENGINE_EVENTS)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"ts": now_iso(), "event": event, "config": config, **fields}
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
