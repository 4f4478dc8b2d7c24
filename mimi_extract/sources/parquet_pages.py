"""A Parquet column chunk read page by page without pyarrow, for the one case pyarrow cannot bound:
a row group whose audio column holds a cell over ``MIMI_EXTRACT_MAX_CELL_MB`` beside other rows.

pyarrow reads a row group's column whole (the footer gives no per-row size, and the pinned pyarrow
exposes neither page headers nor the page index), and its writer puts up to 1,024 values in one
data page, so refusing a 300 MB cell that shares its row group cost what reading it does (3-5x the
cell).  Here each page's header is read (the Thrift compact protocol: :func:`page_headers`, a few
bytes per page, no value read): a page whose uncompressed size is within the limit holds only cells
within it, so a row group whose pages all are is left to pyarrow as before.  Otherwise
:func:`read_cells` walks the chunk's pages: the levels say which rows are null, and each
PLAIN-encoded value's 4-byte length comes before its bytes, so a value over the limit is passed
over (its size kept: the error row says it), never held; the others are copied out.  A page is
streamed through its codec where the codec streams (none, gzip, zstd, brotli: memory is the kept
cells and a block); a snappy or LZ4 page is decompressed whole (memory: the page, stored plus
uncompressed, once).  What this module does not know (another encoding, repeated levels, a codec
it cannot decompress) raises :class:`Unsupported`, and the caller reads the row group with
pyarrow as before.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

from ..common import remote
from ..common.optional import pyarrow

# PageType
DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 1, 2, 3
# Encoding
PLAIN, PLAIN_DICTIONARY, RLE, BIT_PACKED, RLE_DICTIONARY = 0, 2, 3, 4, 8

_HEADER_READ = 1 << 12  # bytes read for a page header at first (statistics can make it longer: read more)
_HEADER_MAX = 1 << 24  # a header longer than this is not one
_SKIP_BLOCK = 1 << 20  # a value passed over is read (and dropped) this much at a time


class Unsupported(Exception):
    """A chunk this module does not read (the caller falls back to pyarrow)."""


class _Short(Exception):
    """The buffer ended inside a Thrift structure (read more of the file)."""


class _Compact:
    """A reader of the Thrift compact protocol (the encoding of Parquet's page headers): structures
    as ``{field id: value}``, nested structures as dicts, lists as lists, binary as bytes."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise _Short
        self.pos += 1
        return self.data[self.pos - 1]

    def varint(self) -> int:
        result = shift = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 70:
                raise Unsupported("a Thrift varint over 10 bytes")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise _Short
        self.pos += n
        return self.data[self.pos - n: self.pos]

    def value(self, kind: int):
        if kind in (1, 2):  # a bool field: its value is its type
            return kind == 1
        if kind == 3:
            return struct.unpack("b", self.take(1))[0]
        if kind in (4, 5, 6):
            return self.zigzag()
        if kind == 7:
            return struct.unpack("<d", self.take(8))[0]
        if kind == 8:
            return self.take(self.varint())
        if kind in (9, 10):
            head = self.byte()
            size, elem = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            return [self.element(elem) for _ in range(size)]
        if kind == 11:
            size = self.varint()
            types = self.byte() if size else 0
            return {self.element(types >> 4): self.element(types & 0x0F) for _ in range(size)}
        if kind == 12:
            return self.struct()
        raise Unsupported(f"Thrift compact type {kind}")

    def element(self, kind: int):
        """A list's or map's element (a bool there is a byte: every element takes one at least)."""
        return self.byte() == 1 if kind in (1, 2) else self.value(kind)

    def struct(self) -> dict:
        fields, last = {}, 0
        while True:
            head = self.byte()
            kind = head & 0x0F
            if kind == 0:
                return fields
            delta = head >> 4
            last = last + delta if delta else self.zigzag()
            fields[last] = self.value(kind)


@dataclass(frozen=True)
class PageHeader:
    """One page of a column chunk, from its header: where it starts (``offset``) and its data
    starts, its sizes, its values.

    ``num_values``: a data page's values, nulls included (its rows, for a column that repeats
    nothing), or a dictionary page's entries; ``levels_size``: a v2 data page's level bytes (stored
    uncompressed before its values); ``compressed``: whether its data went through the codec."""

    kind: int
    offset: int
    data_offset: int
    compressed_size: int
    uncompressed_size: int
    num_values: int
    encoding: int
    levels_size: int = 0
    rep_levels_size: int = 0
    compressed: bool = True
    level_encoding: int = RLE

    @staticmethod
    def parse(fields: dict, offset: int, data_offset: int) -> PageHeader:
        kind, uncompressed, stored = fields.get(1), fields.get(2), fields.get(3)
        if not all(isinstance(v, int) and 0 <= v < 1 << 31 for v in (kind, uncompressed, stored)):
            raise Unsupported("a page header without its type or sizes")
        sub = fields.get({DATA_PAGE: 5, DICTIONARY_PAGE: 7, DATA_PAGE_V2: 8}.get(kind, 6), {})
        if kind == DATA_PAGE_V2:
            reps, defs = sub.get(6, 0), sub.get(5, 0)
            return PageHeader(kind, offset, data_offset, stored, uncompressed, sub.get(1, 0), sub.get(4, PLAIN),
                              reps + defs, reps, sub.get(7, True))
        return PageHeader(kind, offset, data_offset, stored, uncompressed, sub.get(1, 0), sub.get(2, PLAIN),
                          level_encoding=sub.get(3, RLE))


def page_headers(handle, start: int, end: int) -> list[PageHeader]:
    """The headers of the pages between ``start`` and ``end`` (a column chunk) of a file ``handle``
    (:func:`remote.open_object`): each header read, its page's data passed over."""
    pages, pos = [], start
    while pos < end:
        size = _HEADER_READ
        while True:
            data = remote.pread(handle, pos, min(size, end - pos))
            reader = _Compact(data)
            try:
                fields = reader.struct()
                break
            except _Short:
                if len(data) < min(size, end - pos) or size >= _HEADER_MAX or size >= end - pos:
                    raise Unsupported(f"a page header at byte {pos} runs past its column chunk")
                size *= 4
        page = PageHeader.parse(fields, pos, pos + reader.pos)
        pages.append(page)
        pos = page.data_offset + page.compressed_size
    if pos != end:
        raise Unsupported(f"the column chunk's pages end at byte {pos}, not at {end}")
    return pages


@dataclass(frozen=True)
class Chunk:
    """Where a row group's leaf column is, from the footer: its byte range, codec, levels, and
    number of values (the rows, for a leaf that repeats nothing)."""

    start: int
    end: int
    codec: str
    max_def: int
    max_rep: int
    num_values: int
    physical: str
    uncompressed_size: int

    @staticmethod
    def of(parquet_file, group: int, leaf: str) -> Chunk:
        """``leaf``: the column's dotted path (``audio.bytes``); :class:`Unsupported` if none."""
        md = parquet_file.metadata.row_group(group)
        for i in range(md.num_columns):
            col = md.column(i)
            if col.path_in_schema == leaf:
                schema = parquet_file.schema.column(i)
                offsets = [col.data_page_offset]
                if col.has_dictionary_page and col.dictionary_page_offset:
                    offsets.append(col.dictionary_page_offset)
                start = min(offsets)
                return Chunk(start, start + col.total_compressed_size, col.compression,
                             schema.max_definition_level, schema.max_repetition_level, col.num_values,
                             col.physical_type, col.total_uncompressed_size)
        raise Unsupported(f"no column {leaf!r}")


class _Range(io.RawIOBase):
    """Bytes ``start``..``end`` of a file handle, as a stream (what a streaming codec reads)."""

    def __init__(self, handle, start: int, end: int):
        super().__init__()
        self.handle, self.pos, self.end = handle, start, end

    def readable(self) -> bool:
        return True

    def readinto(self, out) -> int:
        data = remote.pread(self.handle, self.pos, max(0, min(len(out), self.end - self.pos)))
        out[:len(data)] = data
        self.pos += len(data)
        return len(data)

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:  # (relative to the range's start: what a skip needs)
        if whence != 1:
            raise io.UnsupportedOperation("a page's range is only skipped forward")
        self.pos = min(self.end, self.pos + pos)
        return self.pos


_STREAMING = {"GZIP": "gzip", "ZSTD": "zstd", "BROTLI": "brotli"}  # Parquet codec -> Arrow's streaming codec
_WHOLE = {"SNAPPY": "snappy", "LZ4": "lz4_raw", "LZ4_RAW": "lz4_raw"}  # ... and those decompressed whole


class _Stream:
    """A page's data as a stream that reads and skips exactly (an error where it ends early)."""

    def __init__(self, raw):
        self.raw = raw

    def read(self, n: int) -> bytes:
        parts, left = [], n
        while left:
            part = self.raw.read(left)
            if not part:
                raise Unsupported(f"a page ends {left} bytes early")
            parts.append(part)
            left -= len(part)
        return b"".join(parts) if len(parts) != 1 else parts[0]

    def skip(self, n: int) -> None:
        if self.raw.seekable():  # (uncompressed, or decompressed whole: nothing read to pass a value over)
            before = self.raw.tell()
            try:
                moved = self.raw.seek(n, 1) - before
            except OSError:  # (pyarrow's buffer: past its end)
                moved = -1
            if moved != n:
                raise Unsupported(f"a page ends {n} bytes early")
            return
        while n:
            n -= len(self.read(min(n, _SKIP_BLOCK)))


def _open_data(handle, page: PageHeader, codec: str, start: int, stored: int, uncompressed: int) -> _Stream:
    """The decompressed stream of ``stored`` bytes at ``start`` (``uncompressed`` once decompressed)."""
    pa = pyarrow("Parquet inputs")
    if codec == "UNCOMPRESSED" or not page.compressed:
        return _Stream(io.BufferedReader(_Range(handle, start, start + stored), _SKIP_BLOCK))
    if codec in _STREAMING:
        raw = pa.PythonFile(_Range(handle, start, start + stored), mode="r")
        return _Stream(pa.CompressedInputStream(raw, _STREAMING[codec]))
    if codec in _WHOLE:
        try:
            # (malloc's memory, not pyarrow's pool: a freed page goes back to the system, not kept in the RSS)
            data = pa.Codec(_WHOLE[codec]).decompress(remote.pread(handle, start, stored), uncompressed,
                                                      memory_pool=pa.system_memory_pool())
        except Exception as e:  # (Hadoop-framed LZ4: pyarrow reads it)
            raise Unsupported(f"{codec} page: {e}")
        return _Stream(pa.BufferReader(data))
    raise Unsupported(f"codec {codec}")


def _hybrid(stream: _Stream, size: int, width: int, count: int) -> list[int]:
    """``count`` values of the RLE / bit-packed hybrid encoding (levels, dictionary indices), from
    ``size`` bytes of ``stream``."""
    data, pos, out = stream.read(size), 0, []
    mask = (1 << width) - 1
    while len(out) < count:
        if pos >= len(data):
            raise Unsupported("RLE levels end early")
        header = shift = 0
        while True:
            b = data[pos]
            pos += 1
            header |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        nbytes = (header >> 1) * width if header & 1 else (width + 7) // 8
        if pos + nbytes > len(data):  # (a run is never longer than its bytes: nothing allocated for a false one)
            raise Unsupported("RLE levels end early")
        left = count - len(out)
        if header & 1:  # bit-packed: groups of 8 values
            bits = int.from_bytes(data[pos: pos + nbytes], "little")
            out.extend((bits >> (i * width)) & mask for i in range(min((header >> 1) * 8, left)))
        else:  # a run of one value
            out.extend([int.from_bytes(data[pos: pos + nbytes], "little")] * min(header >> 1, left))
        pos += nbytes
    return out


@dataclass
class Cells:
    """One row group's cells of a binary leaf: ``values[row]`` is the cell's bytes, None (a null),
    or an int, the size of a cell over the limit (passed over, never held)."""

    values: list

    @property
    def nbytes(self) -> int:
        return sum(len(v) for v in self.values if isinstance(v, bytes))


def _plain_values(stream: _Stream, count: int, limit: int) -> list:
    """``count`` PLAIN byte arrays: each kept, or its size if over ``limit`` (passed over)."""
    out = []
    for _ in range(count):
        (size,) = struct.unpack("<I", stream.read(4))
        if size > limit:
            stream.skip(size)
            out.append(size)
        else:
            out.append(stream.read(size))
    return out


def _data_page(handle, page: PageHeader, chunk: Chunk, dictionary: list | None, limit: int) -> list:
    """The cells of one data page (v1 or v2), nulls as None."""
    width = chunk.max_def.bit_length()
    if page.kind == DATA_PAGE:
        stream = _open_data(handle, page, chunk.codec, page.data_offset, page.compressed_size, page.uncompressed_size)
        defs = [chunk.max_def] * page.num_values
        if chunk.max_def:
            if page.level_encoding != RLE:
                raise Unsupported(f"definition levels encoded {page.level_encoding}")
            (size,) = struct.unpack("<I", stream.read(4))
            defs = _hybrid(stream, size, width, page.num_values)
    else:
        levels = _Stream(io.BytesIO(remote.pread(handle, page.data_offset, page.levels_size)))
        defs = _hybrid(levels, page.levels_size, width, page.num_values) if chunk.max_def else \
            [0] * page.num_values
        stream = _open_data(handle, page, chunk.codec, page.data_offset + page.levels_size,
                            page.compressed_size - page.levels_size, page.uncompressed_size - page.levels_size)
    present = sum(1 for d in defs if d == chunk.max_def)
    if page.encoding == PLAIN:
        values = _plain_values(stream, present, limit)
    elif page.encoding in (PLAIN_DICTIONARY, RLE_DICTIONARY) and dictionary is not None:
        bit_width = stream.read(1)[0] if present else 0
        rest = page.uncompressed_size - (page.levels_size if page.kind == DATA_PAGE_V2 else 0)
        indices = _hybrid_rest(stream, bit_width, present, rest)
        if any(i >= len(dictionary) for i in indices):
            raise Unsupported("a dictionary index past the dictionary")
        values = [dictionary[i] for i in indices]
    else:
        raise Unsupported(f"encoding {page.encoding} of a data page")
    it = iter(values)
    return [next(it) if d == chunk.max_def else None for d in defs]


def _hybrid_rest(stream: _Stream, width: int, count: int, bound: int) -> list[int]:
    """Dictionary indices: the hybrid encoding up to the page's end (its length is not stored)."""
    data = bytearray()
    while True:
        part = stream.raw.read(1 << 16)
        if not part:
            break
        data += part
        if len(data) > bound:
            raise Unsupported("dictionary indices longer than their page")
    return _hybrid(_Stream(io.BytesIO(bytes(data))), len(data), width, count) if count else []


def read_cells(path: str, parquet_file, group: int, leaf: str, limit: int) -> Cells:
    """Every row's cell of ``leaf`` (a BYTE_ARRAY column that repeats nothing) in row group ``group``,
    page by page: cells over ``limit`` are passed over (their size kept).  :class:`Unsupported`: read
    it with pyarrow instead."""
    chunk = Chunk.of(parquet_file, group, leaf)
    if chunk.max_rep or chunk.physical != "BYTE_ARRAY":
        raise Unsupported(f"{leaf}: {chunk.physical}, repetition level {chunk.max_rep}")
    handle = remote.open_object(path)
    try:
        dictionary, values = None, []
        for page in page_headers(handle, chunk.start, chunk.end):
            if page.kind == DICTIONARY_PAGE:
                if page.encoding not in (PLAIN, PLAIN_DICTIONARY):
                    raise Unsupported(f"dictionary page encoding {page.encoding}")
                stream = _open_data(handle, page, chunk.codec, page.data_offset, page.compressed_size,
                                    page.uncompressed_size)
                dictionary = _plain_values(stream, page.num_values, limit)
            elif page.kind in (DATA_PAGE, DATA_PAGE_V2):
                if len(values) + page.num_values > chunk.num_values:  # (before any list of that length)
                    raise Unsupported(f"pages of more values than the footer's {chunk.num_values}")
                values.extend(_data_page(handle, page, chunk, dictionary, limit))
    finally:
        handle.close()
    if len(values) != chunk.num_values:
        raise Unsupported(f"{len(values)} values in the pages, {chunk.num_values} in the footer")
    return Cells(values)


def over_limit(path: str, parquet_file, group: int, leaf: str, limit: int) -> bool:
    """Whether a page of ``leaf``'s chunk in row group ``group`` is over ``limit`` uncompressed (it may
    hold a cell over the limit; a page within it holds none).  The footer answers no for a chunk
    within it; otherwise the page headers are read."""
    chunk = Chunk.of(parquet_file, group, leaf)
    if chunk.uncompressed_size <= limit:
        return False
    with remote.open_object(path) as handle:
        return any(p.uncompressed_size > limit for p in page_headers(handle, chunk.start, chunk.end)
                   if p.kind != INDEX_PAGE)
