"""Parquet and Hugging Face ``datasets`` as inputs: a ``.parquet`` file, a folder of them (the Hub's
``data/train-*.parquet`` layout, searched recursively) or a ``datasets`` ``save_to_disk`` folder
(Arrow stream files, memory-mapped).

The audio column is the one whose type is the ``Audio`` feature's storage (a struct of ``bytes``
and ``path``), or ``--audio-column``; ids come from ``--id-column``, else ``<file>/<row>``.  Nothing
is loaded whole: an item holds its file, its row group and its row (``loc``), and whoever encodes it
reads that row group's audio column alone (:func:`_group_column`, a small per-process cache, so
items of one row group read it once).  Planning reads each row group's audio column once to probe
the headers (the cell is the file: its header is inside the bytes); a row group with a page over
the cell limit is read page by page instead (:mod:`.parquet_pages`: a cell over the limit is passed
over, never decoded).  A cell with null bytes but a
``path`` that exists (``Dataset.to_parquet`` of local files stores paths only) is read from that file.
"""

from __future__ import annotations

import io
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace

from ..common import remote
from ..common.optional import pyarrow
from . import parquet_pages
from .base import Source, probe, register
from .items import Entry, Loc, SourceError
from .text import printable, text_problem

PARQUET_EXTENSIONS = (".parquet",)


@dataclass(frozen=True)
class CellLoc(Loc):
    """The audio cell of row ``row`` of row group ``group``, column ``column``; ``name``: the file name
    the cell's struct gives (its ``path``), or "" (then the decoder sniffs the bytes)."""

    group: int
    row: int
    column: str
    name: str


def _files(path: str) -> list[str]:
    """The data files of ``path``: itself, a folder's ``.parquet`` files (recursive, sorted), or a
    ``save_to_disk`` folder's ``.arrow`` files (its ``state.json`` order; every split of a DatasetDict)."""
    import json

    if remote.isfile(path):
        return [path]
    if not remote.isdir(path):  # a pattern: data/train-*.parquet, braces too
        from .tar import shard_list

        return [p for p in shard_list(path, PARQUET_EXTENSIONS) if p.lower().endswith(PARQUET_EXTENSIONS)]
    if remote.isfile(remote.join(path, "state.json")):
        with remote.open_text(remote.join(path, "state.json")) as f:
            state = json.load(f)
        return [remote.join(path, d["filename"]) for d in state.get("_data_files", [])]
    if remote.isfile(remote.join(path, "dataset_dict.json")):
        with remote.open_text(remote.join(path, "dataset_dict.json")) as f:
            splits = json.load(f).get("splits", [])
        return [p for s in splits for p in _files(remote.join(path, s))]
    return [f for f in remote.walk_files(path) if f.lower().endswith(PARQUET_EXTENSIONS)]


def _is_dataset_dir(path: str) -> bool:
    if not remote.isdir(path):
        return False
    if remote.isfile(remote.join(path, "state.json")) or remote.isfile(remote.join(path, "dataset_dict.json")):
        return True
    if remote.is_url(path):  # (one listing of the prefix)
        return any(f.lower().endswith(PARQUET_EXTENSIONS) for f in remote.walk_files(path))
    for dirpath, _dirnames, filenames in os.walk(path):
        if any(f.lower().endswith(PARQUET_EXTENSIONS) for f in filenames):
            return True
        if len(dirpath) - len(path) > 200:
            break
    return False


