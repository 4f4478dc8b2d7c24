"""Reading an OUT at training speed: one key index over every part, shards kept open.

``mimi_extract.read(OUT, key)`` used to scan every manifest on every call (3.8 s per call at 100k
rows), so a training loop over a real OUT was unusable.  :class:`Reader` parses the manifests
once (``committed_rows`` of each run directory: the same rows resume trusts), keeps the ok rows
in shard order and an index by key, and keeps shard files open (a bounded number) so an item costs
one read from its shard (an HDF5 dataset, a Parquet row...).  ``read()`` goes through a per-OUT cached reader that is rebuilt when a
manifest changes (its size or mtime) or a shard appears, so it stays right while a run is adding
to OUT.

``read_cuts`` is lazy: a lhotse ``CutSet`` over an iterator that builds each cut from the
manifests as it goes (never behind them, unlike a ``cuts.jsonl.gz`` after a kill -9), the way
``CutSet.from_jsonl_lazy`` iterates a file.  ``write_merged_cuts`` writes one ``cuts.jsonl.gz``
over all parts of a job array, for tools that want a single file.

Nothing here imports torch until :meth:`Reader.dataset` is called.
"""

from __future__ import annotations

import atexit
import builtins
import gzip
import json
import os
import threading
import weakref
from collections import OrderedDict

import numpy as np

from ..common import remote
from ..config.taps import frame_shift
from ..store.files import MANIFEST, RUN_INFO
from ..formats.records import StoredRow
from ..store.identity import read_run
from ..store.manifest import committed_rows, iter_committed, out_exists, out_files, out_rows
from ..store.read import close_shard, load_row, open_shard, unreadable_error

_OPEN_SHARDS = 64  # shard files a reader keeps open (file descriptors are a bounded resource)
_HOLDING: "weakref.WeakSet[Reader]" = weakref.WeakSet()  # this process's readers with shard handles open


@atexit.register
def _close_readers() -> None:
    """Close every reader's shard handles while the interpreter is still whole (atexit: before its
    modules are torn down).  A shard on object storage is open through a Python file object
    (fsspec's); left open to the interpreter's teardown, a spawned DataLoader worker over an
    ``s3://`` OUT crashed there when the loader was dropped after one batch ("Unexpected
    segmentation fault encountered in worker", once per worker: issue 41, reproduced with two
    spawned workers over moto; closing the handles at exit ends it, closing fsspec's files alone
    did not).  Forked workers leave with ``os._exit``, which runs no teardown."""
    for reader in list(_HOLDING):
        try:
            reader.close()
        except Exception:  # noqa: BLE001 -- exiting: a handle that cannot close is the OS's to drop
            pass


def _stamp(path: str):
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns


def _signature(out_dir: str, dirs: list[str]) -> tuple | None:
    """What an index depends on, in a few ``stat`` calls: OUT's own mtime (a new part directory),
    and per run directory its mtime (a shard renamed into place makes its rows committed) and its
    manifest's size and mtime (rows appended).  None on object storage, where that would be a
    listing per call: ``read`` rebuilds its reader there when a key is not in it."""
    if remote.is_url(out_dir):
        return None
    return (_stamp(out_dir),) + tuple((_stamp(d), _stamp(os.path.join(d, MANIFEST))) for d in dirs)


