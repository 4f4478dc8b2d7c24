"""Reading OUT back: one manifest row's item (checked against its checksum), a whole-OUT checksum scan,
and the Shar fields of a Shar OUT.  ``reader.py`` is the indexed reader built on these."""

from __future__ import annotations

import zlib

import numpy as np

from ..common import remote
from ..formats.base import array_checksum
from ..formats.registry import format_of
from ..formats.shar import FIELDS, cuts_name
from .files import DamagedError, LayoutError, MalformedError
from ..formats.records import StoredRow
from .identity import read_run, read_run_info
from .manifest import RunFiles, committed_rows, format_of_path, out_files


def load_row(out_dir: str, row: StoredRow, shard=None) -> np.ndarray:
    """The array of one ok manifest row (``shard`` relative to OUT, as ``read_manifest`` gives it),
    time first, checked against the row's checksum.  ``shard``: a handle of that shard from its
    format's ``open`` (readers keep a few open).  Raises :class:`DamagedError` naming OUT, the key
    and the shard when the bytes are not what was written."""
    fmt = format_of_path(row.shard)
    try:
        data = fmt.load(remote.join(out_dir, row.shard), row, shard)
    except Exception as e:  # fletcher32 / page checksum failures, truncated shards, a row pointing nowhere
        raise unreadable_error(out_dir, row, e) from e
    want = row.checksum
    if want is not None and array_checksum(data) != want:
        raise DamagedError(f"{row.key!r} in {out_dir}: the stored array in {row.shard} fails its checksum "
                           f"({array_checksum(data)}, the manifest says {want}): the file was damaged after it "
                           f"was written; {_DAMAGED_HINT}")
    return data


def unreadable_error(out_dir: str, row: StoredRow, e: Exception) -> DamagedError:
    """The :class:`DamagedError` of an item whose shard cannot be opened or read (a damaged
    Parquet footer, HDF5 superblock or tar header raises the library's own error, which names
    neither OUT nor the item)."""
    return DamagedError(f"{row.key!r} in {out_dir}: cannot read it from its shard {row.shard} "
                        f"({type(e).__name__}: {e}); {_DAMAGED_HINT}")


_DAMAGED_HINT = ("`mimi-extract verify --out OUT --checksums` lists every damaged item; resuming the run with "
                 "--reencode-damaged encodes them again")


def scan_checksums(out_dir: str, run_dir: str | None = None, on_item=None) -> dict:
    """Read every committed ok item of OUT (or of one run directory of it) and check it against its
    checksums, without re-encoding.  Returns ``{"checked": n, "unchecked": n (rows written before
    checksums existed: read, but only the format's own checks apply), "damaged": [{"key", "shard"
    (relative to OUT), "problem"}]}``.  Each shard is opened once and read in order.  Each shard
    also gets its format's ``check`` (what resume runs: a Shar tar's headers and ``.json`` members,
    its cuts file): a shard that fails it lists all its items, which resume would encode again.
    Last, each shard file's bytes against the crc32 its rows recorded when it was committed
    (``shard_checksum``): a shard none of whose items failed but whose file did (a byte flipped where
    no reader reads: an HDF5 file's free space) lists all its items too.  So every byte of a shard
    is checked, and a damaged item is still named alone.  ``"problems"``: the run directories'
    ``run.json`` files that are there but unreadable (not JSON, a newer layout, a field this tool
    does not write): every other command refuses such an OUT, so the audit cannot pass it (a missing
    one is no problem here: the items need no settings to be checked)."""
    out_dir = remote.absolute(out_dir)
    dirs = [RunFiles(remote.absolute(run_dir))] if run_dir else out_files(out_dir)
    report = {"checked": 0, "unchecked": 0, "damaged": [], "problems": []}
    for files in dirs:
        d = files.path
        try:
            read_run_info(d, files.read)
        except (MalformedError, LayoutError) as e:
            report["problems"].append(str(e))
        prefix = remote.relpath(d, out_dir)
        by_shard: dict[str, list[StoredRow]] = {}
        in_shard: dict[str, list[StoredRow]] = {}  # every row of a shard (a --shar-extend placeholder too)
        for row in committed_rows(d, files):
            if row.shard:
                in_shard.setdefault(row.shard, []).append(row)
            if row.ok and row.shard:
                row = row.under(prefix)
                by_shard.setdefault(row.shard, []).append(row)
        for shard, rows in sorted(by_shard.items()):
            name = rows[0].shard if prefix == "." else rows[0].shard[len(prefix) + 1:]
            problem = format_of(name).check(remote.join(d, name), in_shard[name])
            # (after the items: their own checks name the damaged ones; this finds the rest: a byte flipped in
            # bytes no reader reads, or in metadata that still parses)
            whole = file_problem(remote.join(d, name), in_shard[name])
            try:
                handle = open_shard(out_dir, shard)
            except Exception as e:  # noqa: BLE001 -- every item of it is unreadable
                report["checked"] += sum(1 for r in rows if r.checksum)
                report["unchecked"] += sum(1 for r in rows if not r.checksum)
                report["damaged"] += [{"key": r.key, "shard": shard,
                                       "problem": f"shard unreadable ({type(e).__name__}: {e})"} for r in rows]
                continue
            try:
                for row in rows:
                    report["checked" if row.checksum else "unchecked"] += 1
                    try:
                        load_row(out_dir, row, handle)
                    except DamagedError as e:
                        cause = e.__cause__
                        report["damaged"].append({"key": row.key, "shard": shard, "problem": (
                            f"unreadable ({type(cause).__name__}: {cause})" if cause else "checksum mismatch (crc32)")})
                    if on_item:
                        on_item(row.key)
            finally:
                close_shard(shard, handle)
            listed = {x["key"] for x in report["damaged"] if x["shard"] == shard}
            if problem is not None:
                report["damaged"] += [{"key": r.key, "shard": shard, "problem": f"its shard fails its check: {problem}"}
                                      for r in rows if r.key not in listed]
            elif whole is not None and not listed:
                report["damaged"] += [{"key": r.key, "shard": shard, "problem": whole} for r in rows]
    return report