class _Data:
    """One data file's row groups: Parquet row groups, or an Arrow stream file as a single group."""

    def __init__(self, path: str):
        pa = pyarrow("Parquet inputs")
        self.path = path
        self.arrow = path.lower().endswith(".arrow")
        if self.arrow:  # zero-copy, memory-mapped (an object: read whole)
            stream = remote.open_input(path) if remote.is_url(path) else pa.memory_map(path, "r")
            self.table = pa.ipc.open_stream(stream).read_all()
            self.schema, self.groups = self.table.schema, [self.table.num_rows]
        else:
            import pyarrow.parquet as pq

            # a buffered stream, not pre-buffered column chunks: pyarrow then holds no copy of the
            # chunk's raw bytes beside its decoded column (a 200 MB cell's group: 0.62 GiB to read, 0.82 before)
            # (an object: through its fsspec file, ranged GETs of the footer and the chunks read)
            source = remote.open_input(path) if remote.is_url(path) else path
            self.file = pq.ParquetFile(source, memory_map=False, pre_buffer=False, buffer_size=1 << 20)
            self.schema = self.file.schema_arrow
            md = self.file.metadata
            self.groups = [md.row_group(i).num_rows for i in range(md.num_row_groups)]

    def read(self, group: int, columns: list[str]):
        if self.arrow:
            return self.table.select(columns)
        return self.file.read_row_group(group, columns=columns)


def audio_column(schema, wanted: str | None) -> str | None:
    """The audio column: ``wanted``, else the first struct with ``bytes`` (binary) and ``path``."""
    pa = pyarrow("Parquet inputs")
    if wanted:
        return wanted if wanted in schema.names else None
    for field in schema:
        t = field.type
        if pa.types.is_struct(t):
            names = {t.field(i).name: t.field(i).type for i in range(t.num_fields)}
            if "bytes" in names and "path" in names and (
                    pa.types.is_binary(names["bytes"]) or pa.types.is_large_binary(names["bytes"])):
                return field.name
    return None


@dataclass
class PageCells:
    """A row group's audio column read page by page (:mod:`.parquet_pages`), because a page of it is
    over the cell limit: ``cells.values[row]`` the cell's bytes, None, or the size of a cell over the
    limit (never held); ``paths[row]``: its struct's ``path`` (None: no path, or a null struct)."""

    cells: parquet_pages.Cells
    paths: list

    @property
    def nbytes(self) -> int:
        return self.cells.nbytes


def _read_column(path: str, group: int, column: str):
    """One row group's audio column: read by pyarrow, unless a page of the column's bytes is over the
    cell limit (it may hold a cell over it, which pyarrow would decode with the whole page: 3-5x the
    cell): then page by page, the cells over the limit passed over (:class:`PageCells`; a chunk this
    reader does not know: pyarrow, as before).  On object storage, where each page header would be
    a ranged GET, a column chunk over the limit is read page by page at once (its bytes read once)."""
    data = _Data(path)
    if not data.arrow:
        pa = pyarrow("Parquet inputs")
        kind = data.schema.field(column).type
        struct = pa.types.is_struct(kind)
        try:
            leaf, limit = (f"{column}.bytes" if struct else column), max_cell_bytes()
            if parquet_pages.Chunk.of(data.file, group, leaf).uncompressed_size > limit if remote.is_url(path) \
                    else parquet_pages.over_limit(path, data.file, group, leaf, limit):
                cells = parquet_pages.read_cells(path, data.file, group, leaf, limit)
                paths = [None] * len(cells.values)
                if struct and kind.get_field_index("path") >= 0:
                    named = data.read(group, [f"{column}.path"]).column(column)
                    paths = [v.get("path") if v else None for v in named.to_pylist()]
                return PageCells(cells, paths)
        except Exception:  # (a chunk it does not know, or cannot read: pyarrow reads it, or says what is wrong)
            pass
    return data.read(group, [column]).column(column)


_CACHE: OrderedDict = OrderedDict()
_CACHE_LOCK = threading.Lock()
_READING: dict = {}  # key -> lock held by the thread reading that row group
_CACHE_GROUPS = 4  # row groups kept per process (workers decode a few items of one group in a row)
_CACHE_BYTES = 256 << 20  # ... and no more bytes than this beyond the newest one (one cell can be 100s of MB)