class Reader:
    """Every committed row of OUT (all parts), indexed by key; arrays loaded on demand.

    ``reader[key]`` -> the array (time first, as ``read``); ``keys()`` ok keys in shard order;
    ``rows()`` every committed row (ok and error), ``shard`` relative to OUT; iterating yields
    ``(key, array)`` in shard order (sequential reads); ``dataset()`` a ``torch.utils.data.Dataset``.
    When a key has several ok rows (an old OUT), the last one wins, as in ``read``."""

    def __init__(self, out_dir: str):
        self.out_dir = remote.absolute(out_dir)
        files = out_files(self.out_dir)
        if not out_exists(self.out_dir, files):
            raise FileNotFoundError(f"{out_dir} does not exist")
        self.dirs = [f.path for f in files]
        self.signature = _signature(self.out_dir, self.dirs)  # before reading: a change while we read shows
        self._rows: list[StoredRow] = []
        for f in files:
            prefix = remote.relpath(f.path, self.out_dir)
            rows = committed_rows(f.path, f)
            self._rows += rows if prefix == "." else [row.under(prefix) for row in rows]
        index: dict[str, StoredRow] = {}
        for row in self._rows:
            if row.ok and row.shard:
                index.pop(row.key, None)  # a later row moves the key to its own shard's place
                index[row.key] = row
        # shard order: by shard path, then the order the rows were written (= datasets in the shard)
        order = {s: i for i, s in enumerate(sorted({r.shard for r in index.values()}))}
        self._index = dict(sorted(index.items(), key=lambda kv: order[kv[1].shard]))
        self._open: OrderedDict[str, object] = OrderedDict()  # shard -> its format's handle
        self._pid = os.getpid()
        self._lock = threading.Lock()

    # -- the index -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: str) -> bool:
        return key in self._index

    def keys(self, min_si_sdr: float | None = None, max_mel_distance: float | None = None) -> list[str]:
        """The ok items' keys (shard order); with ``min_si_sdr`` (dB) / ``max_mel_distance``, only
        those whose ``--fidelity`` numbers pass (an item with a silent input has no SI-SDR: left
        out by ``min_si_sdr``): ``reader.dataset(reader.keys(min_si_sdr=5))``.  A ValueError when
        OUT was made without ``--fidelity``."""
        if min_si_sdr is None and max_mel_distance is None:
            return list(self._index)
        if not any(r.mel_distance is not None for r in self._index.values()):
            raise ValueError(f"{self.out_dir} has no fidelity numbers: it was made without codes --fidelity")
        return [k for k, r in self._index.items()
                if (min_si_sdr is None or (r.si_sdr is not None and r.si_sdr >= min_si_sdr))
                and (max_mel_distance is None or (r.mel_distance is not None and r.mel_distance <= max_mel_distance))]

    def stored_row(self, key: str) -> StoredRow:
        """The ok row of ``key`` (typed: what the package reads)."""
        try:
            return self._index[key]
        except KeyError:
            raise KeyError(f"{key!r} has no ok row in the manifest of {self.out_dir}") from None

    def row(self, key: str) -> dict:
        """The ok row of ``key``, as JSON (a plain dict, ``shard`` relative to OUT)."""
        return self.stored_row(key).to_dict()

    def rows(self, status: str | None = None) -> list[dict]:
        """Committed manifest rows in manifest order (``status``: only "ok" or "error" rows), as JSON."""
        return [r.to_dict() for r in self._rows if status is None or r.status == status]

    # -- arrays ----------------------------------------------------------------------------
    def _shard(self, shard: str):
        if self._pid != os.getpid():  # a forked DataLoader worker: HDF5 handles do not survive fork
            self._open, self._pid = OrderedDict(), os.getpid()
        f = self._open.get(shard)
        if f is None:
            f = open_shard(self.out_dir, shard)
            self._open[shard] = f
            _HOLDING.add(self)
            if len(self._open) > _OPEN_SHARDS:
                close_shard(*self._open.popitem(last=False))
        else:
            self._open.move_to_end(shard)
        return f

    def __getitem__(self, key: str) -> np.ndarray:
        row = self.stored_row(key)
        with self._lock:  # h5py serialises anyway; the lock keeps the handle cache consistent
            try:
                handle = self._shard(row.shard)
            except Exception as e:  # a damaged footer / superblock: the library's error names no item
                raise unreadable_error(self.out_dir, row, e) from e
            return load_row(self.out_dir, row, handle)

    def __iter__(self):
        for key in self._index:
            yield key, self[key]

    def dataset(self, keys: list[str] | None = None):
        """A map-style ``torch.utils.data.Dataset``: item ``i`` is ``{"key", "data" (a tensor), "frames"}``
        of the ``i``-th key (shard order, or ``keys``); picklable (``spawn`` DataLoader workers) and
        safe in forked ones.  :class:`mimi_extract.readers.dataset.OutDataset`; batch it with
        ``mimi_extract.dataset.pad_collate``."""
        return OutDataset(self, keys)

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                for shard, f in self._open.items():
                    close_shard(shard, f)
            self._open.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getstate__(self):  # picklable (spawned DataLoader workers): handles are reopened there
        state = dict(self.__dict__)
        state["_open"], state["_lock"] = OrderedDict(), None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()


