"""The engine check: the file it writes, and its rule for CPU engines: a core is left for the client."""

from __future__ import annotations

import json

import pytest

from conftest import REPO
from gridbench.config.loading import load_grid, load_grid_files
from gridbench.engines.kinds import engine_kind
from gridbench.engines.preflight import check_engine
from gridbench.errors import EngineStartError
from gridbench.util import codec


@pytest.fixture
def two_cores(monkeypatch):
    """The host the demo is made for (README: two idle cores), whatever this one has."""
    monkeypatch.setattr("os.cpu_count", lambda: 2)


def test_a_cpu_engine_given_every_core_fails_its_check_with_what_to_give_it(demo_config, two_cores):
    demo_config["engines"]["llamacpp"]["extra_args"] = ["--threads", "2"]
    grid = load_grid(demo_config, "test")
    with pytest.raises(EngineStartError) as err:
        check_engine(grid, "llamacpp")
    assert "config D_f16_n0 runs it on the CPU with 2 threads, and this host has 2 cores" in str(err.value)
    assert err.value.hint == "give it at most 1 threads (--threads in its extra_args)"

    demo_config["engines"]["llamacpp"]["extra_args"] = ["--threads", "1"]
    assert check_engine(load_grid(demo_config, "test"), "llamacpp").configs[0] == "D_f16_n0"


def test_the_check_file_names_the_engine_its_image_and_its_configs(demo_config, two_cores):
    check = check_engine(load_grid(demo_config, "test"), "llamacpp")
    record = json.loads(json.dumps(codec.to_json(check)))
    keys = ["engine", "runtime", "image", "image_id", "image_digest", "command", "configs"]
    assert list(record) == keys  # the file's keys, in the order they had as a plain dict
    assert record["engine"] == "llamacpp" and record["runtime"] == check.runtime == "process"
    assert record["command"] == list(check.image.command or ()) and record["configs"] == list(check.configs)


def test_a_config_of_its_own_can_take_every_core_and_is_named(demo_config, two_cores):
    demo_config["configs"]["D_q8_0_n0"]["extra_args"] = ["-t", "4"]
    with pytest.raises(EngineStartError, match="config D_q8_0_n0 runs it on the CPU with 4 threads"):
        check_engine(load_grid(demo_config, "test"), "llamacpp")


def test_a_gpu_engine_is_not_held_to_the_cores(demo_config, two_cores):
    demo_config["engines"]["llamacpp"].update(gpus=True, extra_args=["--threads", "2"])
    check_engine(load_grid(demo_config, "test"), "llamacpp")


def test_the_demo_leaves_its_client_a_core_on_two(two_cores):
    check_engine(load_grid_files([REPO / "config/mechanism.yaml"]), "llamacpp")


@pytest.mark.parametrize(
    ("args", "threads"),
    [
        ([], None),
        (["--threads", "3"], 3),
        (["-t", "2", "--metrics"], 2),
        (["--threads=5"], 5),
        (["-t", "2", "--threads", "6"], 6),  # the last one wins, as in llama-server
        (["--threads", "many"], None),
        (["--threads"], None),
    ],
)
def test_llamacpp_reads_its_threads_from_its_flags(args, threads):
    assert engine_kind("llamacpp").cpu_threads(args) == threads