def _group_column(path: str, group: int, column: str):
    """The audio column of one row group (cached per process, a few groups; keyed by the file's
    size and mtime too, so a rewritten file is read again): pyarrow's, or :class:`PageCells` where a
    page of it is over the cell limit."""
    key = (path, *remote.version(path), group, column, max_cell_bytes())  # (the limit: what PageCells kept)
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
        reading = _READING.setdefault(key, threading.Lock())
    with reading:  # threads wanting the same group (planning probes 16 at a time) read it once
        with _CACHE_LOCK:
            if key in _CACHE:
                return _CACHE[key]
        try:
            col = _read_column(path, group, column)
        except BaseException:
            with _CACHE_LOCK:
                _READING.pop(key, None)
            raise
        with _CACHE_LOCK:
            _CACHE[key] = col
            _READING.pop(key, None)
            while len(_CACHE) > _CACHE_GROUPS or (len(_CACHE) > 1 and sum(c.nbytes for c in _CACHE.values())
                                                  > _CACHE_BYTES + col.nbytes):
                _CACHE.popitem(last=False)
        return col


# The largest audio cell taken (bytes as stored: the encoded file).  A cell is copied out of its row
# group (once) and decoded; a larger one is an error row before either, its size read from the
# column's offsets.  128 MiB: a 23-min 48 kHz stereo WAV, hours of FLAC or MP3.
MAX_CELL_ENV = "MIMI_EXTRACT_MAX_CELL_MB"


def max_cell_bytes() -> int:
    try:
        return int(float(os.environ.get(MAX_CELL_ENV, "128")) * (1 << 20))
    except ValueError:
        return 128 << 20


class CellTooLarge(SourceError):
    """An audio cell over :func:`max_cell_bytes` (its error row says how to raise the limit)."""


def _too_large(size: int, limit: int, about: str = "") -> CellTooLarge:
    return CellTooLarge(f"audio cell of {about}{size / (1 << 20):.1f} MiB is over the {limit / (1 << 20):g} MiB "
                        f"limit of one Parquet cell (set {MAX_CELL_ENV} to raise it)")


class CellView(io.RawIOBase):
    """A cell's bytes as a read-only seekable file, read in place from the row group's Arrow buffer
    (no copy of a 300 MB cell into a Python ``bytes``); ``name``: what the decoder is told."""

    def __init__(self, buffer, name: str):
        super().__init__()
        self.buffer, self.view, self.pos, self.name = buffer, memoryview(buffer).cast("B"), 0, name

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, out) -> int:
        n = max(0, min(len(out), len(self.view) - self.pos))
        out[:n] = self.view[self.pos: self.pos + n]
        self.pos += n
        return n

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = max(0, {0: 0, 1: self.pos, 2: len(self.view)}[whence] + pos)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def close(self) -> None:
        self.view.release()
        super().close()


def _group_bound(path: str, group: int, column: str) -> int | None:
    """The stored size of a one-row row group's audio bytes, from the footer alone (None: not
    known so): a cell that large is refused before its row group is read."""
    if remote.is_url(path) or path.lower().endswith(".arrow"):
        return None
    try:
        import pyarrow.parquet as pq

        md = pq.ParquetFile(path).metadata.row_group(group)
        if md.num_rows != 1:
            return None
        leaves = [md.column(i) for i in range(md.num_columns)]
        sizes = [c.total_uncompressed_size for c in leaves if c.path_in_schema in (column, f"{column}.bytes")]
        return sizes[0] if sizes else None
    except Exception:  # (the read that follows says what is wrong with the file)
        return None


