"""The output directory: lock, identity, HDF5 shards + JSONL manifest, crash-safe commit, resume, read.

A *run directory* (OUT itself, or ``OUT/part-I-of-N`` for one part of a job array) holds:

* ``lock`` -- an exclusive ``flock`` held for the whole run (the OS drops it when the process
  dies, so kill -9 leaves no stale lock); its text names the holder (pid, host, start, command);
* ``run.json`` -- settings and provenance: model, content hash of its weights, input root, tap,
  framing...; a resume with anything else is refused;
* ``shard-N.h5`` + ``manifest.jsonl`` -- one dataset per ok item, one row per input.

Commit protocol for a shard.  The shard is built *in memory* (HDF5 core driver), so HDF5 never
writes to OUT and a full disk cannot leave it in a broken state (h5py segfaults there); then:
(1) its image is written to ``shard-N.h5.tmp`` with plain ``write`` calls and fsynced; (2) its
rows are appended to the manifest and fsynced; (3) the tmp file is renamed to ``shard-N.h5`` and
the directory fsynced.  A kill before (2) leaves only a ``.tmp``; a kill between (2) and (3) leaves
rows naming a missing shard: on resume both are dropped and re-encoded.  Resume also opens every
committed shard and checks that it holds exactly the datasets its rows name, with their frame
counts; a shard that does not (truncated, zeroed, edited) is moved to ``OUT/quarantine/`` and its
items are encoded again.  Every write error (ENOSPC, EIO, EDQUOT) becomes an :class:`OutputError`.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import json
import os
import re
import socket
import sys
import time
import uuid

import h5py
import numpy as np

MANIFEST = "manifest.jsonl"
RUN_INFO = "run.json"
LOCK = "lock"
QUARANTINE = "quarantine"
_SHARD_RE = re.compile(r"shard-(\d{5,})\.h5(\.tmp)?$")
_PART_RE = re.compile(r"part-(\d+)-of-(\d+)$")
# the only temporary names this tool writes in a run directory (a user's own *.tmp files are theirs)
_TMP_RE = re.compile(r"(shard-\d{5,}\.h5|manifest\.jsonl|run\.json|plan\.json|stats\.json|cuts\.jsonl\.gz)\.tmp$")


class OutputError(Exception):
    """Writing to OUT failed (disk full, I/O error, permissions) or OUT is unusable."""


class LockedError(OutputError):
    """Another process holds the run directory."""


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


def valid_shard_name(name) -> bool:
    """A shard name as the writer makes it: a plain file name in the run directory, never a path."""
    return isinstance(name, str) and bool(_SHARD_RE.fullmatch(name)) and not name.endswith(".tmp")


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
}


# keys run.json gained after OUT directories existed: an OUT written before them lacks them, and is
# resumed (it cannot say otherwise); once recorded they are compared like every other key
_ADDED_LATER = ("decoders",)


def _differences(old: dict, new: dict, ignore: tuple[str, ...]) -> str:
    diff = {k: (old.get(k), v) for k, v in new.items()
            if k not in ignore and old.get(k) != v and not (k in _ADDED_LATER and k not in old)}
    return "; ".join(f"{k}: {a!r} -> {b!r}" + (f" ({_EXPLAIN[k]})" if k in _EXPLAIN else "") for k, (a, b) in diff.items())


def check_run_info(run_dir: str, info: dict, siblings: list[str] = (), expected_attrs: dict | None = None) -> None:
    """Refuse to mix outputs of different settings, weights or inputs in one run directory, or in
    one job array: every part of an OUT (``siblings``: the other parts' run directories) must have
    been made from the same input with the same model and settings, or their union means nothing."""
    for other in siblings:
        theirs = read_run_info(other)
        changes = _differences(theirs, info, ("tool_version", "part")) if theirs is not None else ""
        if changes:
            raise OutputError(f"{other} (another part of this job array) was made with other settings ({changes}); "
                              "run every part with the same input, model and settings, or use a new OUT directory")
    old = read_run_info(run_dir)
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
    changes = _differences(old, info, ("tool_version",))
    if changes:
        raise OutputError(f"{run_dir} holds a run with other settings ({changes}); resume with the original "
                          "settings or use a new OUT directory")


def _unique_path(path: str) -> str:
    base, n = path, 1
    while os.path.exists(path):
        path, n = f"{base}.{n}", n + 1
    return path


def _check_shard(path: str, rows: list[dict]) -> str | None:
    """None if the shard holds exactly the datasets its rows name with their frame counts."""
    try:
        with h5py.File(path, "r") as f:
            names = set(f.keys())
            wanted = {r.get("dataset") or r["key"]: r for r in rows}
            if names != set(wanted):
                extra, missing = len(names - set(wanted)), len(set(wanted) - names)
                return f"{missing} datasets missing, {extra} without a manifest row"
            for name, row in wanted.items():
                if f[name].shape[0] != row.get("frames"):
                    return f"{name}: {f[name].shape[0]} frames, manifest says {row.get('frames')}"
    except Exception as e:  # truncated, zeroed or not HDF5 at all
        return f"unreadable ({type(e).__name__}: {e})"
    return None


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
    with h5py.File(path, "r") as f:
        return dict(f.attrs)


def recover(run_dir: str, expected_attrs: dict | None = None) -> tuple[dict[str, dict], list[str]]:
    """Make a run directory consistent after any interruption; return (committed ok rows by key,
    messages about what was repaired).  Error rows are dropped so those inputs are retried.
    ``expected_attrs``: the settings this run writes into its shards; a readable committed shard
    holding others is refused (:func:`check_shard_settings`), not quarantined: it is not damaged,
    it is another run's."""
    notes = []
    for name in os.listdir(run_dir):
        if _TMP_RE.fullmatch(name):
            os.remove(os.path.join(run_dir, name))
    by_shard: dict[str, list[dict]] = {}
    seen: set[str] = set()
    rows = read_rows(run_dir)
    for row in rows:
        if row.get("status") != "ok" or not row.get("shard"):
            continue
        if not os.path.exists(os.path.join(run_dir, row["shard"])):
            continue  # killed between manifest append and rename: re-encode
        by_shard.setdefault(row["shard"], []).append(row)
    done = {}
    bad_shards = {}
    for shard, shard_rows in by_shard.items():
        keys = [r["key"] for r in shard_rows]
        problem = _check_shard(os.path.join(run_dir, shard), shard_rows)
        if problem is None and (len(set(keys)) != len(keys) or seen & set(keys)):
            problem = "holds items that another shard also holds"
        if problem:
            bad_shards[shard] = problem
            continue
        if expected_attrs is not None:
            check_shard_settings(run_dir, shard, _shard_file_attrs(os.path.join(run_dir, shard)), expected_attrs)
        seen.update(keys)
        done.update({r["key"]: r for r in shard_rows})
    for name in sorted(os.listdir(run_dir)):  # committed shards that no row names
        if _SHARD_RE.match(name) and not name.endswith(".tmp") and name not in by_shard:
            bad_shards[name] = "no manifest row names it"
    for shard, problem in sorted(bad_shards.items()):
        qdir = os.path.join(run_dir, QUARANTINE)
        os.makedirs(qdir, exist_ok=True)
        dest = _unique_path(os.path.join(qdir, shard))
        os.replace(os.path.join(run_dir, shard), dest)
        n = len(by_shard.get(shard, []))
        notes.append(f"moved damaged shard {shard} to {os.path.relpath(dest, run_dir)} ({problem}); "
                     f"its {n} items will be encoded again")
    if bad_shards:
        _fsync_dir(run_dir)
    if os.path.exists(os.path.join(run_dir, MANIFEST)):
        _write_atomic(os.path.join(run_dir, MANIFEST), "".join(json.dumps(r) + "\n" for r in done.values()))
    return done, notes


def next_shard_index(run_dir: str) -> int:
    used = [int(m.group(1)) for f in os.listdir(run_dir) if (m := _SHARD_RE.match(f))]
    used += [int(m.group(1)) for r in read_rows(run_dir) if (m := _SHARD_RE.match(r.get("shard") or ""))]
    return max(used, default=-1) + 1


# -- writing -------------------------------------------------------------------------------
class ShardWriter:
    """Streams utterances into size-capped shards and the manifest (one row per input).

    Only the lock holder writes; pieces of a streamed item are held until its last piece arrives,
    so a shard only ever holds whole items, and an interrupted run commits exactly those."""

    def __init__(self, run_dir: str, file_attrs: dict, max_items: int = 1000, max_bytes: int = 256 << 20):
        self.run_dir = run_dir
        self.file_attrs = file_attrs
        self.max_items, self.max_bytes = max_items, max_bytes
        self.index = next_shard_index(run_dir)
        self._h5 = None
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
        return f"shard-{self.index:05d}.h5"

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
        if self._h5 is not None and self._bytes + data.nbytes > self.max_bytes and self._rows:
            self.commit()
        if self._h5 is None:
            self._h5 = h5py.File(f"mem-{uuid.uuid4().hex}.h5", "w", driver="core", backing_store=False)
            self._h5.attrs.update(self.file_attrs)
        name = row["dataset"]
        ds = self._h5.create_dataset(name, data=data)
        ds.attrs.update(attrs or {})
        ds.attrs["key"] = key
        self._rows.append({**row, "key": key, "shard": self.shard_name, "status": "ok", "error": None})
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
        if self._h5 is None:
            return
        self._h5.flush()
        image = self._h5.id.get_file_image()
        self._h5.close()
        self._h5 = None
        final = os.path.join(self.run_dir, self.shard_name)
        _write_file(final + ".tmp", image)
        try:
            self._append(self._rows)
        except OutputError:
            try:  # rows may be torn on disk: they name a shard that will never exist, and resume drops them
                os.remove(final + ".tmp")
            except OSError:
                pass
            raise
        try:
            os.replace(final + ".tmp", final)
            _fsync_dir(self.run_dir)
        except OSError as e:
            raise _write_error(e, final) from e
        self._rows, self._bytes = [], 0
        self.index += 1
        self.commits += 1

    def abort(self) -> None:
        """Discard what is not committed (an unrecoverable write error)."""
        if self._h5 is not None:
            self._h5.close()
            self._h5 = None
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
def _time_first(f: h5py.File, data: np.ndarray) -> np.ndarray:
    layout = f.attrs.get("layout", "")
    return data.T if layout == "[num_quantizers, frames]" else data  # outputs of mimi-extract 0.1


def read(out_dir: str, key: str) -> np.ndarray:
    """Load one utterance's output by key, time first: features ``[frames, dim]``, codes
    ``[frames, num_quantizers]`` (``.T`` gives transformers' ``[num_quantizers, frames]``).
    ``mimi_extract.read`` is the indexed version (``reader.py``); this one scans the manifests."""
    rows = [r for r in read_manifest(out_dir) if r.get("key") == key and r.get("status") == "ok"]
    if not rows:
        raise KeyError(f"{key!r} has no ok row in the manifest of {out_dir}")
    return load_row(out_dir, rows[-1])


def load_row(out_dir: str, row: dict, shard: h5py.File | None = None) -> np.ndarray:
    """The array of one ok manifest row (``shard`` relative to OUT, as ``read_manifest`` gives it),
    time first.  ``shard``: that shard already open (a reader keeps its shards open)."""
    if shard is None:
        with h5py.File(os.path.join(out_dir, row["shard"]), "r") as f:
            return load_row(out_dir, row, f)
    return _time_first(shard, shard[row.get("dataset") or row["key"]][()])


def shard_attrs(out_dir: str, shard: str) -> dict:
    with h5py.File(os.path.join(out_dir, shard), "r") as f:
        return dict(f.attrs)


__all__ = ["OutputError", "LockedError", "RunLock", "ShardWriter", "read", "read_manifest", "load_row", "recover", "run_dirs",
           "check_run_info", "read_run_info", "ensure_dir"]
