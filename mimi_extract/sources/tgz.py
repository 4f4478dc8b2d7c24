"""Compressed tar shards (``.tar.gz``, ``.tgz``; WebDataset layout as in ``tar.py``).

A gzip stream has no random access, so the global length-sorted plan of uncompressed shards is not
possible without unpacking.  Instead the shards are cut, in stream order, into *groups* of at most
``--sort-buffer-mb`` MiB of members; the plan sorts by length within each group only and runs the
groups in order (``Source.plan_group``).  Planning streams every shard once (headers probed from
the member bytes as they pass); encoding streams it once more in each encoder process, which keeps
the bytes of the group it works on (at most two groups: the buffer's memory bound, twice, per
encoder process) and reads members from there -- no temporary files, nothing big in the plan.
The cost is padding: a group's length spread is wider than the whole corpus's sorted neighbours
(measured in the README: ``scripts/bench_sources.py``).

Memory stays bounded whatever a member expands to (a few MiB of gzip can hold gigabytes of silent
WAV): a member over :data:`SPILL_BYTES` is never held in memory -- it is streamed into an anonymous
temporary file (``TMPDIR``) to be probed, and again to be encoded, and sits in no group; members that
are neither audio nor a sidecar are not read at all, and a sidecar over ``MAX_ROW_BYTES`` is that
sample's error row (``scripts/bench_memory.py``, docs/inputs.md#bounded-memory).
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import tempfile
import threading
import zlib

from dataclasses import dataclass, replace
from types import SimpleNamespace

from ..common import remote
from ..config.input_options import MAX_ROW_BYTES
from .base import Source, register
from .items import Entry, Loc, SourceError
from .tar import COMPRESSED_TAR_EXTENSIONS, SPARSE, audio_candidate, is_shard_input, shown_names, check_first_samples, \
    guarded_sample, missing_end, shard_identity, split_name, stored_size, tar_shards

FIRST_SAMPLES = 64  # --id-field and --audio-ext are checked against this many first samples (a stream)

DEFAULT_SORT_BUFFER_MB = 256
# a member larger than this is streamed through a temporary file, never held in memory (see the docstring)
SPILL_BYTES = 64 << 20


@dataclass(frozen=True)
class GroupMemberLoc(Loc):
    """A member of a compressed tar: bytes ``offset`` to ``offset + size`` of the decompressed stream,
    inside group ``group`` (decompressed bytes ``start`` to ``end``, read and kept whole)."""

    group: int
    start: int
    end: int | None  # None until the group is closed
    offset: int
    size: int
    name: str


def _header(data, name: str, shown: str | None = None):
    """(sample rate, frames, channels) of a member's bytes (or a file holding them), or the
    exception that says why not (naming the member ``shown``: shard/member)."""
    from ..audio.decoders import open_decoder

    buffer = io.BytesIO(data) if isinstance(data, bytes) else data
    buffer.seek(0)
    try:
        f = open_decoder(buffer, name, shown=shown)
    except Exception as e:  # its error row
        return e
    try:
        return SimpleNamespace(samplerate=f.samplerate, frames=f.frames, channels=f.channels)
    except Exception as e:
        return e
    finally:
        f.close()


_LOCK = threading.Lock()
_GROUPS: dict = {}  # (path, group) -> bytes: the last two groups this process read
_STREAM: dict = {}  # path -> open GzipFile, positioned after the last group read


def _stream_at(path: str, start: int):
    """This process's decompressed stream of ``path``, positioned at ``start`` (forward from where
    it was left; reopened only to go back).  Call with ``_LOCK`` held."""
    f = _STREAM.get(path)
    if f is None or f.tell() > start:
        for old in _STREAM.values():
            old.close()
        _STREAM.clear()
        f = _STREAM[path] = gzip.open(remote.open_input(path) if remote.is_url(path) else path, "rb")
    f.seek(start)
    return f


def group_bytes(path: str, group: int, start: int, end: int) -> bytes:
    """Bytes ``start..end`` of ``path``'s decompressed stream (one group), read forward from
    where this process left the stream (from the beginning only when asked for an earlier group)."""
    with _LOCK:
        if (path, group) in _GROUPS:
            return _GROUPS[(path, group)]
        try:
            data = _stream_at(path, start).read(end - start)
        except (OSError, EOFError, zlib.error) as e:
            raise SourceError(f"{os.path.basename(path)}: cannot decompress bytes {start}..{end}: {e}") from e
        if len(data) != end - start:
            raise SourceError(f"{os.path.basename(path)} is truncated before byte {end} of its decompressed stream")
        while len(_GROUPS) >= 2:
            _GROUPS.pop(next(iter(_GROUPS)))
        _GROUPS[(path, group)] = data
        return data


def spill(source, size: int, name: str, where: str):
    """``size`` bytes of ``source`` (a readable stream) copied, 1 MiB at a time, into an anonymous
    temporary file named like the member (decoders choose by extension; the file is unlinked at once,
    so it goes when it is closed); SourceError naming ``where`` if the stream ends first."""
    tmp = tempfile.NamedTemporaryFile(suffix=os.path.splitext(name)[1], prefix="mimi-extract-member-",  # noqa: SIM115
                                      delete=False)
    os.unlink(tmp.name)  # (gone from the folder now; its space is freed when it is closed)
    try:
        copied = 0
        while copied < size:
            block = source.read(min(1 << 20, size - copied))
            if not block:
                raise SourceError(f"{where} is truncated at byte {copied} of its {size}")
            tmp.write(block)
            copied += len(block)
        tmp.flush()
        tmp.seek(0)
    except BaseException:
        tmp.close()
        raise
    return tmp


def spilled_member(path: str, offset: int, size: int, name: str):
    """A large member (over :data:`SPILL_BYTES`) for encoding: decompressed forward to it and
    streamed into a temporary file (see :func:`spill`)."""
    with _LOCK:
        try:
            return spill(_stream_at(path, offset), size, name, f"{os.path.basename(path)}: member {name!r}")
        except (OSError, EOFError, zlib.error) as e:
            raise SourceError(f"{os.path.basename(path)}: cannot decompress member {name!r}: {e}") from e


def _kept(member) -> bytes:
    """A sidecar's bytes as the index kept them; over ``MAX_ROW_BYTES`` they were not read."""
    if member[3] is None:
        raise ValueError(f"sidecar {member[0]!r} is {member[2]} bytes long, over the {MAX_ROW_BYTES} a row may take")
    return member[3]


