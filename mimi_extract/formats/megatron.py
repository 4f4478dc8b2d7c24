r"""Megatron indexed datasets: ``shard-NNNNN.bin`` + ``shard-NNNNN.idx`` (+ ``shard-NNNNN.json``), the
token files Megatron-Core's data loaders read (``IndexedDataset``, ``GPTDataset``, blended configs),
written by megatron-core's own ``IndexedDatasetBuilder`` (the ``megatron`` extra).  Codes only: a
token is a code.

One *document* per item (the manifest row's ``document`` is its index in the shard), in one of two
token layouts (``--token-layout``), with ``S`` the codebook size (2048 for Mimi), ``N`` the codebooks
kept (``-q``), ``B`` the base offset (``--token-offset``, so audio ids can sit after a text
vocabulary) and ``c[t, k]`` the code of codebook ``k`` at frame ``t``:

* ``flat`` (frame-major): one sequence of ``frames x N`` tokens, per frame codebook 0..N-1:
  ``token[t*N + k] = B + k*S + c[t, k]`` -- every (codebook, code) pair its own id, the ids
  ``B .. B + N*S - 1``;
* ``per-codebook``: ``N`` sequences of ``frames`` tokens each, codebook 0 first:
  ``token_k[t] = B + c[t, k]`` -- the ids ``B .. B + S - 1``, each codebook a stream of its own
  (the sequence's place in the document says which).

Example, 2 frames of 3 codebooks, S = 2048, B = 0, codes ``[[5, 7, 9], [6, 8, 10]]``:
flat ``[5, 2055, 4105, 6, 2056, 4106]``; per-codebook ``[5, 6]``, ``[7, 8]``, ``[9, 10]``.

The token dtype is megatron-core's own choice for the vocabulary (``DType.optimal_dtype(B + N*S)``
flat, ``(B + S)`` per codebook: uint16 below 65,500 ids, else int32).  Layout, offset, codebook size,
codebooks and dtype are recorded in ``run.json`` and in each shard's ``.json`` (a resume that
changes one is refused).

``shard-NNNNN.json`` holds what the ``.bin``/``.idx`` pair cannot: the run's settings and, per
document, its item's key, frames and metadata (duration, start...) -- so a shard says what it holds
without the manifest, and ``check`` can hold it to its rows.  Megatron ignores it.

Commit: the builder writes into memory files (``memfd``; a private temporary folder where there is
none), never into OUT; the shared protocol then writes ``.bin``, ``.json`` and last ``.idx`` (the
commit point: Megatron's ``IndexedDataset.exists`` wants both files, and the builder itself writes
the index last).

OUT also gets ``megatron-data-args.txt``: ``TOKENS PREFIX`` per committed shard (every part of a
job array), what Megatron-LM's ``--data-args-path`` (and megatron-core's ``get_blend_from_list``)
take -- token counts as the blend weights, i.e. each shard sampled in proportion to its size.  The
prefixes are relative to OUT (right wherever OUT is moved, copied or mirrored); prepend OUT's path
where training runs (docs/formats.md).

Reading (``mimi_extract.read``, ``report``, ``verify --out``...) goes through :class:`IndexFile`, a
small numpy reader of the ``.idx`` layout (the light commands must not import torch, which
megatron-core's reader does); the tests hold it to megatron-core's own reader."""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import struct
import tempfile
import warnings
from dataclasses import dataclass

import numpy as np

from ..common import remote
from ..config.choices import FIDELITY_FIELDS, MAX_TOKEN_ID, TOKEN_LAYOUTS
from .base import Format, ShardBuilder, jsonable
from .records import StoredRow
from .registry import register

LAYOUTS = TOKEN_LAYOUTS
DATA_ARGS = "megatron-data-args.txt"
LHOTSE_STORAGE = "mimi_extract_megatron"
NEEDS = "--format megatron (megatron-core's IndexedDatasetBuilder)"
INDEX_HEADER = b"MMIDIDX\x00\x00"  # megatron-core's _INDEX_HEADER, version 1
# megatron-core's DType codes (indexed_dataset.DType)
DTYPE_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
               8: np.uint16}


