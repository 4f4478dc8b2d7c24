"""OUT on object storage (``s3://bucket/out``...): the run directory is staged on local disk and
mirrored to the bucket shard by shard, with the local guarantees kept on both sides.

An object store has no rename and no ``flock``, but a PUT of a whole object is atomic (a reader
sees the old object, the new one, or none; never a part) and S3 has conditional PUTs.  So:

* The run runs, unchanged, in a local *staging* run directory (``MIMI_EXTRACT_STAGING``, else
  ``~/.cache/mimi-extract/staging/<hash of the URL>/<OUT's name>``): the local commit protocol, recovery
  and checks apply there as on any OUT.
* The remote copy is the truth, the staging a cache of it: a run first makes the staging equal to
  the remote (:meth:`Mirror.pull`: what it lacks is downloaded, what the remote does not hold is
  removed, the manifest is rebuilt from the remote's segments), so a resume on another machine
  resumes the same OUT.
* After each local commit (:meth:`Mirror.push`), every staged file the remote lacks is PUT under
  its final name (the shard's files), then one *manifest segment* object
  (``manifest.d/g<generation>-<n>.jsonl``: the manifest lines appended since the last one).  The
  segment is the commit point: a shard that no segment names is an orphan, ignored by readers and
  replaced or removed by the next run.  The manifest is the concatenation, in order, of the
  segments of the highest generation; a run whose recovery rewrote the manifest (dropped error
  rows, quarantined shards) starts a new generation with one segment holding all of it, then
  deletes the older generations and the orphans (after its commit point: a kill leaves only garbage).
* The lock is an object (``lock``) created only if absent (``If-None-Match: *``, atomic on S3),
  holding its holder and an expiry that a heartbeat renews; a lock whose expiry has passed (its
  holder was killed), or whose holder ran on this machine and is certainly gone (its PID runs no
  more: a Slurm requeue or a resume right after a kill -9, ``lock.holder_gone``), is taken over
  with a PUT conditional on its ETag, so two runs cannot both take it.  On stores without conditional writes the lock is only advisory (docs/object-storage.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

from ..common import remote
from ..formats import get_format
from . import files as store_files
from .files import CUTS, LOCK, MANIFEST, SEGMENT_RE, SEGMENTS, LockedError, OutputError
from .cuts import write_cuts
from ..formats.records import RunInfo
from .identity import read_run_info
from .lock import holder_gone, process_identity
from .manifest import manifest_segments, out_rows, run_dirs

STAGING_ENV = "MIMI_EXTRACT_STAGING"
LEASE_ENV = "MIMI_EXTRACT_LOCK_LEASE"  # seconds a lock object stays valid without its heartbeat
_SKIPPED = (LOCK, MANIFEST)  # staged files never mirrored: the local lock; the manifest, sent as segments


def staging_dir(url: str) -> str:
    """The local OUT that stages ``url`` (one per URL, kept between runs as a cache), named as OUT is
    (the title of a card made there); one made by 0.3.0 and before (``<hash>/out``) is adopted, so
    an upgrade downloads nothing again."""
    base = os.environ.get(STAGING_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mimi-extract", "staging")
    folder = os.path.join(base, hashlib.sha256(remote.absolute(url).encode()).hexdigest()[:16])
    name = re.sub(r"[^\w.-]", "_", remote.basename(url.rstrip("/")))
    path = os.path.join(folder, name if name.strip(".") else "out")
    old = os.path.join(folder, "out")
    if path != old and os.path.isdir(old) and not os.path.exists(path):
        try:
            store_files.rename(old, path)
        except OSError:  # (another process adopted it first, or it cannot be moved: then pulled afresh)
            pass
    return path


def _lease() -> float:
    try:
        return max(1.0, float(os.environ.get(LEASE_ENV, "120")))
    except ValueError:
        return 120.0


class RemoteLock:
    """The lock object of one remote run directory; see the module docstring."""

    def __init__(self, run_url: str):
        self.url = remote.join(run_url, LOCK)
        self.fs, self.path = remote.filesystem(self.url)
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def _body(self) -> bytes:
        return json.dumps({**process_identity(), "command": " ".join(sys.argv),
                           "expires": time.time() + _lease()}).encode()

    def acquire(self, wait: float = 0.0) -> None:
        """Take the lock; ``wait``: seconds to keep trying while another holder's lease runs (a
        short step under OUT's root lock: a part's files about OUT, a report's card)."""
        deadline = time.monotonic() + wait
        while True:
            try:
                try:
                    self._create()
                except FileExistsError:
                    self._take_over()
                break
            except LockedError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)
        self._beat = threading.Thread(target=self._renew, name="mimi-extract-lock-heartbeat", daemon=True)
        self._beat.start()

    def _take_over(self) -> None:
        """The lock object exists: refused while its lease runs, else replaced -- on S3 by a PUT
        conditional on the ETag read (of two runs taking over, one wins)."""
        try:
            info = self.fs.info(self.path)
            held = json.loads(self.fs.cat_file(self.path))
        except FileNotFoundError:  # released meanwhile
            try:
                return self._create()
            except FileExistsError:  # ... and taken by another run first
                raise LockedError(f"{self.url}: another run took this lock first; wait for it or use another OUT") \
                    from None
        except ValueError:
            held = {}
        if not isinstance(held, dict):
            held = {}
        try:
            expires = float(held.get("expires", 0))
        except (TypeError, ValueError):
            expires = 0.0
        who = f"pid {held.get('pid')} on {held.get('host')}" if held else "another run"
        if expires > time.time() and not holder_gone(held):
            left = expires - time.time()
            raise LockedError(f"{self.url}: {who} holds this OUT's lock: it is writing this OUT, or it was stopped "
                              f"where this machine cannot tell (another host or container); if it is gone, the lock "
                              f"can be taken over in {left:.0f} s, at "
                              f"{time.strftime('%H:%M:%S UTC', time.gmtime(expires))}, when its lease runs out: run "
                              "again then (or use another OUT)")
        call = getattr(self.fs, "call_s3", None)
        if call is None or not info.get("ETag"):
            raise LockedError(f"{self.url}: an expired lock of {who} remains (its run was killed?); this store has no "
                              "conditional PUT to take it over safely: delete that object to go on")
        bucket, key, _ = self.fs.split_path(self.path)
        try:
            call("put_object", Bucket=bucket, Key=key, Body=self._body(), IfMatch=info["ETag"])
        except (OSError, ValueError) as e:
            raise LockedError(f"{self.url}: another run took over the expired lock of {who} ({e})") from e

    def _create(self) -> None:
        """The lock object, created only if absent (``If-None-Match: *`` on S3): FileExistsError if not."""
        with self.fs.open(self.path, "xb") as f:
            f.write(self._body())

    def _renew(self) -> None:
        while not self._stop.wait(_lease() / 4):
            try:
                self.fs.pipe_file(self.path, self._body())
            except Exception:  # (a missed beat: the lease is four beats long)
                pass

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
            self._beat = None
            try:
                self.fs.rm_file(self.path)
            except FileNotFoundError:
                pass