class _Counted(io.RawIOBase):
    """A shard's decompressed stream for tarfile's forward reading that counts the bytes it hands
    out and keeps the last two reads, so the end-of-archive marker can be checked afterwards."""

    def __init__(self, path: str):
        super().__init__()
        self.raw = remote.open_input(path)
        gzipped = self.raw.read(2) == b"\x1f\x8b"
        self.raw.seek(0)
        self.file = gzip.GzipFile(fileobj=self.raw) if gzipped else self.raw
        self.pos, self.last = 0, [(0, b""), (0, b"")]  # (start, bytes) of the last two reads

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.file.read(len(buffer))
        buffer[:len(data)] = data
        self.last = [self.last[1], (self.pos, data)]
        self.pos += len(data)
        return len(data)

    def end_damage(self, header_at: int, last: str | None) -> str | None:
        """After tarfile's iteration ended without error: None if the 512 zero bytes of the
        end-of-archive marker are at ``header_at`` and the stream's length is a multiple of 512,
        else the damage (``last``: the last member's name)."""
        (a, first), (_, second) = self.last
        block = (first + second)[header_at - a: header_at - a + 512] if header_at >= a else b""
        total = self.pos
        while chunk := self.file.read(1 << 20):  # the rest (the marker's zero records) only counts
            total += len(chunk)
        if len(block) < 512 or block.strip(b"\0"):
            return missing_end(total, header_at, last, " of the decompressed stream")
        if total % 512:
            return f"truncated or damaged: its decompressed size ({total} bytes) is not a multiple of 512"
        return None

    def close(self) -> None:
        if not self.closed:
            if self.file is not self.raw:
                self.file.close()
            self.raw.close()
        super().close()


