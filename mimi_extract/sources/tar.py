"""Tar shards as inputs (WebDataset layout): one ``.tar``, a folder of them, or a brace/glob pattern.

Members are grouped into samples by the WebDataset convention: a sample's key is a member's name
up to the first dot of its base name (within the member's directory), and the members of one
sample are consecutive.  The sample's audio is its first member with an audio extension (or one of
``--audio-ext``); a ``.json`` member is its sidecar, which may name the id (``--id-field``) and a
segment (``start``, ``end`` or ``duration`` in seconds, ``channel``) as a list row does.

Nothing is extracted: :func:`index_tar` reads the headers only (it seeks over each member's
data), an entry holds the shard's path and the member's data offset and size, and whoever
encodes the item reads it through a :class:`MemberView` -- a bounded, seekable window on the shard
file that soundfile (or PyAV) decodes in place.  A truncated shard keeps every sample whose bytes
are complete; the rest become one error row naming the offset where the damage starts.
"""

from __future__ import annotations

import io
import os
import posixpath
import re
import tarfile

from dataclasses import dataclass

from ..common import remote
from ..audio.decoders import DECODED_EXTENSIONS
from .base import Source, register
from .items import Entry, Loc, SourceError
from .kept import ITEM_FIELDS
from .keys import key_stem
from .rows import climbs, id_text, json_object, row_failed, segment_fields
from .text import printable, text_problem

TAR_EXTENSIONS = (".tar",)


@dataclass(frozen=True)
class MemberLoc(Loc):
    """A member of an uncompressed tar (a WebDataset or Shar shard): its data's bytes ``offset`` to
    ``offset + size``, read in place."""

    offset: int
    size: int
    name: str
COMPRESSED_TAR_EXTENSIONS = (".tar.gz", ".tgz")
_PATTERN = re.compile(r"[*?\[{]")


class MemberView(io.RawIOBase):
    """``size`` bytes of ``path`` from ``offset``, as a read-only seekable file: a tar member read
    in place.  ``name`` is the member's name (decoders pick their format from its extension).  A
    shard on an object store is read by ranged GETs (:class:`remote.ObjectFile`), never downloaded."""

    def __init__(self, path: str, offset: int, size: int, name: str = ""):
        super().__init__()
        self.file = remote.open_input(path)
        self.offset, self.size, self.pos, self.name = offset, size, 0, name

    @property
    def over_network(self) -> bool:
        """Whether its bytes come by ranged GETs as they are read (``decoders``: FFmpeg then decodes
        it without taking turns)."""
        return isinstance(self.file, remote.ObjectFile)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.size - self.pos)
        if n <= 0:
            return 0
        self.file.seek(self.offset + self.pos)
        got = self.file.readinto(memoryview(buffer)[:n])
        self.pos += got
        return got

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = max(0, base + pos)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def close(self) -> None:
        if not self.closed:
            self.file.close()
        super().close()


def open_member(path: str, offset: int, size: int, name: str):
    """A buffered :class:`MemberView`; SourceError if the shard no longer holds those bytes."""
    try:
        view = MemberView(path, offset, size, name)
    except OSError as e:
        raise SourceError(f"shard {path}: {e.strerror or e}") from e
    total = remote.getsize(path) if remote.is_url(path) else os.fstat(view.file.fileno()).st_size
    if offset + size > total:
        view.close()
        raise SourceError(f"shard {remote.basename(path)} is truncated: member {name!r} needs bytes "
                          f"{offset}..{offset + size}, the file has {total}")
    return io.BufferedReader(view, 1 << 16)  # .name: the member's


_PROBE_IN_MEMORY = 4 << 20


class _Sparse:
    """The ``data`` an index gives a sparse member (``tar -S``: GNU ``S`` headers, PAX sparse 0.0,
    0.1 and 1.0): its holes are not stored, so its bytes are no range of the shard and it is never
    read in place; its sample is an error row that names it (:func:`sample_entries`)."""

    def __repr__(self) -> str:
        return "SPARSE"


SPARSE = _Sparse()