def indexed_dataset():
    """``megatron.core.datasets.indexed_dataset``, or a clear error naming the extra.  Importing it
    imports megatron.core (and torch), which warns that Transformer Engine / Apex are missing and,
    on a machine with a CUDA toolkit but no GPU, logs that too: neither concerns a data writer."""
    import logging

    from ..common.optional import need

    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return need("megatron.core.datasets.indexed_dataset", NEEDS)
    finally:
        logger.setLevel(level)


# -- the token layouts ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Tokens:
    """The arithmetic of one run's token ids (module docstring): codes <-> a document's sequences."""

    layout: str
    offset: int
    codebook_size: int
    num_quantizers: int

    @classmethod
    def of(cls, attrs: dict) -> Tokens:
        return cls(attrs["token_layout"], int(attrs["token_offset"]), int(attrs["codebook_size"]),
                   int(attrs["num_quantizers"]))

    @property
    def vocab_size(self) -> int:
        """One more than the largest id this layout writes."""
        return self.offset + self.codebook_size * (self.num_quantizers if self.layout == "flat" else 1)

    @property
    def dtype(self) -> str:
        """The ids' dtype, by name: megatron-core's choice for this vocabulary
        (``DType.optimal_dtype``, what its ``preprocess_data.py`` uses), restated here so that ``plan``
        can size a run without importing megatron-core and torch; a test holds the two equal."""
        return "uint16" if self.vocab_size < 65_500 else "int32"

    def lengths(self, frames: int) -> list[int]:
        """The lengths of the sequences of a document of ``frames`` frames."""
        return [frames * self.num_quantizers] if self.layout == "flat" else [frames] * self.num_quantizers

    def encode(self, codes: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """(the document's tokens, int64, its sequences one after the other; the sequences' lengths)
        of codes ``[frames, N]``."""
        frames, n = codes.shape
        if n != self.num_quantizers:
            raise ValueError(f"codes of {n} codebooks, the run keeps {self.num_quantizers}")
        c = codes.astype(np.int64)
        if self.layout == "flat":
            return (c + self.offset + self.codebook_size * np.arange(n, dtype=np.int64)).reshape(-1), self.lengths(frames)
        return (c.T + self.offset).reshape(-1), self.lengths(frames)

    def decode(self, sequences: list[np.ndarray]) -> np.ndarray:
        """Codes ``[frames, N]`` int16 of a document's sequences; ValueError unless they are what
        :meth:`encode` writes (their number, lengths and id ranges)."""
        n = self.num_quantizers
        if self.layout == "flat":
            if len(sequences) != 1 or len(sequences[0]) % n:
                raise ValueError(f"a flat document is one sequence of frames x {n} tokens, got lengths "
                                 f"{[len(s) for s in sequences]}")
            codes = sequences[0].astype(np.int64).reshape(-1, n) - self.offset - self.codebook_size * np.arange(n)
        else:
            if len(sequences) != n or len({len(s) for s in sequences}) > 1:
                raise ValueError(f"a per-codebook document is {n} sequences of equal length, got lengths "
                                 f"{[len(s) for s in sequences]}")
            codes = np.stack([s.astype(np.int64) for s in sequences], axis=1) - self.offset
        if codes.size and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise ValueError(f"token ids outside this layout's range ({self.offset}..{self.vocab_size - 1})")
        return codes.astype(np.int16)


# -- the .idx file, read without megatron-core (and torch) ----------------------------------------
@dataclass
class IndexFile:
    """megatron-core's ``.idx`` layout (``_IndexWriter``), version 1: the 9-byte header, version
    (u64), dtype code (u8), sequence count S (u64), document count D + 1 (u64), then S int32
    sequence lengths, S int64 byte offsets into the ``.bin``, D + 1 int64 document boundaries (0,
    then the end of each document in sequences).  :meth:`parse` refuses anything else."""

    dtype: np.dtype
    lengths: np.ndarray  # tokens per sequence
    pointers: np.ndarray  # byte offset of each sequence in the .bin
    documents: np.ndarray  # document d = sequences documents[d] .. documents[d+1]-1

    @classmethod
    def parse(cls, data: bytes) -> IndexFile:
        """The index in ``data`` (a whole ``.idx`` file); ValueError for anything that is not one
        as megatron-core writes it (no trailing bytes, offsets that follow the lengths, document
        boundaries from 0 to S, non-decreasing)."""
        head = 9 + 8 + 1 + 8 + 8
        if len(data) < head or data[:9] != INDEX_HEADER:
            raise ValueError("not a Megatron index (.idx): bad header")
        version, code, count, docs = struct.unpack_from("<QBQQ", data, 9)
        if version != 1:
            raise ValueError(f"Megatron index version {version}, this reader knows 1")
        if code not in DTYPE_CODES:
            raise ValueError(f"unknown token dtype code {code}")
        if docs < 1 or len(data) != head + 12 * count + 8 * docs:
            raise ValueError(f"{len(data)} bytes for {count} sequences and {docs - 1} documents: truncated or "
                             "not written by megatron-core's builder")
        dtype = np.dtype(DTYPE_CODES[code])
        lengths = np.frombuffer(data, np.int32, count, head)
        pointers = np.frombuffer(data, np.int64, count, head + 4 * count)
        documents = np.frombuffer(data, np.int64, docs, head + 12 * count)
        if (lengths < 0).any():
            raise ValueError("a negative sequence length")
        expected = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * dtype.itemsize)[:-1]]) if count else pointers
        if not np.array_equal(pointers, expected):
            raise ValueError("sequence offsets do not follow the sequence lengths")
        if documents[0] != 0 or documents[-1] != count or (np.diff(documents) < 0).any():
            raise ValueError("document boundaries are not 0 .. sequences, non-decreasing")
        return cls(dtype, lengths, pointers, documents)

    @property
    def document_count(self) -> int:
        return len(self.documents) - 1

    @property
    def bin_size(self) -> int:
        """The ``.bin`` size this index describes."""
        return int(self.lengths.astype(np.int64).sum()) * self.dtype.itemsize

    def sequences(self, document: int) -> range:
        return range(int(self.documents[document]), int(self.documents[document + 1]))


