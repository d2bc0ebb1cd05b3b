"""What a draft's recipe records: each step's facts and the recipe's RECIPE.json. Standard
library only: gridbench.drafts.worker, which runs where gridbench's dependencies may be
missing, writes StepFacts too."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepFacts:
    """What one step did: its counts, where it ran and how long it took."""

    step: str
    wall_s: float  # the step's own work (generation, forward passes, training)
    device: str = "cpu"  # the GPU's name, or cpu
    rows: int | None = None
    tokens: int | None = None  # prompt and answer tokens the step read
    answer_tokens: int | None = None
    truncated_rows: int | None = None  # rows cut to the recipe's seq_length
    ended_on_eos: int | None = None
    by_class: dict[str, int] | None = None
    # the target's layers whose hidden states the head reads, in vLLM's numbering (the last,
    # the number of layers, is the final layer's output before the final norm)
    layers: tuple[int, ...] | None = None
    epochs: int | None = None
    threads: int | None = None
    torch: str | None = None
    dtype: str | None = None  # of the hidden states, the autocast and Muon's orthogonalisation
    python: str | None = None
    sha256: str | None = None
    command_wall_s: float | None = None  # the whole command: imports, loading, saving


@dataclass(frozen=True)
class EpochLoss:
    """One epoch of the loss curve: the training steps' means, the validation at its end."""

    epoch: int
    steps: int
    train_loss_mean: float
    train_accuracy_0_mean: float
    val_loss: float | None = None
    val_accuracy_by_position: tuple[float, ...] = ()
