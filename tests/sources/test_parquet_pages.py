"""mimi_extract/sources/parquet_pages.py, the page-by-page reader of a Parquet binary column (what
refuses an over-limit cell that shares its row group without decoding it), against pyarrow: files
pyarrow writes in every shape it writes pages in (each codec, data pages v1 and v2, dictionary or
PLAIN, nulls of the struct and of the bytes, many or one value per page, several row groups) must
read cell for cell as pyarrow reads them, cells over the limit as their size; its page headers must
add up to what the footer says of the chunk.  The peak memory of refusing a large shared cell is
tests/sources/test_packed_sources.py's."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mimi_extract.sources import parquet_pages as pages

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CODECS = ["none", "snappy", "gzip", "brotli", "zstd", "lz4"]
DELTA = ("DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY")  # encodings the reader leaves to pyarrow

BYTES = st.one_of(st.binary(max_size=40), st.sampled_from([b"", b"same", b"\0" * 300]),
                  st.tuples(st.binary(min_size=1, max_size=8), st.integers(1, 3000)).map(lambda t: t[0] * t[1]))
CELLS = st.one_of(st.none(), st.builds(lambda b, p: {"bytes": b, "path": p}, st.none() | BYTES,
                                       st.none() | st.text(max_size=6)))
WRITER = st.fixed_dictionaries({
    "data_page_version": st.sampled_from(["1.0", "2.0"]), "use_dictionary": st.booleans(),
    "data_page_size": st.integers(1, 6000), "write_batch_size": st.integers(1, 40),
    "dictionary_pagesize_limit": st.integers(1, 8000), "encoding": st.sampled_from([None, "PLAIN", *DELTA]),
    "max_rows_per_page": st.none() | st.integers(1, 20), "layout": st.sampled_from(["struct", "binary", "large"])})


def write(cells: list, codec: str, options: dict, row_group_size: int):
    """The cells as a Parquet file (in memory) and the audio leaf's dotted path."""
    layout = options["layout"]
    if layout == "struct":
        column = pa.array(cells, pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    else:
        column = pa.array([c and c["bytes"] for c in cells], pa.binary() if layout == "binary" else pa.large_binary())
    leaf = "audio.bytes" if layout == "struct" else "audio"
    extra = {}
    if options["encoding"] and not options["use_dictionary"]:
        extra["column_encoding"] = {leaf: options["encoding"]}
    if options["max_rows_per_page"]:
        extra["max_rows_per_page"] = options["max_rows_per_page"]
    sink = io.BytesIO()
    pq.write_table(pa.table({"audio": column, "n": list(range(len(cells)))}), sink, compression=codec,
                   row_group_size=row_group_size, data_page_version=options["data_page_version"],
                   use_dictionary=options["use_dictionary"], data_page_size=options["data_page_size"],
                   write_batch_size=options["write_batch_size"],
                   dictionary_pagesize_limit=options["dictionary_pagesize_limit"], **extra)
    return sink.getvalue(), leaf


@pytest.mark.parametrize("codec", CODECS)
@SETTINGS
@given(cells=st.lists(CELLS, min_size=1, max_size=30), options=WRITER, data=st.data())
def test_pages_read_as_pyarrow_reads_them(codec, cells, options, data, tmp_path_factory):
    """Every row group's cells, read page by page, equal pyarrow's (a cell over the limit: its
    length; a null struct or null bytes: None); the page headers add up to the footer's sizes and
    value count; a chunk with a cell over the limit has a page over it; only the delta encodings
    (which the reader does not know) are refused, as Unsupported."""
    blob, leaf = write(cells, codec, options, data.draw(st.integers(1, len(cells)), label="row_group_size"))
    limit = data.draw(st.integers(0, 4000), label="limit")
    path = tmp_path_factory.mktemp("pages") / "x.parquet"
    path.write_bytes(blob)
    f = pq.ParquetFile(path)
    for group in range(f.metadata.num_row_groups):
        col = f.read_row_group(group, columns=["audio"]).column("audio").combine_chunks()
        binary = col.field("bytes") if pa.types.is_struct(col.type) else col
        expected = [None if not (col[i].is_valid and binary[i].is_valid) else
                    len(binary[i].as_py()) if len(binary[i].as_py()) > limit else binary[i].as_py()
                    for i in range(len(col))]
        chunk = pages.Chunk.of(f, group, leaf)
        with open(path, "rb") as handle:
            headers = pages.page_headers(handle, chunk.start, chunk.end)
        meta = f.metadata.row_group(group).column(0)
        assert sum(p.data_offset - p.offset + p.uncompressed_size for p in headers) == meta.total_uncompressed_size
        assert sum(p.num_values for p in headers if p.kind in (pages.DATA_PAGE, pages.DATA_PAGE_V2)) == len(col)
        assert (pages.DICTIONARY_PAGE in [p.kind for p in headers]) == meta.has_dictionary_page
        if any(isinstance(v, int) for v in expected):
            assert pages.over_limit(str(path), f, group, leaf, limit)
        try:
            cells_read = pages.read_cells(str(path), f, group, leaf, limit)
        except pages.Unsupported:
            assert options["encoding"] in DELTA and not options["use_dictionary"], options
            continue
        assert cells_read.values == expected


def test_a_header_cut_short_or_pages_past_the_chunk_are_unsupported(tmp_path):
    """A column chunk whose byte range ends inside a page header, or whose pages do not end where the
    chunk does, is refused (the caller reads it with pyarrow), never read past."""
    cells = [{"bytes": b"x" * 100, "path": "a"}] * 3
    blob, leaf = write(cells, "snappy", {"layout": "struct", "encoding": None, "use_dictionary": False,
                                         "data_page_version": "1.0", "data_page_size": 1, "write_batch_size": 1,
                                         "dictionary_pagesize_limit": 1, "max_rows_per_page": None}, 3)
    path = tmp_path / "x.parquet"
    path.write_bytes(blob)
    chunk = pages.Chunk.of(pq.ParquetFile(path), 0, leaf)
    with open(path, "rb") as handle:
        assert len(pages.page_headers(handle, chunk.start, chunk.end)) == 3
        with pytest.raises(pages.Unsupported):
            pages.page_headers(handle, chunk.start, chunk.start + 5)
        with pytest.raises(pages.Unsupported):
            pages.page_headers(handle, chunk.start, chunk.end - 1)


@SETTINGS
@given(options=WRITER, codec=st.sampled_from(CODECS), flips=st.lists(st.tuples(st.floats(0, 1), st.binary(min_size=1,
                                                                                                        max_size=6)),
                                                                       min_size=1, max_size=4))
def test_damaged_pages_are_refused_never_read_past_or_sized_from_their_bytes(options, codec, flips, tmp_path_factory):
    """Whatever bytes of a column chunk are overwritten (page headers, levels, lengths, compressed
    data), reading it page by page ends: with every row's cell, or an exception (the caller then
    leaves the row group to pyarrow); no false count or length makes it allocate or loop for what
    the bytes do not hold."""
    cells = [{"bytes": b"ab" * (i * 40), "path": "p"} if i % 3 else None for i in range(12)]
    blob, leaf = write(cells, codec, options, 12)
    path = tmp_path_factory.mktemp("damaged") / "x.parquet"
    f = pq.ParquetFile(io.BytesIO(blob))
    chunk = pages.Chunk.of(f, 0, leaf)
    damaged = bytearray(blob)
    for where, new in flips:
        at = chunk.start + int(where * (chunk.end - chunk.start - 1))
        damaged[at: at + len(new)] = new[: chunk.end - at]
    path.write_bytes(bytes(damaged))
    try:
        read = pages.read_cells(str(path), f, 0, leaf, 1000)
    except Exception:
        return
    assert len(read.values) == len(cells)
    assert all(v is None or isinstance(v, int) or len(v) <= 1000 for v in read.values)
