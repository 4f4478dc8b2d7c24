"""The run directory's names, errors and durable writes: every byte this tool puts in OUT goes
through :func:`write_file` (write + fsync, no partial file on failure) or :func:`write_atomic`
(a ``.tmp`` renamed into place), and every write error (ENOSPC, EIO, EDQUOT) becomes an
:class:`OutputError` naming the file."""

from __future__ import annotations

import errno
import json
import os
import re

from ..common import remote

MANIFEST = "manifest.jsonl"
RUN_INFO = "run.json"
PLAN_INFO = "plan.json"  # what the last run planned (inputs, seconds): status and info read it
STATS = "stats.json"  # the last run's timing
CUTS = "cuts.jsonl.gz"  # lhotse cuts pointing into the shards (not for Shar: its cuts are its own files)
LOCK = "lock"
QUARANTINE = "quarantine"
PART_RE = re.compile(r"part-(\d+)-of-(\d+)$")
# a run directory on object storage has no manifest.jsonl: its manifest is the concatenation, in name
# order, of the segments of its highest generation (``manifest.d/g<generation>-<n>.jsonl``; mirror.py)
SEGMENTS = "manifest.d"
SEGMENT_RE = re.compile(r"g(\d+)-(\d+)\.jsonl")
# the run directory's own temporary names (a format's are its file names + ".tmp"; a user's own *.tmp files are theirs)
# (README.md: Parquet's dataset card; megatron-data-args.txt: the Megatron format's blend: Format.out_files;
# seen.<hex>: a ShardSpec's probe, which tells a Ray actor whether it sees this directory)
TMP_RE = re.compile(r"(manifest\.jsonl|run\.json|plan\.json|stats\.json|cuts\.jsonl\.gz|README\.md|megatron-data-args\.txt"
                    r"|seen\.[0-9a-f]{32})"
                    r"\.tmp$")


class OutputError(Exception):
    """Writing to OUT failed (disk full, I/O error, permissions) or OUT is unusable."""


class LockedError(OutputError):
    """Another process holds the run directory."""


class LayoutError(OutputError, ValueError):
    """OUT is in a layout this version does not read (a newer ``run.json`` schema): a ValueError too,
    so that every command that reads OUT reports it as the clean error it is."""


class MalformedError(OutputError, ValueError):
    """A file of OUT that this tool wrote is not what it writes (a manifest row of the wrong types,
    a line that is not an object, run.json that is not JSON, a folder where a file belongs): the
    message names the file (and line).  A ValueError too, so every command reports it as one line."""


class DamagedError(OutputError):
    """A stored array is not what was written: its bytes fail a checksum (the manifest row's crc32,
    HDF5's fletcher32, a Parquet page checksum) or its shard cannot be read."""


def write_error(e: OSError, path: str) -> OutputError:
    reason = "no space left on device" if e.errno == errno.ENOSPC else (
        "disk quota exceeded" if e.errno == errno.EDQUOT else (e.strerror or str(e)).lower())
    return OutputError(f"{reason} while writing {path}")


def sync(fd: int) -> None:
    """``os.fsync``: the one place the store makes a file or a folder durable, as :func:`rename`
    is the one place it renames and :func:`write_all` the one place it writes bytes. Callers in the
    store call them through this module (``files.sync``), so a test can wrap the commit protocol's
    steps here (tests/store/test_robustness.py) without patching ``os`` for the whole process."""
    os.fsync(fd)


def rename(src: str, dst: str) -> None:
    """``os.replace``: the one place the store renames a file into place (atomic on POSIX)."""
    os.replace(src, dst)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        sync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data`` to the open file ``fd``: ``os.write`` (at most 64 MiB a call) until
    none is left.  The one place the store writes bytes (shards, manifest rows, run.json, the lock's
    holder), so a full disk (ENOSPC) or a failing device (EIO) meets every writer here: raises
    OSError, which each caller turns into an :class:`OutputError` naming its file."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[: 1 << 26]):]


def write_file(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync, with a clean error (and no partial file) on failure."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, data)
            sync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        try:
            os.remove(path)
        except OSError:
            pass
        raise write_error(e, path) from e


def write_atomic(path: str, text: str) -> None:
    write_file(path + ".tmp", text.encode("utf-8"))
    try:
        rename(path + ".tmp", path)
        fsync_dir(os.path.dirname(path) or ".")
    except OSError as e:
        raise write_error(e, path) from e


def ensure_dir(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputError(f"OUT {path!r} exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot create OUT directory {path!r}: {e.strerror or e}") from e



def read_json(path: str, read=None) -> dict | None:
    """A JSON object this tool wrote (``run.json``, ``plan.json``, ``stats.json``), local or on
    object storage; None when there is no such file.  Anything else there (not JSON, not an object,
    a folder) is a :class:`MalformedError` naming the file.  ``read(path)``: its bytes, when a
    caller has them already (``manifest.RunFiles.read``)."""
    try:
        data = (read or remote.read_bytes)(path)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise MalformedError(f"{path} is a folder, not the file this tool writes there: move it away") from None
    try:
        value = json.loads(data)
    except ValueError as e:
        raise MalformedError(f"{path} is not JSON ({e}): it was edited or damaged; restore it, or remove it "
                             "and resume the run that made OUT (which writes it again)") from None
    if not isinstance(value, dict):
        raise MalformedError(f"{path} holds JSON {type(value).__name__}, not an object: it was edited or damaged")
    return value