class OutDataset:
    """A map-style dataset of OUT for ``torch.utils.data.DataLoader`` (torch's protocol: ``__len__``
    and ``__getitem__``): item ``i`` is ``{"key", "data" (a tensor, time first), "frames"}`` of the
    ``i``-th key (shard order, or ``keys``).  ``source``: OUT's path or a :class:`Reader`.  A
    module-level class, so it pickles into ``spawn`` workers (each opens its own shard handles);
    safe in forked ones."""

    def __init__(self, source, keys: list[str] | None = None):
        self.reader = source if isinstance(source, Reader) else Reader(source)
        self.keys = list(keys) if keys is not None else self.reader.keys()

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> dict:
        import torch  # (a training loop's: the light commands never get here)

        key = self.keys[i]
        return {"key": key, "data": torch.from_numpy(np.ascontiguousarray(self.reader[key])),
                "frames": self.reader.stored_row(key).frames}


def open(out_dir: str) -> Reader:  # noqa: A001 - mimi_extract.open(OUT), like h5py.File / lhotse
    """Index OUT once (all parts) and read items by key: ``mimi_extract.open(OUT)[key]``."""
    return Reader(out_dir)


_CACHE: dict[str, Reader] = {}
_CACHE_LOCK = threading.Lock()


def cached_reader(out_dir: str, key: str | None = None) -> Reader:
    """The reader of OUT, rebuilt when its manifests or shards changed since it was built (on
    object storage: when it lacks ``key``)."""
    path = remote.absolute(out_dir)
    with _CACHE_LOCK:
        reader = _CACHE.get(path)
        if reader is None or (key not in reader if reader.signature is None
                              else reader.signature != _signature(path, reader.dirs)):
            if reader is not None:
                reader.close()
            reader = _CACHE[path] = Reader(path)
        return reader


def read(out_dir: str, key: str) -> np.ndarray:
    """One item's array by key, time first: features ``[frames, dim]``, codes ``[frames,
    num_quantizers]`` (``.T`` gives transformers' ``[num_quantizers, frames]``).  The key index is
    built on the first call and reused until OUT's manifests change."""
    return cached_reader(out_dir, key)[key]


# -- lhotse --------------------------------------------------------------------------------
def _cut_run_dirs(out_dir: str) -> list[str]:
    dirs = [f.path for f in out_files(out_dir) if f.exists(RUN_INFO)]
    if not dirs:
        raise FileNotFoundError(f"{out_dir} holds no mimi-extract run (no run.json)")
    return dirs


