"""lhotse Shar shards: ``shar/cuts.NNNNNN.jsonl.gz`` + ``shar/<field>.NNNNNN.tar``, the layout
``CutSet.to_shar`` writes, so that ``CutSet.from_shar(in_dir=RUN_DIR/shar)`` followed by
``cut.load_custom(field)`` returns exactly what ``mimi_extract.read`` returns.

The field is ``mimi_codes``, ``mimi_latent`` or ``mimi_encoder`` (by tap).  The folder holds
nothing else: lhotse's ``from_shar(in_dir=...)`` takes every file in it as a field, so the
manifest, lock, run.json and even the commit protocol's temporaries live one level up.

One shard = one cuts file and one tar, committed together by the shared protocol: the cuts file
is a companion, the tar is the shard (renamed last: the commit point; rows point into it).

* The tar is written with lhotse's own :class:`~lhotse.shar.writers.tar.TarWriter` (into
  memory), member by member as lhotse's ``ArrayTarWriter`` writes them: ``KEY.npy``
  (``np.save``) then ``KEY.json`` (the field's ``TemporalArray`` manifest with ``shar``
  placeholder storage, which lhotse's reader fills with the bytes).  Unlike ``ArrayTarWriter``
  the manifest keeps the item's ``start`` (a segment's offset in its recording): the cuts carry
  their real recording and offset (so, for a loose-file input, ``cut.load_audio()`` is the item's audio), and a
  ``TemporalArray`` whose start differs from its cut's would be sliced at the wrong frames.
* The run's settings ride in the tar's PAX global header (``mimi_extract.attrs``, JSON):
  tar readers, lhotse's included, skip it, so the tar stays a plain Shar field.
* Each ok row records where its ``.npy`` member's bytes sit (``offset``, ``nbytes``), so
  ``mimi_extract.read`` is one ``pread``, not a scan of the tar.
* Cuts are the same ``MonoCut``/``MultiCut`` as the HDF5 output's ``cuts.jsonl.gz`` (recording:
  the source file, absolute path; segment offset, duration spanning the item's frame grid,
  channel), with the field's storage a Shar placeholder.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import tarfile
from dataclasses import replace
from pathlib import PurePosixPath

import numpy as np

from ..common import remote
from ..config.taps import frame_shift
from .base import Format, ShardBuilder, bytes_checksum
from .records import StoredRow
from .registry import register

FOLDER = "shar"
FIELDS = {"codes": "mimi_codes", "latent": "mimi_latent", "encoder": "mimi_encoder"}
PAX_KEY = "mimi_extract.attrs"  # the run's settings, in each tar's PAX global header
_FIELD_RE = "mimi_(?:codes|latent|encoder)"


def field_for(tap: str) -> str:
    return FIELDS[tap]


def cuts_name(shard: str) -> str:
    """``shar/mimi_codes.000003.tar`` -> ``shar/cuts.000003.jsonl.gz`` (its companion)."""
    folder, name = shard.rsplit("/", 1) if "/" in shard else ("", shard)
    index = name.split(".")[1]
    return f"{folder}/cuts.{index}.jsonl.gz" if folder else f"cuts.{index}.jsonl.gz"


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a Shar cut id, or None.  lhotse's reader matches a tar member to its
    cut by ``Path(member).parent / Path(member).stem == cut.id``, which a key such as ``a//b`` or
    ``./a`` does not survive."""
    if ".." in key.split("/"):  # a member name that climbs out of the folder it is extracted to
        return f"key {key!r} climbs out of its folder (a '..' component): it cannot name a tar member (give ids)"
    p = PurePosixPath(key + ".npy")
    if not key or str(p.parent / p.stem) != key:
        return f"key {key!r} cannot name a lhotse Shar tar member (lhotse would read it back as {str(p.parent / p.stem)!r})"
    return None


def _memory_tar_writer(pax_headers: dict):
    """lhotse's ``TarWriter`` writing into memory (with a PAX global header) instead of a path:
    the shared commit protocol, not tarfile, writes the bytes to OUT."""
    from ..common.optional import need

    TarWriter = need("lhotse.shar.writers.tar", "--format shar (lhotse's Shar tar writer) and lhotse cuts").TarWriter

    class MemoryTarWriter(TarWriter):
        def __init__(self):
            super().__init__("memory.tar", shard_size=None)

        def _next_stream(self):
            self.stream = io.BytesIO()
            self.tarstream = tarfile.open(fileobj=self.stream, mode="w|", format=tarfile.PAX_FORMAT,
                                          pax_headers=pax_headers)
            self.num_items = 0

        def image(self) -> bytes:
            self.tarstream.close()
            return self.stream.getvalue()

    return MemoryTarWriter()


