"""Engine runtimes: a container through the Docker SDK, or a local process.

Both start detached, so a started engine outlives the cell that started it and the next
cell of the same config reuses it warm. A handle (ProcessHandle or ContainerHandle, kept as
JSON in the slot's state file) is all a later process needs to check, read and stop the
engine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any, Literal, Protocol

from cattrs.strategies import configure_tagged_union

from gridbench.config.grid import ServingConfig
from gridbench.engines.allocation import cuda_visible_devices, process_start_time, sweep_owner
from gridbench.engines.commands import LaunchPlan
from gridbench.errors import EngineError, EngineStartError, ImageNotFoundError
from gridbench.util import codec
from gridbench.util.files import JsonObject

LABEL = "gridbench.workdir"  # containers are labelled with their owner: working directory (and cluster job)

RuntimeName = Literal["process", "docker"]
# how long a container another client is removing may take to go
REMOVAL_WAIT_S = 60.0


@dataclass(frozen=True)
class ProcessHandle:
    """A local engine process: its pid with its start time (a pid alone is reused)."""

    # the handle's first key, which tells the two kinds of handle apart (see below)
    runtime: Literal["process"] = field(default="process", kw_only=True)
    pid: int
    name: str
    start_time: int | None
    log_path: Path
    log_offset: int = 0  # where this engine's output begins in the (appended) engine log


@dataclass(frozen=True)
class ContainerHandle:
    """A detached container, by id; its output is copied into the engine log when it stops."""

    runtime: Literal["docker"] = field(default="docker", kw_only=True)
    container_id: str
    name: str
    log_path: Path


RuntimeHandle = ProcessHandle | ContainerHandle

# a handle in a slot file (or a watchdog spec) is read as the kind its "runtime" key names
configure_tagged_union(
    RuntimeHandle,
    codec.converter,
    tag_generator={ProcessHandle: "process", ContainerHandle: "docker"}.__getitem__,
    tag_name="runtime",
)


@dataclass(frozen=True)
class ImageInfo:
    """What an engine runs: the image (id and digest) of a container, the command of a process."""

    image: str | None
    image_id: str | None
    image_digest: str | None
    # a process engine's command prefix; a container's record has no such key
    command: tuple[str, ...] | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)


class Runtime(Protocol):
    def start(
        self,
        cfg: ServingConfig,
        plan: LaunchPlan,
        *,
        name: str,
        gpus: list[str],
        log_path: Path,
        env: Mapping[str, str],
        mounts: Mapping[str, str],
    ) -> RuntimeHandle: ...
    def is_running(self, handle: RuntimeHandle) -> bool: ...
    def log_tail(self, handle: RuntimeHandle, lines: int = 40) -> str: ...
    def stop(self, handle: RuntimeHandle, grace_s: float = 15.0) -> None: ...
    def image_info(self, cfg: ServingConfig) -> ImageInfo: ...


def _tail(path: Path, lines: int, start: int = 0) -> str:
    """The last lines of a log, from byte ``start`` on (where this engine's output begins)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(start, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class ProcessRuntime:
    """A local command in its own process group, its output appended to the engine log."""

    def start(
        self,
        cfg: ServingConfig,
        plan: LaunchPlan,
        *,
        name: str,
        gpus: list[str],
        log_path: Path,
        env: Mapping[str, str],
        mounts: Mapping[str, str],  # none for a local process: it sees the host's folders
    ) -> ProcessHandle:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        child_env = {**os.environ, **cfg.all_env, **env}  # a local process inherits pass_env too
        if gpus:
            child_env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices(gpus)
        with log_path.open("ab") as log:
            offset = log.tell()
            try:
                proc = subprocess.Popen(
                    list(plan.argv),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=child_env,
                    start_new_session=True,
                )
            except (FileNotFoundError, PermissionError) as err:
                raise EngineStartError(
                    f"engine {cfg.engine.name}: cannot run {plan.argv[0]!r}: {err}",
                    hint=f"install it or fix engines.{cfg.engine.name}.command",
                ) from err
        return ProcessHandle(
            pid=proc.pid,
            name=name,
            start_time=process_start_time(proc.pid),
            log_path=log_path,
            log_offset=offset,
        )

    def is_running(self, handle: RuntimeHandle) -> bool:
        process = _process(handle)
        pid = process.pid
        start = process_start_time(pid)
        if start is None or start != process.start_time:
            return False  # gone, or the pid now belongs to another process
        with contextlib.suppress(ChildProcessError):
            done, _ = os.waitpid(pid, os.WNOHANG)  # reap it when we are its parent
            if done:
                return False
        return _process_state(pid) not in ("Z", "X", None)

    def log_tail(self, handle: RuntimeHandle, lines: int = 40) -> str:
        process = _process(handle)
        return _tail(process.log_path, lines, process.log_offset)

    def stop(self, handle: RuntimeHandle, grace_s: float = 15.0) -> None:
        if not self.is_running(handle):
            return
        pid = _process(handle).pid
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if not self.is_running(handle):
                    return
                time.sleep(0.05)
        raise EngineError(
            f"engine process {pid} did not stop after SIGKILL", hint=f"kill it by hand: kill -9 -{pid}"
        )

    def image_info(self, cfg: ServingConfig) -> ImageInfo:
        return ImageInfo(image=None, image_id=None, image_digest=None, command=tuple(cfg.engine.command))


def _process(handle: RuntimeHandle) -> ProcessHandle:
    if not isinstance(handle, ProcessHandle):
        raise TypeError(f"the process runtime got a {handle.runtime} handle: {handle}")
    return handle


def _container_handle(handle: RuntimeHandle) -> ContainerHandle:
    if not isinstance(handle, ContainerHandle):
        raise TypeError(f"the docker runtime got a {handle.runtime} handle: {handle}")
    return handle


def _process_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


class DockerRuntime:
    """A detached container; its log is copied into the engine log when it is stopped."""

    def __init__(self) -> None:
        import docker  # the SDK is only needed when a docker engine is used

        try:
            self.client = docker.from_env()
            self.client.ping()
        except docker.errors.DockerException as err:
            raise EngineError(
                f"cannot reach the Docker daemon: {err}",
                hint="start it (dockerd, or systemctl start docker) or use runtime: process",
            ) from err
        self.errors = docker.errors
        self.types = docker.types

    def _image(self, cfg: ServingConfig) -> Any:
        try:
            return self.client.images.get(cfg.engine.image)
        except self.errors.ImageNotFound as err:
            raise ImageNotFoundError(
                f"engine {cfg.engine.name}: image {cfg.engine.image} is not present locally; "
                "gridbench never pulls images",
                hint=f"docker pull {cfg.engine.image} (on a machine with registry access), "
                "docker load an exported copy, or build it (scripts/build_*_image.sh)",
            ) from err

    def image_info(self, cfg: ServingConfig) -> ImageInfo:
        image = self._image(cfg)
        digests = image.attrs.get("RepoDigests") or []
        return ImageInfo(
            image=cfg.engine.image, image_id=image.id, image_digest=digests[0] if digests else None
        )

    def start(
        self,
        cfg: ServingConfig,
        plan: LaunchPlan,
        *,
        name: str,
        gpus: list[str],
        log_path: Path,
        env: Mapping[str, str],
        mounts: Mapping[str, str],  # host folder -> container path, writable (the compile cache)
    ) -> ContainerHandle:
        engine = cfg.engine
        self._image(cfg)
        with contextlib.suppress(self.errors.NotFound):
            self._remove(self.client.containers.get(name))  # a leftover of a killed run
        missing = [v.host for v in cfg.all_volumes if not Path(v.host).exists()]
        if missing:  # docker would silently create an empty folder in their place
            raise EngineStartError(
                f"engine {engine.name} for {cfg.name}: volume host paths do not exist: {', '.join(missing)}",
                hint="fix the volumes' host paths in the config, or put the files there",
            )
        volumes = {
            str(Path(v.host).resolve()): {"bind": v.container, "mode": "ro" if v.read_only else "rw"}
            for v in cfg.all_volumes
        } | {host: {"bind": inside, "mode": "rw"} for host, inside in mounts.items()}
        kwargs: JsonObject = {
            "name": name,
            "detach": True,
            "labels": {LABEL: sweep_owner()},
            "environment": {**cfg.all_env, **passed_env(cfg), **env},
            "volumes": volumes,
            "privileged": engine.privileged,
            "command": list(plan.argv),
            "ulimits": [self.types.Ulimit(name=k, soft=v, hard=v) for k, v in engine.ulimits.items()],
        }
        if engine.entrypoint is not None:
            kwargs["entrypoint"] = list(engine.entrypoint)
        if engine.network == "host":
            kwargs["network_mode"] = "host"
        else:
            kwargs["ports"] = {f"{plan.port}/tcp": (engine.host, plan.port)}
        if engine.ipc:
            kwargs["ipc_mode"] = engine.ipc
        if engine.shm_size:
            kwargs["shm_size"] = engine.shm_size
        if engine.gpus:
            request = {"device_ids": gpus} if gpus else {"count": -1}
            kwargs["device_requests"] = [self.types.DeviceRequest(capabilities=[["gpu"]], **request)]
        try:
            container = self.client.containers.run(engine.image, **kwargs)
        except self.errors.APIError as err:
            raise EngineStartError(
                f"engine {engine.name}: docker could not start {engine.image}: {err.explanation or err}",
                hint="check the engine's docker settings (gpus, volumes, ports) in the config",
            ) from err
        log_path.parent.mkdir(parents=True, exist_ok=True)
        return ContainerHandle(container_id=container.id, name=name, log_path=log_path)

    def _container(self, handle: RuntimeHandle) -> Any:
        try:
            return self.client.containers.get(_container_handle(handle).container_id)
        except self.errors.NotFound:
            return None

    def is_running(self, handle: RuntimeHandle) -> bool:
        container = self._container(handle)
        return container is not None and container.status in ("created", "running")

    def log_tail(self, handle: RuntimeHandle, lines: int = 40) -> str:
        container = self._container(handle)
        if container is None:
            return _tail(handle.log_path, lines)
        logs: bytes = container.logs(tail=lines)
        return logs.decode(errors="replace")

    def stop(self, handle: RuntimeHandle, grace_s: float = 15.0) -> None:
        container = self._container(handle)
        if container is None:
            return
        with contextlib.suppress(self.errors.APIError):
            container.stop(timeout=grace_s)
        with contextlib.suppress(self.errors.APIError), handle.log_path.open("ab") as log:
            log.write(container.logs())
        self._remove(container)

    def _remove(self, container: Any) -> None:
        """Remove a container, and return once it is gone: also when another client (a run
        being interrupted, a second stop) is already removing it, which docker answers with
        409 Conflict rather than waiting."""
        try:
            container.remove(force=True)
            return
        except self.errors.NotFound:
            return
        except self.errors.APIError as err:
            if err.status_code != HTTPStatus.CONFLICT:
                raise
        deadline = time.monotonic() + REMOVAL_WAIT_S
        while time.monotonic() < deadline:
            try:
                container.reload()
            except self.errors.NotFound:
                return
            time.sleep(0.2)
        raise EngineError(
            f"container {container.name} is still being removed after {REMOVAL_WAIT_S:.0f} s",
            hint=f"check the Docker daemon (docker ps -a; docker rm -f {container.name})",
        )

    def remove_labelled(self) -> list[str]:
        """Remove the containers this owner started (a safety net for lost state)."""
        removed = []
        label = f"{LABEL}={sweep_owner()}"
        for container in self.client.containers.list(all=True, filters={"label": label}):
            self._remove(container)
            removed.append(container.name)
        return removed


def passed_env(cfg: ServingConfig) -> dict[str, str]:
    """The host variables the engine's pass_env names, where they are set."""
    return {name: os.environ[name] for name in cfg.engine.pass_env if name in os.environ}


def runtime_for(kind: str) -> Runtime:
    return DockerRuntime() if kind == "docker" else ProcessRuntime()


def runtime_of(handle: RuntimeHandle) -> Runtime:
    """The runtime that checks, reads and stops the engine of ``handle``."""
    return runtime_for(handle.runtime)
