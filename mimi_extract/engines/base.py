"""What every engine shares: the :class:`FrameChunk` it yields, the :class:`Stats` it keeps, the
small :class:`Engine` interface, and the waits that end with their producer.

Engines share one interface, ``run(units, stop, model=None, shards=None) -> iterator of FrameChunk``
(and, when ``shards`` is given to an engine whose workers write, shards to commit) and ``close()``:
see :mod:`mimi_extract.engines` for the engines and their registry.  The writer ignores a chunk for
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

from ..codec.encoder import PaddedMimiEncoder
from ..codec.fidelity import Fidelity
from ..config.choices import SAMPLE_RATE
from ..config.settings import Settings
from ..sources import Item, plan_group
from ..store.manifest import ManifestRow
from .plan import Split, WorkUnit, plan_units, split_items


@dataclass
class FrameChunk:
    """Frames of one item from one step (time first), or the item's error; once assembled
    (``assembly.Assembler``), the item's whole output as one chunk (``first`` and ``final``).
    (A *piece* is something else: a part of a split recording, ``sources.SplitPiece``.)"""

    item: Item
    data: np.ndarray | None
    first: bool
    final: bool
    seconds: float  # encoder-input seconds this chunk covers (progress)
    error: str | None = None
    warnings: str | None = None  # final chunk: what the decoder library printed (the row's decoder_warnings)
    fidelity: Fidelity | None = None  # final chunk, --fidelity: how well the item's codes decode (codec.fidelity)

    def row(self) -> ManifestRow:
        """A whole item's manifest row before it is stored (its decoder warnings and fidelity): the
        one rule for the runner's writer and a worker's or an actor's own shards."""
        return ManifestRow.for_item(self.item, self.warnings, self.fidelity)


@dataclass(frozen=True)
class Progress:
    """Encoder-input seconds encoded of items not yet whole, which a worker writing its own shards
    reports (the runner's progress line) between their commits."""

    seconds: float


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
    """How planned work units become encoded frame chunks, and everything the runner asks of an engine:
    ``plan`` (its own work units), ``describe()`` (the plan line), ``stats`` and ``notes`` (the
    summary), ``run`` and ``close`` (``with make_engine(settings) as engine``: closed when the block
    ends)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        # what one worker runs on decides the units' size: the run's settings, unless the engine's
        # workers are elsewhere (a Ray cluster's actors: a CPU head can drive a GPU cluster)
        self.plan_settings: Settings = settings
        self.stats = Stats()
        self.notes: list[str] = []  # for the run's summary: a worker that died, a request capped

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def describe(self) -> str | None:
        """What runs the work, for the plan line; None: the devices say it."""
        return None

    def long_group(self) -> int:
        """Long items (streamed) per work unit: one, so the run's tail is short items, not one long stream."""
        return 1

    def plan(self, items: list[Item], model=None) -> tuple[list[WorkUnit], Split]:
        """This engine's work units for ``items``, numbered in order, and what splitting did.  With
        ``model`` (the weights: their receptive field bounds a piece's warm-up) and ``--split``, a
        recording that would keep one lane busy while the others idle is first cut into independent
        pieces (``plan.split_items``; lanes: the devices' rows that a step's budget fills with
        chunks).  Then items are grouped by ``sources.plan_group`` (a compressed tar is sorted
        within each buffer-full only), long ones first (:meth:`long_group` a unit), short ones in
        length-sorted batches (``plan.plan_units``), sized by :attr:`plan_settings`."""
        planned = self.plan_settings
        split = Split()
        if model is not None and self.settings.split:
            encoder = PaddedMimiEncoder(model)
            if encoder.window is not None:
                per_device = max(1, min(planned.rows, int(planned.step_seconds * SAMPLE_RATE) // planned.chunk_samples()))
                items, split = split_items(items, len(planned.devices) * per_device, encoder.receptive_field, encoder.hop)
        groups: dict[int, list[Item]] = {}
        for it in items:
            groups.setdefault(plan_group(it), []).append(it)
        units = [u for g in sorted(groups) for u in plan_units(groups[g], planned.chunk_samples(), planned.step_seconds,
                                                                planned.rows, long_group=self.long_group())]
        for i, u in enumerate(units):
            u.index = i
        return units, split

    @abstractmethod
    def run(self, units: list[WorkUnit], stop: threading.Event, model=None, shards=None) -> Iterator[FrameChunk]:
        """Encode ``units`` until done or ``stop`` is set, yielding frame chunks in each item's order.
        ``shards`` (a :class:`~mimi_extract.store.writer.ShardSpec`): an engine whose workers can
        write the run's shards themselves (``ProcessEngine``) does, and yields each shard for the
        caller to commit instead of its items' chunks; the others ignore it."""

    @abstractmethod
    def close(self) -> None:
        """Release workers or the cluster (idempotent)."""


DONE = object()  # end of work on a queue


class AnyEvent:
    def __init__(self, *events):
        self.events = events

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)



def get_while(q: queue_mod.Queue, producer: threading.Thread, poll: float = 1.0):
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