class _Indexing:
    """One :meth:`CompressedTarSource.entries` pass: each shard streamed once, a sample made an entry
    as its last member passes, the entries cut into groups of members (a group is read as one span
    of the decompressed stream, within ``--sort-buffer-mb``)."""

    def __init__(self, source: "CompressedTarSource", warnings: list[str]):
        self.source, self.options, self.warnings = source, source.options, warnings
        self.budget = int(source.options.sort_buffer_mb * 2**20)
        self.entries: list[Entry] = []
        self.group, self.start, self.open = -1, 0, []  # the group being filled: its start and its entries
        # the first samples, until --id-field and --audio-ext are checked against them (tar.check_first_samples)
        self.first = [] if self.options.id_field or self.options.audio_ext else None

    def close_group(self, end: int) -> None:
        # the group's bytes end where its last audio member does (``end`` or before it): what
        # follows in the stream is not held -- a sample's members repeated under one name (only
        # the first is read; 2,000 x 1 MiB of them made one 2 GiB group), members no sample reads
        stop = max((e.loc.offset + e.loc.size for e in self.open), default=end)
        for e in self.open:
            e.loc = replace(e.loc, start=self.start, end=min(end, stop))
        self.open = []

    def shard(self, shard: str, shown: str) -> None:
        full = remote.absolute(shard)
        sample_key, parts, end, damage = None, {}, 0, None
        self.close_group(end)
        self.group += 1
        self.start = 0
        stream = None
        reading = False  # inside a member's data (a sample cut there is incomplete)
        header_at = 0  # where the header after the last member (or the end-of-archive marker) is
        try:
            with _Counted(full) as stream, tarfile.open(fileobj=stream, mode="r|") as tf:
                for info in tf:
                    stored = stored_size(info)  # (a sparse member's size counts its holes, not stored)
                    header_at = info.offset_data + -(-stored // 512) * 512
                    if not info.isfile():
                        continue
                    key, ext = split_name(info.name)
                    if key != sample_key:  # the previous sample is complete
                        self.sample(full, shown, sample_key, parts, end)
                        sample_key, parts = key, {}
                    reading = True
                    data = SPARSE if info.sparse is not None else \
                        self.source._member_data(tf, info, ext, ext in parts, f"{shown}: member {info.name!r}")
                    reading = False
                    if ext in parts and data is not None and data is not SPARSE and not isinstance(data, bytes):
                        data.close()
                    parts.setdefault(ext, (info.name, info.offset_data, info.size, data))
                    end = info.offset_data + stored
                # tarfile stops silently where the stream ends, marker or not: a tar cut at a
                # member boundary or in a member's padding would lose the rest of the shard unsaid
                damage = stream.end_damage(header_at, max(parts.values(), key=lambda m: m[1])[0] if parts else None)
        except (tarfile.ReadError, EOFError, OSError, zlib.error) as e:
            damage = f"damaged or truncated after byte {end} of the decompressed stream ({e or type(e).__name__})"
            if not reading and stream is not None:  # cut between members (in a header, a padding):
                damage = (f"damaged or truncated at byte {stream.pos} of the decompressed stream, between "
                          f"members ({e or type(e).__name__})")
                self.sample(full, shown, sample_key, parts, end)  # the members read are whole: kept, as in a .tar
        else:
            self.sample(full, shown, sample_key, parts, end)
        self.close_group(end)
        if self.first:  # a first shard of fewer samples
            check_first_samples(self.options, shown, self.first)
            self.first = None
        if damage:
            kind = self.source.kind
            self.entries.append(Entry(full, f"{shown}@damage", key=f"{shown}@damage", where=shown, kind=kind,
                                      error=f"{shown}: {damage}; the samples from there on are not read"))
            self.warnings.append(f"{shown}: {damage}")

    def sample(self, full: str, shown: str, key: str | None, parts: dict, end: int) -> None:
        """The sample ``key`` of ``parts`` (ext -> its member), whose last member ends at ``end``, as an entry."""
        if key is None or not parts:
            return
        first = min(m[1] for m in parts.values())
        # in no group: its audio is read alone (a sparse member is never read: see tar.SPARSE)
        alone = max((m[2] for m in parts.values() if m[3] is not SPARSE), default=0) > SPILL_BYTES
        if self.open and (alone or end - self.start > self.budget):
            self.close_group(first)
            self.group += 1
            self.start = first
        if self.first is not None:
            self.first.append((dict.fromkeys(parts, True), parts["json"][3] if "json" in parts else None))
            if len(self.first) >= FIRST_SAMPLES:
                check_first_samples(self.options, shown, self.first)
                self.first = None
        try:
            entry = guarded_sample(full, shown, key, parts, self.options, self.source.kind, data_of=_kept)
            if entry.loc is not None:
                member = entry.loc
                start, stop = (member.offset, member.offset + member.size) if alone else (self.start, None)
                entry.loc = GroupMemberLoc(self.group, start, stop, member.offset, member.size, member.name)
                entry.header = _header(next(m[3] for m in parts.values() if m[0] == member.name), member.name,
                                       entry.rel)
                if not alone:
                    self.open.append(entry)
            self.entries.append(entry)
        finally:
            for m in parts.values():
                if m[3] is not None and m[3] is not SPARSE and not isinstance(m[3], bytes):
                    m[3].close()  # a spilled member's temporary file
        if alone:
            self.group += 1
            self.start = end


@register
class CompressedTarSource(Source):
    """``.tar.gz`` / ``.tgz`` shards, streamed in groups of ``--sort-buffer-mb``; see the module docstring."""

    kind = "tgz"
    summary = ".tar.gz"
    detect_order = 40
    loc_type = GroupMemberLoc

    @classmethod
    def detect(cls, path: str) -> bool:
        return is_shard_input(path, COMPRESSED_TAR_EXTENSIONS)

    def shards(self) -> list[str]:
        if not hasattr(self, "_shards"):
            self._shards = tar_shards(self.path, compressed=True)
        return self._shards

    def entries(self, warnings: list[str]) -> list[Entry]:
        """Stream each shard once: samples are closed as their last member passes, their audio's
        header probed from the bytes in hand (then dropped), and cut into groups of members."""
        indexing = _Indexing(self, warnings)
        shards = self.shards()
        for shard, shown in self.mine(list(zip(shards, shown_names(shards)))):  # (names: over every shard)
            indexing.shard(shard, shown)
        return indexing.entries

    def _member_data(self, tf, info, ext: str, seen: bool, where: str):
        """What the index keeps of a member as it streams by: a sidecar's bytes (None over
        ``MAX_ROW_BYTES``), a possible audio member's bytes (a temporary file over
        :data:`SPILL_BYTES`), nothing of any other member (tarfile skips its data unread)."""
        if ext == "json" and not seen:
            if info.size > MAX_ROW_BYTES:
                return None
        elif seen or not audio_candidate(ext, self.options.audio_ext):
            return None
        member = tf.extractfile(info)
        if info.size > SPILL_BYTES:
            try:
                return spill(member, info.size, info.name, where)
            except SourceError as e:
                raise EOFError(str(e)) from e
        data = member.read()
        if len(data) != info.size:
            raise EOFError("unexpected end of data")
        return data

    @staticmethod
    def plan_group(item) -> int:
        return item.loc.group if item.loc is not None else 0

    def identity(self) -> dict:
        return shard_identity(self.mine(self.shards()))

    def input_shards(self) -> list[str]:
        return [remote.absolute(s) for s in self.shards()]

    @staticmethod
    def open(entry):
        loc = entry.loc
        if int(loc.size) > SPILL_BYTES:
            return spilled_member(entry.path, int(loc.offset), int(loc.size), loc.name)
        data = group_bytes(entry.path, int(loc.group), int(loc.start), int(loc.end))
        first = int(loc.offset) - int(loc.start)
        buffer = io.BytesIO(data[first: first + int(loc.size)])
        buffer.name = loc.name
        return buffer
