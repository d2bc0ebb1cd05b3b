"""The random-weight GGUF generator: streamed, deterministic, grouped-query attention, and
a file real llama.cpp loads and generates from."""

from __future__ import annotations

import json
import urllib.request

import gguf
import numpy as np
import pytest

from conftest import REPO, free_port, load_yaml
from gridbench.assets import gguf_model
from gridbench.assets.gguf_model import ModelShape, active_weight_bytes, vocab, write_random_llama_gguf
from gridbench.config.loading import load_grid
from gridbench.engines.manager import SlotManager

GQA = ModelShape(n_embd=256, n_layer=3, n_ff=512, head_dim=64, n_head_kv=2)


def test_the_file_is_the_same_whatever_the_thread_count(tmp_path):
    one = write_random_llama_gguf(tmp_path / "one.gguf", GQA, "f16", threads=1)
    four = write_random_llama_gguf(tmp_path / "four.gguf", GQA, "f16", threads=4)
    assert one.read_bytes() == four.read_bytes()
    other_seed = write_random_llama_gguf(tmp_path / "seed2.gguf", GQA, "f16", layer_seed=2)
    assert other_seed.read_bytes() != one.read_bytes()


def test_grouped_query_attention_shapes_and_metadata(tmp_path):
    reader = gguf.GGUFReader(str(write_random_llama_gguf(tmp_path / "m.gguf", GQA, "f16")))
    shapes = {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}  # GGUF order: (cols, rows)
    assert shapes["blk.0.attn_q.weight"] == (256, 256)
    assert shapes["blk.0.attn_k.weight"] == (256, 128)
    assert shapes["blk.0.attn_v.weight"] == (256, 128)
    assert shapes["blk.2.ffn_down.weight"] == (512, 256)
    field = reader.get_field("llama.attention.head_count_kv")
    assert int(field.parts[field.data[0]][0]) == 2


def test_layer_weights_have_the_designed_spread(tmp_path):
    reader = gguf.GGUFReader(str(write_random_llama_gguf(tmp_path / "m.gguf", GQA, "f32")))
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert tensors["blk.1.ffn_up.weight"].std() == pytest.approx(0.02, rel=0.02)
    assert abs(tensors["blk.1.ffn_up.weight"].mean()) < 0.001
    assert tensors["blk.1.attn_norm.weight"].dtype == np.float32


def test_active_weight_bytes_count_every_tensor_but_the_embedding(tmp_path):
    n_vocab = len(vocab()[0])
    norms = (2 * GQA.n_layer + 1) * GQA.n_embd * 4  # F32 vectors
    f16 = write_random_llama_gguf(tmp_path / "f16.gguf", GQA, "f16")
    assert active_weight_bytes(f16) == (GQA.parameters + n_vocab * GQA.n_embd) * 2 + norms
    q8 = write_random_llama_gguf(tmp_path / "q8.gguf", GQA, "q8_0")
    assert active_weight_bytes(q8) == (GQA.parameters + n_vocab * GQA.n_embd) * 34 // 32 + norms


def test_a_failed_write_leaves_no_file(tmp_path, monkeypatch):
    real_encode = gguf_model._encode

    def encode(tensor, tensor_type):
        if tensor.name == "blk.1.ffn_up.weight":
            raise RuntimeError("disk full")
        return real_encode(tensor, tensor_type)

    monkeypatch.setattr(gguf_model, "_encode", encode)
    with pytest.raises(RuntimeError, match="disk full"):
        write_random_llama_gguf(tmp_path / "m.gguf", GQA, "f16")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.integration
def test_llama_cpp_serves_a_grouped_query_model_to_the_last_token(workdir):
    write_random_llama_gguf(workdir / "gqa.gguf", GQA, "f16")
    config = load_yaml(REPO / "config/mechanism.yaml")
    config["engines"]["llamacpp"]["port"] = free_port()
    config["checkpoints"]["f16"].update(model="gqa.gguf", files=["gqa.gguf"])
    manager = SlotManager(["cpu"])
    with manager.lease(load_grid(config, "mechanism.yaml").configs["D_f16_n0"]) as engine:
        body = {"model": "demo-f16", "prompt": "the history of the", "max_tokens": 24, "temperature": 0}
        request = urllib.request.Request(
            engine.base_url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.load(response)
    manager.stop_all()
    assert answer["usage"]["completion_tokens"] == 24
    assert answer["choices"][0]["finish_reason"] == "length"
    assert len(answer["choices"][0]["text"].split()) >= 20  # whole words, never stopped early