def file_problem(path: str, rows: list[StoredRow]) -> str | None:
    """Why the shard file at ``path`` is not the file its rows were committed with (the crc32 of
    all its bytes: ``shard_checksum``), or None (also for rows written before that checksum).  Read
    in blocks of 4 MiB, by ranged GETs on object storage."""
    want = next((r.shard_checksum for r in rows if r.shard_checksum), None)
    if want is None:
        return None
    crc = 0
    try:
        with remote.open_object(path) as f:
            for block in iter(lambda: f.read(remote.READ_BLOCK), b""):
                crc = zlib.crc32(block, crc)
    except OSError as e:
        return f"shard unreadable ({type(e).__name__}: {e})"
    got = f"crc32:{crc & 0xFFFFFFFF:08x}"
    if got != want:
        return (f"the shard file's bytes fail their checksum ({got}, the manifest says {want}): damaged after "
                "it was written")
    return None


def open_shard(out_dir: str, shard: str):
    """A handle on a shard (relative to OUT) for :func:`load_row`; close it with :func:`close_shard`."""
    return format_of_path(shard).open(remote.join(out_dir, shard))


def close_shard(shard: str, handle) -> None:
    format_of_path(shard).close_handle(handle)


def item_attrs(out_dir: str, row: StoredRow) -> dict:
    """The per-item metadata stored with an ok row's array (``duration``...)."""
    return format_of_path(row.shard).item_attrs(remote.join(out_dir, row.shard), row)


def shar_fields(run_dirs: list[str]) -> dict[str, list[str]]:
    """``CutSet.from_shar(fields=...)`` of the committed shards of these run directories (every
    part of an OUT), in shard order: only pairs whose rows are committed, so a kill's leftovers
    (a cuts file whose tar was never renamed into place) are never read.  A ``--shar-extend`` OUT:
    the input's own fields (its cuts, recordings...) of the committed shard numbers, and ours."""
    fields: dict[str, list[str]] = {"cuts": []}
    for d in run_dirs:
        shards = sorted({r.shard for r in committed_rows(d) if r.shard}, key=lambda s: int(s.rsplit(".", 2)[1]))
        extend = (info := read_run(d)) is not None and info.shar_extend
        theirs: dict[str, dict[str, str]] = {}
        if extend:
            for name in remote.names(info.input):
                parts = name.split(".")
                if len(parts) > 2 and parts[1].isdigit():
                    theirs.setdefault(parts[1], {})[parts[0]] = remote.join(info.input, name)
        for shard in shards:
            field, number = remote.basename(shard).split(".")[:2]
            fields.setdefault(field, []).append(remote.join(d, shard))
            if extend:
                for name, path in theirs.get(number, {}).items():
                    fields.setdefault(name, []).append(path)
            else:
                fields["cuts"].append(remote.join(d, cuts_name(shard)))
    ours = {f for f in fields if f in FIELDS.values()}
    if len(ours) > 1:
        raise ValueError(f"Shar shards of several fields ({', '.join(sorted(ours))}) in one OUT")
    return fields
