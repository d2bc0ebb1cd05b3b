"""The engine start of a config as a command a person can review or run by hand."""

from __future__ import annotations

import shlex
from pathlib import Path

from gridbench.cells.provenance import redact_env
from gridbench.config.grid import ServingConfig
from gridbench.engines.commands import launch_plan


def docker_run_argv(cfg: ServingConfig, port: int, name: str = "gridbench-0-CONFIG") -> list[str]:
    """What DockerRuntime.start asks the daemon for, as the equivalent ``docker run``."""
    engine = cfg.engine
    plan = launch_plan(cfg, port)
    argv = ["docker", "run", "-d", "--name", name.replace("CONFIG", cfg.name.lower())]
    if engine.network == "host":
        argv += ["--network", "host"]
    else:
        argv += ["-p", f"{engine.host}:{port}:{port}"]
    if engine.gpus:
        argv += ["--gpus", "all"]
    if engine.ipc:
        argv += ["--ipc", engine.ipc]
    if engine.shm_size:
        argv += ["--shm-size", engine.shm_size]
    for limit, count in engine.ulimits.items():
        argv += ["--ulimit", f"{limit}={count}"]  # one value sets soft and hard, as the config does
    if engine.privileged:
        argv.append("--privileged")
    for volume in cfg.all_volumes:
        suffix = ":ro" if volume.read_only else ""
        argv += ["-v", f"{Path(volume.host).resolve()}:{volume.container}{suffix}"]
    for key, value in redact_env(cfg.all_env).items():
        argv += ["-e", f"{key}={value}"]
    entrypoint = list(engine.entrypoint or ())
    if entrypoint:
        argv += ["--entrypoint", entrypoint[0]]
    assert engine.image, "the config's validation requires an image for a docker engine"
    argv.append(engine.image)
    return argv + entrypoint[1:] + list(plan.argv)


def describe_launch(cfg: ServingConfig, slot_index: int = 0) -> str:
    port = cfg.engine.port + slot_index
    if cfg.engine.runtime == "docker":
        return shlex.join(docker_run_argv(cfg, port))
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in redact_env(cfg.all_env).items())
    line = shlex.join(launch_plan(cfg, port).argv)
    return f"{env} {line}" if env else line