def prefix_of(path: str) -> str:
    """The Megatron data prefix of a shard (its ``.idx`` path without the extension)."""
    return path[: -len(".idx")]


def _side(path: str) -> dict:
    """A shard's ``.json`` (local or on object storage)."""
    return json.loads(remote.read_bytes(prefix_of(path) + ".json"))


class MegatronHandle:
    """An open shard: its index, its ``.json`` and its ``.bin`` (items read with ``pread``; on object
    storage by ranged GETs, ``remote.open_object``)."""

    def __init__(self, path: str):
        prefix = prefix_of(path)
        self.index = IndexFile.parse(remote.read_bytes(path))
        side = _side(path)
        self.attrs, self.docs = side["attrs"], side["documents"]
        self.tokens = Tokens.of(self.attrs)
        if self.index.dtype.name != self.attrs.get("token_dtype"):
            raise ValueError(f"{path}: tokens of {self.index.dtype.name}, its settings say {self.attrs.get('token_dtype')}")
        if self.index.document_count != len(self.docs):
            raise ValueError(f"{path}: {self.index.document_count} documents, its .json names {len(self.docs)}")
        self.path = path
        self.bin = remote.open_object(prefix + ".bin")

    def item(self, document: int, key: str | None = None) -> np.ndarray:
        if not isinstance(document, int) or not 0 <= document < len(self.docs):
            raise ValueError(f"document {document!r} is not in {self.path} ({len(self.docs)} documents)")
        if key is not None and self.docs[document]["key"] != key:
            raise ValueError(f"document {document} of {self.path} holds {self.docs[document]['key']!r}, "
                             f"the manifest says {key!r}")
        index, size = self.index, self.index.dtype.itemsize
        sequences = []
        for s in index.sequences(document):
            nbytes = int(index.lengths[s]) * size
            data = remote.pread(self.bin, int(index.pointers[s]), nbytes)
            if len(data) != nbytes:
                raise OSError(f"{prefix_of(self.path)}.bin ends before document {document} (truncated?)")
            sequences.append(np.frombuffer(data, index.dtype))
        return self.tokens.decode(sequences)

    def close(self) -> None:
        self.bin.close()