def sparse_error(name: str) -> str:
    """The error row of a sample whose member ``name`` is sparse (:data:`SPARSE`)."""
    return (f"member {printable(name)!r} is a sparse file (tar -S / --sparse): its holes are not stored, so it is "
            "not read; pack the shard without -S")


def read_member(path: str, offset: int, size: int, name: str) -> io.BytesIO:
    """The member's bytes in memory (a small member, for its header probe); SourceError as
    :func:`open_member` if the shard no longer holds them."""
    try:
        data = remote.read_range(path, offset, size)
    except OSError as e:
        raise SourceError(f"shard {path}: {e.strerror or e}") from e
    if len(data) < size:
        raise SourceError(f"shard {remote.basename(path)} is truncated: member {name!r} needs bytes "
                          f"{offset}..{offset + size}, the file has {offset + len(data)}")
    view = io.BytesIO(data)
    view.name = name
    return view


def tar_shards(path: str, compressed: bool) -> list[str]:
    """The shards of one kind (uncompressed or gzip-compressed) that ``path`` names; the other kind
    among them, or none at all, is an error (the two are read differently: by offset, forward)."""
    shards = shard_list(path, TAR_EXTENSIONS + COMPRESSED_TAR_EXTENSIONS)
    other = [s for s in shards if s.lower().endswith(COMPRESSED_TAR_EXTENSIONS) != compressed]
    if other:
        raise ValueError(f"{other[0]} is {'an uncompressed' if compressed else 'a compressed'} tar: give compressed "
                         "and uncompressed shards as separate inputs")
    if not shards:
        raise FileNotFoundError(f"no {'.tar.gz' if compressed else '.tar'} shards in {path}")
    return shards