def remote_holder(lock: str) -> str | None:
    """Who holds a lock object (:class:`RemoteLock`) whose lease still runs; None if it ran out."""
    try:
        holder = json.loads(remote.read_bytes(lock) or b"null")
    except (OSError, ValueError):
        return None
    if not isinstance(holder, dict) or not isinstance(holder.get("expires"), (int, float)):
        return None
    if holder["expires"] <= time.time():
        return None
    return f"pid {holder.get('pid')} on {holder.get('host')} (its lock's lease runs {holder['expires'] - time.time():.0f} s more)"


def _md5(path: str) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Mirror:
    """One run directory on an object store (``url``) and its staging copy (``local``)."""

    def __init__(self, url: str, local: str):
        self.url, self.local = url.rstrip("/"), local
        self.fs, self.root = remote.filesystem(self.url)
        self.root = self.root.rstrip("/")
        self.sent: dict[str, tuple[int, int]] = {}  # staged name -> (size, mtime_ns) as the remote holds it
        self.pulled = b""  # the remote manifest as pulled
        self.last = (0, -1)  # (generation, last segment number) of the remote manifest
        self.generation, self.next, self.offset = 0, 0, 0  # what this run writes; 0: not begun

    def _remote(self) -> dict[str, dict]:
        """Every object of the remote run directory: name relative to it -> info."""
        if not self.fs.exists(self.root):
            return {}
        self.fs.invalidate_cache(self.root)
        return {posixpath.relpath(p, self.root): info for p, info in self.fs.find(self.root, detail=True).items()}

    @staticmethod
    def _segments(names) -> list[tuple[int, int, str]]:
        found = []
        for name in names:
            folder, _, base = name.rpartition("/")
            if folder == SEGMENTS and (m := SEGMENT_RE.fullmatch(base)):
                found.append((int(m.group(1)), int(m.group(2)), name))
        return sorted(found)

    def _staged(self) -> dict[str, tuple[int, int]]:
        """Every staged file to mirror (not the lock, the manifest or a ``.tmp``): name -> (size, mtime_ns)."""
        out = {}
        for path in remote.walk_files(self.local) if os.path.isdir(self.local) else []:
            name = os.path.relpath(path, self.local).replace(os.sep, "/")
            if name not in _SKIPPED and not name.endswith(".tmp") and not name.startswith("part-"):
                st = os.stat(path)
                out[name] = (st.st_size, st.st_mtime_ns)
        return out

    def _same(self, name: str, info: dict) -> bool:
        path = os.path.join(self.local, name)
        if not os.path.isfile(path) or os.path.getsize(path) != int(info["size"]):
            return False
        etag = str(info.get("ETag", "")).strip('"')
        return not re.fullmatch(r"[0-9a-f]{32}", etag) or _md5(path) == etag  # (a single-part upload's ETag: its MD5)

    def pull(self) -> None:
        """Make the staging equal to the remote: see the module docstring."""
        objects = self._remote()
        segments = self._segments(objects)
        data = {n: i for n, i in objects.items() if n not in _SKIPPED and not n.startswith(SEGMENTS + "/")
                and not n.startswith("part-")}
        os.makedirs(self.local, exist_ok=True)
        for name, info in sorted(data.items()):
            path = os.path.join(self.local, name)
            if not self._same(name, info):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                self.fs.get_file(f"{self.root}/{name}", path + ".pull")
                store_files.rename(path + ".pull", path)
        for name in set(self._staged()) - set(data):  # staged, never committed remotely: not this OUT's
            os.remove(os.path.join(self.local, name))
        self.sent = self._staged()
        if segments:
            mine = manifest_segments(objects)  # (the highest generation's, as every reader of the remote OUT reads them)
            self.pulled = b"".join(remote.read_many([f"{self.url}/{name}" for name in mine]))
            self.last = (segments[-1][0], segments[-1][1])
        manifest = os.path.join(self.local, MANIFEST)
        if segments:
            with open(manifest + ".pull", "wb") as f:
                f.write(self.pulled)
            store_files.rename(manifest + ".pull", manifest)
        elif os.path.exists(manifest):
            os.remove(manifest)

    def push(self) -> None:
        """Upload what the staging holds and the remote lacks, then the manifest segment that
        commits it (the first of a new generation when the manifest is not the one pulled plus
        appended lines).  Nothing before the staging has a ``run.json`` (no run began)."""
        staged = self._staged()
        if "run.json" not in staged:
            return
        if CUTS in staged and self.sent.get(CUTS) != staged[CUTS]:
            # the cuts a run wrote point at the staged shards, on this machine only: the remote's point at
            # the remote shards (URLs, valid wherever the bucket is), and so do the staged ones from now on
            write_cuts(self.local, base=self.url)
            staged = self._staged()
        try:
            for name, stamp in sorted(staged.items()):
                if self.sent.get(name) != stamp:
                    self.fs.put_file(os.path.join(self.local, name), f"{self.root}/{name}")
                    self.sent[name] = stamp
            path = os.path.join(self.local, MANIFEST)
            if self.generation == 0:
                with open(path, "rb") if os.path.exists(path) else _Empty() as f:
                    head = f.read(len(self.pulled))
                if self.pulled and head == self.pulled:  # the pulled manifest, appended to: the same generation
                    self.generation, self.next, self.offset = self.last[0], self.last[1] + 1, len(head)
                else:
                    self._new_generation(path)
                self._collect_garbage(staged)
            with open(path, "rb") if os.path.exists(path) else _Empty() as f:
                f.seek(self.offset)
                tail = f.read()
            if tail:
                tail = tail[: tail.rfind(b"\n") + 1]  # (whole lines only)
                self._put_segment(tail)
                self.offset += len(tail)
        except OSError as e:
            raise OutputError(f"{self.url}: cannot upload ({e})") from e

    def _put_segment(self, data: bytes) -> None:
        self.fs.pipe_file(f"{self.root}/{SEGMENTS}/g{self.generation:06d}-{self.next:010d}.jsonl", data)
        self.next += 1

    def _new_generation(self, manifest: str) -> None:
        """The whole manifest as segment 0 of the next generation: the commit point of a manifest
        that recovery rewrote."""
        with open(manifest, "rb") if os.path.exists(manifest) else _Empty() as f:
            data = f.read()
        data = data[: data.rfind(b"\n") + 1]
        self.generation, self.next = self.last[0] + 1, 0
        self._put_segment(data)
        self.offset = len(data)

    def _collect_garbage(self, staged: dict) -> None:
        """Once this run's manifest is committed: the older generations' segments, and the objects
        no staged file matches (orphans, shards the staging quarantined), which no row names."""
        objects = self._remote()
        old = [name for g, _, name in self._segments(objects) if g != self.generation]
        stray = [n for n in objects if n not in staged and n not in _SKIPPED and not n.startswith(SEGMENTS + "/")
                 and not n.startswith("part-")]
        for name in old + stray:
            self.fs.rm_file(f"{self.root}/{name}")


