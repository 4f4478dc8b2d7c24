"""``manifest.jsonl``: one row per input (ok rows name their shard, error rows say why), the
run directories of OUT, and which format's shard a name is.  A row's ``shard`` is a name, never
trusted as a path: only names a registered format writes are accepted."""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from .. import remote
from ..formats import registry
from ..formats.base import Format, array_checksum
from ..formats.registry import format_of
from .files import MANIFEST, PART_RE, RUN_INFO, TMP_RE, OutputError, write_error

if TYPE_CHECKING:  # (sources import the audio stack: readers of OUT must stay light)
    from ..sources import Item


def run_dirs(out_dir: str) -> list[str]:
    """The run directories of OUT: OUT itself, or its ``part-I-of-N`` folders."""
    parts = sorted(d for d in glob.glob(os.path.join(out_dir, "part-*-of-*")) if PART_RE.search(d))
    if os.path.exists(os.path.join(out_dir, RUN_INFO)) or not parts:
        return [out_dir] + parts
    return parts


def format_of_path(shard: str) -> Format:
    """The format of a shard path relative to OUT (``shard-00000.h5``, ``part-0-of-2/shard-00000.h5``)."""
    parts = shard.split("/")
    for i in range(len(parts)):
        fmt = format_of("/".join(parts[i:]))
        if fmt is not None:
            return fmt
    raise OutputError(f"{shard!r} is not a shard name this tool writes")


def valid_shard_name(name) -> bool:
    """A shard name as a writer makes it: a name matching a registered format's ``shard_re`` (a
    plain file name, or one under that format's fixed folder), never any other path."""
    return isinstance(name, str) and format_of(name) is not None and not name.endswith(".tmp")


def is_tmp(name: str) -> bool:
    """One of the temporary names this tool writes in a run directory (or a format's folder)."""
    return bool(TMP_RE.fullmatch(name)) or (
        name.endswith(".tmp") and any(f.is_file(name[:-4].replace("__", "/")) for f in registry.formats()))


def format_files(run_dir: str):
    """(relative name, format) of every file in the format folders of a run directory that some
    format's ``file_re`` matches, ``.tmp`` names included."""
    for fmt in registry.formats():
        folder = os.path.join(run_dir, fmt.folder) if fmt.folder else run_dir
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            rel = f"{fmt.folder}/{name}" if fmt.folder else name
            if fmt.is_file(rel.removesuffix(".tmp")):
                yield rel, fmt


@dataclass(frozen=True)
class ManifestRow:
    """One row of ``manifest.jsonl`` as a writer makes it: the input item (``path``, ``key``...), then,
    once it is stored, its shape and where it is (``shard``, ``status``, ``checksum``, and the
    format's ``stored`` fields), or why it is not (``error``).  Rows read back stay the plain dicts
    of their JSON (:func:`read_rows`): readers take what an OUT holds, an older version's included."""

    key: str
    path: str | None = None
    dataset: str | None = None
    channel: int | None = None
    sample_rate: int | None = None
    duration: float | None = None
    start: float | None = None  # a segment of its source (seconds); absent for a whole file
    end: float | None = None
    source: dict | None = None  # how to reach its audio again: lhotse recordings, verify --out
    meta: dict | None = None  # what the input says about it (text, speaker...)
    decoder_warnings: str | None = None
    frames: int | None = None  # ok rows: the stored array's shape
    dims: int | None = None
    stored: dict | None = None  # where the format put it in its shard (``ShardBuilder.add``'s fields)
    shard: str | None = None
    status: str | None = None  # "ok" or "error" once written
    error: str | None = None
    checksum: str | None = None

    @classmethod
    def for_item(cls, item: Item, decoder_warnings: str | None = None) -> ManifestRow:
        from ..sources import dataset_name  # (the runner has them loaded)

        source = None
        if item.error is None:  # what a lhotse Recording needs, without probing the file again; the path
            # absolute, so that the cuts load their audio (and verify --out re-reads it) from any directory
            source = {"path": remote.absolute(item.path), "frames": item.file_frames, "channels": item.file_channels}
            if item.kind != "file":  # a member of a container: how to reach its bytes again (verify --out)
                source.update(kind=item.kind, loc=item.loc.values() if item.loc is not None else None)
        start, end = item.segment if item.segment is not None else (None, None)
        return cls(key=item.key, path=item.rel, dataset=dataset_name(item.key),
                   channel=item.channel if isinstance(item.channel, int) else None,
                   sample_rate=item.sample_rate or None, duration=round(item.duration, 4), start=start, end=end,
                   source=source, meta=item.meta or None, decoder_warnings=decoder_warnings)

    def shaped(self, data: np.ndarray) -> ManifestRow:
        """With the shape of its array (time first)."""
        return replace(self, frames=int(data.shape[0]), dims=int(data.shape[1]) if data.ndim > 1 else None)

    def ok(self, data: np.ndarray, shard: str, stored: dict) -> ManifestRow:
        return replace(self.shaped(data), stored=stored or None, shard=shard, status="ok", error=None,
                       checksum=array_checksum(data))

    def failed(self, message: str, shard: str | None = None) -> ManifestRow:
        """An error row; ``shard``: the shard holding its placeholder (``--shar-extend``)."""
        return replace(self, shard=shard, status="error", error=message)

    def as_dict(self) -> dict:
        """Its JSON: the input's fields always (``null`` when unknown), the others when they apply."""
        row = {"path": self.path, "key": self.key, "dataset": self.dataset, "channel": self.channel,
               "sample_rate": self.sample_rate, "duration": self.duration}
        if self.start is not None:
            row["start"], row["end"] = self.start, self.end
        optional = {"source": self.source, "meta": self.meta, "decoder_warnings": self.decoder_warnings,
                    "frames": self.frames, "dims": self.dims}
        row.update({k: v for k, v in optional.items() if v is not None})
        row.update(self.stored or {})
        if self.status is not None:
            row.update(shard=self.shard, status=self.status, error=self.error)
            if self.checksum is not None:
                row["checksum"] = self.checksum
        return row


