"""Compatibility shim: the output directory code moved to :mod:`mimi_extract.formats`
(``formats/common.py``: lock, identity, manifest, commit protocol, resume; ``formats/hdf5.py``:
the HDF5 shards).  Old imports (``from mimi_extract.writer import read_manifest, ShardWriter``)
keep working; ``ShardWriter(run_dir, file_attrs)`` here writes HDF5, as it always did."""

from __future__ import annotations

import os  # noqa: F401  (tests patch writer.os.write: the os module itself)

from .formats import get_format
from .formats.common import (LOCK, MANIFEST, QUARANTINE, RUN_INFO, _PART_RE, _TMP_RE, LockedError,  # noqa: F401
                             OutputError, RunLock, _fsync_dir, _plain, _shard_file_attrs, _unique_path,
                             _write_atomic, _write_error, _write_file, check_run_info, check_shard_settings,
                             commit_files, committed_rows, ensure_dir, format_of, format_of_path, item_attrs,
                             load_row, lock_run_dir, next_shard_index, read, read_manifest, read_rows,
                             read_run_info, recover, run_dirs, shard_attrs, valid_shard_name)
from .formats.common import ShardWriter as _ShardWriter
from .formats.hdf5 import HDF5

_SHARD_RE = HDF5.shard_re


class ShardWriter(_ShardWriter):
    """An HDF5 :class:`mimi_extract.formats.common.ShardWriter` (the signature of mimi-extract 0.2)."""

    def __init__(self, run_dir: str, file_attrs: dict, max_items: int = 1000, max_bytes: int = 256 << 20):
        super().__init__(run_dir, get_format("hdf5"), file_attrs, max_items, max_bytes)


def _check_shard(path: str, rows: list[dict]) -> str | None:
    return get_format("hdf5").check(path, rows)


__all__ = ["OutputError", "LockedError", "RunLock", "ShardWriter", "read", "read_manifest", "load_row", "recover", "run_dirs",
           "check_run_info", "read_run_info", "ensure_dir"]
