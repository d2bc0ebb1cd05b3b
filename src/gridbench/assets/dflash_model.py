"""A random-weight Qwen3 target and a random-weight DFlash draft head for it, in the
layouts vLLM 0.26.0 loads: the target as ``Qwen3ForCausalLM``, the draft as
``DFlashDraftModel`` (vLLM's ``qwen3_dflash.DFlashQwen3ForCausalLM``). Both are written
offline as BF16 safetensors (the streamed writer, so a 3 B-parameter target never sits in
memory), and serve the seed studies' speculative method with no model download:

    vllm serve DIR/target --speculative-config \\
        '{"method":"dflash","model":"DIR/dflash","num_speculative_tokens":8}'

The weights are gridbench's generated ones (gridbench.assets.gguf_model: one random byte
per weight, the same tricks) on the generated vocabulary and tokenizer
(gridbench.assets.hf_model). Random weights accept almost no drafted token; what the
pair checks is that vLLM loads both, drafts, verifies and counts acceptance per position.

How vLLM 0.26.0 reads the draft (model_executor/models/qwen3_dflash.py, config/speculative.py,
v1/worker/gpu/spec_decode/dflash/):

* ``architectures: ["DFlashDraftModel"]`` with ``model_type: "qwen3"`` selects
  ``DFlashQwen3ForCausalLM``; the rest of config.json is a plain Qwen3 config.
* ``dflash_config.target_layer_ids``: the target layers (0-based) whose outputs the draft
  conditions on; vLLM taps the target's aux hidden states at ``id + 1``, concatenates them
  and projects them with the draft's ``fc`` (``[hidden, target_hidden * len(ids)]``) into
  context K/V for every draft layer (after ``hidden_norm``).
* ``dflash_config.mask_token_id``: the token the masked query slots are embedded as. It is
  the first id past the tokenizer (the vocabulary is padded, as Qwen3's is), a row of the
  target's embedding that no prompt uses and no sampler may emit.
* The draft ships no ``embed_tokens`` and no ``lm_head``: vLLM then shares the target's, so
  the draft's ``hidden_size`` is the target's.
* ``block_size`` (16, as z-lab's ``-b16`` drafts) and ``num_target_layers`` are what the
  reference implementation records; vLLM 0.26.0 reads neither for Qwen3 DFlash drafts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from gridbench.assets.gguf_model import (
    LAYER_UPDATE_SCALE,
    WEIGHT_STD,
    random_matrix,
    shared_weights,
    vocab,
)
from gridbench.assets.hf_model import LlamaConfig, LlamaShape, shape_keys, tokenizer_files
from gridbench.assets.safetensors_stream import StreamedTensor, write_safetensors
from gridbench.util import codec
from gridbench.util.files import atomic_write_text

# A dense ~3 B shape close to Llama-3.2-3B's (2.8 B layer parameters; 5.7 GB in BF16).
QWEN3_3B = LlamaShape(
    hidden=3072, layers=28, heads=24, kv_heads=8, head_dim=128, ffn=8192, max_positions=131072
)
# The same layout at test size: seconds to write, every tensor kind present.
QWEN3_TINY = LlamaShape(hidden=64, layers=6, heads=4, kv_heads=2, head_dim=16, ffn=128, max_positions=4096)
DRAFT_LAYERS = 5  # as z-lab's Qwen3 DFlash drafts
DRAFT_LAYERS_TINY = 2
BLOCK_SIZE = 16
TARGET_SEED, DRAFT_SEED = 1, 2
ROPE_THETA = 1_000_000.0  # Qwen3's
RMS_NORM_EPS = 1e-6
CHECKPOINT = "model.safetensors"
DRAFT_ARCHITECTURE = "DFlashDraftModel"
_VOCAB_MULTIPLE = 128


def vocab_layout() -> tuple[int, int]:
    """(vocab_size, mask_token_id): the generated vocabulary padded past its last token to a
    multiple of 128 (Qwen3 pads 151669 tokens to 151936), the first padding id the mask."""
    n_tokens = len(vocab()[0])
    return -(-(n_tokens + 1) // _VOCAB_MULTIPLE) * _VOCAB_MULTIPLE, n_tokens


def target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The target layers a DFlash draft reads, spread as z-lab's ``build_target_layer_ids``
    spreads them (Qwen3-8B, 36 layers, 5 draft layers: [1, 9, 17, 25, 33])."""
    if num_draft_layers == 1:
        ids = [num_target_layers // 2]
    else:
        start, end = 1, num_target_layers - 3
        ids = [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]
    # vLLM collects each tapped layer once: repeated ids would starve the draft's fc
    if len(set(ids)) != len(ids) or not all(0 <= i < num_target_layers for i in ids):
        raise ValueError(
            f"{num_draft_layers} draft layers need {num_draft_layers} distinct target layers "
            f"among {num_target_layers}; got {ids}: give the target more layers"
        )
    return ids


def _shared(hidden: int) -> tuple[np.ndarray, np.ndarray]:
    """gguf_model's shared embedding and output matrices over the padded vocabulary. The
    padding rows (the mask token's among them) are ids the tokenizer cannot decode: they
    weigh the constant channel ten times as negatively as the control tokens do (a logit
    near -100 rather than -10), so not even sampling at temperature 1 ever emits one."""
    tokens, _scores, _types, first_word, paris_id = vocab()
    n_vocab, _mask = vocab_layout()
    embedding, output = shared_weights(n_vocab, hidden, first_word, paris_id)
    output[len(tokens) :, 0] = 10.0 * output[0, 0]  # id 0 (<unk>) is a forbidden token
    return embedding, output


def _ones(size: int) -> Callable[[], np.ndarray]:
    return lambda: np.ones(size, dtype=np.float32)


def _matrix(seed: tuple[int, ...], shape: tuple[int, int], std: float) -> Callable[[], np.ndarray]:
    make = random_matrix(seed, shape, std)
    return lambda: make(np.float32)


def _decoder_layer(
    prefix: str, shape: LlamaShape, n_layers: int, seed: tuple[int, ...]
) -> list[StreamedTensor]:
    """One Qwen3 decoder layer in HF names: Llama's projections plus per-head q/k RMSNorm.
    Layers write small updates into the residual stream (gguf_model's scaling), so the
    current token's embedding decides the next token and the constant channel 0 survives."""
    h, q_dim, kv_dim = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    attn_out_std = LAYER_UPDATE_SCALE / np.sqrt(h * q_dim * n_layers)
    ffn_down_std = LAYER_UPDATE_SCALE / np.sqrt(h * shape.ffn * n_layers)
    matrices = [
        ("self_attn.q_proj", (q_dim, h), WEIGHT_STD),
        ("self_attn.k_proj", (kv_dim, h), WEIGHT_STD),
        ("self_attn.v_proj", (kv_dim, h), WEIGHT_STD),
        ("self_attn.o_proj", (h, q_dim), attn_out_std),
        ("mlp.gate_proj", (shape.ffn, h), WEIGHT_STD),
        ("mlp.up_proj", (shape.ffn, h), WEIGHT_STD),
        ("mlp.down_proj", (h, shape.ffn), ffn_down_std),
    ]
    tensors = [
        StreamedTensor(prefix + "input_layernorm.weight", (h,), _ones(h)),
        StreamedTensor(prefix + "post_attention_layernorm.weight", (h,), _ones(h)),
        StreamedTensor(prefix + "self_attn.q_norm.weight", (shape.head_dim,), _ones(shape.head_dim)),
        StreamedTensor(prefix + "self_attn.k_norm.weight", (shape.head_dim,), _ones(shape.head_dim)),
    ]
    for index, (name, matrix_shape, std) in enumerate(matrices):
        tensors.append(
            StreamedTensor(
                prefix + name + ".weight", matrix_shape, _matrix((*seed, index), matrix_shape, std)
            )
        )
    return tensors


def qwen3_tensors(shape: LlamaShape, seed: int = TARGET_SEED) -> list[StreamedTensor]:
    """Every ``Qwen3ForCausalLM`` tensor (HF names, ``[out, in]`` linears); the layers come
    from ``seed``, the embedding and output matrix from gguf_model's fixed seed."""
    embedding, output = _shared(shape.hidden)
    h = shape.hidden
    tensors = [StreamedTensor("model.embed_tokens.weight", embedding.shape, lambda: embedding)]
    for layer in range(shape.layers):
        tensors += _decoder_layer(f"model.layers.{layer}.", shape, shape.layers, (seed, 0, layer))
    tensors.append(StreamedTensor("model.norm.weight", (h,), _ones(h)))
    tensors.append(StreamedTensor("lm_head.weight", output.shape, lambda: output))
    return tensors


def dflash_tensors(
    target_shape: LlamaShape, draft_layers: int = DRAFT_LAYERS, seed: int = DRAFT_SEED
) -> list[StreamedTensor]:
    """The DFlash draft's tensors, named as ``DFlashQwen3ForCausalLM.load_weights`` takes them
    (it prefixes ``model.``): ``layers.N.*`` Qwen3 decoder layers (q/k/v and gate/up are
    stacked on load), ``fc`` over the concatenated target layers, ``hidden_norm`` for the
    context states and the final ``norm``. No embedding, no lm_head: the target's are used."""
    h = target_shape.hidden
    n_taps = len(target_layer_ids(target_shape.layers, draft_layers))
    fc_shape = (h, h * n_taps)
    tensors = [
        StreamedTensor("fc.weight", fc_shape, _matrix((seed, 1, 0), fc_shape, WEIGHT_STD)),
        StreamedTensor("hidden_norm.weight", (h,), _ones(h)),
    ]
    for layer in range(draft_layers):
        tensors += _decoder_layer(f"layers.{layer}.", target_shape, draft_layers, (seed, 2, layer))
    tensors.append(StreamedTensor("norm.weight", (h,), _ones(h)))
    return tensors


@dataclass(frozen=True, kw_only=True)
class Qwen3Config(LlamaConfig):
    """config.json of a ``Qwen3ForCausalLM``: a Llama config's keys (but ``mlp_bias``), then
    Qwen3's own; a BF16 model of gridbench's generated weights by default."""

    architectures: tuple[str, ...] = ("Qwen3ForCausalLM",)
    model_type: str = "qwen3"
    rms_norm_eps: float = RMS_NORM_EPS
    rope_theta: float = ROPE_THETA
    mlp_bias: bool | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)  # a Llama key
    torch_dtype: str = "bfloat16"
    initializer_range: float = WEIGHT_STD
    attention_dropout: float = 0.0
    use_sliding_window: bool = False
    sliding_window: int | None = None
    max_window_layers: int


