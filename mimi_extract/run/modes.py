"""What a run writes, as a mode object: which of the input's items it takes, how its work units are
planned and which writer stores them.  :class:`EveryItem` (the default: size-capped shards) and
:class:`SharExtend` (``--shar-extend``: a new field for an existing lhotse Shar dataset, one tar per
input shard), so that the runner is one plain pipeline for both."""

from __future__ import annotations

from ..config.request import RunRequest
from ..engines.base import Engine
from ..engines.plan import Split, part_of
from ..sources import Discovered, Item
from ..store.shar_extend import extend_units, plan_extend


class EveryItem:
    """Every item of the input (of this part of a job array: by key, unless the parts took whole
    input shards), planned by the engine (long recordings split where it pays), written to shards
    of at most ``--shard-size`` items or ``--shard-mb``."""

    parts_by_shard = True  # a job array's parts may take whole input shards

    def __init__(self, request: RunRequest):
        self.request = request

    def select(self, found: Discovered, items: list[Item], bad: list[Item]) -> tuple[list[Item], list[Item], list[str]]:
        """(items, bad, warnings): those of this run."""
        part = self.request.part
        if not part.whole and found.part_shards is None:  # (else discovery took this part's whole shards)
            items = [it for it in items if part_of(it.key, part.count) == part.index]
            bad = [it for it in bad if part_of(it.key, part.count) == part.index]
        return items, bad, []

    def plan(self, engine: Engine, todo: list[Item], model) -> tuple[list, Split]:
        return engine.plan(todo, model)

    def writer(self, run, fmt, attrs: dict, on_commit=None):
        request = self.request
        return run.writer(fmt, attrs, request.shard_size, int(request.shard_mb * 2**20), on_commit)

    def worker_shards(self, writer):
        """Where device workers may write this run's shards themselves: the writer's spec (None with
        ``--single-writer``, a measurement's baseline: the runner writes every item)."""
        return None if self.request.settings.single_writer else writer.spec()


class SharExtend:
    """``--shar-extend``: every cut of the input Shar's shards (of this part's: whole shards, by
    shard number) that has exactly one item, planned shard by shard in input order (whole items:
    the writer holds about one shard's outputs), written as one ``<field>.NNNNNN.tar`` per input
    shard (``store.shar_extend``)."""

    parts_by_shard = False  # its own rule: whole input Shar shards, by number

    def __init__(self, request: RunRequest):
        self.request = request
        self.layout: dict[str, list[str]] = {}

    def select(self, found: Discovered, items: list[Item], bad: list[Item]) -> tuple[list[Item], list[Item], list[str]]:
        part = self.request.part
        mine = None if part.whole else (lambda n: part_of(f"shar-shard-{n}", part.count) == part.index)
        self.layout, items, bad, warnings = plan_extend(self.request.source, found.kind, items, bad, mine,
                                                        self.request.settings.format)
        return items, bad, warnings

    def plan(self, engine: Engine, todo: list[Item], model) -> tuple[list, Split]:
        return extend_units(todo, self.layout, lambda items: engine.plan(items)[0]), Split()

    def writer(self, run, fmt, attrs: dict, on_commit=None):
        return run.extend_writer(fmt, attrs, self.layout)

    def worker_shards(self, writer):
        """None: one tar per input shard, its items from every worker, so the runner writes them."""
        return None


def mode_of(request: RunRequest) -> EveryItem | SharExtend:
    """The mode ``request`` asks for."""
    return SharExtend(request) if request.settings.shar_extend else EveryItem(request)