def expand_braces(pattern: str) -> list[str]:
    """``a-{000..002}.tar`` -> three names; ``{x,y}`` alternatives; nested and repeated braces."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    body, head, tail = m.group(1), pattern[: m.start()], pattern[m.end():]
    r = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if r:
        lo, hi = r.group(1), r.group(2)
        width = len(lo) if lo.startswith("0") or len(lo) == len(hi) else 0
        choices = [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    else:
        choices = body.split(",")
    return [x for c in choices for x in expand_braces(head + c + tail)]


def shard_list(path: str, extensions=TAR_EXTENSIONS + COMPRESSED_TAR_EXTENSIONS) -> list[str]:
    """The shard files ``path`` names: itself, the shards in a folder (sorted), or a pattern's
    matches (braces expanded, then globbed; a brace-named file that does not exist is an error)."""
    if remote.isfile(path):
        return [path]
    if remote.isdir(path):
        return sorted(remote.join(path, f) for f in remote.listdir(path) if f.lower().endswith(extensions))
    found = []
    for name in expand_braces(path):
        if _PATTERN.search(name):
            found += remote.glob(name)
        elif remote.isfile(name):
            found.append(name)
        else:
            raise FileNotFoundError(f"shard {name} (from {path}) does not exist")
    return list(dict.fromkeys(found))


def missing_shard(path: str) -> str | None:
    """For a pattern no kind detects: the shard it names that does not exist, if that is why."""
    if not _PATTERN.search(path) or remote.exists(path):
        return None
    try:
        shard_list(path)
    except FileNotFoundError as e:
        return str(e)
    return None


def is_shard_input(path: str, extensions) -> bool:
    if remote.isfile(path):
        return path.lower().endswith(extensions)
    if remote.isdir(path):
        names = remote.listdir(path)
        return any(n.lower().endswith(extensions) for n in names) and not any(
            n.lower().endswith(DECODED_EXTENSIONS) or n.startswith("cuts.") for n in names)  # cuts.*: lhotse Shar
    if _PATTERN.search(path):
        try:
            shards = shard_list(path)
        except FileNotFoundError:
            return False
        return bool(shards) and all(s.lower().endswith(extensions) for s in shards)
    return False


def index_tar(path: str, keep=lambda name: False, keep_max: int = 1 << 20):
    """(members, damage): ``members`` = [(name, data offset, size, data)] of the regular files,
    read from the headers alone (the data is seeked over; ``data`` holds the bytes of the members
    ``keep(name)`` selects, up to ``keep_max`` bytes each -- the sidecars, read on the way --
    else None); ``damage`` = None, or why reading stopped and at which byte offset (a truncated
    or corrupt shard: the members before it are intact).

    ustar, GNU and PAX headers are parsed here (a 512-byte read and a seek per member, several
    times faster than ``tarfile``'s iteration); what this parser does not know (a PAX global path,
    a malformed PAX record, a sparse member of any GNU or PAX kind) is indexed by ``tarfile``
    instead, whose sparse members get ``data`` :data:`SPARSE`."""
    members, damage = [], None
    total = remote.getsize(path)
    long_name, long_size = None, None  # from a PAX or GNU long-name header, for the next member
    with remote.open_input(path) as f:
        pos = 0
        while True:
            if pos + 512 > total:  # no end-of-archive marker: truncated (the samples after it, if any, are lost)
                if pos < total:
                    damage = f"truncated at byte {total}: a header at byte {pos} is incomplete"
                elif total == 0:
                    damage = "not a tar file (empty)"
                else:
                    damage = missing_end(total, pos, members[-1][0] if members else None)
                break
            if f.tell() != pos:
                f.seek(pos)
            header = f.read(512)
            if header == b"\0" * 512:
                if total % 512:
                    damage = f"truncated or damaged: its size ({total} bytes) is not a multiple of 512"
                break
            if _checksum(header) is False:
                damage = "not a tar file (bad header checksum at byte 0)" if pos == 0 else \
                    f"damaged at byte {pos} (bad header checksum)"
                break
            kind = header[156:157]
            size = _number(header[124:136])
            data_at = pos + 512
            pos = data_at + -(-size // 512) * 512
            if kind in (b"x", b"g", b"L", b"K"):  # PAX (per-member / global) or GNU long name / link
                if data_at + size > total:
                    damage = f"truncated at byte {total}: an extended header needs bytes up to {data_at + size}"
                    break
                data = f.read(size)
                if kind == b"x":
                    records = _pax_records(data)
                    if records is None or any(k.startswith(b"GNU.sparse.") for k in records):
                        return _index_with_tarfile(path, keep, keep_max)
                    long_name = records.get(b"path", long_name)
                    long_size = int(records[b"size"]) if b"size" in records else long_size
                elif kind == b"L":
                    long_name = data.split(b"\0", 1)[0]
                elif kind == b"g" and b"path" in (_pax_records(data) or {}):
                    return _index_with_tarfile(path, keep, keep_max)
                continue
            if kind == b"S":  # a GNU sparse member: its map and extension headers, read by tarfile
                return _index_with_tarfile(path, keep, keep_max)
            if long_size is not None:
                size, pos = long_size, data_at + -(-long_size // 512) * 512
            if long_name is not None:
                name = long_name
            else:
                name = header[:100].split(b"\0", 1)[0]
                if header[257:262] == b"ustar":
                    prefix = header[345:500].split(b"\0", 1)[0]
                    if prefix:
                        name = prefix + b"/" + name
            long_name, long_size = None, None
            name = name.decode("utf-8", "surrogateescape")
            if kind in (b"0", b"\0", b"7"):
                if data_at + size > total:
                    damage = f"truncated at byte {total}: member {name!r} needs bytes up to {data_at + size}"
                    break
                data = f.read(size) if keep(name) and size <= keep_max else None
                members.append((name, data_at, size, data))
    return members, damage


def missing_end(total: int, header_at: int, last: str | None, stream: str = "") -> str:
    """The damage of a tar that ends (at byte ``total``) where the next header (``header_at``) or
    the end-of-archive marker should be: cut at a member boundary, or inside a member's padding."""
    where = "at a member boundary" if header_at == total else f"in the header at byte {header_at}" \
        if header_at < total else f"inside the padding of member {last!r} (its blocks end at byte {header_at})"
    return f"truncated at byte {total}{stream}, {where}: no end-of-archive marker"


def _pax_records(data: bytes) -> dict | None:
    """``length key=value\\n`` records of a PAX header; None if malformed."""
    records, i = {}, 0
    try:
        while i < len(data) and data[i:i + 1] not in (b"\0", b""):
            space = data.index(b" ", i)
            n = int(data[i:space])
            key, _, value = data[space + 1: i + n - 1].partition(b"=")
            records[key] = value
            i += n
    except ValueError:
        return None
    return records


