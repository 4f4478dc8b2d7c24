"""Resume: make a run directory consistent after any interruption.  Temporaries are removed, rows
naming a shard that never reached its name are dropped, and every committed shard is given to its
format's ``check``: one that does not hold exactly what its rows say is moved to ``quarantine/``
and its items are encoded again."""

from __future__ import annotations

import json
import os

from ..formats.base import Format
from ..formats.records import StoredRow
from ..formats.registry import format_of
from . import files as store_files
from .files import MANIFEST, QUARANTINE, OutputError, fsync_dir, write_atomic
from .identity import check_shard_settings
from .manifest import format_files, read_rows, remove_tmps, shard_attrs


def _unique_path(path: str) -> str:
    base, n = path, 1
    while os.path.exists(path):
        path, n = f"{base}.{n}", n + 1
    return path



def _quarantine(run_dir: str, name: str) -> str:
    qdir = os.path.join(run_dir, QUARANTINE)
    os.makedirs(qdir, exist_ok=True)
    dest = _unique_path(os.path.join(qdir, name.replace("/", "__")))
    store_files.rename(os.path.join(run_dir, name), dest)
    return dest


def recover(run_dir: str, expected_attrs: dict | None = None, damaged: dict[str, str] | None = None,
            fmt: Format | None = None) -> tuple[dict[str, StoredRow], list[str]]:
    """Make a run directory consistent after any interruption; return (committed ok rows by key,
    messages about what was repaired).  Error rows are dropped so those inputs are retried (but for
    the error rows committed inside a shard, as --shar-extend placeholders: they are returned with it).
    ``expected_attrs``: the settings this run writes into its shards; a readable committed shard
    holding others is refused (:func:`check_shard_settings`), not quarantined: it is not damaged,
    it is another run's.  ``damaged``: shards already known to be damaged (name -> why, e.g. from
    a checksum scan): quarantined with the others.  ``fmt``: the format this run writes; a
    committed shard of another format is refused (``run.json`` deleted, then another ``--format``)."""
    notes = []
    remove_tmps(run_dir)  # (a device worker's too: its provisional shard names are tmp names)
    by_shard: dict[str, list[StoredRow]] = {}
    seen: set[str] = set()
    rows = read_rows(run_dir)
    for row in rows:  # an error row with a shard is part of it (a --shar-extend placeholder): kept with it
        if row.status not in ("ok", "error") or not row.shard:
            continue
        if not os.path.exists(os.path.join(run_dir, row.shard)):
            continue  # killed between manifest append and rename: re-encode
        by_shard.setdefault(row.shard, []).append(row)
    if fmt is not None:
        other = sorted(s for s in by_shard if not fmt.is_shard(s))
        if other:
            raise OutputError(f"{run_dir} holds {format_of(other[0]).name} shards ({other[0]}, ...), not {fmt.name}: "
                              f"resume with --format {format_of(other[0]).name} or use a new OUT directory")
    done = {}
    bad_shards = dict(damaged or {})
    for shard, shard_rows in by_shard.items():
        if shard in bad_shards:
            continue
        keys = [r.key for r in shard_rows]
        problem = format_of(shard).check(os.path.join(run_dir, shard), shard_rows)
        if problem is None and (len(set(keys)) != len(keys) or seen & set(keys)):
            problem = "holds items that another shard also holds"
        if problem:
            bad_shards[shard] = problem
            continue
        if expected_attrs is not None:
            check_shard_settings(run_dir, shard, shard_attrs(run_dir, shard), expected_attrs)
        seen.update(keys)
        done.update({r.key: r for r in shard_rows})
    companions = {c for s in by_shard if s not in bad_shards for c in format_of(s).companions(s)}
    for name, fmt in sorted(format_files(run_dir)):  # committed shards that no row names; stray companions
        if fmt.is_shard(name) and name not in by_shard:
            bad_shards[name] = "no manifest row names it"
        elif not fmt.is_shard(name) and name not in companions and not any(
                name in fmt.companions(s) for s in bad_shards if s in by_shard):
            bad_shards[name] = "its shard was never committed"
    for shard, problem in sorted(bad_shards.items()):
        if not os.path.exists(os.path.join(run_dir, shard)):
            continue
        fmt = format_of(shard)
        dest = _quarantine(run_dir, shard)
        for companion in (fmt.companions(shard) if fmt else []):
            if os.path.exists(os.path.join(run_dir, companion)):
                _quarantine(run_dir, companion)
        n = len(by_shard.get(shard, []))
        notes.append(f"moved damaged shard {shard} to {os.path.relpath(dest, run_dir)} ({problem}); "
                     f"its {n} items will be encoded again" if fmt is not None else
                     f"moved {shard} to {os.path.relpath(dest, run_dir)} ({problem})")
    if bad_shards:
        fsync_dir(run_dir)
    if os.path.exists(os.path.join(run_dir, MANIFEST)):
        write_atomic(os.path.join(run_dir, MANIFEST), "".join(json.dumps(r.to_dict()) + "\n" for r in done.values()))
    return done, notes

