"""What every engine shares: the :class:`Piece` it yields, the :class:`Stats` it keeps, the
small :class:`Engine` interface, and the waits that end with their producer.

Engines share one interface, ``run(units, stop, model=None) -> iterator of Piece`` and ``close()``:
see :mod:`mimi_extract.engines` for the engines and their registry.  The writer ignores a piece for
an item it already stored, so a unit handed out twice (after a worker died) can never store an item
twice.
"""

from __future__ import annotations

import queue as queue_mod
import threading
from dataclasses import dataclass
from abc import ABC, abstractmethod
from typing import Iterator

import numpy as np
import torch

from .plan import WorkUnit
from ..config.settings import Settings
from ..sources import Item


@dataclass
class Piece:
    """Frames of one item from one step (time first), or the item's error."""

    item: Item
    data: np.ndarray | None
    first: bool
    final: bool
    seconds: float  # encoder-input seconds this piece covers (progress)
    error: str | None = None
    warnings: str | None = None  # final piece: what the decoder library printed (the row's decoder_warnings)


@dataclass
class Stats:
    """Where a device's wall time went: the encoder busy, waiting for input, waiting to hand out."""

    wall: float = 0.0
    busy: float = 0.0
    wait_input: float = 0.0
    wait_output: float = 0.0
    steps: int = 0
    real: int = 0  # samples
    padded: int = 0  # samples computed (rows x step length)
    joined: int = 0  # streams that started in a row freed mid-run, beside streams going on (continuous batching)

    def add(self, other: "Stats") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def idle_fraction(self) -> float:
        return (self.wait_input + self.wait_output) / self.wall if self.wall else 0.0

    @property
    def padding_fraction(self) -> float:
        return 1 - self.real / self.padded if self.padded else 0.0


def is_out_of_memory(e: BaseException) -> bool:
    """Out of memory on any device: CUDA's error, the CPU allocator's, or Python's."""
    if isinstance(e, (MemoryError, getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError))):
        return True
    message = str(e).lower()
    return isinstance(e, RuntimeError) and any(s in message for s in (
        "out of memory", "can't allocate memory", "not enough memory", "failed to allocate"))



class Engine(ABC):
    """How planned work units become encoded pieces, and everything the runner asks of an engine:
    ``plan_settings`` (what sizes the units), ``describe()`` (the plan line), ``stats`` and ``notes``
    (the summary), ``run`` and ``close``."""

    def __init__(self, settings: Settings):
        self.settings = settings
        # what one worker runs on decides the units' size: the run's settings, unless the engine's
        # workers are elsewhere (a Ray cluster's actors: a CPU head can drive a GPU cluster)
        self.plan_settings: Settings = settings
        self.stats = Stats()
        self.notes: list[str] = []  # for the run's summary: a worker that died, a request capped

    def describe(self) -> str | None:
        """What runs the work, for the plan line; None: the devices say it."""
        return None

    @abstractmethod
    def run(self, units: list[WorkUnit], stop: threading.Event, model=None) -> Iterator[Piece]:
        """Encode ``units`` until done or ``stop`` is set, yielding pieces in each item's order."""

    @abstractmethod
    def close(self) -> None:
        """Release workers or the cluster (idempotent)."""


_DONE = object()  # end of work on a queue


class _AnyEvent:
    def __init__(self, *events):
        self.events = events

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)



def _get_while(q: queue_mod.Queue, producer: threading.Thread, poll: float = 1.0):
    """``q.get()``, bounded by the producer's life: a producer that ended without its end-of-work
    marker (it cannot, but a wait must not outlive the one who would end it) gives an error."""
    while True:
        try:
            return q.get(timeout=poll)
        except queue_mod.Empty:
            if not producer.is_alive():
                try:
                    return q.get_nowait()
                except queue_mod.Empty:
                    return RuntimeError(f"the {producer.name} thread ended without its end-of-work marker")

