"""Deterministic random-weight llama GGUF models, written offline for the CPU test engine.

Two weight tricks make the models behave like well-mannered benchmark targets:

* channel 0 of the residual stream is a constant that every output row of EOS, control
  and byte tokens weighs negatively, so generation never stops early and always yields
  exactly ``max_tokens`` whole-word tokens (valid UTF-8);
* the layers write only small updates into the residual stream, so the next token is
  decided mostly by the current token's embedding and the output matrix. A *draft* with
  the same embedding and output matrix but fewer, thinner layers therefore predicts the
  target's tokens most of the time: a small draft model with a high acceptance rate.

The " Paris" token also gets +3 logits so llama-benchy's coherence check passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from gridbench.assets.words import WORDS

FILE_TYPES = {
    "f32": (gguf.LlamaFileType.ALL_F32, gguf.GGMLQuantizationType.F32),
    "f16": (gguf.LlamaFileType.MOSTLY_F16, gguf.GGMLQuantizationType.F16),
    "q8_0": (gguf.LlamaFileType.MOSTLY_Q8_0, gguf.GGMLQuantizationType.Q8_0),
}
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_WEIGHT_STD = 0.02
# Layers write updates this much smaller than the token embeddings' own signal, so the
# current token dominates the next-token logits (see the module docstring).
_LAYER_UPDATE_SCALE = 0.05


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Width and depth of a generated model; ``head_dim`` fixes the head count."""

    n_embd: int = 64
    n_layer: int = 2
    n_ff: int = 256
    head_dim: int = 16
    n_ctx: int = 4096


def vocab() -> tuple[list[str], list[float], list[int], int, int]:
    """SPM vocab: control tokens, bytes, ASCII pieces, word prefixes, then whole words.

    llama.cpp's SPM tokenizer builds a word by merging adjacent pieces, so every prefix of
    every word is in the vocab ("▁h", "▁ha", "▁had"): prompts tokenize into whole words.
    Returns the tokens, scores, types, the id of the first whole word and of " Paris"."""
    token_type = gguf.TokenType
    tokens: list[str] = []
    scores: list[float] = []
    types: list[int] = []

    def add(token: str, score: float = 0.0, kind: int = token_type.NORMAL) -> None:
        tokens.append(token)
        scores.append(score)
        types.append(int(kind))

    add("<unk>", kind=token_type.UNKNOWN)
    for control in ("<s>", "</s>", "<|im_start|>", "<|im_end|>"):
        add(control, kind=token_type.CONTROL)
    for byte in range(256):
        add(f"<0x{byte:02X}>", kind=token_type.BYTE)
    chars = [chr(c) for c in range(33, 127)]
    add("\u2581", -1.0)
    for char in chars:
        add(char, -2.0)
    for char in chars:
        add("\u2581" + char, -1.5)
    words = ["\u2581" + w for w in dict.fromkeys([*WORDS, "Paris"])]
    seen = set(tokens)
    for word in words:
        for end in range(3, len(word)):
            if word[:end] not in seen and word[:end] not in words:
                seen.add(word[:end])
                add(word[:end], -1.0)
    first_word = len(tokens)
    for rank, word in enumerate(words[:-1]):
        if word not in seen:
            seen.add(word)
            add(word, 10.0 - rank * 0.001)
    paris_id = len(tokens)
    add(words[-1], 9.0)
    return tokens, scores, types, first_word, paris_id


def _shared_weights(n_vocab: int, n_embd: int, first_word: int, paris_id: int):
    """Embedding and output matrices: drawn from seed 0 whatever the layer shape, so a
    draft and its target agree on them."""
    rng = np.random.default_rng(0)
    embedding = (rng.standard_normal((n_vocab, n_embd)) * _WEIGHT_STD).astype(np.float32)
    embedding[:, 0] = 1.0
    normed_channel0 = 1.0 / np.sqrt((1.0 + (n_embd - 1) * _WEIGHT_STD**2) / n_embd)
    output_std = 1.2 / (_WEIGHT_STD * normed_channel0 * np.sqrt(n_embd - 1))
    output = (rng.standard_normal((n_vocab, n_embd)) * output_std).astype(np.float32)
    allowed = np.zeros(n_vocab, dtype=bool)
    allowed[first_word:] = True
    output[:, 0] = np.where(allowed, 0.0, -10.0 / normed_channel0)
    output[paris_id, 0] = 3.0 / normed_channel0
    return embedding, output


def write_tiny_llama_gguf(
    path: Path, shape: ModelShape = ModelShape(), file_type: str = "f32", layer_seed: int = 1
) -> Path:
    """Write a llama-architecture GGUF with an embedded vocab and chat template."""
    if file_type not in FILE_TYPES:
        raise ValueError(f"file_type {file_type!r} is not one of {sorted(FILE_TYPES)}")
    if shape.n_embd % shape.head_dim:
        raise ValueError(f"n_embd {shape.n_embd} is not a multiple of head_dim {shape.head_dim}")
    llama_file_type, tensor_type = FILE_TYPES[file_type]
    tokens, scores, types, first_word, paris_id = vocab()
    n_vocab = len(tokens)
    n_head = shape.n_embd // shape.head_dim

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"tiny-random-llama-{shape.n_embd}x{shape.n_layer}")
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(llama_file_type)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(4)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(True)
    writer.add_chat_template(CHAT_TEMPLATE)

    def add_matrix(name: str, matrix: np.ndarray) -> None:
        if tensor_type == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, matrix.astype(np.float32))
        elif tensor_type == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, matrix.astype(np.float16))
        else:
            quantized = gguf.quants.quantize(matrix.astype(np.float32), tensor_type)
            writer.add_tensor(name, quantized, raw_dtype=tensor_type)

    def add_vector(name: str, vector: np.ndarray) -> None:
        writer.add_tensor(name, vector.astype(np.float32))  # norms stay F32, as llama.cpp does

    embedding, output = _shared_weights(n_vocab, shape.n_embd, first_word, paris_id)
    rng = np.random.default_rng(layer_seed)
    n_embd, n_ff, n_layer = shape.n_embd, shape.n_ff, shape.n_layer
    add_matrix("token_embd.weight", embedding)
    for layer in range(n_layer):
        prefix = f"blk.{layer}."
        add_vector(prefix + "attn_norm.weight", np.ones(n_embd))
        for name in ("attn_q", "attn_k", "attn_v"):
            add_matrix(prefix + name + ".weight", rng.standard_normal((n_embd, n_embd)) * _WEIGHT_STD)
        add_matrix(
            prefix + "attn_output.weight",
            rng.standard_normal((n_embd, n_embd)) * _LAYER_UPDATE_SCALE / np.sqrt(n_embd * n_embd * n_layer),
        )
        add_vector(prefix + "ffn_norm.weight", np.ones(n_embd))
        add_matrix(prefix + "ffn_gate.weight", rng.standard_normal((n_ff, n_embd)) * _WEIGHT_STD)
        add_matrix(prefix + "ffn_up.weight", rng.standard_normal((n_ff, n_embd)) * _WEIGHT_STD)
        add_matrix(
            prefix + "ffn_down.weight",
            rng.standard_normal((n_embd, n_ff)) * _LAYER_UPDATE_SCALE / np.sqrt(n_embd * n_ff * n_layer),
        )
    add_vector("output_norm.weight", np.ones(n_embd))
    add_matrix("output.weight", output)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
