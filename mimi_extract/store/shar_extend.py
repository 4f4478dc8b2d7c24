"""``--shar-extend``: a new field for an existing lhotse Shar dataset.  One tar per input Shar
shard, named by its number and holding that shard's cuts in its order, so the input's own fields
(cuts, recordings...) and ours are read together by ``CutSet.from_shar(fields=...)``: what to
encode (:func:`plan_extend`), in which order (:func:`extend_units`), and its writer
(:class:`SharExtendWriter`), which commits a shard only once every one of its cuts is in."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace

import numpy as np

from ..formats.base import Format
from ..formats.shar import FOLDER, SharShard
from .files import OutputError
from .manifest import ManifestAppender, ManifestRow, with_shard_checksum
from .writer import WriterBlock, commit_files

_INPUT_CUTS = re.compile(r"cuts\.(\d+)\.jsonl(?:\.gz)?")


def input_cut_ids(shar_dir: str) -> dict[str, list[str]]:
    """Cut ids of each ``cuts.NNNNNN.jsonl.gz`` of a Shar folder, in order, by shard number (its
    digits as written), read with lhotse's own JSONL reader."""
    from ..common.optional import need

    LazyJsonlIterator = need("lhotse.lazy", "--shar-extend").LazyJsonlIterator
    layout = {}
    for name in sorted(os.listdir(shar_dir)):
        if (m := _INPUT_CUTS.fullmatch(name)):
            layout[m.group(1)] = [d["id"] for d in LazyJsonlIterator(os.path.join(shar_dir, name))]
    return layout


def plan_extend(source: str, kind: str, items: list, bad: list, mine=None, output_format: str = "shar"):
    """What ``--shar-extend`` encodes: ``(layout, items, bad, warnings)``.  ``layout`` maps each input
    shard number to its cut ids in order; every cut of a shard in the layout has exactly one item
    (ok or bad) keyed by its id.  A shard where a cut has no such item (a cut split by channel,
    ``--limit``) is left out with a warning: its tar could not line up with its cuts.  ``mine``
    (a job array's ``--part I/N``): which input shard numbers this part encodes (whole shards)."""
    if output_format != "shar":
        raise OutputError(f"--shar-extend writes a lhotse Shar field: use it with --format shar, not {output_format}")
    if kind != "shar":
        raise OutputError(f"--shar-extend adds a field to a lhotse Shar dataset: INPUT must be a Shar folder "
                          f"(cuts.NNNNNN.jsonl.gz + recording.NNNNNN.tar), not a {kind} input")
    layout = input_cut_ids(source)
    if mine is not None:
        layout = {n: ids for n, ids in layout.items() if mine(n)}
    short = sorted(n for n in layout if len(n) < 6)
    if short:
        raise OutputError(f"--shar-extend: input shard number {short[0]!r} has fewer than 6 digits "
                          "(lhotse writes cuts.%06d.jsonl.gz); rename the shards")
    have = {it.key for it in items} | {it.key for it in bad}
    warnings, keep = [], {}
    for n, ids in layout.items():
        missing = [i for i in ids if i not in have]
        if missing:
            warnings.append(f"--shar-extend: shard {n} left out: cut {missing[0]!r} has no item of its own"
                            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                            + " (a cut split by channel: use --channel mix or first; or --limit)")
        elif len(set(ids)) != len(ids):
            warnings.append(f"--shar-extend: shard {n} left out: it holds a cut id twice")
        else:
            keep[n] = ids
    wanted = {i for ids in keep.values() for i in ids}
    return keep, [it for it in items if it.key in wanted], [it for it in bad if it.key in wanted], warnings


def extend_units(todo: list, layout: dict[str, list[str]], plan) -> list:
    """Work units shard by shard, in input order (``plan(items)`` batches one shard's items), so
    the writer holds the outputs of about one shard at a time, not of the whole run."""
    shard_of = {key: n for n, ids in layout.items() for key in ids}
    by_shard: dict[str, list] = {}
    for it in todo:
        by_shard.setdefault(shard_of[it.key], []).append(it)
    units = [u for n in layout for u in plan(by_shard.get(n, []))]
    for i, u in enumerate(units):
        u.index = i
    return units


@dataclass(frozen=True)
class _Held:
    """A finished item waiting for the rest of its shard: its array, or its error."""

    row: ManifestRow
    data: np.ndarray | None
    error: str | None = None


class SharExtendWriter(WriterBlock):
    """``--shar-extend``: one ``<field>.NNNNNN.tar`` per input Shar shard, named by its number,
    holding that shard's cuts in its order (an array, or lhotse's placeholder pair for a cut that
    failed), so ``CutSet.from_shar(fields={"cuts": input, ..., field: these})`` lines up.

    A finished item is held until every cut of its shard is final, then the shard is committed by
    the shared protocol (error rows too: they are part of the shard); a shard is never committed
    part-way.  Memory: the held outputs of the shards not yet complete; units are planned shard by
    shard in input order (:func:`extend_units`), so that is about the shards that units in flight
    touch (one or two), not the run: ``peak_held_bytes`` reports it."""

    def __init__(self, run_dir: str, fmt: Format, file_attrs: dict, layout: dict[str, list[str]]):
        self.run_dir = run_dir
        self.file_attrs = {**file_attrs, "shar_extend": True}
        self.format = fmt.for_run(self.file_attrs)
        self.layout = layout
        self.shard_of = {key: n for n, ids in layout.items() for key in ids}
        self.pending: dict[str, dict[str, _Held]] = {}
        self.written: set[str] = set()  # keys held or written by this run (a retried unit cannot add a second copy)
        self.held_bytes = self.peak_held_bytes = 0
        self._manifest = ManifestAppender(run_dir)

    def add(self, key: str, data: np.ndarray, row: ManifestRow, attrs: dict | None = None) -> None:
        if key in self.written or key not in self.shard_of:
            return
        self.written.add(key)
        self.held_bytes += data.nbytes
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)
        self._hold(key, _Held(replace(row, key=key).shaped(data), data))

    def add_error(self, row: ManifestRow, message: str) -> None:
        if row.key in self.written or row.key not in self.shard_of:
            return
        self.written.add(row.key)
        self._hold(row.key, _Held(row, None, message))

    def _hold(self, key: str, entry: _Held) -> None:
        n = self.shard_of[key]
        held = self.pending.setdefault(n, {})
        held[key] = entry
        if len(held) == len(self.layout[n]):
            self._commit_shard(n)

    def _commit_shard(self, n: str) -> None:
        held = self.pending.pop(n)
        name = f"{FOLDER}/{self.format.field}.{n}.tar"
        shard = SharShard(self.file_attrs)
        rows = []
        for key in self.layout[n]:
            entry = held[key]
            if entry.error is None:
                rows.append(entry.row.ok(entry.data, name, shard.add(key, entry.data, entry.row.as_stored(), {})))
                self.held_bytes -= entry.data.nbytes
            else:
                shard.add_placeholder(key)
                rows.append(entry.row.failed(entry.error, name))
        files = shard.files(name)
        shard.close()
        rows = with_shard_checksum(rows, files, name)
        commit_files(self.run_dir, files, lambda: self._manifest.append(rows))

    def abort(self) -> None:
        """Discard what is not committed (an unrecoverable write error)."""
        for held in self.pending.values():
            for key in held:
                self.written.discard(key)
        self.pending.clear()
        self.held_bytes = 0

    def close(self) -> None:
        self.pending.clear()  # shards not complete: encoded again on resume
        self._manifest.close()
