"""What a config's weights are, as the report and the explorer both say it: each config's
declared origin (``checkpoints.*.origin``), its text, and the wording that marks what rests on
random weights as a mechanism check rather than a finding."""

from __future__ import annotations

from gridbench.config.grid import Grid, WeightsOrigin

# A finding on random weights is labelled so: "Mechanism check: <finding>"
MECHANISM_CHECK = "Mechanism check"
# What measurements on random weights show, and what they do not
RANDOM_WEIGHTS_SHOW = "engines, counters and harness work, not how these methods perform on a real model"
UNDECLARED = "undeclared"  # the origin's kind where a checkpoint declares none


def config_origins(grid: Grid) -> dict[str, WeightsOrigin | None]:
    """Each config's declared weights origin, None where its checkpoint declares none."""
    return {name: cfg.checkpoint.origin for name, cfg in grid.configs.items()}


def is_random(origin: WeightsOrigin | None) -> bool:
    return origin is not None and not origin.real


def random_weight_configs(grid: Grid) -> list[str]:
    """Configs whose checkpoint declares random weights: their findings are mechanism checks."""
    return [name for name, origin in config_origins(grid).items() if is_random(origin)]


def origin_kind(origin: WeightsOrigin | None) -> str:
    """real, random or undeclared."""
    return UNDECLARED if origin is None else origin.kind


def origin_text(origin: WeightsOrigin | None) -> str:
    """The origin as the report's weights column gives it: its kind and, where declared, its source."""
    if origin is None:
        return "not declared"
    return f"{origin.kind}: {origin.source}" if origin.source else origin.kind