def _number(field: bytes) -> int:
    """A tar header's numeric field: octal text, or GNU base-256 (first byte 0x80)."""
    if field[0] & 0x80:
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip() or b"0"
    return int(text, 8)


def _checksum(header: bytes) -> bool:
    field = header[148:156]
    try:
        stored = int(field.split(b"\0", 1)[0].strip() or b"-1", 8)
    except ValueError:
        return False
    return stored == sum(header) - sum(field) + 256  # the field itself counts as 8 spaces


def _index_with_tarfile(path: str, keep=lambda name: False, keep_max: int = 1 << 20):
    members, damage = [], None
    size = remote.getsize(path)
    stream = remote.open_input(path)
    try:
        tf = tarfile.open(fileobj=stream, mode="r:")
    except tarfile.ReadError as e:
        stream.close()
        return [], f"not a tar file ({e})"
    with stream, tf, remote.open_input(path) as f:
        while True:
            try:
                info = tf.next()
            except (tarfile.ReadError, EOFError, OSError) as e:
                damage = f"damaged at byte {tf.offset} ({e or type(e).__name__})"
                break
            if info is None:
                f.seek(tf.offset)
                marker = f.read(512)
                if len(marker) < 512 or marker.strip(b"\0"):  # tarfile stops silently where the file ends
                    damage = missing_end(size, tf.offset, members[-1][0] if members else None)
                elif size % 512:
                    damage = f"truncated or damaged: its size ({size} bytes) is not a multiple of 512"
                break
            if not info.isfile():
                continue
            stored = stored_size(info)
            if info.offset_data + stored > size:
                damage = f"truncated at byte {size}: member {info.name!r} needs bytes up to {info.offset_data + stored}"
                break
            data = None
            if info.sparse is not None:
                data = SPARSE
            elif keep(info.name) and info.size <= keep_max:
                f.seek(info.offset_data)
                data = f.read(info.size)
            members.append((info.name, info.offset_data, info.size, data))
    return members, damage


def stored_size(info: tarfile.TarInfo) -> int:
    """The bytes a member's data takes in the archive after ``info.offset_data``: its size, or for a
    sparse member (whose ``size`` is the file's, holes included) the data blocks its map lists."""
    return info.size if info.sparse is None else sum(n for _, n in info.sparse)


def split_name(name: str) -> tuple[str, str]:
    """WebDataset (key, extension): ``dir/abc.flac`` -> (``dir/abc``, ``flac``); ``a.seg.json`` ->
    (``a``, ``seg.json``)."""
    folder, slash, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return folder + slash + stem, ext.lower()


def group_samples(members):
    """Consecutive members sharing a key -> [(key, {extension: (name, offset, size)})], in order (a
    key seen again later is another sample: a duplicate key, which dedup makes an error row)."""
    samples = []
    for name, offset, size, data in members:
        key, ext = split_name(name)
        if not samples or samples[-1][0] != key:
            samples.append((key, {}))
        samples[-1][1].setdefault(ext, (name, offset, size, data))
    return samples


def audio_candidate(ext: str, audio_ext) -> bool:
    """Whether a member of WebDataset extension ``ext`` can be its sample's audio: one of
    ``audio_ext`` (``--audio-ext``), else any extension a decoder reads."""
    last = ext.rsplit(".", 1)[-1]
    if audio_ext:
        wanted = tuple(e.lower().lstrip(".") for e in audio_ext)
        return ext in wanted or last in wanted
    return "." + last in DECODED_EXTENSIONS


def _audio_member(parts: dict, audio_ext):
    """The sample's audio member: the first whose extension is an audio one (or in ``audio_ext``)."""
    return next((member for ext, member in parts.items() if audio_candidate(ext, audio_ext)), None)


def _read_bytes(path: str, offset: int, size: int) -> bytes:
    return remote.read_range(path, offset, size)


