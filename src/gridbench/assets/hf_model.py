"""Tiny random-weight Llama models in Hugging Face format, written offline for the CPU vLLM
test engine: safetensors weights, ``config.json``, tokenizer and ChatML chat template.

The tokenizer is the GGUF demo's (gridbench.assets.tokenizer), so llama-benchy's prompts
tokenize into whole words of the synthetic corpus. Two weight tricks make the models
behave like well-mannered benchmark targets:

* channel 0 of the residual stream is a constant (the embeddings set it, no layer writes
  it) that the output rows of control and byte tokens weigh very negatively, so generation
  never emits EOS and always yields exactly ``max_tokens`` printable tokens;
* two models of different seeds share no weights, so a draft drawn from another seed
  agrees with the target about as often as chance allows (acceptance near 0), while a
  draft written from the target's own seed and shape is the target itself (acceptance
  near 1 at temperature 0). These two extremes check acceptance end to end.

Weights are float32; vLLM's ``--dtype`` decides the precision they are served in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import gguf
import numpy as np
from safetensors.numpy import save as save_safetensors

from gridbench.assets.gguf_model import CHAT_TEMPLATE, vocab
from gridbench.assets.tokenizer import build_tokenizer
from gridbench.util import codec
from gridbench.util.files import JsonObject, atomic_write_bytes, atomic_write_text

_WEIGHT_STD = 0.05
_EMBED_STD = 1.0
_OUTPUT_STD = 0.5
# Logit weight of the constant channel on tokens that must never be generated.
_FORBIDDEN_LOGIT = -1000.0
UNK, BOS, EOS_TEXT, IM_END = "<unk>", "<s>", "</s>", "<|im_end|>"


@dataclass(frozen=True, slots=True)
class LlamaShape:
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    ffn: int = 768
    max_positions: int = 4096


TARGET = LlamaShape()
RANDOM_DRAFT = LlamaShape(hidden=128, layers=2, heads=2, kv_heads=1, head_dim=64, ffn=256)
TARGET_SEED, RANDOM_DRAFT_SEED = 0, 1
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
VLLM_TEST_MODELS = ("target", "draft-self", "draft-random")


def _token_ids() -> tuple[dict[str, int], np.ndarray]:
    """Ids of the special tokens, and which tokens may be generated (printable pieces)."""
    tokens, _scores, types, _first_word, _paris = vocab()
    ids = {token: i for i, token in enumerate(tokens)}
    allowed = np.array([kind == gguf.TokenType.NORMAL for kind in types])
    return ids, allowed


def llama_weights(shape: LlamaShape, seed: int) -> dict[str, np.ndarray]:
    """HF ``LlamaForCausalLM`` tensors (``[out, in]`` linear weights), float32."""
    _ids, allowed = _token_ids()
    n_vocab = len(allowed)
    rng = np.random.default_rng(seed)

    def normal(*dims: int, std: float = _WEIGHT_STD) -> np.ndarray:
        return (rng.standard_normal(dims) * std).astype(np.float32)

    h, q_dim, kv_dim = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    embedding = normal(n_vocab, h, std=_EMBED_STD)
    embedding[:, 0] = 1.0  # the constant channel
    tensors = {"model.embed_tokens.weight": embedding}
    for layer in range(shape.layers):
        prefix = f"model.layers.{layer}."
        o_proj, down_proj = normal(h, q_dim), normal(h, shape.ffn)
        o_proj[0, :] = 0.0  # no layer writes the constant channel
        down_proj[0, :] = 0.0
        tensors |= {
            prefix + "input_layernorm.weight": np.ones(h, np.float32),
            prefix + "self_attn.q_proj.weight": normal(q_dim, h),
            prefix + "self_attn.k_proj.weight": normal(kv_dim, h),
            prefix + "self_attn.v_proj.weight": normal(kv_dim, h),
            prefix + "self_attn.o_proj.weight": o_proj,
            prefix + "post_attention_layernorm.weight": np.ones(h, np.float32),
            prefix + "mlp.gate_proj.weight": normal(shape.ffn, h),
            prefix + "mlp.up_proj.weight": normal(shape.ffn, h),
            prefix + "mlp.down_proj.weight": down_proj,
        }
    output = normal(n_vocab, h, std=_OUTPUT_STD)
    output[:, 0] = np.where(allowed, 0.0, _FORBIDDEN_LOGIT)
    tensors["model.norm.weight"] = np.ones(h, np.float32)
    tensors["lm_head.weight"] = output
    return tensors


class ShapeKeys(TypedDict):
    """The config.json keys a model's shape and the generated vocabulary's special ids set."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int


