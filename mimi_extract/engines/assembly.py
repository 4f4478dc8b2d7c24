"""The one place where an item's frame chunks become its whole output.

An engine hands an item back in chunks (:class:`~.base.FrameChunk`): the chunks of a streamed item,
one after another (``first`` ... ``final``); and, for a recording split into independent pieces
(``Item.piece``, ``plan.split_items``), each piece's own chunks, from any worker, interleaved and in
any order.  Nothing of an item reaches OUT before it is whole, so a kill mid-item loses no
committed data and a resume encodes the item again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .base import FrameChunk


@dataclass
class _Held:
    """What has arrived of one item: each piece's chunks (by piece index), which pieces are complete."""

    chunks: dict[int, list[np.ndarray]] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)  # distinct, in order: the row's decoder_warnings
    end: int | None = None  # a split recording's last sample (its last piece's end)


class Assembler:
    """``add(chunk)`` returns the item's whole output as one :class:`~.base.FrameChunk` (``first``
    and ``final``: its chunks concatenated, pieces in order, ``seconds`` summed, distinct decoder
    warnings joined) once everything is in, the error chunk at the item's first error, else None.

    A piece (or an unsplit item) that starts again (``first``: re-handed after its worker died)
    drops what it had; a chunk of a piece that never started is dropped (it cannot be whole).  A split recording fails
    as a whole at its first failing piece: its other pieces, still arriving, are ignored.
    ``join_pieces=False`` (a Ray actor, which holds only some pieces of a split recording): each
    piece is assembled as an item of its own, and the driver's assembler joins them."""

    def __init__(self, join_pieces: bool = True):
        self.join_pieces = join_pieces
        self._held: dict[str, _Held] = {}
        self._failed: set[str] = set()

    def add(self, chunk: FrameChunk) -> FrameChunk | None:
        item = chunk.item
        joined = self.join_pieces and item.piece is not None
        key = item.key if self.join_pieces else item.uid
        if key in self._failed:
            return None
        if chunk.error is not None:
            self._held.pop(key, None)
            if not joined:
                return chunk
            self._failed.add(key)
            return replace(chunk, item=replace(item, piece=None))
        if chunk.first and chunk.final and not joined:  # a whole item in one chunk (most items): itself
            self._held.pop(key, None)  # (re-handed after its worker died: what it had is dropped)
            return chunk if chunk.warnings != "" else replace(chunk, warnings=None)
        index, count = (item.piece.index, item.piece.count) if joined else (0, 1)
        held = self._held.get(key)
        if chunk.first:
            held = self._held.setdefault(key, _Held())
            held.chunks[index], held.seconds[index] = [], 0.0
            held.done.discard(index)
        elif held is None or index not in held.chunks:
            return None
        held.chunks[index].append(chunk.data)
        held.seconds[index] += chunk.seconds
        if chunk.warnings and chunk.warnings not in held.warnings:
            held.warnings.append(chunk.warnings)
        if joined and item.piece.last:
            held.end = item.piece.end  # the last piece ends where the recording does
        if chunk.final:
            held.done.add(index)
        if len(held.done) < count:
            return None
        del self._held[key]
        arrays = [a for i in range(count) for a in held.chunks[i]]
        whole = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
        return FrameChunk(replace(item, piece=None, samples=held.end) if joined else item, whole, True, True,
                     sum(held.seconds.values()), None, "; ".join(held.warnings) or None,
                     None if joined else chunk.fidelity)  # (a split recording's pieces: none, docs/fidelity.md)
