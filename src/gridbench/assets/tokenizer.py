"""An HF ``tokenizer.json`` with the generated GGUF models' own vocabulary.

llama-benchy sizes prompts with a local tokenizer; this one tokenizes like llama.cpp's SPM
tokenizer on the generated models (same pieces and merges, '▁' word prefix, byte
fallback), so prompt sizes come out as the server counts them.
"""

from __future__ import annotations

from pathlib import Path

import gguf
from tokenizers import Tokenizer, decoders, models, normalizers

from gridbench.assets.gguf_model import vocab
from gridbench.util.files import atomic_write_text


def build_tokenizer() -> Tokenizer:
    """Byte-fallback BPE, laid out like Llama-2's tokenizer.json: each multi-character
    piece is one merge of its prefix and its last character, exactly the merges llama.cpp's
    SPM tokenizer can make with this vocab."""
    tokens, _scores, types, _first_word, _paris = vocab()
    ids = {token: i for i, token in enumerate(tokens)}
    merges = []
    for token, kind in zip(tokens, types, strict=True):
        if kind == gguf.TokenType.NORMAL and len(token) > 1 and token[:-1] in ids:
            merges.append((token[:-1], token[-1]))
    tokenizer = Tokenizer(
        models.BPE(vocab=ids, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    )
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
    )
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.add_special_tokens(["<s>", "</s>", "<|im_start|>", "<|im_end|>"])
    return tokenizer


def write_tokenizer(path: Path) -> Path:
    return atomic_write_text(path, build_tokenizer().to_str())