def _cell(path: str, group: int, row: int, column: str) -> tuple[object | None, str | None]:
    """(the cell's bytes as an Arrow buffer, its struct's path) of one cell; :class:`CellTooLarge`
    before the bytes are read (a one-row row group: its size from the footer) or used (any other:
    from the column's offsets) when they are over the limit."""
    pa = pyarrow("Parquet inputs")
    limit = max_cell_bytes()
    bound = _group_bound(path, group, column)
    if bound is not None and bound > limit + (1 << 16):  # (the chunk's page headers and levels: a few bytes)
        raise _too_large(bound, limit, "about ")
    col = _group_column(path, group, column)
    if isinstance(col, PageCells):
        value = col.cells.values[row]
        if isinstance(value, int):
            raise _too_large(value, limit)
        return (None if value is None else pa.py_buffer(value)), col.paths[row]
    for chunk in col.chunks:
        if row < len(chunk):
            break
        row -= len(chunk)
    binary = chunk.field("bytes") if pa.types.is_struct(chunk.type) else chunk
    path_value = None
    if pa.types.is_struct(chunk.type) and chunk[row].is_valid and "path" in [f.name for f in chunk.type]:
        path_value = chunk.field("path")[row].as_py()
    if not (chunk[row].is_valid and binary[row].is_valid):
        return None, path_value
    import pyarrow.compute as pc

    size = pc.binary_length(binary.slice(row, 1))[0].as_py()  # from the offsets: nothing copied
    if size > limit:
        raise _too_large(size, limit)
    return binary[row].as_buffer(), path_value


def kept_columns(schema, keep, skip) -> list[str]:
    """The columns whose values items carry (``--keep-columns``): by default the scalar ones
    (strings, numbers, booleans); never the audio or id column (``skip``) nor any holding bytes."""
    pa = pyarrow("Parquet inputs")

    def scalar(t) -> bool:
        if pa.types.is_dictionary(t):  # a datasets ClassLabel-like or categorical column: its values
            return scalar(t.value_type)
        return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t) or \
            pa.types.is_floating(t) or pa.types.is_boolean(t)

    return [f.name for f in schema if f.name not in skip and "binary" not in str(f.type)
            and keep.wants(f.name, scalar(f.type))]


