"""One engine's life on its slots: start, readiness, watchdog, stop.

The lease (manager.py) decides which slots a cell gets and whether it reuses the engine on
them; these functions start and stop one engine there and keep its slot records (slots.py)
in step: an engine is recorded in each of its slots from the moment it is started, its
watchdog and readiness are added as they come, and its records go when it stops.

An engine never outlives the sweep that owns it by more than a few seconds: its record names
the sweep's process (see allocation.claim_sweep), the watchdog started with it stops it once
that process is gone, and a cell that finds a slot whose owner process is gone stops that
engine at once (watchdog.stop_orphan: a ``reclaim`` event) instead of waiting.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gridbench import layout
from gridbench.config.grid import ServingConfig
from gridbench.engines import compile_cache, deadline, failed_starts, probe, watchdog
from gridbench.engines.allocation import ProcessIdentity, process_identity
from gridbench.engines.commands import LaunchPlan, launch_plan
from gridbench.engines.events import EngineEvent, log_event, now_iso
from gridbench.engines.kinds import engine_kind
from gridbench.engines.runtime import Runtime, RuntimeHandle, runtime_for, runtime_of
from gridbench.engines.slots import SlotState, SlotStore
from gridbench.errors import EngineError, EngineStartError, PortInUseError

# a start's log lines read for what it made of its compile cache: its whole start-up
COMPILE_LOG_LINES = 20_000


@dataclass(frozen=True)
class EngineOwner:
    """Whose engines a cell starts: its sweep's, named by the working directory (and cluster
    job), and ending with the sweep's process."""

    name: str
    process: ProcessIdentity | None


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


def is_running(handle: RuntimeHandle) -> bool:
    """Whether the engine runs; False too when its runtime cannot be asked (no Docker daemon)."""
    try:
        return runtime_of(handle).is_running(handle)
    except EngineError:
        return False


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


def port_for(cfg: ServingConfig, slot: str, all_slots: Sequence[str]) -> int:
    """The engine's port on ``slot``: the configured port plus the GPU id, or plus the slot's
    place in ``all_slots`` for a slot that is no GPU id."""
    # GPU ids are host-wide, so jobs on one node that hold different GPUs get different ports
    port = cfg.engine.port + (int(slot) if slot.isdigit() else all_slots.index(slot))
    if _port_free(cfg.engine.host, port):
        return port
    if cfg.engine.port_in_use == "pick_free":
        return _free_port(cfg.engine.host)
    raise PortInUseError(
        f"engine {cfg.engine.name} for {cfg.name}: port {cfg.engine.host}:{port} is already "
        "in use by something gridbench did not start",
        hint=f"stop what listens there, change engines.{cfg.engine.name}.port, or set port_in_use: pick_free",
    )


def container_name(cfg: ServingConfig, slots: tuple[str, ...], owner: EngineOwner) -> str:
    # unique per owner: two sweeps (or cluster jobs) on one host never touch each other's container
    digest = hashlib.sha256(owner.name.encode()).hexdigest()[:8]
    return f"gridbench-{digest}-{'-'.join(slots)}-{cfg.name}".lower()


def start_engine(
    cfg: ServingConfig,
    slots: tuple[str, ...],
    fingerprint: str,
    *,
    owner: EngineOwner,
    store: SlotStore,
    all_slots: Sequence[str],
    fresh: bool = False,
) -> SlotState:
    """Start ``cfg``'s engine on ``slots`` (which run none) and wait until it answers;
    ``fresh``: its cell asked for an engine that has served nothing (the start event says so).

    Returns its record, as written in each of its slots. An engine that does not get ready
    is stopped: a half-started engine never holds the GPU; one that the sweep's deadline
    would cut short is not started (engines/deadline.py), nor one whose start already failed
    in this sweep (engines/failed_starts.py)."""
    deadline.refuse_late_start(cfg.name, fingerprint)
    failed_starts.refuse_failed_start(cfg.name, fingerprint, Path(layout.ENGINE_LOG.format(config=cfg.name)))
    slot = slots[0]
    runtime = runtime_for(cfg.engine.runtime)
    image = runtime.image_info(cfg)
    plan = launch_plan(cfg, port_for(cfg, slot, all_slots))
    started_at = now_iso()
    cache = compile_cache.prepare(cfg, fingerprint, image)
    handle = _launch(
        cfg,
        slots,
        plan,
        runtime,
        owner=owner,
        fingerprint=fingerprint,
        started_at=started_at,
        cache=cache,
        fresh=fresh,
    )
    state = SlotState(
        owner=owner.name,
        owner_process=owner.process,
        config=cfg.name,
        fingerprint=fingerprint,
        slots=slots,
        handle=handle,
        plan=plan,
        started_at=started_at,
        ready_s=None,
        version=None,
        image=image,
        compile_cache=cache.cache if cache else None,
    )
    _record(state, store)
    return _ready(cfg, _wait_until_ready(cfg, state, store, runtime), store, runtime)


