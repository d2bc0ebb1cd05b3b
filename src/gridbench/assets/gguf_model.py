"""Deterministic random-weight llama GGUF models, written offline: the CPU test engine's
small models and the GPU studies' multi-billion-parameter ones.

Two weight tricks make the models behave like well-mannered benchmark targets:

* channel 0 of the residual stream is a constant that every output row of EOS, control
  and byte tokens weighs negatively, so generation never stops early and always yields
  exactly ``max_tokens`` whole-word tokens (valid UTF-8);
* the layers write only small updates into the residual stream, so the next token is
  decided mostly by the current token's embedding and the output matrix. A *draft* with
  the same embedding and output matrix but fewer, thinner layers therefore predicts the
  target's tokens most of the time: a small draft model with a high acceptance rate.
  A quantized copy of the target itself (llama-quantize to Q4_0, say) agrees with it
  on nearly every token: a draft whose acceptance should come out close to 1.

The " Paris" token also gets +3 logits so llama-benchy's coherence check passes.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
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
WEIGHT_STD = 0.02
# llama.cpp's defaults, written out so that an HF config of the same weights can say the same
ROPE_THETA = 10000.0
RMS_NORM_EPS = 1e-5
# Layers write updates this much smaller than the token embeddings' own signal, so the
# current token dominates the next-token logits (see the module docstring).
LAYER_UPDATE_SCALE = 0.05
# Layer weights take one of 256 evenly spaced levels of unit variance: one random byte per
# weight and a table look-up, about ten times faster than normal draws, which is what
# makes a multi-billion-parameter model a matter of seconds.
_UNIT_LEVELS = ((np.arange(256) - 127.5) / np.sqrt((256**2 - 1) / 12)).astype(np.float32)


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Width and depth of a generated model; ``head_dim`` fixes the head count, and
    ``n_head_kv`` (grouped-query attention; all heads when None) the K/V head count."""

    n_embd: int = 64
    n_layer: int = 2
    n_ff: int = 256
    head_dim: int = 16
    n_ctx: int = 4096
    n_head_kv: int | None = None

    @property
    def n_head(self) -> int:
        return self.n_embd // self.head_dim

    @property
    def kv_heads(self) -> int:
        return self.n_head if self.n_head_kv is None else self.n_head_kv

    @property
    def parameters(self) -> int:
        """Matrix parameters of the layers (embedding and output excluded)."""
        n_kv = self.kv_heads * self.head_dim
        return self.n_layer * (
            2 * self.n_embd * self.n_embd + 2 * n_kv * self.n_embd + 3 * self.n_ff * self.n_embd
        )


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


