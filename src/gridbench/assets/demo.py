"""The embedded demo's models: one target in two quantizations, a small draft, a tokenizer."""

from __future__ import annotations

from pathlib import Path

from gridbench.assets.gguf_model import ModelShape, write_random_llama_gguf
from gridbench.assets.tokenizer import write_tokenizer

TARGET = ModelShape(n_embd=256, n_layer=4, n_ff=768, head_dim=64)
# Same width, embedding and output matrix as the target, one thin layer: a cheap draft that
# agrees with the target on most tokens (see gguf_model's docstring).
DRAFT = ModelShape(n_embd=256, n_layer=1, n_ff=256, head_dim=64)


def write_demo_models(outdir: Path) -> list[Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    paths = [
        write_random_llama_gguf(outdir / "target-f16.gguf", TARGET, "f16"),
        write_random_llama_gguf(outdir / "target-q8_0.gguf", TARGET, "q8_0"),
        write_random_llama_gguf(outdir / "draft-q8_0.gguf", DRAFT, "q8_0", layer_seed=2),
        write_tokenizer(outdir / "tokenizer.json"),
    ]
    return paths
