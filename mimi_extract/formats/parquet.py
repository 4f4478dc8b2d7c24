"""Parquet shards: ``shard-NNNNN.parquet``, one row per ok item, what Hugging Face ``datasets``,
pyarrow and polars read as is.

Columns: ``key`` (string), the array named by the tap (``codes``: list<list<int16>>, ``latent``
or ``encoder``: list<list<float32|float16>>, time first: one inner list per frame), ``frames``,
``dims``, ``duration``, ``sample_rate``, ``path``, ``start``/``end`` (null unless the item is a
segment) and ``channel`` (null unless one channel of a file was taken).  The run's settings and
provenance are file metadata (key ``mimi_extract``, JSON).  zstd; dictionary encoding for the codes
only; page checksums written (and verified on every read by this module).

Row groups: at most 1000 rows and about 8 MiB of arrays, so a streaming reader (``datasets``
with ``streaming=True``, a DataLoader over row groups) holds a few MiB at a time, and a random
``read(OUT, key)`` decodes one group.  The manifest row's ``index`` is the item's row in the file.

Names: ``shard-NNNNN.parquet``, not ``part-NNNNN.parquet``: the run directories of a job array
are already ``part-I-of-N``, and the two must not be confused (by people or by globs).

pyarrow is imported only when a Parquet shard is written or read."""

from __future__ import annotations

import bisect
import json
import os
import re

import numpy as np

from ..common import remote
from ..config.choices import FIDELITY_FIELDS
from ..config.taps import frame_rate
from ..common.optional import pyarrow
from .base import Format, ShardBuilder, jsonable
from .records import StoredRow
from .registry import register

METADATA_KEY = b"mimi_extract"
LHOTSE_STORAGE = "mimi_extract_parquet"
ROW_GROUP_ROWS = 1000
ROW_GROUP_BYTES = 8 << 20
_NULLABLE = ("start", "end", "channel")
NEEDS = "Parquet shards"  # what pyarrow is imported for (named when it is missing)
CARD_MARK = "<!-- written by mimi-extract; it rewrites this card at the end of each run unless this line is removed -->"


def array_column(tap: str) -> str:
    """The column that holds the arrays: the tap's name (``codes``, ``latent``, ``encoder``)."""
    return tap