def sample_entries(shard: str, shown: str, key: str, parts: dict, options, kind: str, data_of=None) -> Entry:
    """One sample -> its entry: audio member, sidecar id and segment, or the reason it has none.
    ``data_of(member)`` gives a member's bytes (the sidecar), read from the shard by default."""
    data_of = data_of or (lambda m: m[3] if m[3] is not None else _read_bytes(shard, m[1], m[2]))
    clean = posixpath.normpath(key) if key else key  # ./a, a//b -> a, a/b
    if climbs(clean) or clean.startswith("/"):  # ../x, /etc/x: never a key (a Shar output's member name)
        shown_key = f"{shown}/{printable(key).replace('/', '%2F')}"
        return Entry(shard, shown_key, key=shown_key, where=f"{shown}:{printable(key)}", kind=kind,
                     error=f"member name {printable(key)!r} climbs out of the shard ('..' or a leading '/'): "
                           "not read (path traversal)")
    key = clean
    where = f"{shown}:{key}"
    default_key = key_stem(key) if options.key == "stem" else f"{shown}/{key}"
    sparse = next((m[0] for m in parts.values() if m[3] is SPARSE), None)
    if sparse is not None:
        return Entry(shard, f"{shown}/{sparse}", key=default_key, where=where, kind=kind, error=sparse_error(sparse))
    audio = _audio_member(parts, options.audio_ext)
    if audio is None:
        wanted = ", ".join(options.audio_ext) if options.audio_ext else "an audio extension"
        return Entry(shard, default_key, key=default_key, where=where, kind=kind,
                     error=f"sample has no audio member ({wanted}); members: " + ", ".join(sorted(parts)))
    name, offset, size = audio[:3]
    entry = Entry(shard, f"{shown}/{name}", key=default_key, where=where, kind=kind, loc=MemberLoc(offset, size, name))
    if "json" in parts:
        try:
            row = json_object(data_of(parts["json"]), f"sidecar {parts['json'][0]!r}")
        except ValueError as e:
            entry.error = str(e)
            return entry
        if options.id_field:
            ident = row.get(options.id_field)
            if ident in (None, ""):
                entry.error = f"sidecar {parts['json'][0]!r} has no {options.id_field!r}"
                return entry
            try:
                ident = id_text(ident)
            except ValueError as e:
                entry.error = f"sidecar {parts['json'][0]!r}: {e}"
                return entry
            if problem := text_problem(ident):
                entry.key, entry.error = printable(ident), f"id {problem}"
                return entry
            entry.key = ident
        try:
            segment_fields(row, entry, options.sidecar_duration)
        except ValueError as e:
            entry.error = f"sidecar {parts['json'][0]!r}: {e}"
        try:
            entry.meta = options.keep.pick(row, skip=(options.id_field, *ITEM_FIELDS[2:]))  # text, speaker... (--keep-fields)
        except ValueError as e:  # over the bounds a row's fields may take
            entry.error = entry.error or f"sidecar {parts['json'][0]!r}: {e}"
    elif options.id_field:
        entry.error = f"sample has no .json sidecar with {options.id_field!r}"
    return entry


def guarded_sample(shard: str, shown: str, key: str, parts: dict, options, kind: str, data_of=None) -> Entry:
    """:func:`sample_entries`, whatever the sample holds: what it raises is that sample's error row
    (named ``shard:key``), never the shard's or the run's end."""
    try:
        return sample_entries(shard, shown, key, parts, options, kind, data_of)
    except Exception as e:
        return row_failed(f"{shown}:{printable(key)}", e, shard, kind)


def sidecar_bytes(shard: str, parts: dict) -> bytes | None:
    """A sample's ``.json`` sidecar bytes (kept by the index, else read from the shard), or None."""
    member = parts.get("json")
    if member is None:
        return None
    return member[3] if member[3] is not None else _read_bytes(shard, member[1], member[2])


