"""HDF5 shards: ``shard-NNNNN.h5``, one dataset per ok item (named by ``sources.dataset_name`` of
its key: the row's ``dataset``), time first, with HDF5's fletcher32 checksum filter, the run's settings as file attributes and the item's
(``key``, ``duration``, ``start``...) as dataset attributes.  lhotse reads these datasets in place
(``numpy_hdf5`` storage, ``cuts.py``).

A shard is built in memory (HDF5's ``core`` driver, no backing store) and its file image handed
to the shared commit protocol, so h5py never writes to OUT (it segfaults on a full disk)."""

from __future__ import annotations

import functools
import math
import re
import uuid

import h5py
import numpy as np
from h5py import h5a, h5d, h5p, h5s, h5t
from h5py._hl.filters import guess_chunk  # (h5py's chunk rule: the bytes must be what create_dataset writes)

from ..common import remote
from .base import Format, ShardBuilder
from .records import StoredRow
from .registry import register

LHOTSE_REMOTE_STORAGE = "mimi_extract_hdf5"  # lhotse's numpy_hdf5 for a shard on object storage (cuts.py)


def open_hdf5(path: str) -> h5py.File:
    """A shard open for reading: by name, or (a URL, which h5py cannot open by name) through a file
    object that reads it by ranged GETs (``remote.open_object``): the superblock, the object
    headers and the chunks an item needs, never the whole object."""
    if not remote.is_url(path):
        return h5py.File(path, "r")
    source = remote.open_object(path)
    try:
        f = h5py.File(source, "r")
    except BaseException:
        source.close()
        raise
    f._mimi_source = source  # closed with it (close_hdf5)
    return f


def write_attrs(oid, values: dict) -> None:
    """A new object's attributes (``oid``: its h5py object id, ``File.id`` or a dataset's), every
    string as a fixed-length UTF-8 string, not h5py's default variable-length one. A variable-length
    string lives in HDF5's global heap, which has no checksum: one flipped byte there made HDF5 loop
    forever reading the attribute (7 of the 11,780 byte flips of the demo shard), so a resume or
    ``verify`` hung on that shard. A fixed-length string lives in the object header, whose checksum
    turns every flip into an error (0 hangs, 0 silent changes in all 7,622 flips of the same shard:
    docs/integrity.md). h5py reads them back as bytes; :func:`read_attrs` decodes.

    Written with the low-level calls h5py's ``attrs.create`` makes (the same type, space and value:
    the same bytes, ``tests/formats/test_hdf5_build.py``), without its per-call Python (type
    guessing, shape checks, an existence check: the object is new), which was a third of a codes
    item's writing (issue 40).  Values: strings, bools, ints and floats (what a run's and an item's
    attributes are)."""
    scalar = _scalar_space()
    for name, value in values.items():
        if isinstance(value, str):
            raw = value.encode("utf-8", "surrogateescape")
            size = max(len(raw), 1)  # HDF5 has no zero-length string type
            stored, memory = _string_types(size)
            array = np.array(raw, dtype=f"S{size}")
        else:
            array = np.asarray(value)
            if array.ndim or array.dtype.kind not in "biuf":
                raise TypeError(f"attribute {name!r}: {value!r} is not a string or a number")
            stored, memory = _numeric_types(array.dtype)
        attr = h5a.create(oid, name.encode("utf-8"), stored, scalar)
        try:
            attr.write(array, mtype=memory)
        finally:
            attr.close()


@functools.lru_cache(maxsize=None)
def _numeric_types(dtype: np.dtype):
    """h5py's (stored, in-memory) HDF5 types of a numpy dtype (``h5t.py_create``, logical and
    bit for bit, as ``attrs.create`` and ``create_dataset`` make them), made once per dtype."""
    return h5t.py_create(dtype, logical=True), h5t.py_create(dtype)