@dataclass(frozen=True)
class DFlashTaps:
    """A DFlash draft's ``dflash_config``: the mask token, and the target layers it reads."""

    mask_token_id: int
    target_layer_ids: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class DFlashConfig(Qwen3Config):
    """config.json of a DFlash draft, shaped as z-lab's Qwen3 DFlash drafts: a Qwen3 config of
    the draft's depth, then the draft's own keys."""

    architectures: tuple[str, ...] = (DRAFT_ARCHITECTURE,)
    # all full attention and no causal override: vLLM runs the draft non-causally
    layer_types: tuple[str, ...]
    block_size: int
    num_target_layers: int
    dflash_config: DFlashTaps


def qwen3_config(shape: LlamaShape) -> Qwen3Config:
    """config.json of the target: hf_model's Llama config (the vocabulary's special ids)
    retyped as a Qwen3 of the padded vocabulary, stored in BF16."""
    n_vocab, _mask = vocab_layout()
    return Qwen3Config(vocab_size=n_vocab, max_window_layers=shape.layers, **shape_keys(shape))


def dflash_config(
    target_shape: LlamaShape, draft_layers: int = DRAFT_LAYERS, block_size: int = BLOCK_SIZE
) -> DFlashConfig:
    """config.json of the draft: a Qwen3 config of the draft's depth, ``DFlashDraftModel``,
    and ``dflash_config`` (mask token, tapped layers)."""
    n_vocab, mask_token_id = vocab_layout()
    draft_shape = replace(target_shape, layers=draft_layers)
    return DFlashConfig(
        vocab_size=n_vocab,
        max_window_layers=draft_layers,
        **shape_keys(draft_shape),
        layer_types=("full_attention",) * draft_layers,
        block_size=block_size,
        num_target_layers=target_shape.layers,
        dflash_config=DFlashTaps(mask_token_id, tuple(target_layer_ids(target_shape.layers, draft_layers))),
    )


