r"""The output-format interface: what a format implements, and what the shared code guarantees it.

A *format* decides how the arrays of one shard are laid out in bytes (HDF5 datasets, Parquet rows,
a Shar tar...).  Everything else -- the lock, ``run.json`` identity, the manifest, the commit
protocol, resume with damaged-shard quarantine, the per-item checksums, the key index of the
readers -- is format-agnostic and lives in :mod:`mimi_extract.store`, written once.

Adding a format means one module that defines a :class:`Format` subclass and registers it with
:func:`mimi_extract.formats.register` (see ``formats/__init__.py``); ``--format NAME`` then offers it.

What a format must define
-------------------------
* ``name`` -- the ``--format`` value, recorded in ``run.json``;
* ``shard_re`` -- a regex that *fully* matches the name of a committed shard file (relative to the
  run directory: a plain name, or one under the format's fixed ``folder``) and nothing else.  It
  is also the validation rule for the ``shard`` field of manifest rows (a row naming anything else
  is refused, so OUT's files can never make the tool read or move a file outside OUT), and it
  tells readers which format a shard is in; no two formats' patterns may match the same name;
* ``file_re`` (optional) -- every file name a shard consists of (the shard and any *companion*
  files, see :meth:`Format.companions`); defaults to ``shard_re``;
* ``folder`` (optional) -- the sub-folder of the run directory its shard files live in ("": the
  run directory itself);
* :meth:`Format.shard_name` -- the name of shard number N (it must match ``shard_re``, with N as
  the regex's first group);
* :meth:`Format.builder` -- a new in-memory :class:`ShardBuilder` (see below);
* :meth:`Format.check` -- does a committed shard hold exactly what its manifest rows say?  (resume
  quarantines one that does not);
* :meth:`Format.open`, :meth:`Format.load`, :meth:`Format.attrs` -- the read side;
* optionally: ``taps`` (what it stores: a token format stores codes only, and ``--format X`` with
  ``features`` is refused in one line), ``tokens`` (it takes ``--token-layout``/``--token-offset``),
  :meth:`Format.run_settings` (its own settings, recorded in ``run.json`` and each shard and checked
  on resume), :meth:`Format.require` (say what to install, before a run starts),
  :meth:`Format.item_attrs` (per-item metadata, for ``verify --out``), :meth:`Format.lhotse_storage`
  (how lhotse cuts point at an item: ``cuts.py``), :meth:`Format.companions` and
  :meth:`Format.out_files` (files about OUT as a whole, e.g. Parquet's dataset card).

A format also gets, with no code of its own: parts (``part-I-of-N`` run directories), Ray, signals,
``mimi_extract.read``/``open``/``read_manifest``/``read_cuts``, ``info``, ``status``, ``decode``,
``verify --out`` (with ``--checksums``) and ``--reencode-damaged``; all go through the methods
above.  Its tests: the round-trip, damage and kill -9 tests take every registered format
(``tests/formats/test_formats.py``, ``tests/store/test_integrity.py``), each given what it needs of
the format by its entry in ``tests/support/registered.py`` (where to flip a byte of an item, how to make
a shard unopenable, its own OUT check after a kill); a format with no entry there fails the suite.

A minimal format, for orientation (``formats/hdf5.py`` is the complete one, ~100 lines)::

    @register
    class Npz(Format):
        name = "npz"
        shard_re = re.compile(r"shard-(\d{5,})\.npz")

        def shard_name(self, index): return f"shard-{index:05d}.npz"
        def builder(self, file_attrs): return NpzShard(file_attrs)   # add() keeps arrays; files() -> np.savez bytes
        def check(self, path, rows): ...                            # None, or what is wrong; never raises
        def open(self, path): return np.load(path)
        def load(self, path, row, handle=None): ...                 # (handle or np.load(path))[row.dataset]
        def attrs(self, path): ...

A :class:`ShardBuilder` collects the items of one shard *in memory* and finally returns the
shard's bytes (``files()``): nothing a format does touches OUT, so a full disk or a kill cannot
leave a half-written file that the format's library would then choke on; the shared commit
protocol writes those bytes.

What the shared code guarantees a format
----------------------------------------
* its ``files()`` bytes reach OUT by the commit protocol: each file is written to ``NAME.tmp`` and
  fsynced; the shard's manifest rows are appended and fsynced; the companions and then the shard
  are renamed into place; the directory is fsynced.  An item is committed when its row is in the
  manifest *and* its shard exists under its final name; a kill at any instant leaves either a
  ``.tmp`` (removed on resume) or rows naming a missing shard (dropped on resume), never a shard
  without rows;
* every write error (ENOSPC, EIO, EDQUOT) becomes an :class:`OutputError` naming the file;
* on resume, every committed shard is given to :meth:`Format.check` with its rows; a shard it
  calls damaged (or one no row names) is moved to ``quarantine/`` with its companions and its
  items are encoded again;
* every ok row carries ``checksum`` (crc32 of the time-first array's little-endian bytes, see
  :func:`array_checksum`), checked by every read (``store.read.load_row``), so a format only has to
  store the bytes; any exception from ``load`` becomes a ``DamagedError`` naming OUT, key, shard;
* ``load`` only ever receives rows whose ``shard`` matched ``shard_re``;
* the rows ``check``, ``load``, ``item_attrs`` and ``lhotse_storage`` are handed are typed
  :class:`~mimi_extract.formats.records.StoredRow` (read back and checked by the store): a format
  reads attributes (``row.key``, ``row.frames``, its own ``row.index``...), never a dict's keys.
  The fields a format's ``ShardBuilder.add`` returns are ``StoredRow`` fields too (add a new one
  there, and its JSON type to ``store.manifest``'s row check: a test holds the two lists together).
"""

