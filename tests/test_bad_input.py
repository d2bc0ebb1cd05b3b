"""Invalid configs stop before any engine starts: non-zero exit, one message naming the key
and what is allowed."""

from __future__ import annotations

import copy
import csv
import json
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, gridbench, load_yaml

DEMO = load_yaml(REPO / "config/mechanism.yaml")


def changed(mutate):
    config = copy.deepcopy(DEMO)
    mutate(config)
    return yaml.safe_dump(config, sort_keys=False)


def set_in(path: str, value):
    def mutate(config):
        *parents, last = path.split(".")
        node = config
        for key in parents:
            node = node[key]
        node[last] = value

    return mutate


def drop(path: str):
    def mutate(config):
        *parents, last = path.split(".")
        node = config
        for key in parents:
            node = node[key]
        del node[last]

    return mutate


CASES = {
    "unknown top-level key": (changed(set_in("depth", [0])), "'depth' was unexpected); allowed keys:"),
    "unknown nested key": (changed(set_in("benchy.rnus", 3)), "key benchy: Additional properties"),
    "wrong type": (changed(set_in("benchy.runs", "two")), "key benchy.runs: 'two' is not of type 'integer'"),
    "negative depth": (
        changed(set_in("depths", [0, -512])),
        "key depths.1: -512 is less than the minimum of 0",
    ),
    "non-integer depth": (changed(set_in("depths", [0, 1.5])), "key depths.1: 1.5 is not of type 'integer'"),
    "nothing to measure": (
        changed(lambda c: (c.update(depths=[]), c.pop("natural"))),
        "the study measures nothing: depths is empty and there is no natural section",
    ),
    "duplicate depth": (changed(set_in("depths", [0, 0])), "key depths: [0, 0] has non-unique elements"),
    "empty grid": (changed(set_in("configs", {})), "key configs: {} should be non-empty"),
    "missing section": (changed(drop("checkpoints")), "'checkpoints' is a required property"),
    "unknown engine": (
        changed(set_in("configs.D_f16_n0.engine", "vllm0")),
        "configs.D_f16_n0.engine: unknown engine 'vllm0'; allowed values: llamacpp",
    ),
    "unknown checkpoint": (
        changed(set_in("configs.D_f16_n0.checkpoint", "fp8")),
        "unknown checkpoint 'fp8'; allowed values: f16, q8_0",
    ),
    "unknown speculation": (
        changed(set_in("configs.D_f16_n0.speculation", "eagle")),
        "unknown speculation 'eagle'; allowed values: none, draft4",
    ),
    "bad enum": (changed(set_in("engines.llamacpp.kind", "sglang")), "allowed values: vllm, llamacpp"),
    "bad runtime": (changed(set_in("engines.llamacpp.runtime", "podman")), "allowed values: docker, process"),
    "docker without image": (
        changed(set_in("engines.llamacpp.runtime", "docker")),
        "the docker runtime needs an image",
    ),
    "process without command": (
        changed(set_in("engines.llamacpp.command", [])),
        "the process runtime needs a command",
    ),
    "malformed speculative JSON": (
        changed(set_in("speculations.draft4.extra", '{"draft_sample_method": ')),
        "key speculations.draft4.extra: '{\"draft_sample_method\": ' is not of type 'object'",
    ),
    "method of another engine kind": (
        changed(set_in("speculations.draft4.method", "dflash")),
        "'dflash' is not a llamacpp method; allowed values:",
    ),
    "draft method without draft model": (
        changed(set_in("speculations.draft4.draft_model", None)),
        "method draft-simple needs draft_model",
    ),
    "pp + tg above max model length": (
        changed(set_in("serving.max_model_len", 150)),
        "benchy.pp + benchy.tg = 192 exceeds configs.D_f16_n0's max_model_len 150",
    ),
    "config name with a path in it": (
        changed(set_in("configs", {"../x": DEMO["configs"]["D_f16_n0"]})),
        "key configs: '../x' does not match",
    ),
    "memory fraction above 1": (
        changed(set_in("serving.gpu_memory_utilization", 1.5)),
        "1.5 is greater than the maximum of 1",
    ),
    "port out of range": (
        changed(set_in("engines.llamacpp.port", 70000)),
        "key engines.llamacpp.port: 70000 is greater than the maximum of 65535",
    ),
    "relative container path": (
        changed(set_in("engines.llamacpp.volumes", [{"host": "a", "container": "b"}])),
        "key engines.llamacpp.volumes.0.container: 'b' does not match '^/'",
    ),
    "secret in the config": (
        changed(set_in("engines.llamacpp.env", {"HF_TOKEN": "hf_x"})),
        "a secret may not be written in a config file",
    ),
    "duplicate config name": (
        Path(REPO / "config/mechanism.yaml")
        .read_text()
        .replace("  D_q8_0_n0: {engine", "  D_f16_n0: {engine", 1),
        "key 'D_f16_n0' is given twice",
    ),
    "YAML syntax error": ("engines: [unclosed\n", "is not valid YAML"),
}