def _placeholder(data_shape: tuple, frame_shift: float, start: float) -> dict:
    """The field's ``TemporalArray`` manifest as Shar stores it (lhotse fills the storage on read)."""
    return {"array": {"storage_type": "shar", "storage_path": "", "storage_key": "", "shape": list(data_shape)},
            "temporal_dim": 0, "frame_shift": frame_shift, "start": start}


def cut_for(row: StoredRow, field: str, frame_shift: float, shape: tuple) -> dict:
    """The Shar cut of one ok row (as ``ShardBuilder.add`` is handed it): the HDF5 output's cut
    (``cuts.cut_dict``) with Shar storage."""
    from .cuts import cut_dict

    return cut_dict(replace(row, shard="", frames=shape[0]), "", field, frame_shift,
                    array=_placeholder(shape, frame_shift, row.start or 0.0)["array"])


class SharShard(ShardBuilder):
    """One Shar shard in memory: the tar and (unless ``--shar-extend``, whose cuts are the
    input's) its cuts file."""

    def __init__(self, file_attrs: dict):
        super().__init__(file_attrs)
        self.extend = bool(file_attrs.get("shar_extend"))
        self.field = field_for(file_attrs["tap"])
        self.frame_shift = frame_shift(file_attrs["tap"])
        self._tar = _memory_tar_writer({PAX_KEY: json.dumps(file_attrs, sort_keys=True, default=_plain)})
        self._cuts: list[str] = []

    def add(self, key: str, data: np.ndarray, row: StoredRow, attrs: dict) -> dict:
        problem = key_problem(key)
        if problem:
            raise ValueError(problem)
        # C order whatever the array's layout (the encoder's codes are a transposed view): np.save
        # keeps a Fortran-ordered array's layout, so --shar-extend's members (its arrays as they
        # come) and the writer's (ShardWriter._fill makes them contiguous) differed in their bytes
        data = np.ascontiguousarray(data)
        npy = io.BytesIO()
        np.save(npy, data, allow_pickle=False)
        nbytes = npy.getbuffer().nbytes
        self._tar.write(f"{key}.npy", npy)
        # tarfile's offset is now past the member's data padded to a 512-byte block (headers, long-name
        # PAX headers included, come before the data): the data starts that padded size back
        offset = self._tar.tarstream.offset - -(-nbytes // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
        cut = cut_for(row, self.field, self.frame_shift, data.shape)
        meta = (json.dumps(cut["custom"][self.field]) + "\n").encode("utf-8")
        self._tar.write(f"{key}.json", io.BytesIO(meta), count=False)
        line = json.dumps(cut, ensure_ascii=False) + "\n"
        self._cuts.append(line)
        # what lhotse reads besides the array, checksummed like it (check() and verify --checksums)
        return {"offset": offset, "nbytes": nbytes, "meta_checksum": bytes_checksum(meta),
                **({} if self.extend else {"cut_checksum": bytes_checksum(line.encode("utf-8"))})}

    def add_placeholder(self, key: str) -> None:
        """No array for this cut (its error row says why): lhotse's own placeholder pair, as
        ``ArrayTarWriter.write_placeholder`` writes it, so the tar still lines up with the cuts."""
        self._tar.write(f"{key}.nodata", io.BytesIO())
        self._tar.write(f"{key}.nometa", io.BytesIO(), count=False)

    def files(self, shard_name: str) -> dict[str, bytes]:
        if self.extend:
            return {shard_name: self._tar.image()}
        cuts = gzip.compress("".join(self._cuts).encode("utf-8"), 6, mtime=0)
        return {cuts_name(shard_name): cuts, shard_name: self._tar.image()}

    def close(self) -> None:
        self._cuts = []
        self._tar = None


def _plain(value):
    return value.item() if isinstance(value, np.generic) else str(value)


def _npy_shape(f) -> tuple:
    version = np.lib.format.read_magic(f)
    shape, _, _ = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                   else np.lib.format.read_array_header_2_0(f))
    return shape


