"""Which slots a cell gets: reuse its config's warm engine, wait for it, or start one.

Pure: it decides over a survey of the slots (SlotView, taken under the selection lock by
SlotManager) and touches no file, lock or engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO

from gridbench.engines.slots import SlotHolder, SlotState


@dataclass
class SlotView:
    """One slot as a selecting cell sees it, under the selection lock."""

    name: str
    lock: IO[str] | None  # held by us: the slot is free; None: a running cell holds it
    state: SlotState | None  # the slot's engine record (alive or not)
    alive: bool
    holder: SlotHolder | None  # which cell holds it, when one does

    @property
    def free(self) -> bool:
        return self.lock is not None

    def runs_engine_of(self, owner: str) -> bool:
        """Whether a live engine of ``owner``'s sweep runs here."""
        return self.alive and self.state is not None and self.state.owner == owner


@dataclass(frozen=True)
class Choice:
    slots: tuple[str, ...]
    warm: bool  # the config's engine already runs on them


def choose_slots(
    views: Sequence[SlotView], fingerprint: str, need: int, *, owner: str, order: Sequence[str]
) -> Choice | None:
    """The slots to use and whether their engine is warm; None: wait.

    A config has one engine: a cell whose config's engine is busy (another cell of it
    measures, or starts it) waits for it instead of starting a second one. A new engine
    takes empty slots first (other warm engines stay reusable), then ``owner``'s to switch,
    each in ``order``."""
    if any(v.holder and v.holder.fingerprint == fingerprint and v.holder.owner == owner for v in views):
        return None
    free = {v.name for v in views if v.free}
    for v in views:
        if v.state is None or v.state.fingerprint != fingerprint or not v.runs_engine_of(owner):
            continue
        if v.free and free.issuperset(v.state.slots):
            return Choice(v.state.slots, warm=True)
    usable = [v for v in views if v.free and (not v.alive or v.runs_engine_of(owner))]
    usable.sort(key=lambda v: (v.alive, order.index(v.name)))
    if len(usable) < need:
        return None
    return Choice(tuple(v.name for v in usable[:need]), warm=False)