@pytest.mark.parametrize("text,expected", CASES.values(), ids=CASES.keys())
def test_invalid_config_is_one_clear_error(tmp_path, text, expected):
    (tmp_path / "bad.yaml").write_text(text)
    result = gridbench("cells", "--configfile", "bad.yaml", cwd=tmp_path, check=False)
    assert result.returncode == 2
    message = result.stderr.strip()
    assert message.startswith("gridbench: error: ") and expected in message, message
    assert "Traceback" not in message
    assert message.count("gridbench: error:") == 1


@pytest.mark.parametrize(
    "override,expected",
    [
        ("engine=aoen", "--config engine=aoen: unknown engine aoen; allowed values: llamacpp"),
        ("config=D_f16_n0,D_x", "unknown config D_x; allowed values: D_f16_n0, D_f16_draft4"),
        ("speculation=", "unknown speculation (empty)"),
    ],
)
def test_unknown_filter_value_is_one_clear_error(tmp_path, override, expected):
    result = gridbench(
        "cells",
        "--configfile",
        str(REPO / "config/mechanism.yaml"),
        "--config",
        override,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 2 and expected in result.stderr, result.stderr


@pytest.mark.workflow
@pytest.mark.parametrize("case", ["unknown nested key", "duplicate config name", "unknown engine"])
def test_the_workflow_stops_before_any_engine_starts(tmp_path, case):
    import subprocess

    (tmp_path / "bad.yaml").write_text(CASES[case][0])
    snakemake = Path(sys.executable).parent / "snakemake"
    result = subprocess.run(
        [
            str(snakemake),
            "-s",
            str(REPO / "Snakefile"),
            "-d",
            str(tmp_path),
            "-j1",
            "--configfile",
            str(tmp_path / "bad.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert f"gridbench: invalid config: {tmp_path}/bad.yaml" in output or "bad.yaml" in output
    assert CASES[case][1] in output
    assert not (tmp_path / "logs/engines").exists() and not (tmp_path / "results").exists()


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`gridbench cells … | head`: the pipe closes before the listing is written."""
    import subprocess

    exe = Path(sys.executable).parent / "gridbench"
    argv = [str(exe), "cells", "--configfile", str(REPO / "config/config.yaml")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # before the interpreter has even started: every write fails
    stderr = proc.stderr.read()
    assert proc.wait(timeout=60) == 141, stderr
    assert "Traceback" not in stderr, stderr


# A grid file as a person writes it: only the required keys, no defaults filled in.
HAND_WRITTEN = {
    "engines": {"llamacpp": {"kind": "llamacpp", "runtime": "process", "command": ["llama-server"]}},
    "checkpoints": {"q8": {"model": "m.gguf", "quantization": "Q8_0"}},
    "speculations": {"none": {"method": "none"}},
    "configs": {"Q8": {"engine": "llamacpp", "checkpoint": "q8", "speculation": "none"}},
    "depths": [0, 512],
}


def test_a_hand_written_grid_file_works_where_the_workflow_s_does(tmp_path):
    """`--grid` files are what the rules write, but one written by hand (no defaults) goes
    through the same loader: the schema fills its defaults instead of a KeyError."""
    (tmp_path / "grid.json").write_text(json.dumps(HAND_WRITTEN))
    result = gridbench(
        "dataset", "--grid", "grid.json", "--csv", "d.csv", "--json", "d.json", "--parquet", "d.parquet",
        cwd=tmp_path, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    rows = list(csv.DictReader((tmp_path / "d.csv").open()))  # no cell ran: each row says so
    assert [(row["config"], row["context_tokens"], row["status"]) for row in rows] == [
        ("Q8", "0", "failed"),
        ("Q8", "512", "failed"),
    ]


@pytest.mark.parametrize(
    "text,expected",
    [
        (json.dumps({**HAND_WRITTEN, "depths": "0,512"}), "key depths: '0,512' is not of type 'array'"),
        (
            json.dumps({k: v for k, v in HAND_WRITTEN.items() if k != "engines"}),
            "'engines' is a required property",
        ),
        ("{not json", "grid.json is not JSON"),
        ("[1, 2]", "grid.json must hold a JSON object"),
    ],
    ids=["wrong type", "missing section", "not JSON", "not an object"],
)
def test_a_broken_grid_file_is_one_clear_error(tmp_path, text, expected):
    (tmp_path / "grid.json").write_text(text)
    result = gridbench(
        "report", "--grid", "grid.json", "--dataset", "d.csv", "--out", "r.md", cwd=tmp_path, check=False
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("gridbench: error: ") and expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
