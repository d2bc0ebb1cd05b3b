"""One random-weight llama for two engines: a Hugging Face checkpoint (safetensors, BF16)
for vLLM, and the GGUF that llama.cpp serves, converted from that checkpoint.

The weights are gridbench's generated llama (gridbench.assets.gguf_model: the same
tricks, the same vocabulary and tokenizer), so both engines serve one model and a study
can say how much faster one engine decodes it than the other. The checkpoint is written
from the generator's tensors; the GGUF is read back from the checkpoint, as
``convert_hf_to_gguf.py`` would, so llama.cpp gets what vLLM loads (BF16 values, widened
to the GGUF's F16 or F32). Both directions stream one tensor at a time: a 3 B-parameter
model needs a few hundred MB of memory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np

from gridbench.assets.gguf_model import (
    ROPE_THETA,
    GGUFTensor,
    ModelShape,
    random_llama_tensors,
    write_llama_gguf,
)
from gridbench.assets.hf_model import LlamaConfig, LlamaShape, llama_config, tokenizer_files
from gridbench.assets.safetensors_stream import StreamedTensor, read_safetensors, write_safetensors
from gridbench.errors import GridbenchError
from gridbench.util import codec
from gridbench.util.files import atomic_write_text

CHECKPOINT_FILE = "model.safetensors"
# GGUF tensor name (after blk.N.) -> Hugging Face LlamaForCausalLM name (after model.layers.N.)
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name: str, layer_names: Mapping[str, str] = _LAYER_NAMES) -> str:
    """blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight (``layer_names``: another
    architecture's names within a layer; outside the layers every one shares these)."""
    stem, suffix = gguf_name.rsplit(".", 1)
    if stem.startswith("blk."):
        _, layer, part = stem.split(".", 2)
        return f"model.layers.{layer}.{layer_names[part]}.{suffix}"
    return f"{_GLOBAL_NAMES[stem]}.{suffix}"


def _heads(hf_tensor_name: str, shape: ModelShape) -> int | None:
    """Heads whose rotary halves the two layouts order differently (q and k only)."""
    if hf_tensor_name.endswith("q_proj.weight"):
        return shape.n_head
    if hf_tensor_name.endswith("k_proj.weight"):
        return shape.kv_heads
    return None


def to_gguf_rotary(weight: np.ndarray, heads: int) -> np.ndarray:
    """HF's rotary layout (each head's two halves) -> GGUF's (interleaved pairs): the
    permutation ``convert_hf_to_gguf.py`` applies to a llama's q and k projections."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def to_hf_rotary(weight: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of ``to_gguf_rotary``."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def hf_config(shape: ModelShape) -> LlamaConfig:
    """config.json of the checkpoint: the GGUF's shape, rope and vocabulary, stored in BF16."""
    llama_shape = LlamaShape(
        hidden=shape.n_embd,
        layers=shape.n_layer,
        heads=shape.n_head,
        kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        ffn=shape.n_ff,
        max_positions=shape.n_ctx,
    )
    return replace(llama_config(llama_shape), torch_dtype="bfloat16", rope_theta=ROPE_THETA)


def shape_of(config: LlamaConfig) -> ModelShape:
    return ModelShape(
        n_embd=config.hidden_size,
        n_layer=config.num_hidden_layers,
        n_ff=config.intermediate_size,
        head_dim=config.head_dim,
        n_ctx=config.max_position_embeddings,
        n_head_kv=config.num_key_value_heads,
    )


def write_hf_llama(outdir: Path, shape: ModelShape, layer_seed: int = 1, threads: int | None = None) -> Path:
    """The generated llama as a vLLM-loadable folder: BF16 weights, config, tokenizer."""

    def hf_tensor(tensor: GGUFTensor) -> StreamedTensor:
        name = hf_name(tensor.name)
        heads = _heads(name, shape)

        def values() -> np.ndarray:
            weight = tensor.make(np.float32)
            return weight if heads is None else to_hf_rotary(weight, heads)

        return StreamedTensor(name, tensor.shape, values, "BF16")

    tensors = [hf_tensor(t) for t in random_llama_tensors(shape, layer_seed)]
    write_safetensors(outdir / CHECKPOINT_FILE, tensors, threads=threads)
    atomic_write_text(outdir / "config.json", json.dumps(codec.to_json(hf_config(shape)), indent=2))
    for name, text in tokenizer_files(shape.n_ctx).items():
        atomic_write_text(outdir / name, text)
    return outdir


def gguf_from_hf(model_dir: Path, out: Path, file_type: str = "f16", threads: int | None = None) -> Path:
    """Convert a checkpoint of ``write_hf_llama`` into a llama.cpp GGUF of ``file_type``."""
    config_path, checkpoint = model_dir / "config.json", model_dir / CHECKPOINT_FILE
    if not config_path.is_file() or not checkpoint.is_file():
        raise GridbenchError(
            f"{model_dir} is not a generated checkpoint (config.json and {CHECKPOINT_FILE} needed)",
            hint="write it first: gridbench assets hf-llama --outdir " + str(model_dir),
        )
    shape = shape_of(codec.from_json(LlamaConfig, json.loads(config_path.read_text())))
    stored = {t.name: t for t in read_safetensors(checkpoint)}
    # the generator's own list gives the GGUF's tensor order, names and kinds; the values
    # come from the checkpoint
    layout = random_llama_tensors(shape, layer_seed=0)
    missing = [hf_name(t.name) for t in layout if hf_name(t.name) not in stored]
    if missing:
        raise GridbenchError(f"{checkpoint} lacks {len(missing)} llama tensors, e.g. {missing[:3]}")

    def gguf_tensor(tensor: GGUFTensor) -> GGUFTensor:
        source = stored[hf_name(tensor.name)]
        heads = _heads(source.name, shape)

        def make(dtype: type[np.floating]) -> np.ndarray:
            weight = source.float32()
            return (weight if heads is None else to_gguf_rotary(weight, heads)).astype(dtype)

        return replace(tensor, make=make)

    tensors = [gguf_tensor(t) for t in layout]
    name = f"{model_dir.name}-{shape.n_embd}x{shape.n_layer}"
    return write_llama_gguf(out, shape, tensors, file_type, name, threads)


def hf_active_weight_bytes(checkpoint: Path, linear_bytes_per_weight: float | None = None) -> int:
    """Bytes of weights one decoded token reads: every tensor but the token embedding, which
    a checkpoint without ``lm_head.weight`` (tied embeddings) reads whole as its output layer,
    as gguf_model.active_weight_bytes counts it. With ``linear_bytes_per_weight`` (1 for
    vLLM's online FP8) the layers' projections count at that size, as an engine quantizing
    them on load stores them."""
    tensors = list(read_safetensors(checkpoint))
    tied = all(t.name != "lm_head.weight" for t in tensors)
    total = 0
    for tensor in tensors:
        if tensor.name == "model.embed_tokens.weight" and not tied:
            continue
        count = int(np.prod(tensor.shape))
        projection = tensor.name.startswith("model.layers.") and tensor.name.endswith("_proj.weight")
        per_weight: float = tensor.raw.itemsize
        if projection and linear_bytes_per_weight:
            per_weight = linear_bytes_per_weight
        total += int(count * per_weight)
    return total