class ParquetShard(ShardBuilder):
    def __init__(self, file_attrs: dict):
        super().__init__(file_attrs)
        self.column = array_column(file_attrs.get("tap", "codes"))
        self.arrays: list[np.ndarray] = []
        self.cols: dict[str, list] = {k: [] for k in ("key", "frames", "dims", "duration", "sample_rate", "path",
                                                      *_NULLABLE)}
        # the kept input fields (text, speaker, supervisions...): name -> type, the same in every shard of the run
        self.meta_types: dict[str, str] = json.loads(file_attrs.get("metadata") or "{}")
        self.meta: dict[str, list] = {k: [] for k in self.meta_types}
        if file_attrs.get("fidelity"):  # --fidelity: float64 columns (si_sdr null for a silent input)
            self.cols.update({k: [] for k in FIDELITY_FIELDS})

    def add(self, key: str, data: np.ndarray, row: StoredRow, attrs: dict) -> dict:
        if data.ndim != 2:
            raise ValueError(f"{key}: Parquet shards store [frames, dims] arrays, got shape {data.shape}")
        index = len(self.arrays)
        self.arrays.append(np.ascontiguousarray(data))
        c = self.cols
        c["key"].append(key)
        c["frames"].append(int(data.shape[0]))
        c["dims"].append(int(data.shape[1]))
        c["duration"].append(float(attrs.get("duration", row.duration)))
        c["sample_rate"].append(row.sample_rate)
        c["path"].append(row.path)
        c["start"].append(attrs.get("start"))
        c["end"].append(attrs.get("end"))
        c["channel"].append(row.channel)
        for k in FIDELITY_FIELDS:
            if k in c:
                c[k].append(getattr(row, k))
        meta = row.meta or {}
        for name, kind in self.meta_types.items():
            value = meta.get(name)
            self.meta[name].append(json.dumps(value, ensure_ascii=False) if kind == "json" and value is not None
                                   else value)
        return {"index": index}

    def _array(self):
        """list<list<T>> from the items' [frames, dims] arrays, without a Python loop over frames."""
        pa = pyarrow(NEEDS)
        frames = np.array([a.shape[0] for a in self.arrays], dtype=np.int64)
        dims = np.array([a.shape[1] for a in self.arrays], dtype=np.int64)
        outer = np.concatenate([[0], np.cumsum(frames)]).astype(np.int32)
        inner = np.concatenate([[0], np.cumsum(np.repeat(dims, frames))]).astype(np.int32)
        dtype = self.arrays[0].dtype
        values = np.concatenate([a.reshape(-1) for a in self.arrays]) if self.arrays else np.zeros(0, dtype)
        frames_list = pa.ListArray.from_arrays(pa.array(inner), pa.array(values))
        return pa.ListArray.from_arrays(pa.array(outer), frames_list)

    def files(self, shard_name: str) -> dict[str, bytes]:
        pa = pyarrow(NEEDS)
        pq = pa.parquet
        c = self.cols
        table = pa.table({
            "key": pa.array(c["key"], pa.string()),
            self.column: self._array(),
            "frames": pa.array(c["frames"], pa.int32()),
            "dims": pa.array(c["dims"], pa.int32()),
            "duration": pa.array(c["duration"], pa.float64()),
            "sample_rate": pa.array(c["sample_rate"], pa.int32()),
            "path": pa.array(c["path"], pa.string()),
            "start": pa.array(c["start"], pa.float64()),
            "end": pa.array(c["end"], pa.float64()),
            "channel": pa.array(c["channel"], pa.int32()),
            **{k: pa.array(c[k], pa.float64()) for k in FIDELITY_FIELDS if k in c},
            **{name: pa.array(self.meta[name], _meta_type(kind)) for name, kind in self.meta_types.items()},
        })
        table = table.replace_schema_metadata({METADATA_KEY: json.dumps(jsonable(self.file_attrs))})
        per_row = max(1, sum(a.nbytes for a in self.arrays) // max(1, len(self.arrays)))
        rows = max(1, min(ROW_GROUP_ROWS, ROW_GROUP_BYTES // per_row))
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, row_group_size=rows, compression="zstd", write_page_checksum=True,
                       use_dictionary=["key", "path"] + ([f"{self.column}.list.element.list.element"]
                                                         if self.column == "codes" else []),
                       write_statistics=["key", "frames", "duration"])
        return {shard_name: sink.getvalue()}  # a pyarrow Buffer: bytes-like, not copied again

    def close(self) -> None:
        self.arrays, self.cols, self.meta = [], {}, {}


def _meta_type(kind: str):
    """The Arrow type of a metadata column (``sources.metadata_columns``); ``json``: JSON text."""
    pa = pyarrow(NEEDS)
    return {"string": pa.string, "int64": pa.int64, "float64": pa.float64, "bool": pa.bool_, "json": pa.string}[kind]()


class ParquetHandle:
    """An open shard: its footer, row-group boundaries, and the last decoded row group (items are
    read in shard order by iteration, so each group is decoded once)."""

    def __init__(self, path: str):
        self.path = path
        self.file, self._source = open_parquet(path)
        meta = self.file.metadata
        self.starts = [0]
        for g in range(meta.num_row_groups):
            self.starts.append(self.starts[-1] + meta.row_group(g).num_rows)
        self.column = array_column(attrs_of(self.file).get("tap", "codes"))
        self._group: int | None = None
        self._cached = None

    def group(self, g: int):
        """(keys, outer offsets, inner offsets, values) of row group ``g``."""
        if self._group != g:
            table = self.file.read_row_group(g, columns=["key", self.column])
            arr = table.column(self.column).combine_chunks()
            frames = arr.values
            self._cached = (table.column("key").to_pylist(), arr.offsets.to_numpy(), frames.offsets.to_numpy(),
                            frames.values.to_numpy(zero_copy_only=False))
            self._group = g
        return self._cached

    def item(self, index: int, key: str | None = None, dims: int | None = None) -> np.ndarray:
        if not 0 <= index < self.starts[-1]:
            raise ValueError(f"row {index} is not in {self.path} ({self.starts[-1]} rows)")
        g = bisect.bisect_right(self.starts, index) - 1
        keys, outer, inner, values = self.group(g)
        j = index - self.starts[g]
        if key is not None and keys[j] != key:
            raise ValueError(f"row {index} of {self.path} holds {keys[j]!r}, the manifest says {key!r}")
        a, b = int(outer[j]), int(outer[j + 1])
        lengths = np.diff(inner[a:b + 1])
        d = int(lengths[0]) if len(lengths) else (dims or 0)
        if len(lengths) and not (lengths == d).all():
            raise ValueError(f"{key!r} in {self.path}: frames of unequal width")
        return values[int(inner[a]):int(inner[b])].reshape(b - a, d).copy()

    def close(self) -> None:
        self.file.close()
        if self._source is not None:
            self._source.close()
        self._cached = None


def open_parquet(path: str):
    """(``ParquetFile`` with page checksums verified, the file object it reads or None): a local
    shard by name (pyarrow's own file); one on object storage through a file object reading it by
    ranged GETs (``remote.open_object``: the footer, then the row groups asked for), as the Parquet
    sources read their objects."""
    pq = pyarrow(NEEDS).parquet
    source = remote.open_object(path) if remote.is_url(path) else None
    try:
        return pq.ParquetFile(source if source is not None else path, page_checksum_verification=True), source
    except BaseException:
        if source is not None:
            source.close()
        raise


def attrs_of(file) -> dict:
    meta = file.schema_arrow.metadata or {}
    return json.loads(meta[METADATA_KEY]) if METADATA_KEY in meta else {}


@register
class Parquet(Format):
    name = "parquet"
    summary = ("shard-N.parquet (one row per item, zstd; datasets.load_dataset('parquet'), pyarrow, polars; "
               "a Hub dataset card)")
    order = 20
    shard_re = re.compile(r"shard-(\d{5,})\.parquet")

    def shard_name(self, index: int) -> str:
        return f"shard-{index:05d}.parquet"

    def builder(self, file_attrs: dict) -> ShardBuilder:
        return ParquetShard(file_attrs)

    def require(self) -> None:
        pyarrow(NEEDS)

    def check(self, path: str, rows: list[StoredRow]) -> str | None:
        try:
            f, source = open_parquet(path)
            try:
                table = f.read(columns=["key", "frames"])
                keys, frames = table.column("key").to_pylist(), table.column("frames").to_pylist()
            finally:
                f.close()
                if source is not None:
                    source.close()
        except Exception as e:  # truncated, zeroed or not Parquet at all; a footer naming other columns
            return f"unreadable ({type(e).__name__}: {e})"
        if len(keys) != len(rows) or set(keys) != {r.key for r in rows}:
            missing = len({r.key for r in rows} - set(keys))
            return f"{missing} items missing, {max(0, len(keys) - len(rows) + missing)} without a manifest row"
        for row in rows:
            i = row.index
            if not isinstance(i, int) or not 0 <= i < len(keys) or keys[i] != row.key:
                return f"{row.key}: not at row {i}"
            if frames[i] != row.frames:
                return f"{row.key}: {frames[i]} frames, manifest says {row.frames}"
        return None

    def open(self, path: str):
        return ParquetHandle(path)

    def load(self, path: str, row: StoredRow, handle=None) -> np.ndarray:
        if handle is None:
            handle = ParquetHandle(path)
            try:
                return handle.item(row.index, row.key, row.dims)
            finally:
                handle.close()
        return handle.item(row.index, row.key, row.dims)

    def attrs(self, path: str) -> dict:
        handle = ParquetHandle(path)
        try:
            return attrs_of(handle.file)
        finally:
            handle.close()

    def lhotse_storage(self, path: str, row: StoredRow) -> tuple[str, str]:
        """lhotse has no Parquet array storage: ``mimi_extract_parquet`` is a lhotse ``FeaturesReader``
        that ``cuts.register_lhotse_readers`` adds to lhotse's registry (``read_cuts`` calls it); the key is ``INDEX/KEY`` (the row, checked against the key stored there)."""
        return LHOTSE_STORAGE, f"{row.index}/{row.key}"

    def out_files(self, out_dir: str, info: dict, parts: bool, rows) -> dict[str, str]:
        """OUT's dataset card (``README.md``), unless the user wrote their own (one without our marker)."""
        path = os.path.join(out_dir, "README.md")
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                if CARD_MARK not in f.read():
                    return {}
        return {"README.md": dataset_card(out_dir, info, parts)}

    def item_attrs(self, path: str, row: StoredRow) -> dict:
        handle = ParquetHandle(path)
        try:
            f, starts = handle.file, handle.starts
            g = int(np.searchsorted(starts, row.index, side="right") - 1)
            t = f.read_row_group(g, columns=["key", "duration", "start", "end"]).slice(row.index - int(starts[g]), 1)
            return {k: v for k, v in t.to_pylist()[0].items() if v is not None}
        finally:
            handle.close()


def dataset_card(out_dir: str, info: dict, parts: bool) -> str:
    """``README.md`` for OUT as a Hugging Face dataset: the YAML ``configs`` block the Hub reads
    (``data_files`` globs every shard), and what the columns hold."""
    glob = "part-*-of-*/shard-*.parquet" if parts else "shard-*.parquet"
    column = array_column(info.get("tap", "codes"))
    what = (f"Mimi codes, int16, {info.get('num_quantizers')} codebooks per frame" if column == "codes"
            else f"Mimi {column} features, {info.get('feature_dtype', 'float32')}")
    settings = "\n".join(f"| {k} | `{info[k]}` |" for k in sorted(info)
                         if k in ("model", "weights", "tap", "num_quantizers", "framing", "frames_per_call",
                                  "causal_16k", "dtype", "feature_dtype", "channel", "tool_version"))
    rate = f"{frame_rate(column):g}"
    kept = info.get("metadata") or {}
    meta_rows = "".join(f"| `{name}` | {'string (JSON)' if kind == 'json' else kind} or null | kept from the input "
                        f"({'its lhotse supervisions' if name == 'supervisions' else '--keep-fields'}) |\n"
                        for name, kind in kept.items())
    fidelity_rows = ("| `si_sdr`, `mel_distance` | float64 (si_sdr null for a silent input) | `--fidelity`: the "
                     "stored codes decoded against the encoder's input (SI-SDR in dB: higher is better; log-mel "
                     "distance: lower is better) |\n" if info.get("fidelity") else "")
    return f"""---
configs:
- config_name: default
  data_files:
  - split: train
    path: "{glob}"
---

# {os.path.basename(os.path.abspath(out_dir))}

{what} at {rate} Hz, written by mimi-extract (`--format parquet`): one row per audio item.
{CARD_MARK}

| column | type | |
|---|---|---|
| `key` | string | the item's key (its path relative to the input, `#chN` for one channel) |
| `{column}` | list of lists | time first: one inner list per frame (`np.array(row["{column}"])` is `[frames, dims]`; `.T` gives transformers' `[num_quantizers, frames]`) |
| `frames`, `dims` | int32 | the array's shape |
| `duration` | float64 | seconds of audio encoded |
| `sample_rate` | int32 | the source file's rate |
| `path` | string | source path relative to the input |
| `start`, `end` | float64 or null | the segment of the source, for segment inputs |
| `channel` | int32 or null | the source channel, for one-channel items |
{fidelity_rows}{meta_rows}
```python
from datasets import load_dataset
ds = load_dataset("parquet", data_files="{glob}", split="train")  # or load_dataset("<this repo>")
```

Settings (also in each file's Parquet metadata, key `mimi_extract`):

| setting | value |
|---|---|
{settings}
"""