class ManifestCuts:
    """A lazy source of lhotse cut dicts over every part of OUT, read from the manifests at each
    iteration (so never behind them); picklable, like lhotse's own lazy iterators."""

    def __init__(self, out_dir: str):
        self.out_dir = remote.absolute(out_dir)
        self.dirs = _cut_run_dirs(self.out_dir)
        self._len: int | None = None

    def dicts(self):
        from ..formats.cuts import FIELDS, cut_dict

        for d in self.dirs:
            tap = read_run(d).tap
            for row in iter_committed(d):
                if row.ok and row.source:
                    cut = cut_dict(row, d, FIELDS[tap], frame_shift(tap))
                    if cut is not None:  # None: a format with no lhotse storage (Format.lhotse_storage)
                        yield cut

    def __iter__(self):
        from lhotse.serialization import deserialize_item

        from ..formats.cuts import register_lhotse_readers

        register_lhotse_readers()  # Parquet OUTs: lhotse loads their arrays through our reader

        yield from map(deserialize_item, self.dicts())

    def __len__(self) -> int:
        if self._len is None:
            from ..formats.registry import format_of

            self._len = sum(1 for d in self.dirs for r in iter_committed(d)
                            if r.ok and r.source and format_of(r.shard).lhotse_storage(r.shard, r) is not None)
        return self._len


def read_cuts(out_dir: str):
    """A lazy lhotse ``CutSet`` of every committed ok item of OUT (all parts of a job array): cuts are
    built from the manifests while it is iterated, as ``CutSet.from_jsonl_lazy`` reads a file.
    ``.to_eager()`` loads them all; ``mimi-extract cuts OUT -o FILE`` writes them to one file.
    A Shar OUT: lhotse's own ``CutSet.from_shar`` over the committed shards of every part."""
    from ..common.optional import lhotse as _lhotse

    dirs = _cut_run_dirs(remote.absolute(out_dir))
    if read_run(dirs[0]).format == "shar":
        from ..store.read import shar_fields

        return _lhotse().CutSet.from_shar(fields=shar_fields(dirs))
    return _lhotse().CutSet(ManifestCuts(out_dir))


def write_merged_cuts(out_dir: str, path: str, storages: set | None = None) -> int:
    """Write one ``cuts.jsonl.gz`` (or ``.jsonl``) with the cuts of every part of OUT; returns the
    number of cuts.  Written to ``path.tmp`` and renamed, so a reader never sees half a file.
    ``storages``: a set that gets the lhotse storage types the cuts name (ours need
    ``formats.cuts.register_lhotse_readers()`` before lhotse loads them)."""
    if read_run(_cut_run_dirs(out_dir)[0]).format == "shar":
        raise ValueError(f"{out_dir} is a Shar OUT: its cuts are shar/cuts.*.jsonl.gz beside the tars they need; "
                         "read them with mimi_extract.read_cuts(OUT) or lhotse's CutSet.from_shar")
    n = 0
    tmp = path + ".tmp"
    opener = gzip.open if path.endswith(".gz") else builtins.open
    with opener(tmp, "wt", encoding="utf-8") as f:
        for cut in ManifestCuts(out_dir).dicts():
            f.write(json.dumps(cut, ensure_ascii=False) + "\n")
            n += 1
            if storages is not None:
                storages.update(v.get("array", v)["storage_type"] for v in (cut.get("custom") or {}).values()
                                if isinstance(v, dict) and "storage_type" in v.get("array", v))
    os.replace(tmp, path)
    return n


__all__ = ["Reader", "OutDataset", "open", "read", "read_cuts", "write_merged_cuts", "ManifestCuts"]


def megatron_blend(out_dir: str) -> tuple[list[str], list[float]]:
    """Megatron-Core's ``BlendedMegatronDatasetConfig.blend`` of a ``--format megatron`` OUT: (absolute
    shard prefixes, their token counts as weights), from the manifests (never behind them, unlike
    ``megatron-data-args.txt`` after a kill)."""
    from ..formats.megatron import shard_tokens

    dirs = out_files(out_dir)
    info = read_run(dirs[0].path) if dirs else None
    tokens = shard_tokens(out_rows(out_dir, dirs), (info.num_quantizers or 0) if info is not None else 0)
    found = {p: t for p, t in tokens.items() if t}
    base = out_dir.rstrip("/") if remote.is_url(out_dir) else os.path.abspath(out_dir)
    return [remote.join(base, p) if remote.is_url(base) else os.path.join(base, p) for p in found], \
        [float(t) for t in found.values()]
