"""The engine kinds gridbench can serve, one module each, registered here.

Adding a kind (SGLang, TensorRT-LLM) is one new module with an ``EngineKind`` subclass,
its name in the schema's ``engines.*.kind`` enum (a test holds the two equal) and a line below.
"""

from __future__ import annotations

from gridbench.engines.kinds import llamacpp, vllm
from gridbench.engines.kinds.base import EngineKind

KINDS: dict[str, EngineKind] = {kind.name: kind for kind in (vllm.KIND, llamacpp.KIND)}


def engine_kind(name: str) -> EngineKind:
    """The kind of that name; the schema allows no other, so a miss is a bug."""
    return KINDS[name]


__all__ = ["KINDS", "EngineKind", "engine_kind"]