class _Empty:
    """An empty file (a staging without a manifest yet)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def read(self, n: int = -1) -> bytes:
        return b""

    def seek(self, pos: int) -> int:
        return 0


def pull(url: str, local: str) -> list[str]:
    """A remote OUT's committed state copied into the folder ``local`` (made equal to it:
    :meth:`Mirror.pull`), every part of a job array into its own ``part-I-of-N`` (a job array's
    root is the union of its parts, as on disk); returns the run directories pulled (local)."""
    pulled = []
    for d in run_dirs(url.rstrip("/")):
        name = remote.relpath(d, url.rstrip("/"))
        folder = local if name == "." else os.path.join(local, name)
        Mirror(d, folder).pull()
        pulled.append(folder)
    return pulled


def pull_siblings(url: str, staging: str) -> None:
    """The ``run.json`` of every part of a job array's remote OUT, staged read-only: a part checks
    that its siblings ran with its settings (they push their own run directories)."""
    fs, root = remote.filesystem(url)
    for path in fs.glob(f"{root.rstrip('/')}/part-*/run.json"):
        local = os.path.join(staging, posixpath.relpath(path, root.rstrip("/")))
        os.makedirs(os.path.dirname(local), exist_ok=True)
        fs.get_file(path, local)


def publish_out_files(url: str, staging: str, part_dirname: str, wait: float | None = None) -> list[str]:
    """A job array's part on object storage, at its end: the files about OUT as a whole
    (``Format.out_files``: Parquet's dataset card, Megatron's data-args list) made from every part's
    committed rows in the bucket and uploaded to OUT's root -- a part's mirror pushes only its own
    folder, and its staging holds only its own rows. Under the lock object at OUT's root, as parts on
    one disk take OUT's lock for them: parts ending at once take turns, and the last one writes what
    all of them committed. Made in a private folder (with the bucket's own copies: a card the user
    wrote is kept), never in the staging root that other parts on this machine share. ``wait``: how
    long to wait for the root's lock, by default longer than a lease (a lock left by a part killed
    here expires and is taken over). Returns the names uploaded; OutputError if it cannot."""
    info = read_run_info(os.path.join(staging, part_dirname))
    if info is None:
        return []
    fmt = get_format(RunInfo.from_dict(info).format)
    fs, root = remote.filesystem(url)
    root = root.rstrip("/")
    lock = RemoteLock(url)
    try:
        lock.acquire(_lease() + 30.0 if wait is None else wait)
    except (LockedError, OSError) as e:
        raise OutputError(f"{url}: cannot take OUT's lock to write the files about OUT as a whole ({e})") from e
    try:
        with tempfile.TemporaryDirectory(prefix="mimi-extract-out-files-") as scratch:
            here = os.path.join(scratch, os.path.basename(staging))  # (OUT's name: the card's title)
            os.makedirs(here)
            fs.invalidate_cache(root)
            for entry in fs.ls(root, detail=True):
                name = posixpath.basename(entry["name"])
                if entry.get("type") == "file" and name != LOCK:
                    fs.get_file(f"{root}/{name}", os.path.join(here, name))
            files = fmt.out_files(here, info, True, lambda: out_rows(url))
            for name, text in files.items():
                fs.pipe_file(f"{root}/{name}", text.encode("utf-8"))
        return sorted(files)
    except OSError as e:
        raise OutputError(f"{url}: cannot upload the files about OUT as a whole ({e})") from e
    finally:
        lock.release()


@dataclass(frozen=True)
class Staged:
    """An OUT on object storage as a run writes it: ``path``, the local staging OUT it runs in;
    ``push()``, after each commit there; ``url``, the OUT itself."""

    url: str
    path: str
    push: Callable[[], None]
    notes: list[str] = field(default_factory=list)  # what the run's end could not do (said, not fatal)


@contextmanager
def mirrored(url: str, part_dirname: str | None):
    """``with mirrored(url, part) as staged``: the run directory of ``url`` (``part_dirname``: a job
    array's part, its own ``part-I-of-N``; None for a whole run) locked, pulled into the local staging
    OUT (:class:`Staged`), pushed after each commit (``staged.push``) and when the block ends -- after
    an error too, what was committed before it."""
    staging = staging_dir(url)
    run_url = remote.join(url, part_dirname) if part_dirname else url.rstrip("/")
    mirror = Mirror(run_url, os.path.join(staging, part_dirname) if part_dirname else staging)
    lock = RemoteLock(run_url)
    lock.acquire()
    try:
        mirror.pull()
        if part_dirname:
            pull_siblings(url, staging)
        staged = Staged(url.rstrip("/"), staging, mirror.push)
        try:
            yield staged
        except BaseException:
            try:
                mirror.push()  # what was committed before the error
                if part_dirname:
                    publish_out_files(url, staging, part_dirname)
            except OutputError:
                pass
            raise
        mirror.push()
        if part_dirname:
            try:
                publish_out_files(url, staging, part_dirname)
            except OutputError as e:  # every item is committed: the files about OUT lag until a part ends again
                staged.notes.append(f"{e}; they lag until a part of this OUT ends again")
    finally:
        lock.release()
