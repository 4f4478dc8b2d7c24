"""Writing: the commit protocol and :class:`ShardWriter`.

Commit protocol for a shard (written once, here, for every format).  A format builds the shard
*in memory* (:class:`~mimi_extract.formats.base.ShardBuilder`), so its library never writes to OUT
and a full disk cannot leave it in a broken state (h5py segfaults there); then: (1) each of its
files is written to ``NAME.tmp`` with plain ``write`` calls and fsynced; (2) its rows are
appended to the manifest and fsynced; (3) the tmp files are renamed into place (the shard itself
last) and the directory fsynced.  A kill before (2) leaves only ``.tmp`` files; a kill between (2)
and (3) leaves rows naming a missing shard: on resume both are dropped and re-encoded
(``recover.py``)."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, replace

import numpy as np

from ..formats.base import Format
from . import files as store_files  # (store_files.rename: the one rename, as it is when called)
from .files import OutputError, fsync_dir, write_error, write_file
from .manifest import ManifestAppender, ManifestRow, in_shard, next_shard_index, remove_tmps


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
    publish(run_dir, write_tmp_files(run_dir, files), append_rows)


def write_tmp_files(run_dir: str, files: dict[str, bytes]) -> list[tuple[str, str]]:
    """The commit protocol's first step, which any process may take (a device worker writes its
    own shards): each of ``files`` to its :func:`tmp_path`, fsynced (its format's folder made
    first).  Returns ``[(tmp path, final relative name)]`` in order; on :class:`OutputError` the
    ``.tmp`` files written so far are removed."""
    written: list[tuple[str, str]] = []
    try:
        for name, data in files.items():
            folder = os.path.dirname(os.path.join(run_dir, name))
            if not os.path.isdir(folder):
                try:
                    os.makedirs(folder, exist_ok=True)
                    fsync_dir(run_dir)
                except OSError as e:
                    raise write_error(e, folder) from e
            write_file(tmp_path(run_dir, name), data)
            written.append((tmp_path(run_dir, name), name))
    except OutputError:
        remove_files([tmp for tmp, _ in written])
        raise
    return written


def remove_files(paths) -> None:
    for path in paths:
        try:
            os.remove(path)
        except OSError:
            pass


def publish(run_dir: str, written: list[tuple[str, str]], append_rows) -> None:
    """The commit protocol's ordered steps, taken by the lock holder only: ``append_rows()`` (the
    manifest rows, fsynced), then each ``.tmp`` of ``written`` (:func:`write_tmp_files`) renamed to
    its final name, in order (the shard last: its rename is the commit point), then the folders
    fsynced.  A failure before the renames removes the ``.tmp`` files."""
    try:
        append_rows()
    except OutputError:
        remove_files([tmp for tmp, _ in written])
        raise
    folders = [run_dir]
    for tmp, name in written:
        path = os.path.join(run_dir, name)
        try:
            store_files.rename(tmp, path)
        except OSError as e:
            raise write_error(e, path) from e
        if os.path.dirname(path) not in folders:
            folders.append(os.path.dirname(path))
    try:
        for folder in folders:
            fsync_dir(folder)
    except OSError as e:
        raise write_error(e, folders[0]) from e


class WriterBlock:
    """A writer as a context manager, as lhotse's writers are: ``with run.writer(...) as writer``
    commits what is open when the block ends; a block that ends with an error first discards what
    is not committed (``abort``), then closes without raising a second error over the first."""

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace) -> None:
        if kind is None:
            self.close()
            return
        self.abort()
        try:
            self.close()
        except OutputError:
            pass

    def abort(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class ShardSpec:
    """What a device worker needs to build and write shards of this run itself (picklable: it
    crosses to spawned and forked workers): the run directory, the format's name, the settings
    every shard stores, and the shard limits of ``--shard-size``/``--shard-mb``."""

    run_dir: str
    format: str
    file_attrs: dict
    max_items: int
    max_bytes: int
    probe: str | None = None  # a file only this run directory holds (:meth:`with_probe`)

    def with_probe(self) -> ShardSpec:
        """This spec with a probe: an empty file of a random temporary name written in the run
        directory (removed with the run's other temporaries).  A worker on another machine (a Ray
        actor) may see a folder of the same path on its own disk, or none; only one that sees the
        probe writes shards here (:meth:`reachable`), the others hand their items to the lock holder."""
        name = f"seen.{uuid.uuid4().hex}.tmp"
        write_file(os.path.join(self.run_dir, name), b"")
        return replace(self, probe=name)

    def reachable(self) -> bool:
        """Whether this process sees the run directory itself (its probe), not another machine's
        folder of the same path."""
        return self.probe is None or os.path.exists(os.path.join(self.run_dir, self.probe))


@dataclass
class PreparedShard:
    """A shard a worker has built and written to its ``.tmp`` files (fsynced), not yet committed:
    ``name`` its provisional name (:data:`PROVISIONAL`), ``files`` its ``(tmp path, provisional
    relative name)`` in commit order, ``rows`` its manifest rows (naming ``name``), ``uids`` the
    work items it holds, ``seconds`` the encoder-input seconds they cover (progress).  The lock
    holder commits it under its final name (:meth:`ShardWriter.commit_prepared`)."""

    name: str
    files: list[tuple[str, str]]
    rows: list[ManifestRow]
    uids: list[str]
    seconds: float
    committed: bool = False

    def discard(self) -> None:
        """Remove its ``.tmp`` files (a shard refused, or from a worker declared dead)."""
        remove_files(tmp for tmp, _ in self.files)


# a worker's shards are numbered from PROVISIONAL x (worker + 1) until the lock holder gives each its
# final number as it commits it: far above any final number, and every worker's its own, so that
# their .tmp names never meet each other's or a committed shard's (and resume removes them as any .tmp)
PROVISIONAL = 10**9


class _Filling(WriterBlock):
    """The one rule of which items go into which shard, for the runner's writer and a worker's:
    items in arrival order, a shard closed at ``max_items`` items or ``max_bytes`` (an item that
    would pass ``max_bytes`` starts the next one); built in memory by the format's ShardBuilder."""

    def __init__(self, fmt: Format, file_attrs: dict, max_items: int, max_bytes: int):
        self.format = fmt.for_run(file_attrs)  # a format whose shard names depend on the run (Shar's field)
        self.file_attrs = file_attrs
        self.max_items, self.max_bytes = max_items, max_bytes
        self._shard = None  # the format's ShardBuilder of the open shard
        self._rows: list[ManifestRow] = []
        self._bytes = 0

    def _fill(self, key: str, data: np.ndarray, row: ManifestRow, attrs: dict | None) -> None:
        if self._shard is not None and self._bytes + data.nbytes > self.max_bytes and self._rows:
            self.commit()
        if self._shard is None:
            self._shard = self.format.builder(self.file_attrs)
        data = np.ascontiguousarray(data)  # (once: an encoder's frames are a transposed view; the format and the checksum read it)
        row = row.shaped(data, key=key)
        stored = self._shard.add(key, data, row.as_stored(), attrs or {})
        self._rows.append(row.ok(data, "", stored))  # (the shard's name: once it has one, in _take)
        self._bytes += data.nbytes
        if len(self._rows) >= self.max_items or self._bytes >= self.max_bytes:
            self.commit()

    def _take(self, name: str) -> tuple[dict, list[ManifestRow]]:
        """The open shard's files under ``name`` and its rows naming it (with its checksum); the
        shard is closed."""
        shard, self._shard = self._shard, None
        try:
            files = shard.files(name)
        finally:
            shard.close()
        rows = in_shard(self._rows, files, name)
        self._rows, self._bytes = [], 0
        return files, rows

    def commit(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        if self._shard is not None:
            self._shard.close()
            self._shard = None
        self._rows, self._bytes = [], 0


class WorkerShards(_Filling):
    """A device worker's own shards: it builds each in memory and writes its ``.tmp`` files
    (:func:`write_tmp_files`), in parallel with the other workers, then hands the lock holder a
    :class:`PreparedShard` (rows and names only), which commits it (:meth:`ShardWriter.commit_prepared`):
    the bytes of a run no longer pass through one process.  ``add`` returns the shards it closed."""

    def __init__(self, spec: ShardSpec, worker: int):
        from ..formats import get_format

        super().__init__(get_format(spec.format), spec.file_attrs, spec.max_items, spec.max_bytes)
        self.run_dir = spec.run_dir
        self.next = PROVISIONAL * (worker + 1)
        self._uids: list[str] = []
        self._seconds = 0.0
        self._ready: list[PreparedShard] = []

    def add(self, uid: str, key: str, data: np.ndarray, row: ManifestRow, attrs: dict | None,
            seconds: float) -> list[PreparedShard]:
        self._fill(key, data, row, attrs)  # (a shard it closes before the item holds the uids so far)
        if self._shard is not None:  # (else the item closed its own shard: it is counted there)
            self._uids.append(uid)
            self._seconds += seconds
        else:
            self._ready[-1].uids.append(uid)
            self._ready[-1].seconds += seconds
        ready, self._ready = self._ready, []
        return ready

    def commit(self) -> None:
        if self._shard is None:
            return
        name = self.format.shard_name(self.next)
        self.next += 1
        files, rows = self._take(name)
        uids, seconds = self._uids, self._seconds
        self._uids, self._seconds = [], 0.0
        self._ready.append(PreparedShard(name, write_tmp_files(self.run_dir, files), rows, uids, seconds))

    @property
    def held(self) -> list[str]:
        """The work items its open shard holds (not written yet)."""
        return list(self._uids)

    def flush(self) -> list[PreparedShard]:
        """The open shard, written (a worker about to wait for work, or at its end)."""
        self.commit()
        ready, self._ready = self._ready, []
        return ready

    def close(self) -> None:
        self.abort()


class ShardWriter(_Filling):
    """Streams utterances into size-capped shards of one format and the manifest (one row per input).

    Only the lock holder commits, and only whole items (``engines.assembly`` joins their frame
    chunks), so a shard only ever holds whole items, and an interrupted run commits exactly those.
    The format only builds each shard in memory (``fmt.builder``); this class owns the manifest and
    the commit protocol (:func:`commit_files`).  Shards that device workers built and wrote
    (:class:`WorkerShards`) are committed here too (:meth:`commit_prepared`), numbered in commit
    order with this writer's own."""

    def __init__(self, run_dir: str, fmt: Format, file_attrs: dict, max_items: int = 1000,
                 max_bytes: int = 256 << 20, on_commit=None):
        super().__init__(fmt, file_attrs, max_items, max_bytes)
        self.run_dir = run_dir
        self.on_commit = on_commit  # called after each commit (an OUT on object storage uploads it: mirror.py)
        self.index = next_shard_index(run_dir)
        self.written: set[str] = set()  # keys written by this run (a retried unit cannot add a second copy)
        self._manifest = ManifestAppender(run_dir)
        self.commits = 0

    @property
    def shard_name(self) -> str:
        return self.format.shard_name(self.index)

    def spec(self) -> ShardSpec:
        """What a device worker needs to write this run's shards itself (:class:`WorkerShards`)."""
        return ShardSpec(self.run_dir, self.format.name, self.file_attrs, self.max_items, self.max_bytes)

    def add(self, key: str, data: np.ndarray, row: ManifestRow, attrs: dict | None = None) -> None:
        """Store one utterance; its manifest row is committed together with the shard."""
        if key in self.written:
            return
        self._fill(key, data, row, attrs)
        self.written.add(key)

    def add_error(self, row: ManifestRow, message: str) -> None:
        if row.key in self.written:
            return
        self._manifest.append([row.failed(message)])

    def commit(self) -> None:
        """Write the open shard and make it (and its rows) durable."""
        if self._shard is None:
            return
        name = self.shard_name
        files, rows = self._take(name)
        commit_files(self.run_dir, files, lambda: self._manifest.append(rows))
        self._committed()

    def commit_prepared(self, shard: PreparedShard) -> bool:
        """Commit a shard a worker wrote (:class:`WorkerShards`) under the next shard number: its
        rows appended (fsynced), its ``.tmp`` files renamed, the folders fsynced.  A shard holding a
        key this run already stored is refused and its files removed (a unit handed out again after
        its worker died must never store an item twice): False."""
        if any(r.key in self.written for r in shard.rows):
            shard.discard()
            return False
        name = self.shard_name
        given = [*self.format.companions(shard.name), shard.name]
        final = dict(zip(given, [*self.format.companions(name), name]))
        rows = [replace(r, shard=name) for r in shard.rows]
        publish(self.run_dir, [(tmp, final[n]) for tmp, n in shard.files], lambda: self._manifest.append(rows))
        self.written.update(r.key for r in rows)
        shard.committed = True
        self._committed()
        return True

    def _committed(self) -> None:
        self.index += 1
        self.commits += 1
        if self.on_commit is not None:
            self.on_commit()

    def abort(self) -> None:
        """Discard what is not committed (an unrecoverable write error)."""
        for key in (r.key for r in self._rows):
            self.written.discard(key)
        super().abort()

    def close(self) -> None:
        """Commit the open shard; remove the ``.tmp`` files a worker that died mid-write left (every
        worker has ended by now: only this writer is left)."""
        try:
            self.commit()
        finally:
            self._manifest.close()
            remove_tmps(self.run_dir)