from __future__ import annotations

import re
import zlib

import numpy as np

from .records import StoredRow


class ShardBuilder:
    """One shard being built in memory.  ``add`` is called once per item (the whole time-first
    array); ``files`` once at the end.  Must be cheap to drop (``abort``: nothing on disk)."""

    def __init__(self, file_attrs: dict):
        self.file_attrs = file_attrs  # the run's settings and provenance, stored in the shard

    def add(self, key: str, data: np.ndarray, row: StoredRow, attrs: dict) -> dict:
        """Store one item.  ``row`` is its manifest row so far (``key``, ``path``, ``duration``,
        ``frames``, ``dataset``...), ``attrs`` per-item metadata (``duration``, ``start``...).
        Returns fields to add to the row (e.g. where the item sits in the shard); may be ``{}``."""
        raise NotImplementedError

    def files(self, shard_name: str) -> dict[str, bytes]:
        """The shard's files (any bytes-like value), relative to the run directory, ``shard_name``
        itself last (the protocol renames in this order: the shard's rename is the commit point)."""
        raise NotImplementedError

    def close(self) -> None:
        """Free what ``add`` holds (called after ``files`` and on abort)."""


class Format:
    """One output format (see the module docstring for what a subclass must define)."""

    name: str = ""
    summary: str = ""  # what ``--format NAME`` writes and what reads it: the CLI's help is made of these
    shard_re: re.Pattern = re.compile(r"(?!)")
    file_re: re.Pattern | None = None
    folder: str = ""
    taps: tuple[str, ...] = ("encoder", "latent", "codes")  # what it can store
    tokens: bool = False  # whether it writes token ids (--token-layout, --token-offset)
    order: int = 100  # where --format offers it (lower first; then in the order modules register)

    def shard_name(self, index: int) -> str:
        raise NotImplementedError

    def for_run(self, file_attrs: dict) -> "Format":
        """This format as one run writes it (the writer calls it with the run's settings); a
        format whose shard names depend on them (Shar: ``mimi_codes`` or ``mimi_latent``) returns
        a configured copy."""
        return self

    def builder(self, file_attrs: dict) -> ShardBuilder:
        raise NotImplementedError

    def run_settings(self, settings, model_config=None) -> dict:
        """This format's own settings of a run (``settings``: the run's ``Settings``): recorded in
        ``run.json`` and in every shard's ``file_attrs``, so that a resume (or another part) that
        changes one is refused, naming it.  ``model_config``: the model's config once it is loaded
        (None for the check made before: it compares what it has).  ValueError for a bad value."""
        return {}

    def require(self) -> None:
        """Raise a RuntimeError saying what to install when the format's library is missing
        (called before a run starts, so it never fails after hours of encoding)."""

    def companions(self, shard: str) -> list[str]:
        """Other files that belong to committed shard ``shard`` (moved with it to quarantine)."""
        return []

    def check(self, path: str, rows: list[StoredRow]) -> str | None:
        """``None`` when the committed shard at ``path`` holds exactly the items ``rows`` name with
        their frame counts; else what is wrong (the shard is then quarantined and redone).  Must
        not raise: an unreadable file is a reason, not an exception."""
        raise NotImplementedError

    def open(self, path: str):
        """A handle on a committed shard for repeated ``load`` calls (readers keep a few open);
        closed with ``close_handle``."""
        raise NotImplementedError

    def close_handle(self, handle) -> None:
        handle.close()

    def load(self, path: str, row: StoredRow, handle=None) -> np.ndarray:
        """The array of one ok row, time first (``[frames, dims]``), exactly as it was added.
        ``handle``: ``open(path)`` already done."""
        raise NotImplementedError

    def attrs(self, path: str) -> dict:
        """The file-level settings stored in a shard (the ``file_attrs`` it was built with)."""
        raise NotImplementedError

    def item_attrs(self, path: str, row: StoredRow) -> dict:
        """Per-item metadata stored with an item (``duration``, ``start``...); ``{}`` if none."""
        return {}

    def key_problem(self, key: str) -> str | None:
        """Why this format cannot store an item keyed ``key`` (the runner makes it an error row
        before encoding), or None."""
        return None

    def lhotse_storage(self, path: str, row: StoredRow) -> tuple[str, str] | None:
        """(lhotse ``storage_type``, ``storage_key``) of an ok row's array in the shard at ``path``,
        for the cuts that point into OUT (``cuts.py``).  The storage type must be a lhotse
        ``FeaturesReader`` name (lhotse's own, or one ``cuts.register_lhotse_readers`` adds).
        ``None``: the format's items get no cut in ``cuts.jsonl.gz`` / ``read_cuts`` (a format that
        is its own lhotse manifest, as Shar is)."""
        return None

    def out_files(self, out_dir: str, info: dict, parts: bool, rows) -> dict[str, str]:
        """Files that describe OUT as a whole (Parquet's dataset card, Megatron's data-args list),
        asked for at the end of every run (an interrupted one too) with OUT, its ``run.json``, whether
        OUT holds the parts of a job array, and ``rows()``: the committed ok rows of every part, their
        ``shard`` relative to OUT (read only if called: the store reads its manifests, a format never
        does).  Name relative to OUT -> text.  The store writes them (atomically, under OUT's lock
        when parts share OUT): a format never writes to OUT itself."""
        return {}

    def is_shard(self, name: str) -> bool:
        return isinstance(name, str) and bool(self.shard_re.fullmatch(name))

    def is_file(self, name: str) -> bool:
        return isinstance(name, str) and bool((self.file_re or self.shard_re).fullmatch(name))


def array_checksum(data: np.ndarray) -> str:
    """``crc32:XXXXXXXX`` of an array's bytes in a canonical form: C order, little-endian, its own
    dtype (int16 codes, float32/float16 features), time first.  zlib's crc32 runs at GB/s and
    needs no dependency; it catches every burst error up to 32 bits and any single flipped byte."""
    a = np.ascontiguousarray(data)
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and np.little_endian is False):
        a = a.astype(a.dtype.newbyteorder("<"))
    return f"crc32:{zlib.crc32(memoryview(a).cast('B')) & 0xFFFFFFFF:08x}"


def jsonable(attrs: dict) -> dict:
    """``file_attrs`` as JSON takes them (numpy scalars as Python numbers)."""
    return {k: (v.item() if isinstance(v, np.generic) else v) for k, v in attrs.items()}


def bytes_checksum(data: bytes) -> str:
    """``crc32:XXXXXXXX`` of raw bytes (what a format stores beside the arrays: a Shar tar's
    ``.json`` member, one line of its cuts file), in the form of :func:`array_checksum`."""
    return f"crc32:{zlib.crc32(data) & 0xFFFFFFFF:08x}"
