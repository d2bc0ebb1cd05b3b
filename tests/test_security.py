"""Secrets stay in the environment, engines stay on loopback and unprivileged, and config
values never pass through a shell."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from conftest import REPO, load_yaml, write_config
from gridbench.config.loading import load_grid
from gridbench.engines.manager import SlotManager
from gridbench.errors import ConfigError
from test_workflow import in_runtime, snakemake

pytestmark = pytest.mark.integration
API_KEY = "sk-gridbench-planted-7f3a9c1e"
HUB_TOKEN = "hf_gridbenchPlantedToken4242"


def secured(config: dict) -> dict:
    config["engines"]["llamacpp"]["api_key_env"] = "GRIDBENCH_TEST_API_KEY"
    config["engines"]["llamacpp"]["pass_env"] = ["HF_TOKEN"]
    return config


def status_of(url: str, headers: dict | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


def test_planted_secrets_appear_in_no_output(workdir, demo_config, monkeypatch):
    monkeypatch.setenv("GRIDBENCH_TEST_API_KEY", API_KEY)
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    demo_config["configs"] = {k: demo_config["configs"][k] for k in ("D_f16_n0", "D_f16_draft4")}
    demo_config["depths"] = [0]
    write_config(workdir / "grid.yaml", secured(demo_config))
    result = snakemake(workdir, "--configfile", "grid.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    prov = json.loads((workdir / "results/raw/D_f16_draft4/depth_0.provenance.json").read_text())
    assert prov["spec_decode"]["acceptance_rate"] > 0.8  # /metrics was read with the key
    leaks = [
        str(path)
        for path in workdir.rglob("*")
        if path.is_file()
        and not path.is_symlink()
        and "resources" not in path.parts
        and (API_KEY.encode() in path.read_bytes() or HUB_TOKEN.encode() in path.read_bytes())
    ]
    assert leaks == []
    assert API_KEY not in result.stdout + result.stderr


def test_the_engine_really_requires_the_key(workdir, demo_config, monkeypatch):
    monkeypatch.setenv("GRIDBENCH_TEST_API_KEY", API_KEY)
    cfg = load_grid(secured(demo_config), "test.yaml").configs["D_f16_n0"]
    with SlotManager(["cpu"]).lease(cfg) as engine:
        assert status_of(engine.base_url + "/v1/models") == 401
        assert status_of(engine.base_url + "/v1/models", engine.headers) == 200


def test_a_secret_written_into_a_config_is_refused():
    config = load_yaml(REPO / "config/mechanism.yaml")
    config["engines"]["llamacpp"]["env"] = {"HF_TOKEN": "hf_literal"}
    with pytest.raises(ConfigError, match=r"engines\.llamacpp\.env\.HF_TOKEN: a secret may not be written"):
        load_grid(config, "mechanism.yaml")


@pytest.mark.parametrize("runtime", ["process", pytest.param("docker", marks=pytest.mark.docker)])
def test_engines_listen_on_loopback_and_are_not_privileged(workdir, demo_config, runtime):
    config = in_runtime(demo_config, runtime)
    cfg = load_grid(config, "test.yaml").configs["D_f16_n0"]
    with SlotManager(["cpu"]).lease(cfg) as engine:
        if runtime == "docker":
            import docker

            attrs = docker.from_env().containers.get(engine.handle.container_id).attrs
            assert attrs["HostConfig"]["Privileged"] is False
            listeners = [
                c
                for c in psutil.net_connections("tcp")
                if c.laddr.port == engine.plan.port and c.status == psutil.CONN_LISTEN
            ]
        else:
            listeners = [
                c
                for c in psutil.Process(engine.handle.pid).net_connections("tcp")
                if c.status == psutil.CONN_LISTEN
            ]
        assert listeners and {c.laddr.ip for c in listeners} == {"127.0.0.1"}


def test_config_values_reach_the_engine_as_literal_arguments(workdir, demo_config):
    demo_config["configs"] = {"D_f16_n0": demo_config["configs"]["D_f16_n0"]}
    demo_config["configs"]["D_f16_n0"]["extra_args"] = ["--alias", "x; touch pwned; $(touch pwned2)"]
    demo_config["benchy"]["extra_body"] = {"note": "`touch pwned3`"}
    demo_config["depths"] = [0]
    write_config(workdir / "grid.yaml", demo_config)
    snakemake(workdir, "--configfile", "grid.yaml")
    assert not [p for p in workdir.rglob("pwned*")]
    log = (workdir / "logs/engines/D_f16_n0.log").read_text()
    assert "x; touch pwned; $(touch pwned2)" in log  # handed over verbatim, as one argument
    assert Path(workdir / "logs/cells/D_f16_n0/depth_0.log").exists()


@pytest.mark.parametrize(
    ("place", "plant"),
    [
        (
            "engine extra_args",
            lambda c: c["engines"]["llamacpp"]["extra_args"].extend(["--api-key", API_KEY]),
        ),
        ("engine command", lambda c: c["engines"]["llamacpp"]["command"].append(f"--api-key={API_KEY}")),
        (
            "engine entrypoint",
            lambda c: c["engines"]["llamacpp"].update(entrypoint=["serve", "--hf-token", "x"]),
        ),
        ("config extra_args", lambda c: c["configs"]["D_f16_n0"].update(extra_args=["--token", "abc"])),
        (
            "speculation extra_args",
            lambda c: c["speculations"]["draft4"].update(
                extra_args=["-H", f"Authorization: Bearer {API_KEY}"]
            ),
        ),
        ("speculation extra", lambda c: c["speculations"]["draft4"].update(extra={"hub": HUB_TOKEN})),
        (
            "volume path",
            lambda c: c["checkpoints"]["f16"].update(
                volumes=[{"host": f"/keys/{API_KEY}", "container": "/k"}]
            ),
        ),
        ("checkpoint model", lambda c: c["checkpoints"]["f16"].update(model=f"/models/{HUB_TOKEN}/m.gguf")),
    ],
)
def test_a_credential_in_arguments_or_paths_is_refused_without_echoing_it(place, plant):
    """Arguments and paths end up in `gridbench engine command`, every provenance file and
    the dataset: a credential there is refused, and the message never repeats it."""
    config = load_yaml(REPO / "config/mechanism.yaml")
    plant(config)
    with pytest.raises(ConfigError, match="would put a secret on the engine's command line") as refused:
        load_grid(config, "mechanism.yaml")
    assert API_KEY not in str(refused.value) and HUB_TOKEN not in str(refused.value), place
    assert "api_key_env" in str(refused.value)


def test_flags_that_merely_look_alike_are_allowed():
    config = load_yaml(REPO / "config/mechanism.yaml")
    config["engines"]["llamacpp"]["extra_args"] += [
        "--api-key-file",
        "/run/keys/engine",
        "--tokenizer",
        "t.json",
    ]
    load_grid(config, "mechanism.yaml")