def _ready(cfg: ServingConfig, state: SlotState, store: SlotStore, runtime: Runtime) -> SlotState:
    """The ready engine's record, with what its start made of the compile cache, written and
    logged as the ready event."""
    if state.compile_cache is not None:
        log = runtime.log_tail(state.handle, lines=COMPILE_LOG_LINES)
        state = dataclasses.replace(
            state, compile_cache=compile_cache.after_ready(cfg, state.compile_cache, log)
        )
    _record(state, store)
    log_event(
        EngineEvent(
            event="ready",
            config=cfg.name,
            slot=state.slots[0],
            fingerprint=state.fingerprint,
            ready_s=state.ready_s,
            compile_cache=state.compile_cache.found if state.compile_cache else None,
            compile_cache_files=state.compile_cache.artifacts_after if state.compile_cache else None,
        )
    )
    return state


def _launch(
    cfg: ServingConfig,
    slots: tuple[str, ...],
    plan: LaunchPlan,
    runtime: Runtime,
    *,
    owner: EngineOwner,
    fingerprint: str,
    started_at: str,
    cache: compile_cache.CacheUse | None,
    fresh: bool,
) -> RuntimeHandle:
    """Log the start, mark it in the engine's log and start its process or container."""
    log_path = Path(layout.ENGINE_LOG.format(config=cfg.name))
    log_event(
        EngineEvent(
            event="start",
            config=cfg.name,
            slot=slots[0],
            slots=tuple(slots),
            fingerprint=fingerprint,
            port=plan.port,
            owner=owner.name,
            compile_cache_key=cache.cache.key if cache else None,
            compile_cache_files=cache.cache.artifacts_before if cache else None,
            fresh=fresh,
        )
    )
    with log_path.open("a") as engine_log:
        engine_log.write(
            f"\n=== gridbench: starting {cfg.name} on slot {','.join(slots)} at {started_at}: "
            f"{plan.shell_line()}\n"
        )
    key = api_key(cfg)
    env = {engine_kind(cfg.engine.kind).api_key_variable: key} if key else {}
    env |= cache.env if cache else {}
    mounts = cache.mounts if cache else {}
    gpus = [s for s in slots if s != "cpu"] if cfg.engine.gpus else []
    name = container_name(cfg, slots, owner)
    return runtime.start(cfg, plan, name=name, gpus=gpus, log_path=log_path, env=env, mounts=mounts)


def _wait_until_ready(cfg: ServingConfig, state: SlotState, store: SlotStore, runtime: Runtime) -> SlotState:
    """The started engine's record once it answers, with its watchdog, readiness time and
    version; an engine that does not answer is stopped."""
    handle, plan = state.handle, state.plan
    headers = api_headers(cfg)
    try:
        state = watch(state, store)  # from now on, the engine ends with its sweep
        ready_s = probe.wait_ready(
            base_url=plan.base_url,
            health_path=cfg.engine.health_path,
            served_model_name=plan.served_model_name,
            timeout_s=cfg.engine.startup_timeout_s,
            is_running=lambda: runtime.is_running(handle),
            log_text=lambda: runtime.log_tail(handle, 200),
            fatal_patterns=cfg.engine.fatal_log_patterns,
            what=f"engine {cfg.engine.name} for config {cfg.name}",
            headers=headers,
        )
    except BaseException as err:
        stop_engine(state, store, slot=state.slots[0])
        if isinstance(err, EngineStartError):
            failed_starts.note_failed_start(cfg.name, state.slots[0], state.fingerprint, err)
        raise
    return dataclasses.replace(
        state,
        ready_s=round(ready_s, 3),
        version=engine_kind(cfg.engine.kind).version(plan.base_url, headers),
    )


def _record(state: SlotState, store: SlotStore) -> None:
    for member in state.slots:  # an engine on several GPUs is recorded in each
        store.write_state(member, state)


def watch(state: SlotState, store: SlotStore) -> SlotState:
    """Start the engine's watchdog and record it with the engine in its slots."""
    proc = watchdog.start(state, store.dir, state.handle.log_path)
    state = dataclasses.replace(state, watchdog=process_identity(proc.pid))
    _record(state, store)
    return state


def stop_engine(state: SlotState, store: SlotStore, *, slot: str) -> None:
    """Stop the engine of ``state`` and free its slots; ``slot``, where it was found, is the
    one its ``stop`` event names."""
    runtime_of(state.handle).stop(state.handle)
    log_event(EngineEvent(event="stop", config=state.config, slot=slot, fingerprint=state.fingerprint))
    for member in state.slots:  # an engine on several GPUs frees them all
        current = store.read_state(member)
        if current and current.handle == state.handle:
            store.write_state(member, None)
