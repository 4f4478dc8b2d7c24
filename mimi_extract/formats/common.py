"""The output directory, format-agnostic: lock, identity, manifest, the commit protocol, resume.

A *run directory* (OUT itself, or ``OUT/part-I-of-N`` for one part of a job array) holds:

* ``lock`` -- an exclusive ``flock`` held for the whole run (the OS drops it when the process
  dies, so kill -9 leaves no stale lock); its text names the holder (pid, host, start, command);
* ``run.json`` -- settings and provenance: model, content hash of its weights, input root, tap,
  framing, output format...; a resume with anything else is refused;
* shards (their layout is the format's: ``formats/hdf5.py``, ``formats/parquet.py``...) and
  ``manifest.jsonl`` -- one row per input: ok rows name their shard, error rows say why.

Commit protocol for a shard (written once, here, for every format).  A format builds the shard
*in memory* (:class:`~mimi_extract.formats.base.ShardBuilder`), so its library never writes to OUT
and a full disk cannot leave it in a broken state (h5py segfaults there); then: (1) each of its
files is written to ``NAME.tmp`` with plain ``write`` calls and fsynced; (2) its rows are
appended to the manifest and fsynced; (3) the tmp files are renamed into place (the shard itself
last) and the directory fsynced.  A kill before (2) leaves only ``.tmp`` files; a kill between (2)
and (3) leaves rows naming a missing shard: on resume both are dropped and re-encoded.  Resume
also gives every committed shard to its format's ``check`` with its rows; a shard that does not
hold exactly what they say (truncated, zeroed, edited) is moved to ``OUT/quarantine/`` and its
items are encoded again.  Every write error (ENOSPC, EIO, EDQUOT) becomes an :class:`OutputError`.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import json
import os
import re
import shlex
import socket
import sys
import time

import numpy as np

from . import registry
from .base import Format, array_checksum

MANIFEST = "manifest.jsonl"
RUN_INFO = "run.json"
PLAN_INFO = "plan.json"  # what the last run planned (inputs, seconds): status and info read it
LOCK = "lock"
QUARANTINE = "quarantine"
_PART_RE = re.compile(r"part-(\d+)-of-(\d+)$")
# the run directory's own temporary names (a format's are its file names + ".tmp"; a user's own *.tmp files are theirs)
_TMP_RE = re.compile(r"(manifest\.jsonl|run\.json|plan\.json|stats\.json|cuts\.jsonl\.gz|README\.md)\.tmp$")


class OutputError(Exception):
    """Writing to OUT failed (disk full, I/O error, permissions) or OUT is unusable."""


class LockedError(OutputError):
    """Another process holds the run directory."""


class DamagedError(OutputError):
    """A stored array is not what was written: its bytes fail a checksum (the manifest row's crc32,
    HDF5's fletcher32, a Parquet page checksum) or its shard cannot be read."""


def _write_error(e: OSError, path: str) -> OutputError:
    reason = "no space left on device" if e.errno == errno.ENOSPC else (
        "disk quota exceeded" if e.errno == errno.EDQUOT else (e.strerror or str(e)).lower())
    return OutputError(f"{reason} while writing {path}")


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync, with a clean error (and no partial file) on failure."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view[: 1 << 26]):]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        try:
            os.remove(path)
        except OSError:
            pass
        raise _write_error(e, path) from e


def _write_atomic(path: str, text: str) -> None:
    _write_file(path + ".tmp", text.encode("utf-8"))
    try:
        os.replace(path + ".tmp", path)
        _fsync_dir(os.path.dirname(path) or ".")
    except OSError as e:
        raise _write_error(e, path) from e


def ensure_dir(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputError(f"OUT {path!r} exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot create OUT directory {path!r}: {e.strerror or e}") from e


# -- lock ----------------------------------------------------------------------------------
class RunLock:
    """Exclusive lock on a run directory for the life of the process (``flock``: released by the
    OS however the process ends).  A second run fails at once, naming the holder.

    ``wait``: seconds to keep trying while another process holds it only briefly (a part run
    deciding the layout of OUT); ``refuse`` (a function of the holder's text) says when not to wait."""

    def __init__(self, run_dir: str, wait: float = 0.0, what: str = "run", refuse=None):
        self.path = os.path.join(run_dir, LOCK)
        try:
            self.file = open(self.path, "a+", encoding="utf-8")
        except OSError as e:
            raise _lock_error(e, self.path, "create") from e
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                self.file.seek(0)
                holder = self.file.read().strip()
                try:
                    h = json.loads(holder)
                except ValueError:
                    h = None
                if time.monotonic() < deadline and not (refuse and isinstance(h, dict) and refuse(h)):
                    time.sleep(0.02)
                    continue
                self.file.close()
                try:
                    who = f"pid {h['pid']} on {h['host']}, started {h['started']} ({h['command']})"
                except (KeyError, TypeError):
                    who = "another process"
                raise LockedError(f"{run_dir} is in use by {who}; wait for it to finish or use another OUT") from None
            except OSError as e:
                self.file.close()
                raise OutputError(f"cannot lock {self.path}: {e.strerror or e} (does this file system support "
                                  "locks? use a local OUT or one --part per machine)") from e
        info = {"pid": os.getpid(), "host": socket.gethostname(), "what": what,
                "started": time.strftime("%Y-%m-%d %H:%M:%S %z"), "command": " ".join(sys.argv)}
        try:  # unbuffered: a failed write leaves nothing pending that close() would try (and fail) again
            fd = self.file.fileno()
            os.ftruncate(fd, 0)
            data = (json.dumps(info) + "\n").encode("utf-8")
            while data:
                data = data[os.write(fd, data):]
        except OSError as e:
            self.release()
            raise _write_error(e, self.path) from e

    def release(self) -> None:
        if not self.file.closed:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()


def _lock_error(e: OSError, path: str, doing: str) -> OutputError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return _write_error(e, path)
    return OutputError(f"cannot {doing} the lock file {path}: {e.strerror or e}")


def lock_run_dir(out_dir: str, part_dirname: str | None = None, part_count: int | None = None):
    """Decide OUT's layout and lock the run directory; returns (run_dir, lock).

    OUT holds either one whole run (its files in OUT itself) or the parts of one job array
    (``part-I-of-N`` folders), never both: their union would hold keys twice.  The decision is made
    under ``OUT/lock``, taken by both kinds of run before either writes anything:

    * a whole run takes ``OUT/lock`` exclusively and keeps it for its whole life, so it checks that
      no part folder exists, and nothing can create one until it ends;
    * a part run takes ``OUT/lock`` just long enough to check that no whole run holds or has used
      OUT (``run.json``) and that no part of another N exists, creates its part folder, lets
      ``OUT/lock`` go and takes its own folder's lock for its life.  Parts of one array starting
      together wait for each other (milliseconds each); a whole run holding OUT is refused at once.

    A whole run that was killed before writing ``run.json`` leaves nothing that claims the layout."""
    ensure_dir(out_dir)
    if part_dirname is None:
        lock = RunLock(out_dir, what="whole run")
        parts = [d for d in glob.glob(os.path.join(out_dir, "part-*-of-*")) if os.path.isdir(d)]
        if parts:
            lock.release()
            raise OutputError(f"{out_dir} holds parts of a job array ({os.path.basename(sorted(parts)[0])}, ...); "
                              "run with the same --part I/N, or use another OUT")
        return out_dir, lock
    layout = RunLock(out_dir, wait=30.0, what=f"layout check of {part_dirname}",
                     refuse=lambda h: h.get("what", "whole run") == "whole run")
    try:
        if os.path.exists(os.path.join(out_dir, RUN_INFO)):
            raise OutputError(f"{out_dir} holds a whole run (not split into parts); use another OUT for --part")
        parts = [d for d in glob.glob(os.path.join(out_dir, "part-*-of-*")) if os.path.isdir(d)]
        other = sorted({d.rsplit("-of-", 1)[1] for d in parts} - {str(part_count)})
        if other:
            raise OutputError(f"{out_dir} holds parts of N={other[0]}, not N={part_count}; use the same N or another OUT")
        run_dir = os.path.join(out_dir, part_dirname)
        ensure_dir(run_dir)
        lock = RunLock(run_dir, what=part_dirname)
    finally:
        layout.release()
    return run_dir, lock


# -- run directories and manifests ---------------------------------------------------------
def run_dirs(out_dir: str) -> list[str]:
    """The run directories of OUT: OUT itself, or its ``part-I-of-N`` folders."""
    parts = sorted(d for d in glob.glob(os.path.join(out_dir, "part-*-of-*")) if _PART_RE.search(d))
    if os.path.exists(os.path.join(out_dir, RUN_INFO)) or not parts:
        return [out_dir] + parts
    return parts


# -- shard names: every registered format's ----------------------------------------------
def format_of(name: str) -> Format | None:
    """The format whose committed shard name ``name`` is (relative to its run directory)."""
    for fmt in registry.formats():
        if fmt.is_shard(name):
            return fmt
    return None


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


def _is_tmp(name: str) -> bool:
    """One of the temporary names this tool writes in a run directory (or a format's folder)."""
    return bool(_TMP_RE.fullmatch(name)) or (
        name.endswith(".tmp") and any(f.is_file(name[:-4].replace("__", "/")) for f in registry.formats()))


def _format_files(run_dir: str):
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


def read_run_info(run_dir: str) -> dict | None:
    path = os.path.join(run_dir, RUN_INFO)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


_EXPLAIN = {
    "weights": "the model's weights differ (same config, other checkpoint)",
    "input": "another input (directory or list)",
    "input_identity": "the input's shards or files changed (added, removed, rewritten: size or mtime)",
    "decoders": "other decoder versions: a resume must decode each format as the first run did",
    "format": "another output format (--format)",
    "metadata": "other input metadata kept as output columns and cut fields (--keep-fields; an OUT written before "
                "metadata was kept resumes with --keep-fields none)",
    "keep_fields": "another --keep-fields / --keep-columns",
    "channel": "--channel: other items and keys",
    "input_kind": "INPUT read as another kind (--input-format): other items and keys",
    "part_shards": "every part of one OUT must divide the input the same way (an OUT begun before --part took whole "
                   "input shards, or by another tool version): run every part with one version, or use a new OUT",
}
# run.json: the input options that shape the items and their keys, {flag: value} (sources.item_identity)
ITEMS = "items"
_ITEMS_EXPLAIN = "an option that decides the items and their keys: the same audio would be stored again, or mixed"


# keys run.json gained after OUT directories existed: an OUT written before them lacks them, and is
# resumed (it cannot say otherwise); once recorded they are compared like every other key
_ADDED_LATER = ("decoders", "keep_fields", ITEMS)


def _shown(value) -> str:
    return "not given" if value is None else repr(value)


def _differences(old: dict, new: dict, ignore: tuple[str, ...]) -> str:
    diff = {k: (old.get(k), v) for k, v in new.items()
            if k not in ignore and old.get(k) != v and not (k in _ADDED_LATER and k not in old)}
    if "part_shards" in old and "part_shards" not in new and "part_shards" not in ignore:
        diff["part_shards"] = (old["part_shards"], None)
    out = []
    for k, (a, b) in diff.items():
        if k == ITEMS and isinstance(a, dict) and isinstance(b, dict):  # one entry per option, named by its flag
            out += [f"{flag}: {_shown(a.get(flag))} -> {_shown(b.get(flag))}, {_ITEMS_EXPLAIN}"
                    for flag in sorted(set(a) | set(b)) if a.get(flag) != b.get(flag)]
        else:
            out.append(_shard_changes(k, a, b) or f"{k}: {a!r} -> {b!r}" + (f" ({_EXPLAIN[k]})" if k in _EXPLAIN else ""))
    return "; ".join(out)


def _shard_changes(key: str, old, new) -> str | None:
    """A change of the input's shards, naming only the shards that changed (not every shard's size
    and mtime): ``input_identity``'s ``shards``/``files`` ([path, size, mtime]) and ``part_shards``."""
    def listed(names: list[str], what: str) -> str:
        return f"{what} {', '.join(names[:5])}" + (f" and {len(names) - 5} more" if len(names) > 5 else "")

    if key == "part_shards":
        if old is None or new is None:
            return ("part_shards: the parts of this OUT divide " + ("their items by key" if old is None else "whole input shards")
                    + ", this one " + ("whole input shards" if old is None else "its items by key") + ": " + _EXPLAIN[key])
        changes = [listed(n, w) for n, w in (([s for s in new if s not in old], "added"),
                                             ([s for s in old if s not in new], "removed")) if n]
        return (f"part_shards: the input's shards differ ({'; '.join(changes) or 'reordered'}): the parts of one OUT "
                "must divide the same shards; run every part over the same input, or use a new OUT")
    if key != "input_identity" or not isinstance(old, dict) or not isinstance(new, dict):
        return None
    field = next((f for f in ("shards", "files") if f in old or f in new), None)
    if field is None or {k: v for k, v in old.items() if k != field} != {k: v for k, v in new.items() if k != field}:
        return None  # (another --key / --sidecar-duration: the plain rendering says which)
    before = {p: (size, mtime) for p, size, mtime in old.get(field, [])}
    after = {p: (size, mtime) for p, size, mtime in new.get(field, [])}
    changes = [listed(n, w) for n, w in (
        ([f"{p} ({before[p][0]} -> {after[p][0]} bytes)" if before[p][0] != after[p][0] else f"{p} (modified)"
          for p in after if p in before and before[p] != after[p]], "rewritten:"),
        ([p for p in after if p not in before], "added:"), ([p for p in before if p not in after], "removed:")) if n]
    only_rewritten = list(before) == list(after)
    return (f"input_identity: input shards changed since this run began ({'; '.join(changes) or 'reordered'}); "
            "their stored outputs would describe other audio"
            + ("; to encode their items again from the new shards, resume with --reencode-changed" if only_rewritten else ""))


def _original_items(old: dict, new: dict) -> str | None:
    """The item options that made ``old``, as flags to type again, when ``new`` changes them; else None."""
    if ITEMS not in old or ITEMS not in new or old[ITEMS] == new[ITEMS]:
        return None
    given = " ".join(f"{flag} {shlex.quote(str(value))}" for flag, value in sorted(old[ITEMS].items()))
    return given or "no " + ", no ".join(sorted(new[ITEMS]))


def check_run_info(run_dir: str, info: dict, siblings: list[str] = (), expected_attrs: dict | None = None,
                   write: bool = True) -> None:
    """Refuse to mix outputs of different settings, weights or inputs in one run directory, or in
    one job array: every part of an OUT (``siblings``: the other parts' run directories) must have
    been made from the same input with the same model and settings, or their union means nothing.
    A ``run.json`` without ``format`` was written before formats existed: it is an HDF5 run.
    ``write=False``: compare only (the keys ``info`` has), write nothing -- the check a run makes
    before it locks OUT or loads the model, so a refused resume touches nothing and costs nothing."""
    for other in siblings:
        theirs = _with_format(read_run_info(other))
        # parts of whole shards: each has its own shards' identity (the shard list is compared instead)
        mine = ("input_identity",) if "part_shards" in info or "part_shards" in (theirs or {}) else ()
        changes = _differences(theirs, info, ("tool_version", "part") + mine) if theirs is not None else ""
        if changes:
            items = _original_items(theirs, info)
            raise OutputError(f"{other} (another part of this job array) was made with other settings ({changes}); "
                              + (f"run every part with {items}" if items else
                                 "run every part with the same input, model and settings") + ", or use a new OUT directory")
    old = _with_format(read_run_info(run_dir))
    if old is None and not write:
        return
    if old is None:  # run.json deleted (or never written): the shards still say what made them
        if expected_attrs is not None:
            for shard in sorted({r["shard"] for r in committed_rows(run_dir) if r.get("shard")}):
                try:
                    attrs = _shard_file_attrs(os.path.join(run_dir, shard))
                except Exception:  # noqa: BLE001 -- damaged: recover() quarantines it
                    continue
                check_shard_settings(run_dir, shard, attrs, expected_attrs)
        _write_atomic(os.path.join(run_dir, RUN_INFO), json.dumps(info, indent=2, sort_keys=True))
        return
    other_division = ("input_identity",) if ("part_shards" in old) != ("part_shards" in info) else ()  # (said once)
    changes = _differences(old, info, ("tool_version",) + other_division)
    if changes:
        items = _original_items(old, info)
        raise OutputError(f"{run_dir} holds a run with other settings ({changes}); resume with the original "
                          + (f"settings ({items})" if items else "settings") + " or use a new OUT directory")
    if write and ITEMS in info and ITEMS not in old:  # written before items were recorded: pinned from now on
        _write_atomic(os.path.join(run_dir, RUN_INFO),
                      json.dumps({**read_run_info(run_dir), ITEMS: info[ITEMS]}, indent=2, sort_keys=True))


def _with_format(info: dict | None) -> dict | None:
    return info if info is None or "format" in info else {**info, "format": "hdf5"}


def _unique_path(path: str) -> str:
    base, n = path, 1
    while os.path.exists(path):
        path, n = f"{base}.{n}", n + 1
    return path


def check_shard_settings(run_dir: str, shard: str, attrs: dict, expected: dict) -> None:
    """Refuse a committed shard made with other settings than this run's (its file attributes are
    the settings it was made with; run.json can be deleted, and attributes edited in place)."""
    changes = [f"{k}: {_plain(attrs.get(k))!r} -> {v!r}" + (f" ({_EXPLAIN[k]})" if k in _EXPLAIN else "")
               for k, v in expected.items() if k != "tool_version" and _plain(attrs.get(k)) != _plain(v)]
    if changes:
        raise OutputError(f"{os.path.join(run_dir, shard)} was made with other settings than this run "
                          f"({'; '.join(changes)}); resume with the original settings or use a new OUT directory")


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def _shard_file_attrs(path: str) -> dict:
    return format_of_path(path.replace(os.sep, "/")).attrs(path)


def _quarantine(run_dir: str, name: str) -> str:
    qdir = os.path.join(run_dir, QUARANTINE)
    os.makedirs(qdir, exist_ok=True)
    dest = _unique_path(os.path.join(qdir, name.replace("/", "__")))
    os.replace(os.path.join(run_dir, name), dest)
    return dest


def recover(run_dir: str, expected_attrs: dict | None = None, damaged: dict[str, str] | None = None,
            fmt: Format | None = None) -> tuple[dict[str, dict], list[str]]:
    """Make a run directory consistent after any interruption; return (committed ok rows by key,
    messages about what was repaired).  Error rows are dropped so those inputs are retried (but for
    the error rows committed inside a shard, as --shar-extend placeholders: they are returned with it).
    ``expected_attrs``: the settings this run writes into its shards; a readable committed shard
    holding others is refused (:func:`check_shard_settings`), not quarantined: it is not damaged,
    it is another run's.  ``damaged``: shards already known to be damaged (name -> why, e.g. from
    a checksum scan): quarantined with the others.  ``fmt``: the format this run writes; a
    committed shard of another format is refused (``run.json`` deleted, then another ``--format``)."""
    notes = []
    for name in os.listdir(run_dir):
        if _is_tmp(name):
            os.remove(os.path.join(run_dir, name))
    for name, _ in list(_format_files(run_dir)):
        if name.endswith(".tmp") and os.path.exists(os.path.join(run_dir, name)):
            os.remove(os.path.join(run_dir, name))
    by_shard: dict[str, list[dict]] = {}
    seen: set[str] = set()
    rows = read_rows(run_dir)
    for row in rows:  # an error row with a shard is part of it (a --shar-extend placeholder): kept with it
        if row.get("status") not in ("ok", "error") or not row.get("shard"):
            continue
        if not os.path.exists(os.path.join(run_dir, row["shard"])):
            continue  # killed between manifest append and rename: re-encode
        by_shard.setdefault(row["shard"], []).append(row)
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
        keys = [r["key"] for r in shard_rows]
        problem = format_of(shard).check(os.path.join(run_dir, shard), shard_rows)
        if problem is None and (len(set(keys)) != len(keys) or seen & set(keys)):
            problem = "holds items that another shard also holds"
        if problem:
            bad_shards[shard] = problem
            continue
        if expected_attrs is not None:
            check_shard_settings(run_dir, shard, _shard_file_attrs(os.path.join(run_dir, shard)), expected_attrs)
        seen.update(keys)
        done.update({r["key"]: r for r in shard_rows})
    companions = {c for s in by_shard if s not in bad_shards for c in format_of(s).companions(s)}
    for name, fmt in sorted(_format_files(run_dir)):  # committed shards that no row names; stray companions
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
        _fsync_dir(run_dir)
    if os.path.exists(os.path.join(run_dir, MANIFEST)):
        _write_atomic(os.path.join(run_dir, MANIFEST), "".join(json.dumps(r) + "\n" for r in done.values()))
    return done, notes


def next_shard_index(run_dir: str) -> int:
    """One more than the highest shard number any file or row of the run directory uses."""
    used = [int(m.group(1)) for name, fmt in _format_files(run_dir)
            if (m := fmt.shard_re.fullmatch(name.removesuffix(".tmp")))]
    for r in read_rows(run_dir):
        fmt = format_of(r.get("shard") or "")
        if fmt is not None:
            used.append(int(fmt.shard_re.fullmatch(r["shard"]).group(1)))
    return max(used, default=-1) + 1


# -- writing -------------------------------------------------------------------------------
def tmp_path(run_dir: str, name: str) -> str:
    """Where the commit protocol writes ``name`` (relative to the run directory) before renaming
    it into place: always the run directory itself, never a format's folder (``shar/x`` ->
    ``shar__x.tmp``): lhotse's ``from_shar(in_dir=...)`` takes every file of the Shar folder as a
    field, a half-written one included.  A rename between two folders of one file system is
    atomic all the same."""
    return os.path.join(run_dir, name.replace("/", "__") + ".tmp")


def commit_files(run_dir: str, files: dict[str, bytes], append_rows) -> None:
    """The commit protocol, for any format: ``files`` (relative names -> bytes; the shard last)
    each to its :func:`tmp_path` + fsync; ``append_rows()`` (the manifest rows, fsynced); rename
    each into place, in order; fsync the directories.  Raises :class:`OutputError`; a failure
    before the renames removes the ``.tmp`` files (rows torn on disk name a shard that never
    exists, and resume drops them)."""
    written = []
    try:
        for name, data in files.items():
            path = os.path.join(run_dir, name)
            folder = os.path.dirname(path)
            if not os.path.isdir(folder):
                try:
                    os.makedirs(folder, exist_ok=True)
                    _fsync_dir(run_dir)
                except OSError as e:
                    raise _write_error(e, folder) from e
            _write_file(tmp_path(run_dir, name), data)
            written.append((tmp_path(run_dir, name), path))
        append_rows()
    except OutputError:
        for tmp, _ in written:
            try:
                os.remove(tmp)
            except OSError:
                pass
        raise
    folders = [run_dir]
    for tmp, path in written:
        try:
            os.replace(tmp, path)
        except OSError as e:
            raise _write_error(e, path) from e
        if os.path.dirname(path) not in folders:
            folders.append(os.path.dirname(path))
    try:
        for folder in folders:
            _fsync_dir(folder)
    except OSError as e:
        raise _write_error(e, folders[0]) from e


class ShardWriter:
    """Streams utterances into size-capped shards of one format and the manifest (one row per input).

    Only the lock holder writes; pieces of a streamed item are held until its last piece arrives,
    so a shard only ever holds whole items, and an interrupted run commits exactly those.  The
    format only builds each shard in memory (``fmt.builder``); this class owns the manifest and
    the commit protocol (:func:`commit_files`)."""

    def __init__(self, run_dir: str, fmt: Format, file_attrs: dict, max_items: int = 1000,
                 max_bytes: int = 256 << 20, on_commit=None):
        self.run_dir = run_dir
        self.on_commit = on_commit  # called after each commit (an OUT on object storage uploads it: mirror.py)
        self.format = fmt.for_run(file_attrs)  # a format whose shard names depend on the run (Shar's field)
        self.file_attrs = file_attrs
        self.max_items, self.max_bytes = max_items, max_bytes
        self.index = next_shard_index(run_dir)
        self._shard = None  # the format's ShardBuilder of the open shard
        self._rows: list[dict] = []
        self._bytes = 0
        self._streams: dict[str, list[np.ndarray]] = {}
        self.written: set[str] = set()  # keys written by this run (a retried unit cannot add a second copy)
        path = os.path.join(run_dir, MANIFEST)
        try:  # unbuffered appends: a failed write leaves at most a torn last line, nothing pending
            self._manifest = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise _write_error(e, path) from e
        self.commits = 0

    @property
    def shard_name(self) -> str:
        return self.format.shard_name(self.index)

    def add_piece(self, key: str, data: np.ndarray, first: bool, final: bool, row: dict, attrs: dict) -> None:
        """One piece (time-first frames) of an item's output; the item is stored with its last piece."""
        if key in self.written:
            return
        if first:
            self._streams[key] = []
        elif key not in self._streams:  # the rest of a stream whose start was dropped: cannot be whole
            return
        self._streams[key].append(data)
        if final:
            pieces = self._streams.pop(key)
            whole = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
            shape = {"frames": int(whole.shape[0]), **({"dims": int(whole.shape[1])} if whole.ndim > 1 else {})}
            self.add(key, whole, {**row, **shape}, attrs)

    def drop_stream(self, key: str) -> None:
        self._streams.pop(key, None)

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def add(self, key: str, data: np.ndarray, row: dict, attrs: dict | None = None) -> None:
        """Store one utterance; its manifest row is committed together with the shard."""
        if key in self.written:
            return
        if self._shard is not None and self._bytes + data.nbytes > self.max_bytes and self._rows:
            self.commit()
        if self._shard is None:
            self._shard = self.format.builder(self.file_attrs)
        row = {**row, "key": key}
        extra = self._shard.add(key, data, row, attrs or {})
        self._rows.append({**row, **extra, "shard": self.shard_name, "status": "ok", "error": None,
                           "checksum": array_checksum(data)})
        self.written.add(key)
        self._bytes += data.nbytes
        if len(self._rows) >= self.max_items or self._bytes >= self.max_bytes:
            self.commit()

    def add_error(self, row: dict, message: str) -> None:
        if row["key"] in self.written:
            return
        self._append([{**row, "shard": None, "status": "error", "error": message}])

    def _append(self, rows: list[dict]) -> None:
        try:
            view = memoryview("".join(json.dumps(r) + "\n" for r in rows).encode("utf-8"))
            while view:
                view = view[os.write(self._manifest, view):]
            os.fsync(self._manifest)
        except OSError as e:
            raise _write_error(e, os.path.join(self.run_dir, MANIFEST)) from e

    def commit(self) -> None:
        """Write the open shard and make it (and its rows) durable."""
        if self._shard is None:
            return
        shard, self._shard = self._shard, None
        try:
            files = shard.files(self.shard_name)
        finally:
            shard.close()
        rows = self._rows
        commit_files(self.run_dir, files, lambda: self._append(rows))
        self._rows, self._bytes = [], 0
        self.index += 1
        self.commits += 1
        if self.on_commit is not None:
            self.on_commit()

    def abort(self) -> None:
        """Discard what is not committed (an unrecoverable write error)."""
        if self._shard is not None:
            self._shard.close()
            self._shard = None
        for key in (r["key"] for r in self._rows):
            self.written.discard(key)
        self._rows = []
        self._streams.clear()

    def close(self) -> None:
        self._streams.clear()  # unfinished streams are encoded again on resume
        try:
            self.commit()
        finally:
            if self._manifest is not None:
                os.close(self._manifest)
                self._manifest = None


# -- reading -------------------------------------------------------------------------------
def read(out_dir: str, key: str) -> np.ndarray:
    """Load one utterance's output by key, time first: features ``[frames, dim]``, codes
    ``[frames, num_quantizers]`` (``.T`` gives transformers' ``[num_quantizers, frames]``).
    ``mimi_extract.read`` is the indexed version (``reader.py``); this one scans the manifests."""
    rows = [r for r in read_manifest(out_dir) if r.get("key") == key and r.get("status") == "ok"]
    if not rows:
        raise KeyError(f"{key!r} has no ok row in the manifest of {out_dir}")
    return load_row(out_dir, rows[-1])


def load_row(out_dir: str, row: dict, shard=None) -> np.ndarray:
    """The array of one ok manifest row (``shard`` relative to OUT, as ``read_manifest`` gives it),
    time first, checked against the row's checksum.  ``shard``: a handle of that shard from its
    format's ``open`` (readers keep a few open).  Raises :class:`DamagedError` naming OUT, the key
    and the shard when the bytes are not what was written."""
    fmt = format_of_path(row["shard"])
    try:
        data = fmt.load(os.path.join(out_dir, row["shard"]), row, shard)
    except Exception as e:  # fletcher32 / page checksum failures, truncated shards, a row pointing nowhere
        raise unreadable_error(out_dir, row, e) from e
    want = row.get("checksum")
    if want is not None and array_checksum(data) != want:
        raise DamagedError(f"{row['key']!r} in {out_dir}: the stored array in {row['shard']} fails its checksum "
                           f"({array_checksum(data)}, the manifest says {want}): the file was damaged after it "
                           f"was written; {_DAMAGED_HINT}")
    return data


def unreadable_error(out_dir: str, row: dict, e: Exception) -> DamagedError:
    """The :class:`DamagedError` of an item whose shard cannot be opened or read (a damaged
    Parquet footer, HDF5 superblock or tar header raises the library's own error, which names
    neither OUT nor the item)."""
    return DamagedError(f"{row['key']!r} in {out_dir}: cannot read it from its shard {row['shard']} "
                        f"({type(e).__name__}: {e}); {_DAMAGED_HINT}")


_DAMAGED_HINT = ("`mimi-extract verify --out OUT --checksums` lists every damaged item; resuming the run with "
                 "--reencode-damaged encodes them again")


def scan_checksums(out_dir: str, run_dir: str | None = None, on_item=None) -> dict:
    """Read every committed ok item of OUT (or of one run directory of it) and check it against its
    checksums, without re-encoding.  Returns ``{"checked": n, "unchecked": n (rows written before
    checksums existed: read, but only the format's own checks apply), "damaged": [{"key", "shard"
    (relative to OUT), "problem"}]}``.  Each shard is opened once and read in order.  Each shard
    also gets its format's ``check`` (what resume runs: a Shar tar's headers and ``.json`` members,
    its cuts file): a shard that fails it lists all its items, which resume would encode again."""
    out_dir = os.path.abspath(out_dir)
    dirs = [os.path.abspath(run_dir)] if run_dir else run_dirs(out_dir)
    report = {"checked": 0, "unchecked": 0, "damaged": []}
    for d in dirs:
        prefix = os.path.relpath(d, out_dir)
        by_shard: dict[str, list[dict]] = {}
        in_shard: dict[str, list[dict]] = {}  # every row of a shard (a --shar-extend placeholder too)
        for row in committed_rows(d):
            if row.get("shard"):
                in_shard.setdefault(row["shard"], []).append(dict(row))
            if row.get("status") == "ok" and row.get("shard"):
                row["shard"] = row["shard"] if prefix == "." else f"{prefix}/{row['shard']}"
                by_shard.setdefault(row["shard"], []).append(row)
        for shard, rows in sorted(by_shard.items()):
            name = rows[0]["shard"] if prefix == "." else rows[0]["shard"][len(prefix) + 1:]
            problem = format_of(name).check(os.path.join(d, name), in_shard[name])
            try:
                handle = open_shard(out_dir, shard)
            except Exception as e:  # noqa: BLE001 -- every item of it is unreadable
                report["checked"] += sum(1 for r in rows if r.get("checksum"))
                report["unchecked"] += sum(1 for r in rows if not r.get("checksum"))
                report["damaged"] += [{"key": r["key"], "shard": shard,
                                       "problem": f"shard unreadable ({type(e).__name__}: {e})"} for r in rows]
                continue
            try:
                for row in rows:
                    report["checked" if row.get("checksum") else "unchecked"] += 1
                    try:
                        load_row(out_dir, row, handle)
                    except DamagedError as e:
                        cause = e.__cause__
                        report["damaged"].append({"key": row["key"], "shard": shard, "problem": (
                            f"unreadable ({type(cause).__name__}: {cause})" if cause else "checksum mismatch (crc32)")})
                    if on_item:
                        on_item(row["key"])
            finally:
                close_shard(shard, handle)
            if problem is not None:
                listed = {x["key"] for x in report["damaged"] if x["shard"] == shard}
                report["damaged"] += [{"key": r["key"], "shard": shard, "problem": f"its shard fails its check: {problem}"}
                                      for r in rows if r["key"] not in listed]
    return report


def open_shard(out_dir: str, shard: str):
    """A handle on a shard (relative to OUT) for :func:`load_row`; close it with :func:`close_shard`."""
    return format_of_path(shard).open(os.path.join(out_dir, shard))


def close_shard(shard: str, handle) -> None:
    format_of_path(shard).close_handle(handle)


def shard_attrs(out_dir: str, shard: str) -> dict:
    """The settings stored in a shard (relative to OUT)."""
    return format_of_path(shard).attrs(os.path.join(out_dir, shard))


def item_attrs(out_dir: str, row: dict) -> dict:
    """The per-item metadata stored with an ok row's array (``duration``...)."""
    return format_of_path(row["shard"]).item_attrs(os.path.join(out_dir, row["shard"]), row)
