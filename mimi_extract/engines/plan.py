"""Planning: which items this run encodes (``--part``) and in which work units.

A *work unit* is what an engine hands to one device at a time: a length-sorted batch of short
items (encoded in one step), or long items that are streamed chunk by chunk.  Devices take units
from a shared queue as they become free, so a slow device simply takes fewer.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from ..sources import Item
from ..sources.items import SplitPiece


def part_of(key: str, count: int) -> int:
    """Stable part of a key: depends on the key alone, so adding inputs never moves existing ones."""
    return int.from_bytes(hashlib.sha1(key.encode("utf-8")).digest()[:8], "big") % count


@dataclass
class WorkUnit:
    index: int
    items: list[Item]
    stream: bool  # long items, streamed in chunks

    @property
    def seconds(self) -> float:
        return sum(it.duration for it in self.items)


def pack(sizes: list[int], budget: float, max_rows: int) -> list[list[int]]:
    """The packing rule (work units here, the Ray Data entry's steps): ``sizes`` in increasing order,
    taken greedily into batches of at most ``max_rows`` whose rows x longest stays within ``budget``
    (padded samples); a size over the budget gets a batch of its own.  Returns the indices of each
    batch."""
    batches: list[list[int]] = []
    current: list[int] = []
    for i, size in enumerate(sizes):
        if current and (len(current) >= max_rows or (len(current) + 1) * size > budget):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def plan_batches(items: list[Item], max_batch_seconds: float, batch_size: int, rate: int = 24_000) -> list[list[Item]]:
    """Sort by length and pack greedily so that (items x longest item) stays under the budget
    (:func:`pack`); an item longer than the budget gets a batch of its own."""
    ordered = sorted(items, key=lambda it: (it.samples, it.key))
    return [[ordered[i] for i in b] for b in pack([it.samples for it in ordered], max_batch_seconds * rate, batch_size)]


def plan_units(items: list[Item], chunk_samples: int, max_batch_seconds: float, batch_size: int,
               long_group: int = 1) -> list[WorkUnit]:
    """Long items (over one chunk) first, longest first, in groups of ``long_group`` (so the
    run's tail is short items, not one long stream); then length-sorted batches of short items."""
    long = sorted((it for it in items if it.samples > chunk_samples), key=lambda it: (-it.samples, it.key))
    short = [it for it in items if it.samples <= chunk_samples]
    units = [WorkUnit(0, long[i : i + long_group], True) for i in range(0, len(long), long_group)]
    units += [WorkUnit(0, b, False) for b in plan_batches(short, max_batch_seconds, batch_size)]
    for i, u in enumerate(units):
        u.index = i
    return units


@dataclass
class Split:
    """What splitting long recordings did to a plan (see :func:`split_items`)."""

    items: int = 0  # recordings split
    pieces: int = 0
    warmup_seconds: float = 0.0  # encoded twice: each piece's warm-up
    seconds: float = 0.0  # the split recordings' own audio

    @property
    def overhead(self) -> float:
        return self.warmup_seconds / self.seconds if self.seconds else 0.0


def split_items(items: list[Item], lanes: int, warmup: int, hop: int, max_overhead: float = 0.15,
                rate: int = 24_000) -> tuple[list[Item], Split]:
    """Cut recordings that would keep one lane busy while the others idle into independent pieces.

    A recording is one causal stream: unsplit, its chunks run one after another on one row of one
    device.  Mimi's receptive field is finite (``warmup`` samples, see
    ``PaddedMimiEncoder.receptive_field``), so a piece encoded from ``warmup`` samples before its
    first frame gives the unsplit result for its frames (``encoder.split_bounds``).  Split only where
    it pays: a recording longer than a lane's fair share of the work (total / ``lanes``), into pieces
    of that fair share (the last one takes the rest, or the least a piece may be when the rest is
    shorter), each long enough that its warm-up costs at most ``max_overhead`` of it.  Pieces of one fair share each, not equal pieces: the scheduler hands the
    longest units first, so the lane that gets the shorter last piece also takes the short items,
    and every lane ends at about the same time."""
    from ..codec.encoder import split_bounds

    warm = -(-warmup // hop) * hop
    shortest = max(hop, int(warm / max_overhead))  # a piece's own audio: warm-up <= max_overhead of it
    fair = sum(it.samples for it in items) / max(1, lanes)
    per = -(-max(shortest, int(fair)) // hop)  # frames of own audio per piece
    out, split = [], Split()
    for it in items:
        frames = -(-it.samples // hop)
        cuts = list(range(per, frames, per))
        least = -(-shortest // hop)
        if cuts and frames - cuts[-1] < least:  # a last piece too short: move its cut back, or drop it
            cuts[-1] = frames - least
            if cuts[-1] - (cuts[-2] if len(cuts) > 1 else 0) < least:
                cuts.pop()
        if lanes < 2 or not cuts or it.samples <= fair or it.piece is not None:
            out.append(it)
            continue
        bounds = split_bounds(it.samples, 0, warm, hop, cuts)
        for i, (begin, first, end) in enumerate(bounds):
            out.append(replace(it, piece=SplitPiece(i, len(bounds), begin, first, end), samples=end - begin))
        split.items += 1
        split.pieces += len(bounds)
        split.warmup_seconds += sum(first - begin for begin, first, _ in bounds) / rate
        split.seconds += it.samples / rate
    return out, split


def padding_fraction(batches: list[list[Item]]) -> float:
    """Share of padded (wasted) samples over batches of whole items, from header lengths."""
    padded = sum(len(b) * max(it.samples for it in b) for b in batches)
    real = sum(it.samples for b in batches for it in b)
    return 1 - real / padded if padded else 0.0