@register
class ParquetSource(Source):
    """Parquet / Hugging Face datasets; see the module docstring."""

    kind = "parquet"
    detect_order = 50
    loc_type = CellLoc

    @classmethod
    def detect(cls, path: str) -> bool:
        if remote.isfile(path):
            return path.lower().endswith(PARQUET_EXTENSIONS)
        if not remote.exists(path):
            from .tar import is_shard_input

            return is_shard_input(path, PARQUET_EXTENSIONS)
        return _is_dataset_dir(path)

    def files(self) -> list[str]:
        if not hasattr(self, "_files"):
            files = _files(self.path)
            if not files:
                raise FileNotFoundError(f"no .parquet files in {self.path}")
            self._files = files
        return self._files

    def entries(self, warnings: list[str]) -> list[Entry]:
        files = self.files()
        folder = remote.isdir(self.path)
        entries, columns_found, present = [], 0, set()
        from .tar import shown_names

        names = [remote.relpath(p, self.path) for p in files] if folder \
            else shown_names(files)  # file names (paths when two files share one)
        for path, shown in self.mine(list(zip(files, names))):  # (names: over every file)
            full = remote.absolute(path)
            try:
                data = _Data(full)
            except Exception as e:  # not Parquet, bad footer
                entries.append(Entry(full, shown, key=shown, where=shown, kind=self.kind,
                                     error=f"{shown}: cannot read ({type(e).__name__}: {e})"))
                continue
            column = audio_column(data.schema, self.options.audio_column)
            if column is None:
                what = f"--audio-column {self.options.audio_column!r}: {shown} has no such column" \
                    if self.options.audio_column else f"{shown}: no audio column (a struct of bytes and path, the " \
                    "Audio feature); name one with --audio-column"
                entries.append(Entry(full, shown, key=shown, where=shown, kind=self.kind, error=f"{what} "
                                     f"(columns: {', '.join(data.schema.names)})"))
                continue
            columns_found += 1
            id_column = self.options.id_column
            if id_column and id_column not in data.schema.names:
                raise ValueError(f"--id-column {id_column!r}: {shown} has no such column "
                                 f"(columns: {', '.join(data.schema.names)})")
            kept = kept_columns(data.schema, self.options.keep, (column, id_column))
            present.update(kept)
            base = 0
            for group, rows in enumerate(data.groups):
                ids = metas = None
                if id_column:
                    try:
                        ids = data.read(group, [id_column]).column(id_column).to_pylist()
                    except Exception as e:
                        ids = e
                if kept:  # the row's metadata (text, speaker...): --keep-columns
                    try:
                        metas = data.read(group, kept).to_pylist()
                    except Exception as e:
                        metas = e
                for row in range(rows):
                    n = base + row
                    key, where = f"{shown}/{n}", f"{shown}:row {n}"
                    entry = Entry(full, key, key=key, where=where, kind=self.kind, loc=CellLoc(group, row, column, ""))
                    if isinstance(metas, Exception):
                        entry.error = f"row group {group} unreadable: {type(metas).__name__}: {metas}"
                    elif metas is not None:
                        try:
                            entry.meta = self.options.keep.pick(metas[row])
                        except ValueError as e:  # over the bounds a row's fields may take
                            entry.error = str(e)
                    if isinstance(ids, Exception):
                        entry.error = f"row group {group} unreadable: {type(ids).__name__}: {ids}"
                    elif ids is not None:
                        ident = ids[row]
                        if ident in (None, ""):
                            entry.error = f"null {id_column!r}"
                        elif problem := text_problem(str(ident)):
                            entry.key, entry.error = printable(str(ident)), f"id {problem}"
                        else:
                            entry.key = str(ident)
                    entries.append(entry)
                base += rows
        if not columns_found:
            raise ValueError(entries[0].error if entries else f"no data in {self.path}")
        missing = [n for n in self.options.keep.names if n not in present]
        if missing:
            raise ValueError(f"--keep-columns {missing[0]!r}: no such column in {self.path} (or it holds bytes)")
        return entries

    def probe(self, entry: Entry, channel_mode: str, framing):
        """Probe from the cell's bytes; a null cell with an existing ``path`` becomes that file."""
        if entry.error is None:
            try:
                data, path = _cell(entry.path, entry.loc.group, entry.loc.row, entry.loc.column)
            except CellTooLarge as e:
                entry.error = str(e)
            except Exception as e:
                entry.error = f"row group {entry.loc.group} unreadable: {type(e).__name__}: {e}"
            else:
                name = path or ""
                if data is None:
                    local = self._local(entry.path, path)
                    if local is None:
                        entry.error = "null audio bytes" + (f" (path {path!r} not found)" if path else "")
                    else:
                        entry.kind, entry.loc, entry.path = "file", None, local
                else:
                    entry.loc = replace(entry.loc, name=name)
        return probe(entry, channel_mode, framing)

    @staticmethod
    def _local(data_file: str, path: str | None) -> str | None:
        if not path:
            return None
        full = path if os.path.isabs(path) else os.path.join(os.path.dirname(data_file), path)
        return full if os.path.isfile(full) else None

    def input_shards(self) -> list[str]:
        return [remote.absolute(f) for f in self.files()]

    def identity(self) -> dict:
        return {"files": [remote.identity(f) for f in self.mine(self.files())]}

    @staticmethod
    def open(entry):
        group, row, column, name = entry.loc.values()
        try:
            data, _ = _cell(entry.path, int(group), int(row), column)
        except SourceError:
            raise
        except FileNotFoundError as e:
            raise SourceError(f"{entry.path}: file not found") from e
        except Exception as e:
            raise SourceError(f"row group {group} unreadable: {type(e).__name__}: {e}") from e
        if data is None:
            raise SourceError("null audio bytes")
        return io.BufferedReader(CellView(data, name or ""), 1 << 16)
