"""A deterministic English-like book for llama-benchy's prompts, written offline."""

from __future__ import annotations

import random
from pathlib import Path

from gridbench.assets.words import WORDS
from gridbench.util.files import atomic_write_text

# llama-benchy cuts a Gutenberg book at this marker; keeping it makes the file a drop-in.
HEADER = "*** START OF THE PROJECT GUTENBERG EBOOK SYNTHETIC ***\n\n"


def synthetic_book(paragraphs: int = 3000, seed: int = 0) -> str:
    rng = random.Random(seed)
    out = []
    for _ in range(paragraphs):
        sentences = []
        for _ in range(rng.randint(2, 6)):
            sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 18)))
            sentences.append(sentence[0].upper() + sentence[1:] + rng.choice(".....?!,"))
        out.append(" ".join(sentences))
    return HEADER + "\n\n".join(out) + "\n"


def write_corpus(path: Path, paragraphs: int = 3000) -> Path:
    return atomic_write_text(path, synthetic_book(paragraphs))