@functools.lru_cache(maxsize=4096)
def _string_types(size: int):
    """:func:`_numeric_types` of ``h5py.string_dtype("utf-8", size)``: a fixed-length UTF-8 string."""
    dtype = h5py.string_dtype("utf-8", size)
    return h5t.py_create(dtype, logical=True), h5t.py_create(dtype)


@functools.cache
def _scalar_space():
    """The dataspace of every attribute (a scalar), made once per process: HDF5 copies a dataspace
    into each attribute it creates, so one serves them all.  Made per ``write_attrs`` call, it was an
    HDF5 object and an h5py id (a weakref registration) per item (issue 40)."""
    return h5s.create_simple(())


@functools.lru_cache(maxsize=4096)
def _dataset_creation(shape: tuple[int, ...], itemsize: int, track_order: bool):
    """The dataspace and the dataset creation property list h5py's ``create_dataset(data=...,
    fletcher32=True)`` makes for an array of ``shape`` (its ``filters.fill_dcpl`` and
    ``make_new_dset``): chunked by h5py's own ``guess_chunk`` (an empty array: contiguous, no filter),
    the rest :func:`_dataset_plist_base`'s.  Made once per shape (a shard's items mostly differ in
    length, so a corpus has a few hundred): ``h5d.create`` only reads both (it copies the extent)."""
    plist = _dataset_plist_base(bool(math.prod(shape)), track_order).copy()
    if math.prod(shape):
        plist.set_chunk(guess_chunk(shape, None, itemsize))
    return h5s.create_simple(shape), plist


@functools.lru_cache(maxsize=None)
def _dataset_plist_base(chunked: bool, track_order: bool):
    """What every dataset's creation property list holds but its chunk shape: the fletcher32 filter
    (chunked only), no times, the attributes' creation order tracked only where
    ``h5py.get_config().track_order`` says so (False unless set).  Copied per new shape
    (:func:`_dataset_creation`): a copy and ``set_chunk`` cost 10 µs, a list made afresh 29."""
    plist = h5p.create(h5p.DATASET_CREATE)
    if chunked:
        plist.set_fletcher32()
    plist.set_obj_track_times(False)
    if track_order:
        plist.set_attr_creation_order(h5p.CRT_ORDER_TRACKED | h5p.CRT_ORDER_INDEXED)
    else:
        plist.set_attr_creation_order(0)
    return plist


def read_attrs(attrs: h5py.AttributeManager) -> dict:
    """Attributes as written: fixed-length strings (:func:`write_attrs`) decoded to ``str``, the
    variable-length ones of shards written before 0.3.1 as h5py gives them (``str``)."""
    return {name: value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value
            for name, value in attrs.items()}


def close_hdf5(f: h5py.File) -> None:
    source = getattr(f, "_mimi_source", None)
    f.close()
    if source is not None:
        source.close()


class HDF5Shard(ShardBuilder):
    def __init__(self, file_attrs: dict):
        super().__init__(file_attrs)
        # libver v110 (HDF5 >= 1.10, 2016): its single-chunk index makes fletcher32 free on disk; with
        # the default (1.8) format each small chunked dataset costs a B-tree (measured 2.4x the bytes
        # of 2-20 s codes, against 1.16x here and 1.19x for 1.8 contiguous datasets without a checksum)
        self._h5 = h5py.File(f"mem-{uuid.uuid4().hex}.h5", "w", driver="core", backing_store=False,
                             libver=("v110", "v110"))
        write_attrs(self._h5.id, file_attrs)

    def add(self, key: str, data: np.ndarray, row: StoredRow, attrs: dict) -> dict:
        """The item's dataset, as ``create_dataset(row.dataset, data=data, fletcher32=data.size > 0)``
        makes it, through the same low-level calls (:func:`_dataset_creation`): half of h5py's per-item
        Python was its argument handling, not HDF5 (issue 40).  fletcher32: HDF5's own checksum of
        each chunk, verified by h5py (and lhotse) on every read; it needs a chunked layout, which an
        empty array cannot have."""
        data = np.ascontiguousarray(data)
        space, plist = _dataset_creation(data.shape, data.dtype.itemsize, bool(h5py.get_config().track_order))
        stored, memory = _numeric_types(data.dtype)
        ds = h5d.create(self._h5.id, row.dataset.encode("utf-8"), stored, space, dcpl=plist)
        try:
            ds.write(h5s.ALL, h5s.ALL, data, mtype=memory)  # (the type h5py would make for it: made once)
            write_attrs(ds, {**attrs, "key": key})
        finally:
            ds.close()
        return {}

    def files(self, shard_name: str) -> dict[str, bytes]:
        self._h5.flush()
        return {shard_name: self._h5.id.get_file_image()}

    def close(self) -> None:
        if self._h5 is not None:
            self._h5.close()
            self._h5 = None