def write_qwen3_target(
    outdir: Path, shape: LlamaShape = QWEN3_3B, seed: int = TARGET_SEED, threads: int | None = None
) -> Path:
    """The target as vLLM loads it: BF16 weights, config.json, tokenizer and chat template."""
    write_safetensors(outdir / CHECKPOINT, qwen3_tensors(shape, seed), threads=threads)
    atomic_write_text(outdir / "config.json", json.dumps(codec.to_json(qwen3_config(shape)), indent=2))
    for name, text in tokenizer_files(shape.max_positions).items():
        atomic_write_text(outdir / name, text)
    return outdir


def write_dflash_draft(
    outdir: Path,
    target_shape: LlamaShape = QWEN3_3B,
    draft_layers: int = DRAFT_LAYERS,
    block_size: int = BLOCK_SIZE,
    seed: int = DRAFT_SEED,
    threads: int | None = None,
) -> Path:
    """The draft head for a target of ``target_shape``: config.json and BF16 weights. vLLM
    takes the tokenizer from the target."""
    tensors = dflash_tensors(target_shape, draft_layers, seed)
    write_safetensors(outdir / CHECKPOINT, tensors, threads=threads)
    config = dflash_config(target_shape, draft_layers, block_size)
    atomic_write_text(outdir / "config.json", json.dumps(codec.to_json(config), indent=2))
    return outdir


def write_qwen3_dflash(outdir: Path, tiny: bool = False, threads: int | None = None) -> list[Path]:
    """``outdir/target`` and ``outdir/dflash``: the 3 B pair, or the test-size one."""
    shape, draft_layers = (QWEN3_TINY, DRAFT_LAYERS_TINY) if tiny else (QWEN3_3B, DRAFT_LAYERS)
    return [
        write_qwen3_target(outdir / "target", shape, threads=threads),
        write_dflash_draft(outdir / "dflash", shape, draft_layers, threads=threads),
    ]