class ManifestAppender:
    """``manifest.jsonl`` of one run directory, open for appends: unbuffered, each call fsynced, so
    a failed write leaves at most a torn last line (which :func:`read_rows` ignores), nothing pending."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, MANIFEST)
        try:
            self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise write_error(e, self.path) from e

    def append(self, rows: list[ManifestRow]) -> None:
        try:
            view = memoryview("".join(json.dumps(r.as_dict()) + "\n" for r in rows).encode("utf-8"))
            while view:
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        except OSError as e:
            raise write_error(e, self.path) from e

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_rows(run_dir: str) -> list[dict]:
    """All rows of one run directory's manifest; a torn line (killed mid-write) is ignored.

    A row's ``shard`` is a name, never trusted as a path: nothing outside OUT may be read, moved
    or written because of what OUT's files say, so a row naming anything but a shard this tool
    writes (``../x``, ``/etc/x``, ``sub/shard-00000.h5``) is an error naming the row."""
    path = os.path.join(run_dir, MANIFEST)
    rows = []
    if os.path.exists(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict) and "key" in row:
                    if row.get("shard") is not None and not valid_shard_name(row["shard"]):
                        raise OutputError(f"{path} line {n} (key {row['key']!r}) names {row['shard']!r} as its shard, "
                                          "which is not a shard name this tool writes: the manifest was edited or "
                                          "damaged; remove or fix that row")
                    rows.append(row)
    return rows


def committed_rows(run_dir: str) -> list[dict]:
    """The committed rows of one run directory: rows whose shard was never renamed into place (a
    run killed, or a disk filled, between the manifest append and the rename) are left out: they
    are not committed, and resume drops them."""
    exists: dict[str, bool] = {}
    rows = []
    for row in read_rows(run_dir):
        shard = row.get("shard")
        if shard and exists.setdefault(shard, os.path.exists(os.path.join(run_dir, shard))) is False:
            continue
        rows.append(row)
    return rows


def read_manifest(out_dir: str) -> list[dict]:
    """Committed rows of every run directory of OUT (all parts), ``shard`` relative to OUT."""
    rows = []
    for d in run_dirs(out_dir):
        prefix = os.path.relpath(d, out_dir)
        for row in committed_rows(d):
            if row.get("shard") and prefix != ".":
                row["shard"] = f"{prefix}/{row['shard']}"
            rows.append(row)
    return rows



def next_shard_index(run_dir: str) -> int:
    """One more than the highest shard number any file or row of the run directory uses."""
    used = [int(m.group(1)) for name, fmt in format_files(run_dir)
            if (m := fmt.shard_re.fullmatch(name.removesuffix(".tmp")))]
    for r in read_rows(run_dir):
        fmt = format_of(r.get("shard") or "")
        if fmt is not None:
            used.append(int(fmt.shard_re.fullmatch(r["shard"]).group(1)))
    return max(used, default=-1) + 1

def shard_attrs(out_dir: str, shard: str) -> dict:
    """The settings stored in a shard (relative to OUT)."""
    return format_of_path(shard).attrs(os.path.join(out_dir, shard))
