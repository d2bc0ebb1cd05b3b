"""Engine slots against real llama.cpp servers: as local processes and in containers."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest

from conftest import REPO, free_port, load_yaml
from gridbench.config.grid import Grid
from gridbench.config.loading import load_grid
from gridbench.engines.manager import SlotManager
from gridbench.errors import (
    EngineDeadlineError,
    EngineStartError,
    EngineTimeoutError,
    ImageNotFoundError,
    PortInUseError,
)

pytestmark = pytest.mark.integration
CPU_IMAGE = "local/gridbench-llamacpp-cpu:latest"


def grid_for(runtime: str, **engine_changes) -> Grid:
    config = load_yaml(REPO / "config/mechanism.yaml")
    if runtime == "docker":
        overlay = load_yaml(REPO / "config/mechanism-docker.yaml")
        config["engines"]["llamacpp"].update(overlay["engines"]["llamacpp"])
        for name, change in overlay["checkpoints"].items():
            config["checkpoints"][name].update(change)
        config["speculations"]["draft4"].update(overlay["speculations"]["draft4"])
    config["engines"]["llamacpp"].update({"port": free_port(), **engine_changes})
    return load_grid(config, "mechanism.yaml")


@pytest.fixture(params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def runtime(request):
    if request.param == "docker":
        import docker

        client = docker.from_env()
        client.images.get(CPU_IMAGE)  # built by .ci/run (scripts/build_llamacpp_cpu_image.sh)
    return request.param


def models(engine) -> list[str]:
    with urllib.request.urlopen(engine.base_url + "/v1/models", timeout=5) as r:
        return [m["id"] for m in json.load(r)["data"]]


def test_start_reuse_switch_and_stop(workdir, runtime):
    grid = grid_for(runtime)
    manager = SlotManager(["cpu"])
    with manager.lease(grid.configs["D_f16_n0"]) as first:
        assert not first.reused and models(first) == ["demo-f16"]
    with manager.lease(grid.configs["D_f16_n0"]) as again:
        assert again.reused and again.handle == first.handle
    with manager.lease(grid.configs["D_q8_0_draft4"]) as other:
        assert not other.reused and models(other) == ["demo-q8_0"]
        assert not manager.is_alive(first)  # one engine per slot
    assert manager.stop_all() == ["D_q8_0_draft4"]
    assert not manager.is_alive(other)
    events = [json.loads(line) for line in (workdir / "logs/engines/events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "ready", "reuse", "stop", "start", "ready", "stop"]


def test_a_start_the_sweeps_deadline_would_cut_short_is_not_begun(workdir, monkeypatch):
    grid = grid_for("process")
    manager = SlotManager(["cpu"])
    with manager.lease(grid.configs["D_f16_n0"]):  # no deadline: it starts, its start timed
        pass
    monkeypatch.setenv("GRIDBENCH_DEADLINE", str(time.time()))  # no time left
    with manager.lease(grid.configs["D_f16_n0"]) as warm:  # a warm engine serves on regardless
        assert warm.reused
    with pytest.raises(EngineDeadlineError, match=r"D_q8_0_draft4: its engine was not started: 0 s are left"):
        with manager.lease(grid.configs["D_q8_0_draft4"]):
            pass
    assert manager.status() == []  # the other config's engine stopped, none started in its place
    monkeypatch.setenv("GRIDBENCH_DEADLINE", str(time.time() + 600))
    with manager.lease(grid.configs["D_q8_0_draft4"]) as other:
        assert models(other) == ["demo-q8_0"]
    manager.stop_all()
    events = [json.loads(line) for line in (workdir / "logs/engines/events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "ready", "reuse", "stop", "start", "ready", "stop"]


def test_engine_that_exits_fails_fast_with_its_log(workdir, runtime):
    grid = grid_for(runtime, extra_args=["--no-such-flag"])
    manager = SlotManager(["cpu"])
    started = time.monotonic()
    with pytest.raises(EngineStartError, match="exited during start-up") as info:
        with manager.lease(grid.configs["D_f16_n0"]):
            pass
    assert time.monotonic() - started < 15
    assert "--no-such-flag" in info.value.log_tail
    assert manager.status() == []


def test_engine_that_never_gets_ready_times_out(workdir):
    grid = grid_for("process", command=["python3", "-c", "import time; time.sleep(60)"], startup_timeout_s=2)
    manager = SlotManager(["cpu"])
    with pytest.raises(EngineTimeoutError, match="not ready after 2 s"):
        with manager.lease(grid.configs["D_f16_n0"]):
            pass
    assert manager.status() == []  # stopped, not left behind


def test_fatal_log_line_fails_the_start_at_once(workdir):
    code = "import sys, time; print('Traceback (most recent call last):', flush=True); time.sleep(60)"
    grid = grid_for("process", command=["python3", "-c", code])
    with pytest.raises(EngineStartError, match="fatal error: Traceback"):
        with SlotManager(["cpu"]).lease(grid.configs["D_f16_n0"]):
            pass


def test_port_in_use_is_a_clear_error_or_a_free_port(workdir):
    grid = grid_for("process")
    cfg = grid.configs["D_f16_n0"]
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", cfg.engine.port))
        squatter.listen()
        with pytest.raises(PortInUseError, match=f"port 127.0.0.1:{cfg.engine.port} is already in use"):
            with SlotManager(["cpu"]).lease(cfg):
                pass
        picking = grid_for("process", port=cfg.engine.port, port_in_use="pick_free")
        with SlotManager(["cpu"]).lease(picking.configs["D_f16_n0"]) as engine:
            assert engine.plan.port != cfg.engine.port and models(engine) == ["demo-f16"]
        SlotManager(["cpu"]).stop_all()


@pytest.mark.docker
def test_missing_image_names_the_image(workdir):
    grid = grid_for("docker", image="local/not-built:never")
    with pytest.raises(ImageNotFoundError, match="image local/not-built:never is not present locally"):
        with SlotManager(["cpu"]).lease(grid.configs["D_f16_n0"]):
            pass


def stop_together(runtime, handle, together, errors: list[BaseException]) -> None:
    together.wait()
    try:
        runtime.stop(handle, grace_s=0)
    except BaseException as err:
        errors.append(err)


@pytest.mark.docker
def test_two_clients_stopping_one_container_both_return_once_it_is_gone(tmp_path):
    """A stop racing another (an interrupted run's and a test's teardown, or two sweeps'
    clean-ups): docker answers the second removal 409 Conflict while the first is under way,
    and the stop waits for the container to go instead of failing."""
    import threading

    import docker

    from gridbench.engines.runtime import ContainerHandle, DockerRuntime

    client = docker.from_env()
    for round_ in range(4):
        container = client.containers.run(CPU_IMAGE, entrypoint=["sleep", "300"], detach=True)
        handle = ContainerHandle(
            container_id=container.id, name=container.name, log_path=tmp_path / f"{round_}.log"
        )
        together, errors = threading.Barrier(2), []
        threads = [
            threading.Thread(target=stop_together, args=(DockerRuntime(), handle, together, errors))
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not errors, errors
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(container.id)