def check_first_samples(options, shown: str, samples: list[tuple[dict, bytes | None]]) -> None:
    """``--audio-ext`` and ``--id-field`` against an input's first samples (each: its members by
    extension, and its ``.json`` sidecar's bytes or None).  When not one of them has such a member
    or field, the option is wrong (a typo, another dataset's name), not the data: one clear error
    before anything is loaded, not an error row per sample.  Samples that lack it beside others
    that have it stay error rows."""
    if not samples:
        return
    if options.audio_ext and not any(_audio_member(parts, options.audio_ext) for parts, _ in samples):
        found = dict.fromkeys(ext for parts, _ in samples for ext in parts)
        raise ValueError(f"--audio-ext {','.join(options.audio_ext)}: no sample among the first {len(samples)} of "
                         f"{shown} has such a member (members: {', '.join(found)})")
    if not options.id_field:
        return
    fields: dict[str, None] = {}
    for _, data in samples:
        try:
            row = json_object(data) if data is not None else None
        except ValueError:
            continue
        if row is not None:
            if options.id_field in row:
                return
            fields.update(dict.fromkeys(row))
    if not fields:
        raise ValueError(f"--id-field {options.id_field!r}: the samples of {shown} have no .json sidecar to read it from")
    raise ValueError(f"--id-field {options.id_field!r}: no .json sidecar of the first {len(samples)} samples of {shown} "
                     f"has it (fields: {', '.join(fields)})")


def shown_names(shards: list[str]) -> list[str]:
    """Shard names as keys show them: the file name, or the path relative to the shards' common
    folder when two shards share a file name."""
    names = [remote.basename(s) for s in shards]
    if len(set(names)) == len(names):
        return names
    if remote.is_url(shards[0]):  # (posixpath folds the URL's '//' alike in both)
        common = posixpath.commonpath(shards)
        return [posixpath.relpath(s, common) for s in shards]
    common = os.path.commonpath([os.path.abspath(s) for s in shards])
    return [os.path.relpath(os.path.abspath(s), common).replace(os.sep, "/") for s in shards]


def shard_identity(shards: list[str]) -> dict:
    """The input's identity for run.json: every shard with its size and modification time (an
    object's ETag: :func:`remote.identity`), so a resume over shards that were rewritten, added or
    removed is refused."""
    return {"shards": [remote.identity(s) for s in shards]}


@register
class TarSource(Source):
    """Uncompressed tar shards (WebDataset), read by offset; see the module docstring."""

    kind = "tar"
    detect_order = 20
    loc_type = MemberLoc

    @classmethod
    def detect(cls, path: str) -> bool:
        return is_shard_input(path, TAR_EXTENSIONS)

    def shards(self) -> list[str]:
        if not hasattr(self, "_shards"):
            self._shards = tar_shards(self.path, compressed=False)
        return self._shards

    @classmethod
    def why_not(cls, path: str) -> str | None:
        return missing_shard(path)

    def input_shards(self) -> list[str]:
        return [remote.absolute(s) for s in self.shards()]

    def entries(self, warnings: list[str]) -> list[Entry]:
        shards = self.shards()
        entries, checked = [], False
        for shard, shown in self.mine(list(zip(shards, shown_names(shards)))):  # (names: over every shard)
            full = remote.absolute(shard)
            members, damage = index_tar(full, keep=lambda name: name.lower().endswith(".json"))
            samples = group_samples(members)
            if samples and not checked:  # the first shard's samples say whether --id-field, --audio-ext fit
                check_first_samples(self.options, shown, [(parts, sidecar_bytes(full, parts)) for _, parts in samples])
                checked = True
            for key, parts in samples:
                entries.append(guarded_sample(full, shown, key, parts, self.options, self.kind))
            if damage:
                entries.append(Entry(full, f"{shown}@damage", key=f"{shown}@damage", where=shown, kind=self.kind,
                                     error=f"{shown}: {damage}; the samples after it are not read"))
                warnings.append(f"{shown}: {damage}")
        return entries

    def identity(self) -> dict:
        return shard_identity(self.mine(self.shards()))

    @staticmethod
    def open(entry):
        loc = entry.loc
        return open_member(entry.path, int(loc.offset), int(loc.size), loc.name)

    @classmethod
    def open_header(cls, entry):
        """A member up to 4 MiB is read in one ``pread`` and probed from memory: as cheap as probing
        a loose file (75 us per FLAC header here), where the file view's Python reads cost 95 us."""
        loc = entry.loc
        if int(loc.size) > _PROBE_IN_MEMORY or remote.is_url(entry.path):  # (an object's: its header's bytes only)
            return cls.open(entry)
        return read_member(entry.path, int(loc.offset), int(loc.size), loc.name)