# -- writing ----------------------------------------------------------------------------------------
class _MemoryFiles:
    """Two files the builder writes by path without touching OUT: memory files (``memfd``, reached
    at ``/proc/self/fd/N``) where Linux has them, else files of a private temporary folder."""

    def __init__(self):
        self.folder = None
        self.fds: dict[str, int] = {}
        if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
            self.fds = {ext: os.memfd_create(f"mimi-extract-shard.{ext}") for ext in ("bin", "idx")}
        else:
            self.folder = tempfile.mkdtemp(prefix="mimi-extract-shard-")

    def path(self, ext: str) -> str:
        return f"/proc/self/fd/{self.fds[ext]}" if self.fds else os.path.join(self.folder, f"shard.{ext}")

    def content(self, ext: str):
        """The file's bytes: a read-only ``mmap`` (no copy; it outlives :meth:`close`), or b""."""
        import mmap

        with open(self.path(ext), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) if size else b""

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


class MegatronShard(ShardBuilder):
    def __init__(self, file_attrs: dict):
        super().__init__(file_attrs)
        if file_attrs.get("tap") != "codes":
            raise ValueError("--format megatron stores codes only")
        self.tokens = Tokens.of(file_attrs)
        self.dtype = np.dtype(file_attrs["token_dtype"])
        self._files = _MemoryFiles()
        self._builder = indexed_dataset().IndexedDatasetBuilder(self._files.path("bin"), dtype=self.dtype.type)
        self._docs: list[dict] = []

    def add(self, key: str, data: np.ndarray, row: StoredRow, attrs: dict) -> dict:
        tokens, lengths = self.tokens.encode(data)
        # megatron-core's builder: one document of the item's sequences (a flat item is one sequence)
        self._builder.add_document(tokens, lengths)
        self._docs.append({"key": key, "frames": int(data.shape[0]), **attrs,
                           **{k: getattr(row, k) for k in FIDELITY_FIELDS if getattr(row, k) is not None}})
        return {"document": len(self._docs) - 1}

    def files(self, shard_name: str) -> dict[str, bytes]:
        self._builder.finalize(self._files.path("idx"))
        prefix = prefix_of(shard_name)
        side = json.dumps({"attrs": jsonable(self.file_attrs), "documents": self._docs}, ensure_ascii=False)
        return {prefix + ".bin": self._files.content("bin"), prefix + ".json": side.encode("utf-8"),
                shard_name: self._files.content("idx")}

    def close(self) -> None:
        if self._builder is not None and not self._builder.data_file.closed:
            self._builder.data_file.close()  # (an aborted shard: finalize never ran)
        self._builder = None
        self._files.close()
        self._docs = []