@register
class HDF5(Format):
    name = "hdf5"
    summary = "shard-N.h5 (one dataset per item; lhotse cuts read it in place)"
    order = 10
    shard_re = re.compile(r"shard-(\d{5,})\.h5")

    def shard_name(self, index: int) -> str:
        return f"shard-{index:05d}.h5"

    def builder(self, file_attrs: dict) -> ShardBuilder:
        return HDF5Shard(file_attrs)

    def check(self, path: str, rows: list[StoredRow]) -> str | None:
        try:
            f = open_hdf5(path)
            try:
                names = set(f.keys())
                wanted = {r.dataset or r.key: r for r in rows}
                if names != set(wanted):
                    extra, missing = len(names - set(wanted)), len(set(wanted) - names)
                    return f"{missing} datasets missing, {extra} without a manifest row"
                for name, row in wanted.items():
                    if f[name].shape[0] != row.frames:
                        return f"{name}: {f[name].shape[0]} frames, manifest says {row.frames}"
            finally:
                close_hdf5(f)
        except Exception as e:  # truncated, zeroed or not HDF5 at all
            return f"unreadable ({type(e).__name__}: {e})"
        return None

    def open(self, path: str):
        return open_hdf5(path)

    def close_handle(self, handle) -> None:
        close_hdf5(handle)

    def load(self, path: str, row: StoredRow, handle=None) -> np.ndarray:
        if handle is None:
            f = open_hdf5(path)
            try:
                return self.load(path, row, f)
            finally:
                close_hdf5(f)
        data = handle[row.dataset or row.key][()]
        # the file's layout read once per open handle, not per item (an attribute read is h5py's
        # slowest step here: 1.7x the CPU of a whole-OUT read, scripts/bench_report.py)
        if row.shard_checksum:  # written by a version that records it: time first, no attribute read
            return data  # (an attribute read in a damaged attribute index can loop forever in HDF5: docs/object-storage.md)
        transposed = getattr(handle, "_mimi_transposed", None)
        if transposed is None:
            layout = handle.attrs.get("layout", "")
            transposed = handle._mimi_transposed = (layout.decode() if isinstance(layout, bytes) else layout) \
                == "[num_quantizers, frames]"
        return data.T if transposed else data  # outputs of mimi-extract 0.1

    def attrs(self, path: str) -> dict:
        f = open_hdf5(path)
        try:
            return read_attrs(f.attrs)
        finally:
            close_hdf5(f)

    def lhotse_storage(self, path: str, row: StoredRow) -> tuple[str, str]:
        """lhotse's own ``numpy_hdf5``; for a shard on object storage ``mimi_extract_hdf5`` (the same
        read, through a file object: ``cuts.register_lhotse_readers``)."""
        return LHOTSE_REMOTE_STORAGE if remote.is_url(path) else "numpy_hdf5", row.dataset or row.key

    def item_attrs(self, path: str, row: StoredRow) -> dict:
        f = open_hdf5(path)
        try:
            return read_attrs(f[row.dataset or row.key].attrs)
        finally:
            close_hdf5(f)