@register
class Shar(Format):
    name = "shar"
    summary = ("lhotse Shar in OUT/shar/ (cuts.N.jsonl.gz + mimi_codes.N.tar; "
               "CutSet.from_shar(in_dir=OUT/shar))")
    order = 30
    folder = FOLDER
    shard_re = re.compile(rf"{FOLDER}/{_FIELD_RE}\.(\d{{6,}})\.tar")
    file_re = re.compile(rf"{FOLDER}/(?:{_FIELD_RE}\.(\d{{6,}})\.tar|cuts\.(\d{{6,}})\.jsonl\.gz)")

    def __init__(self, field: str = "mimi_latent"):
        self.field = field

    def require(self) -> None:
        from ..common.optional import need

        need("lhotse.shar.writers.tar", "--format shar (lhotse's Shar tar writer)")

    def for_run(self, file_attrs: dict) -> "Shar":
        """This format with the run's field (``mimi_codes``...): shard names depend on the tap."""
        return type(self)(field_for(file_attrs["tap"]))

    def key_problem(self, key: str) -> str | None:
        return key_problem(key)

    def shard_name(self, index: int) -> str:
        return f"{FOLDER}/{self.field}.{index:06d}.tar"

    def builder(self, file_attrs: dict) -> ShardBuilder:
        return SharShard(file_attrs)

    def companions(self, shard: str) -> list[str]:
        return [cuts_name(shard)]

    def check(self, path: str, rows: list[StoredRow]) -> str | None:
        """The tar holds exactly ``KEY.npy`` + ``KEY.json`` per row, in row order, each array where
        its row says with its frame count; the cuts file names the same keys in the same order.
        Every byte lhotse reads besides the arrays (each ``.json`` member, each line of the cuts
        file) matches the checksum its row recorded (rows written before those checksums: the
        structure only); tar headers carry their own checksum, which tarfile checks."""
        try:
            with remote.open_object(path) as raw, tarfile.open(fileobj=raw, mode="r:") as tar:
                members = tar.getmembers()
                extend = bool(json.loads(tar.pax_headers.get(PAX_KEY, "{}")).get("shar_extend"))
                names = [m.name for m in members]
                want = [n for r in rows for n in ((f"{r.key}.npy", f"{r.key}.json") if r.ok
                                                  else (f"{r.key}.nodata", f"{r.key}.nometa"))]
                if names != want:
                    have = {n.rsplit(".", 1)[0] for n in names}
                    keys = {r.key for r in rows}
                    return (f"{len(keys - have)} items missing, {len(have - keys)} without a manifest row"
                            if have != keys else "members out of order, or an array where a placeholder belongs")
                for m, row in zip(members[::2], rows):
                    if not row.ok:
                        continue
                    if (m.offset_data, m.size) != (row.offset, row.nbytes):
                        return f"{row.key}: array at byte {m.offset_data}, manifest says {row.offset}"
                    frames = _npy_shape(tar.extractfile(m))[0]
                    if frames != row.frames:
                        return f"{row.key}: {frames} frames, manifest says {row.frames}"
                for m, row in zip(members[1::2], rows):
                    if row.ok and row.meta_checksum is not None and (
                            bytes_checksum(tar.extractfile(m).read()) != row.meta_checksum):
                        return f"{row.key}: its {m.name} member fails its checksum"
                    if not row.ok and m.size:
                        return f"{row.key}: its placeholder {m.name} is not empty"
                end = max(m.offset_data + m.size for m in members)
                raw.seek(0, os.SEEK_END)
                if raw.tell() < end + 2 * tarfile.BLOCKSIZE:
                    return "truncated"
            if extend:  # a field of the input's shards: no cuts of its own
                return None
            cuts = remote.join(remote.dirname(path), os.path.basename(cuts_name(remote.basename(path))))
            with remote.open_object(cuts) as raw, gzip.GzipFile(fileobj=raw) as f:  # to the end: gzip checks its crc32
                lines = f.read().splitlines(keepends=True)
            if [json.loads(line)["id"] for line in lines] != [r.key for r in rows]:
                return f"{os.path.basename(cuts)} names other cuts than the manifest"
            for line, row in zip(lines, rows):
                if row.cut_checksum is not None and bytes_checksum(line) != row.cut_checksum:
                    return f"{row.key}: its cut in {os.path.basename(cuts)} fails its checksum"
        except Exception as e:  # truncated, zeroed, not a tar, companion missing or damaged
            return f"unreadable ({type(e).__name__}: {e})"
        return None

    def open(self, path: str):
        return io.open(path, "rb", buffering=0) if not remote.is_url(path) else remote.open_object(path)

    def load(self, path: str, row: StoredRow, handle=None) -> np.ndarray:
        if handle is None:
            with self.open(path) as f:
                return self.load(path, row, f)
        data = remote.pread(handle, row.offset, row.nbytes)
        if len(data) != row.nbytes:
            raise OSError(f"{path}: {row.key!r} ends past the end of the file (truncated?)")
        return np.load(io.BytesIO(data), allow_pickle=False)

    def attrs(self, path: str) -> dict:
        with remote.open_object(path) as raw, tarfile.open(fileobj=raw, mode="r:") as tar:
            return json.loads(tar.pax_headers[PAX_KEY])