def shape_keys(shape: LlamaShape) -> ShapeKeys:
    ids, _allowed = _token_ids()
    return ShapeKeys(
        hidden_size=shape.hidden,
        intermediate_size=shape.ffn,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_positions,
        bos_token_id=ids[BOS],
        eos_token_id=ids[IM_END],
        pad_token_id=ids[EOS_TEXT],
    )


@dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """config.json of a ``LlamaForCausalLM``: its keys, in this order."""

    architectures: tuple[str, ...] = ("LlamaForCausalLM",)
    model_type: str = "llama"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str = "silu"
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: JsonObject | None = None  # per rope type in HF's configs; none here
    attention_bias: bool = False
    mlp_bias: bool | None = False
    tie_word_embeddings: bool = False
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int
    torch_dtype: str = "float32"
    initializer_range: float = _WEIGHT_STD
    use_cache: bool = True


@dataclass(frozen=True, kw_only=True)
class Gemma3TextConfig:
    """config.json of a text-only Gemma 3 (``Gemma3ForCausalLM``), as Google's checkpoints
    spell it: sliding-window layers with their own rotary base, every ``layer_types``
    entry listed."""

    architectures: tuple[str, ...] = ("Gemma3ForCausalLM",)
    model_type: str = "gemma3_text"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_activation: str = "gelu_pytorch_tanh"
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float
    rope_local_base_freq: float
    rope_scaling: JsonObject | None = None
    sliding_window: int
    layer_types: tuple[str, ...]
    query_pre_attn_scalar: float
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    attention_bias: bool = False
    tie_word_embeddings: bool = True
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int
    torch_dtype: str = "bfloat16"
    use_cache: bool = True


def llama_config(shape: LlamaShape) -> LlamaConfig:
    _ids, allowed = _token_ids()
    return LlamaConfig(vocab_size=len(allowed), **shape_keys(shape))


def tokenizer_files(max_positions: int) -> dict[str, str]:
    ids, _allowed = _token_ids()
    specials = {"bos_token": BOS, "eos_token": IM_END, "unk_token": UNK, "pad_token": EOS_TEXT}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_positions,
        "chat_template": CHAT_TEMPLATE,
    }
    generation_config = {"bos_token_id": ids[BOS], "eos_token_id": ids[IM_END], "pad_token_id": ids[EOS_TEXT]}
    return {
        "tokenizer.json": build_tokenizer().to_str(),
        "tokenizer_config.json": json.dumps(tokenizer_config, indent=2),
        "special_tokens_map.json": json.dumps(specials, indent=2),
        "chat_template.jinja": CHAT_TEMPLATE,
        "generation_config.json": json.dumps(generation_config, indent=2),
    }


def write_hf_llama(outdir: Path, shape: LlamaShape, seed: int) -> Path:
    """One model folder, as vLLM (and transformers) load it."""
    weights = llama_weights(shape, seed)
    atomic_write_bytes(outdir / "model.safetensors", save_safetensors(weights, metadata={"format": "pt"}))
    atomic_write_text(outdir / "config.json", json.dumps(codec.to_json(llama_config(shape)), indent=2))
    for name, text in tokenizer_files(shape.max_positions).items():
        atomic_write_text(outdir / name, text)
    return outdir


def write_vllm_test_models(outdir: Path) -> list[Path]:
    """The target, a draft with the target's own weights, and a draft of other random weights."""
    return [
        write_hf_llama(outdir / "target", TARGET, TARGET_SEED),
        write_hf_llama(outdir / "draft-self", TARGET, TARGET_SEED),
        write_hf_llama(outdir / "draft-random", RANDOM_DRAFT, RANDOM_DRAFT_SEED),
    ]