def shared_weights(
    n_vocab: int, n_embd: int, first_word: int, paris_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Embedding and output matrices: drawn from seed 0 whatever the layer shape, so a
    draft and its target agree on them."""
    rng = np.random.default_rng(0)
    embedding = (rng.standard_normal((n_vocab, n_embd)) * WEIGHT_STD).astype(np.float32)
    embedding[:, 0] = 1.0
    normed_channel0 = 1.0 / np.sqrt((1.0 + (n_embd - 1) * WEIGHT_STD**2) / n_embd)
    output_std = 1.2 / (WEIGHT_STD * normed_channel0 * np.sqrt(n_embd - 1))
    output = (rng.standard_normal((n_vocab, n_embd)) * output_std).astype(np.float32)
    allowed = np.zeros(n_vocab, dtype=bool)
    allowed[first_word:] = True
    output[:, 0] = np.where(allowed, 0.0, -10.0 / normed_channel0)
    output[paris_id, 0] = 3.0 / normed_channel0
    return embedding, output


# Makes a tensor's values in the float type asked for.
Maker = Callable[[type[np.floating]], np.ndarray]


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    """One tensor of the file: its name, numpy shape, and how to make its float values."""

    name: str
    shape: tuple[int, ...]
    make: Maker
    matrix: bool = True  # matrices take the file type; norm vectors stay F32, as llama.cpp does


def random_matrix(seed: tuple[int, ...], shape: tuple[int, int], std: float) -> Maker:
    """Weights drawn from ``_UNIT_LEVELS`` scaled to ``std``, from their own seed, so any
    tensor can be made on any thread in any order and still come out the same."""

    def make(dtype: type[np.floating]) -> np.ndarray:
        levels = np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)
        values: np.ndarray = (_UNIT_LEVELS * std).astype(dtype)[levels]
        return values

    return make


def _constant(values: np.ndarray) -> Maker:
    return lambda dtype: values.astype(dtype)


def random_llama_tensors(shape: ModelShape, layer_seed: int) -> list[GGUFTensor]:
    """Every tensor in GGUF order and layout; the layers' values come from ``layer_seed``."""
    tokens, _scores, _types, first_word, paris_id = vocab()
    n_vocab = len(tokens)
    n_embd, n_ff, n_layer = shape.n_embd, shape.n_ff, shape.n_layer
    n_kv = shape.kv_heads * shape.head_dim
    embedding, output = shared_weights(n_vocab, n_embd, first_word, paris_id)
    ones = np.ones(n_embd, dtype=np.float32)
    # Layers write updates this much smaller than the token embeddings' own signal
    # (see the module docstring), shrinking with depth so the sum over layers stays small.
    attn_out_std = LAYER_UPDATE_SCALE / np.sqrt(n_embd * n_embd * n_layer)
    ffn_down_std = LAYER_UPDATE_SCALE / np.sqrt(n_embd * n_ff * n_layer)
    tensors = [GGUFTensor("token_embd.weight", embedding.shape, _constant(embedding))]
    for layer in range(n_layer):
        prefix = f"blk.{layer}."
        matrices = [
            ("attn_q", (n_embd, n_embd), WEIGHT_STD),
            ("attn_k", (n_kv, n_embd), WEIGHT_STD),
            ("attn_v", (n_kv, n_embd), WEIGHT_STD),
            ("attn_output", (n_embd, n_embd), attn_out_std),
            ("ffn_gate", (n_ff, n_embd), WEIGHT_STD),
            ("ffn_up", (n_ff, n_embd), WEIGHT_STD),
            ("ffn_down", (n_embd, n_ff), ffn_down_std),
        ]
        tensors.append(GGUFTensor(prefix + "attn_norm.weight", ones.shape, _constant(ones), matrix=False))
        for index, (name, matrix_shape, std) in enumerate(matrices):
            if name == "ffn_gate":
                tensors.append(
                    GGUFTensor(prefix + "ffn_norm.weight", ones.shape, _constant(ones), matrix=False)
                )
            seed = (layer_seed, layer, index)
            tensors.append(
                GGUFTensor(prefix + name + ".weight", matrix_shape, random_matrix(seed, matrix_shape, std))
            )
    tensors.append(GGUFTensor("output_norm.weight", ones.shape, _constant(ones), matrix=False))
    tensors.append(GGUFTensor("output.weight", output.shape, _constant(output)))
    return tensors


def _encode(tensor: GGUFTensor, tensor_type: gguf.GGMLQuantizationType) -> np.ndarray:
    """The tensor's bytes as the file stores them."""
    if not tensor.matrix or tensor_type == gguf.GGMLQuantizationType.F32:
        return tensor.make(np.float32)
    if tensor_type == gguf.GGMLQuantizationType.F16:
        return tensor.make(np.float16)
    return gguf.quants.quantize(tensor.make(np.float32), tensor_type)


def _add_tensor_info(
    writer: gguf.GGUFWriter, tensor: GGUFTensor, tensor_type: gguf.GGMLQuantizationType
) -> None:
    count = int(np.prod(tensor.shape))
    if not tensor.matrix or tensor_type == gguf.GGMLQuantizationType.F32:
        writer.add_tensor_info(tensor.name, tensor.shape, np.dtype(np.float32), count * 4)
    elif tensor_type == gguf.GGMLQuantizationType.F16:
        writer.add_tensor_info(tensor.name, tensor.shape, np.dtype(np.float16), count * 2)
    else:
        block, block_bytes = gguf.GGML_QUANT_SIZES[tensor_type]
        byte_shape = gguf.quants.quant_shape_to_byte_shape(tensor.shape, tensor_type)
        writer.add_tensor_info(
            tensor.name, byte_shape, np.dtype(np.uint8), count // block * block_bytes, raw_dtype=tensor_type
        )


def write_random_llama_gguf(
    path: Path,
    shape: ModelShape = ModelShape(),
    file_type: str = "f32",
    layer_seed: int = 1,
    threads: int | None = None,
) -> Path:
    """Write a llama-architecture GGUF with an embedded vocab and chat template."""
    tensors = random_llama_tensors(shape, layer_seed)
    name = f"random-llama-{shape.n_embd}x{shape.n_layer}"
    return write_llama_gguf(path, shape, tensors, file_type, name, threads)


def write_llama_gguf(
    path: Path,
    shape: ModelShape,
    tensors: list[GGUFTensor],
    file_type: str,
    name: str,
    threads: int | None = None,
) -> Path:
    """Write ``tensors`` (in GGUF names and layout) as a llama GGUF with the generated vocab
    and chat template.

    Tensors are made on ``threads`` threads and streamed to the file in order, a few at a
    time, so memory stays at a few tensors whatever the model's size; the file appears
    under its name only once it is complete."""
    _check_writable(shape, file_type)
    llama_file_type, tensor_type = FILE_TYPES[file_type]
    tokens, scores, types, _first_word, _paris_id = vocab()
    threads = threads or min(16, os.cpu_count() or 1)

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    writer = gguf.GGUFWriter(str(partial), "llama")
    _add_model_metadata(writer, shape, name, vocab_size=len(tokens), llama_file_type=llama_file_type)
    _add_tokenizer(writer, tokens, scores, types)
    for tensor in tensors:
        _add_tensor_info(writer, tensor, tensor_type)
    with whole_or_removed(writer, partial, path):
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        _write_tensor_data(writer, tensors, tensor_type, threads)
    return path


def _check_writable(shape: ModelShape, file_type: str) -> None:
    if file_type not in FILE_TYPES:
        raise ValueError(f"file_type {file_type!r} is not one of {sorted(FILE_TYPES)}")
    if shape.n_embd % shape.head_dim:
        raise ValueError(f"n_embd {shape.n_embd} is not a multiple of head_dim {shape.head_dim}")
    if shape.n_head % shape.kv_heads:
        raise ValueError(f"{shape.n_head} heads are not a multiple of n_head_kv {shape.kv_heads}")


def _add_model_metadata(
    writer: gguf.GGUFWriter,
    shape: ModelShape,
    name: str,
    *,
    vocab_size: int,
    llama_file_type: gguf.LlamaFileType,
) -> None:
    writer.add_name(name)
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(RMS_NORM_EPS)
    writer.add_vocab_size(vocab_size)
    writer.add_file_type(llama_file_type)


def _add_tokenizer(writer: gguf.GGUFWriter, tokens: list[str], scores: list[float], types: list[int]) -> None:
    """The generated vocab as a llama (SentencePiece) tokenizer, and the chat template."""
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


def _write_tensor_data(
    writer: gguf.GGUFWriter, tensors: list[GGUFTensor], tensor_type: gguf.GGMLQuantizationType, threads: int
) -> None:
    """Encode the tensors on ``threads`` threads and write them in order."""
    with ThreadPoolExecutor(threads) as pool:
        pending: deque[Future[np.ndarray]] = deque()
        for tensor in tensors:
            pending.append(pool.submit(_encode, tensor, tensor_type))
            if len(pending) > 2 * threads:  # bounded look-ahead: memory stays flat
                writer.write_tensor_data(pending.popleft().result())
        while pending:
            writer.write_tensor_data(pending.popleft().result())


@contextmanager
def whole_or_removed(writer: gguf.GGUFWriter, partial: Path, path: Path) -> Iterator[None]:
    """The file the block writes through ``writer`` into ``partial`` becomes ``path`` once it
    is whole; a block that fails leaves neither."""
    try:
        yield
        writer.close()
        partial.replace(path)
    except BaseException:
        writer.close()
        partial.unlink(missing_ok=True)
        raise


def active_weight_bytes(path: Path) -> int:
    """Bytes of weights one decoded token reads: every tensor but the token embedding, of
    which a token reads one row (the roofline's denominator). A model without an output
    matrix (tied embeddings, as SmolLM2's) reads the whole embedding as its output layer."""
    reader = gguf.GGUFReader(str(path))
    tied = all(t.name != "output.weight" for t in reader.tensors)
    return sum(int(t.n_bytes) for t in reader.tensors if tied or t.name != "token_embd.weight")
