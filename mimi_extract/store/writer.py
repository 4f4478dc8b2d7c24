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
from dataclasses import replace

import numpy as np

from ..formats.base import Format
from . import files as store_files  # (store_files.rename: the one rename, as it is when called)
from .files import OutputError, fsync_dir, write_error, write_file
from .manifest import ManifestAppender, ManifestRow, next_shard_index, with_shard_checksum


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
                    fsync_dir(run_dir)
                except OSError as e:
                    raise write_error(e, folder) from e
            write_file(tmp_path(run_dir, name), data)
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


class ShardWriter(WriterBlock):
    """Streams utterances into size-capped shards of one format and the manifest (one row per input).

    Only the lock holder writes, and only whole items (``engines.assembly`` joins their frame chunks), so
    a shard only ever holds whole items, and an interrupted run commits exactly those.  The
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
        self._rows: list[ManifestRow] = []
        self._bytes = 0
        self.written: set[str] = set()  # keys written by this run (a retried unit cannot add a second copy)
        self._manifest = ManifestAppender(run_dir)
        self.commits = 0

    @property
    def shard_name(self) -> str:
        return self.format.shard_name(self.index)

    def add(self, key: str, data: np.ndarray, row: ManifestRow, attrs: dict | None = None) -> None:
        """Store one utterance; its manifest row is committed together with the shard."""
        if key in self.written:
            return
        if self._shard is not None and self._bytes + data.nbytes > self.max_bytes and self._rows:
            self.commit()
        if self._shard is None:
            self._shard = self.format.builder(self.file_attrs)
        row = replace(row, key=key).shaped(data)
        stored = self._shard.add(key, data, row.as_dict(), attrs or {})
        self._rows.append(row.ok(data, self.shard_name, stored))
        self.written.add(key)
        self._bytes += data.nbytes
        if len(self._rows) >= self.max_items or self._bytes >= self.max_bytes:
            self.commit()

    def add_error(self, row: ManifestRow, message: str) -> None:
        if row.key in self.written:
            return
        self._manifest.append([row.failed(message)])

    def commit(self) -> None:
        """Write the open shard and make it (and its rows) durable."""
        if self._shard is None:
            return
        shard, self._shard = self._shard, None
        try:
            files = shard.files(self.shard_name)
        finally:
            shard.close()
        rows = with_shard_checksum(self._rows, files, self.shard_name)
        commit_files(self.run_dir, files, lambda: self._manifest.append(rows))
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
        for key in (r.key for r in self._rows):
            self.written.discard(key)
        self._rows = []

    def close(self) -> None:
        try:
            self.commit()
        finally:
            self._manifest.close()