# -- the format ---------------------------------------------------------------------------------
@register
class Megatron(Format):
    name = "megatron"
    summary = ("codes as token ids in Megatron indexed datasets, shard-N.bin/.idx (one document per item; "
               "--token-layout, --token-offset; OUT/megatron-data-args.txt for --data-args-path)")
    order = 40
    shard_re = re.compile(r"shard-(\d{5,})\.idx")
    file_re = re.compile(r"shard-(\d{5,})\.(?:idx|bin|json)")
    taps = ("codes",)
    tokens = True

    def shard_name(self, index: int) -> str:
        return f"shard-{index:05d}.idx"

    def builder(self, file_attrs: dict) -> ShardBuilder:
        return MegatronShard(file_attrs)

    def require(self) -> None:
        indexed_dataset()

    def run_settings(self, settings, model_config=None) -> dict:
        """The token layout (``--token-layout``, ``--token-offset``), and with the model's config
        its codebook size and megatron-core's dtype for the ids (module docstring)."""
        found = {"token_layout": settings.token_layout, "token_offset": settings.token_offset}
        if settings.tap not in self.taps:  # (the CLI refuses it first: request.token_settings)
            raise ValueError(f"--format {self.name} writes token ids, made from codes only, not {settings.tap} features")
        if settings.token_layout not in LAYOUTS:
            raise ValueError(f"--token-layout {settings.token_layout!r}: choose one of {', '.join(LAYOUTS)}")
        if model_config is not None:
            tokens = Tokens(settings.token_layout, settings.token_offset, int(model_config.codebook_size),
                            settings.num_quantizers)
            if tokens.vocab_size - 1 > MAX_TOKEN_ID:
                raise ValueError(f"--token-offset {settings.token_offset}: the largest id, {tokens.vocab_size - 1}, "
                                 f"does not fit megatron-core's widest token dtype (int32)")
            found.update(codebook_size=tokens.codebook_size, token_dtype=tokens.dtype)
        return found

    def companions(self, shard: str) -> list[str]:
        prefix = prefix_of(shard)
        return [prefix + ".bin", prefix + ".json"]

    def check(self, path: str, rows: list[StoredRow]) -> str | None:
        """The index, the ``.json`` and the ``.bin`` agree (documents, dtype, size), and document
        ``row.document`` holds each row's key with its frames in the layout's sequences."""
        try:
            handle = MegatronHandle(path)
            handle.close()
            index, docs = handle.index, handle.docs
            size = remote.getsize(prefix_of(path) + ".bin")
            if size != index.bin_size:
                return f"{os.path.basename(prefix_of(path))}.bin has {size} bytes, its index describes {index.bin_size}"
            if len(docs) != len(rows):
                return f"{len(docs)} documents, {len(rows)} manifest rows"
            for row in rows:
                d = row.document
                if not isinstance(d, int) or not 0 <= d < len(docs) or docs[d]["key"] != row.key:
                    return f"{row.key}: not document {d}"
                lengths = [int(index.lengths[s]) for s in index.sequences(d)]
                if lengths != handle.tokens.lengths(row.frames or 0) or docs[d].get("frames") != row.frames:
                    return f"{row.key}: sequences of {lengths} tokens, manifest says {row.frames} frames"
        except Exception as e:  # truncated, zeroed, a companion missing: a reason, not an exception
            return f"unreadable ({type(e).__name__}: {e})"
        return None

    def open(self, path: str):
        return MegatronHandle(path)

    def load(self, path: str, row: StoredRow, handle=None) -> np.ndarray:
        if handle is None:
            handle = MegatronHandle(path)
            try:
                return handle.item(row.document, row.key)
            finally:
                handle.close()
        return handle.item(row.document, row.key)

    def attrs(self, path: str) -> dict:
        return _side(path)["attrs"]

    def item_attrs(self, path: str, row: StoredRow) -> dict:
        doc = _side(path)["documents"][row.document]
        return {k: v for k, v in doc.items() if k != "frames"}

    def lhotse_storage(self, path: str, row: StoredRow) -> tuple[str, str]:
        """``mimi_extract_megatron``: a lhotse ``FeaturesReader`` that ``cuts.register_lhotse_readers``
        adds (``read_cuts`` calls it); the key is ``DOCUMENT/KEY`` (checked against the shard's)."""
        return LHOTSE_STORAGE, f"{row.document}/{row.key}"

    def out_files(self, out_dir: str, info: dict, parts: bool, rows) -> dict[str, str]:
        return {DATA_ARGS: data_args(shard_tokens(rows(), int(info.get("num_quantizers") or 0)))}


def shard_tokens(rows, per_frame: int) -> dict[str, int]:
    """{data prefix relative to OUT: tokens} of the committed Megatron shards the ok ``rows`` of OUT
    name (every part's: ``shard`` relative to OUT); ``per_frame``: tokens a frame makes (the codebooks)."""
    found: dict[str, int] = {}
    for row in rows:
        if row.ok and Megatron.shard_re.fullmatch(posixpath.basename(row.shard or "")):
            prefix = prefix_of(row.shard)
            found[prefix] = found.get(prefix, 0) + int(row.frames or 0) * per_frame
    return dict(sorted(found.items()))


def data_args(tokens: dict[str, int]) -> str:
    """``megatron-data-args.txt``: ``TOKENS PREFIX`` per shard holding tokens (prefixes relative to OUT)."""
    return "".join(f"{count} {prefix}\n" for prefix, count in tokens.items() if count)
