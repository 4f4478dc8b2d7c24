"""``manifest.jsonl``: one row per input (ok rows name their shard, error rows say why), the
run directories of OUT, and which format's shard a name is.  A row's ``shard`` is a name, never
trusted as a path: only names a registered format writes are accepted."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

from ..common import remote
from ..common.messages import bounded
from ..formats import registry
from ..formats.base import Format, array_checksum, bytes_checksum
from ..formats.records import StoredRow
from ..formats.registry import format_of
from . import files as store_files  # (write_all, sync: the one byte writer and fsync, as they are when called)
from .files import MANIFEST, PART_RE, RUN_INFO, SEGMENT_RE, SEGMENTS, TMP_RE, MalformedError, OutputError, write_error

if TYPE_CHECKING:  # (sources import the audio stack: readers of OUT must stay light)
    from ..sources import Item


def run_dirs(out_dir: str) -> list[str]:
    """The run directories of OUT: OUT itself, or its ``part-I-of-N`` folders (a local folder or a
    URL: one listing of OUT's names either way)."""
    return _run_dirs(out_dir, remote.names(out_dir))


def _run_dirs(out_dir: str, names) -> list[str]:
    parts = sorted(remote.join(out_dir, n) for n in set(names) if PART_RE.fullmatch(n))
    if RUN_INFO in names or not parts:
        return [out_dir] + parts
    return parts


def out_files(out_dir: str) -> list[RunFiles]:
    """:class:`RunFiles` of every run directory of OUT (:func:`run_dirs`, in its order).  On object
    storage OUT is listed once, its parts and all (LIST requests of 1,000 names), not once per part."""
    if not remote.is_url(out_dir):
        return [RunFiles(d) for d in run_dirs(out_dir)]
    listing = remote.listing(out_dir)
    own: dict[str, int] = {}
    parts: dict[str, dict[str, int]] = {}
    for name, size in listing.items():
        head, sep, rest = name.partition("/")
        if sep and PART_RE.fullmatch(head):
            parts.setdefault(head, {})[rest] = size
        else:
            own[name] = size
    names = {name.partition("/")[0] for name in listing}
    return [RunFiles(d, own if d == out_dir else parts.get(remote.basename(d), {})) for d in _run_dirs(out_dir, names)]


def format_of_path(shard: str) -> Format:
    """The format of a shard path relative to OUT (``shard-00000.h5``, ``part-0-of-2/shard-00000.h5``)."""
    parts = shard.split("/")
    for i in range(len(parts)):
        fmt = format_of("/".join(parts[i:]))
        if fmt is not None:
            return fmt
    raise OutputError(f"{shard!r} is not a shard name this tool writes")


def valid_shard_name(name) -> bool:
    """A shard name as a writer makes it: a name matching a registered format's ``shard_re`` (a
    plain file name, or one under that format's fixed folder), never any other path."""
    return isinstance(name, str) and _valid_name(name)


@functools.lru_cache(maxsize=4096)
def _valid_name(name: str) -> bool:  # (a shard's rows all name it: its name is matched once, not per row)
    return format_of(name) is not None and not name.endswith(".tmp")


def is_tmp(name: str) -> bool:
    """One of the temporary names this tool writes in a run directory (or a format's folder)."""
    return bool(TMP_RE.fullmatch(name)) or (
        name.endswith(".tmp") and any(f.is_file(name[:-4].replace("__", "/")) for f in registry.formats()))


def remove_tmps(run_dir: str) -> None:
    """Remove every temporary this tool writes in a run directory (and its formats' folders): a
    commit a kill cut short, or the ``.tmp`` files of a device worker that died mid-shard."""
    for name in os.listdir(run_dir):
        if is_tmp(name):
            os.remove(os.path.join(run_dir, name))
    for name, _ in list(format_files(run_dir)):
        if name.endswith(".tmp") and os.path.exists(os.path.join(run_dir, name)):
            os.remove(os.path.join(run_dir, name))


def format_files(run_dir: str):
    """(relative name, format) of every file in the format folders of a run directory that some
    format's ``file_re`` matches, ``.tmp`` names included."""
    for fmt in registry.formats():
        folder = os.path.join(run_dir, fmt.folder) if fmt.folder else run_dir
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            rel = f"{fmt.folder}/{name}" if fmt.folder else name
            if fmt.is_file(rel.removesuffix(".tmp")):
                yield rel, fmt


@dataclass(frozen=True)
class ManifestRow:
    """One row of ``manifest.jsonl`` as a writer makes it: the input item (``path``, ``key``...), then,
    once it is stored, its shape and where it is (``shard``, ``status``, ``checksum``, and the
    format's ``stored`` fields), or why it is not (``error``).  Rows read back are
    :class:`~mimi_extract.formats.records.StoredRow` (:func:`read_rows`: checked, then typed), an
    older version's included; the public ``read_manifest()`` gives users each row's own JSON."""

    key: str
    path: str | None = None
    dataset: str | None = None
    channel: int | None = None
    sample_rate: int | None = None
    duration: float | None = None
    start: float | None = None  # a segment of its source (seconds); absent for a whole file
    end: float | None = None
    source: dict | None = None  # how to reach its audio again: lhotse recordings, verify --out
    meta: dict | None = None  # what the input says about it (text, speaker...)
    decoder_warnings: str | None = None
    frames: int | None = None  # ok rows: the stored array's shape
    dims: int | None = None
    stored: dict | None = None  # where the format put it in its shard (``ShardBuilder.add``'s fields)
    shard: str | None = None
    status: str | None = None  # "ok" or "error" once written
    error: str | None = None
    checksum: str | None = None
    shard_checksum: str | None = None  # crc32 of the whole shard file as committed (:func:`with_shard_checksum`)
    si_sdr: float | None = None  # --fidelity: the decoded codes against the encoder's input (codec.fidelity)
    mel_distance: float | None = None

    @classmethod
    def for_item(cls, item: Item, decoder_warnings: str | None = None, fidelity=None) -> ManifestRow:
        from ..sources import dataset_name  # (the runner has them loaded)

        source = None
        if item.error is None:  # what a lhotse Recording needs, without probing the file again; the path
            # absolute, so that the cuts load their audio (and verify --out re-reads it) from any directory
            source = {"path": remote.absolute(item.path), "frames": item.file_frames, "channels": item.file_channels}
            if item.kind != "file":  # a member of a container: how to reach its bytes again (verify --out)
                source.update(kind=item.kind, loc=item.loc.values() if item.loc is not None else None)
        start, end = item.segment if item.segment is not None else (None, None)
        return _made(key=item.key, path=item.rel, dataset=dataset_name(item.key),
                     channel=item.channel if isinstance(item.channel, int) else None,
                     sample_rate=item.sample_rate or None, duration=round(item.duration, 4), start=start, end=end,
                     source=source, meta=item.meta or None, decoder_warnings=decoder_warnings,
                     si_sdr=fidelity.si_sdr if fidelity is not None else None,
                     mel_distance=fidelity.mel_distance if fidelity is not None else None)

    def changed(self, **changes) -> ManifestRow:
        """A copy with ``changes`` (field names), as ``dataclasses.replace`` makes it, without its
        per-field ``getattr`` and its ``__init__``'s 21 ``object.__setattr__`` calls: 1 µs instead of
        7-8, and the writer makes two or three per item (issue 40).  The row is frozen, with no
        ``__post_init__`` and no derived field, so its fields are its ``__dict__``."""
        if not _FIELD_NAMES.issuperset(changes):
            raise TypeError(f"not fields of ManifestRow: {sorted(set(changes) - _FIELD_NAMES)}")
        fields_ = dict(self.__dict__)
        fields_.update(changes)
        return _as_row(fields_)

    def shaped(self, data: np.ndarray, **changes) -> ManifestRow:
        """With the shape of its array (time first), and ``changes`` (one copy of the row: a writer
        makes a few per item)."""
        return self.changed(frames=int(data.shape[0]), dims=int(data.shape[1]) if data.ndim > 1 else None, **changes)

    def ok(self, data: np.ndarray, shard: str, stored: dict) -> ManifestRow:
        """The stored item's row: this row (already :meth:`shaped` by its writer, which handed the
        format its record) with where ``data`` went and its checksum."""
        return self.changed(stored=stored or None, shard=shard, status="ok", error=None, checksum=array_checksum(data))

    def failed(self, message: str, shard: str | None = None) -> ManifestRow:
        """An error row; ``shard``: the shard holding its placeholder (``--shar-extend``)."""
        return self.changed(shard=shard, status="error", error=bounded(message))

    def as_stored(self) -> StoredRow:
        """The row so far as the read side's record (what a format's ``ShardBuilder.add`` is handed,
        and what :meth:`as_dict` lays out): its set fields, the format's ``stored`` ones among them."""
        row = {name: value for name, value in self.__dict__.items() if value is not None and name != "stored"}
        row.update(self.stored or {})  # (its fields are its __dict__, in field order: :meth:`changed`)
        return StoredRow.from_dict(row)

    def as_dict(self) -> dict:
        """Its JSON, laid out by the one rule the read side writes rows back with
        (:meth:`StoredRow.to_dict`): the input's fields always (``null`` when unknown), the others when
        they apply."""
        return self.as_stored().to_dict()


_FIELD_NAMES = frozenset(f.name for f in fields(ManifestRow))
# each field's default, in field order (``key``, which has none, is always given)
_UNSET = {f.name: None if f.default is MISSING else f.default for f in fields(ManifestRow)}


def _as_row(fields_: dict) -> ManifestRow:
    """The row whose ``__dict__`` is ``fields_`` (every field, in field order), as ``ManifestRow(**fields_)``
    makes it, without its ``__init__``'s 21 ``object.__setattr__`` calls (:meth:`ManifestRow.changed`)."""
    row = object.__new__(ManifestRow)
    object.__setattr__(row, "__dict__", fields_)
    return row


def _made(**values) -> ManifestRow:
    """``ManifestRow(**values)`` (``values``: fields) at a third of its cost: the writer makes one per
    item (:meth:`ManifestRow.for_item`), 7 µs through the frozen dataclass's ``__init__`` (issue 40)."""
    fields_ = dict(_UNSET)
    fields_.update(values)
    return _as_row(fields_)


def item_attrs(item: Item) -> dict:
    """What a shard stores about an item beside its array (its duration, source rate and segment):
    the same wherever the shard is built (the runner, or a device worker)."""
    return {"duration": item.duration, "source_sample_rate": item.sample_rate,
            **({"start": item.segment[0], "end": item.segment[1]} if item.segment else {})}


def with_shard_checksum(rows: list[ManifestRow], files: dict, shard: str) -> list[ManifestRow]:
    """The rows of a shard about to be committed, each with the crc32 of the shard file's bytes
    (``files[shard]``): what ``verify --checksums`` compares before any library parses the file,
    so a byte flipped anywhere in it -- unused space, metadata that sends a parser into a loop --
    is found, not only one inside an array."""
    checksum = bytes_checksum(files[shard])
    return [r.changed(shard_checksum=checksum) if r.shard == shard else r for r in rows]


def in_shard(rows: list[ManifestRow], files: dict, shard: str) -> list[ManifestRow]:
    """Rows of one shard about to be committed, each naming ``shard`` with its checksum
    (:func:`with_shard_checksum`'s), in one copy of each row."""
    checksum = bytes_checksum(files[shard])
    return [r.changed(shard=shard, shard_checksum=checksum) for r in rows]


class ManifestAppender:
    """``manifest.jsonl`` of one run directory, open for appends: unbuffered, each call fsynced, so
    a failed write leaves at most a torn last line (which :func:`read_rows` ignores), nothing pending."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, MANIFEST)
        try:
            self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise write_error(e, self.path) from e

    def append(self, rows: list[ManifestRow]) -> None:
        try:
            store_files.write_all(self._fd, "".join(json.dumps(r.as_dict()) + "\n" for r in rows).encode("utf-8"))
            store_files.sync(self._fd)
        except OSError as e:
            raise write_error(e, self.path) from e

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def out_exists(out_dir: str, files: list[RunFiles]) -> bool:
    """Whether OUT is there at all (``files``: its :func:`out_files`): a local folder, or a prefix
    with objects under it (an object store has no empty folders)."""
    return any(f.listing for f in files) if remote.is_url(out_dir) else os.path.isdir(out_dir)


def manifest_segments(names) -> list[str]:
    """The segments that make a remote run directory's manifest, in order: of ``names`` (relative
    to the run directory), those of ``manifest.d/`` of the highest generation, by number."""
    found = []
    for name in names:
        folder, _, base = name.rpartition("/")
        if folder == SEGMENTS and (m := SEGMENT_RE.fullmatch(base)):
            found.append((int(m.group(1)), int(m.group(2)), name))
    top = max((g for g, _, _ in found), default=None)
    return [name for g, _, name in sorted(found) if g == top]


class RunFiles:
    """What the readers of one run directory ask of its files: does a file exist, how big is it,
    which files hold the manifest.  A local run directory answers with ``os`` calls as they come; one
    on object storage with one listing (LIST requests of 1,000 names: no request per shard)."""

    def __init__(self, run_dir: str, listing: dict[str, int] | None = None):
        self.path = run_dir
        self.listing = listing if listing is not None or not remote.is_url(run_dir) else remote.listing(run_dir)
        self._exists: dict[str, bool] = {}
        self._read: dict[str, bytes] = {}  # path -> bytes read ahead (:func:`read_ahead`)

    def read(self, path: str) -> bytes:
        """A small file of the run directory (its path): read ahead, or read now."""
        data = self._read.get(path)
        return data if data is not None else remote.read_bytes(path)

    def exists(self, name: str) -> bool:
        if self.listing is not None:
            return name in self.listing
        found = self._exists.get(name)
        if found is None:
            found = self._exists[name] = os.path.exists(os.path.join(self.path, name))
        return found

    def size(self, name: str) -> int | None:
        """A file's size (None: no such file)."""
        if self.listing is not None:
            return self.listing.get(name)
        path = os.path.join(self.path, name)
        return os.path.getsize(path) if os.path.isfile(path) else None

    def manifest_files(self) -> list[str]:
        """The files whose lines, in order, are the manifest: ``manifest.jsonl``; on object storage
        its segments (:func:`manifest_segments`)."""
        if self.listing is not None:
            return [remote.join(self.path, name) for name in manifest_segments(self.listing)]
        path = os.path.join(self.path, MANIFEST)
        if not os.path.exists(path):
            return []
        if not os.path.isfile(path):
            raise MalformedError(f"{path} is not a file: OUT's manifest must be one (move it away, or use another OUT)")
        return [path]


def read_ahead(files: list[RunFiles], names: tuple[str, ...], manifests: bool = True) -> None:
    """On object storage, read the small files ``names`` (run.json, plan.json...) and (``manifests``)
    the manifest segments of every run directory at once, ``remote.READ_MANY`` GETs in flight
    across all parts (round trips: a few per batch, not one per file).  Held in memory until those
    :class:`RunFiles` go: for commands that hold every row anyway (status, info), not for streaming
    readers.  Locally: nothing (files are read as they are needed)."""
    wanted = [(f, remote.join(f.path, n)) for f in files if f.listing is not None for n in names if f.exists(n)]
    if manifests:
        wanted += [(f, p) for f in files if f.listing is not None for p in f.manifest_files()]
    for start in range(0, len(wanted), 8 * remote.READ_MANY):
        batch = wanted[start:start + 8 * remote.READ_MANY]
        try:
            contents = remote.read_many([p for _, p in batch])
        except FileNotFoundError:  # a run began a new generation and removed these meanwhile
            raise OutputError(f"{files[0].path}: OUT changed while it was read (a run is rewriting it); try again") from None
        for (f, p), data in zip(batch, contents):
            f._read[p] = data


def manifest_lines(files: RunFiles) -> Iterator[tuple[str, int, str]]:
    """(file, line number, text) of every line of a run directory's manifest, streamed: a local
    file line by line, segments a batch of ``remote.READ_MANY`` at a time (concurrent GETs)."""
    paths = files.manifest_files()
    if files.listing is None:
        for path in paths:
            with open(path, encoding="utf-8", errors="replace") as f:
                yield from ((path, n, line) for n, line in enumerate(f, 1))
        return
    for start in range(0, len(paths), remote.READ_MANY):
        batch = paths[start:start + remote.READ_MANY]
        try:
            contents = ([files._read[p] for p in batch] if all(p in files._read for p in batch)
                        else remote.read_many(batch))
        except FileNotFoundError:  # a run began a new generation and removed these meanwhile
            raise OutputError(f"{files.path}: its manifest changed while it was read (a run is rewriting it); "
                              "try again") from None
        for path, data in zip(batch, contents):
            text = data.decode("utf-8", errors="replace")
            yield from ((path, n, line) for n, line in enumerate(text.splitlines(keepends=True), 1))


_NUMBER = (int, float)
# the JSON types each field of a row may hold, as the readers use them (None: null); a field not
# listed is the reader's business (a newer version's: ignored)
_ROW_TYPES: dict[str, tuple] = {
    "key": (str,), "path": (str, None), "dataset": (str, None), "channel": (int, None), "sample_rate": (int, None),
    "duration": _NUMBER, "start": (*_NUMBER, None), "end": (*_NUMBER, None), "source": (dict, None),
    "meta": (dict, None), "decoder_warnings": (str, None), "frames": (int, None), "dims": (int, None),
    "shard": (str, None), "status": (str, None), "error": (str, None), "checksum": (str, None),
    "shard_checksum": (str, None), "si_sdr": (*_NUMBER, None), "mel_distance": (*_NUMBER, None),
    # the formats' own fields (``ShardBuilder.add``): Parquet's row, a Shar member's bytes and checksums
    "index": (int,), "offset": (int,), "nbytes": (int,), "meta_checksum": (str, None), "cut_checksum": (str, None),
}
_SOURCE_TYPES: dict[str, tuple] = {"path": (str,), "frames": (int,), "channels": (int,), "kind": (str, None)}


def _typed(value, kinds: tuple) -> bool:
    if value is None:
        return None in kinds
    if isinstance(value, bool):  # (a bool is an int to Python, not to a row)
        return bool in kinds
    return isinstance(value, _CLASSES.get(kinds) or tuple(k for k in kinds if k is not None))


# each field's kinds as isinstance takes them, made once (a row is checked each time a manifest is read:
# at a run's end, by every reader)
_CLASSES = {kinds: tuple(k for k in kinds if k is not None) for kinds in (*_ROW_TYPES.values(), *_SOURCE_TYPES.values())}
# the same rule for the exact types ``json.loads`` makes (no bool where an int is meant): a row whose
# fields all have one passes at a set lookup each; any other value goes through _typed, which names it
_EXACT = {field: frozenset(type(None) if k is None else k for k in kinds) for field, kinds in _ROW_TYPES.items()}


def _type_name(value) -> str:
    return "null" if value is None else {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
                                         int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def row_problem(row) -> str | None:
    """Why a parsed manifest line is not a row this tool writes (None: it is one): not an object,
    no ``key``, a field of the wrong type, an ok row without its shard or frame count, a ``shard``
    that is not a shard name a format writes (a row's ``shard`` is a name, never trusted as a path:
    nothing outside OUT may be read, moved or written because of what OUT's files say)."""
    if not isinstance(row, dict):
        return f"is {_type_name(row)}, not an object"
    if "key" not in row:
        return "has no key"
    for field, value in row.items():  # JSON's own types, exactly: one set lookup a field (the loop below says why not)
        if field in _EXACT and type(value) not in _EXACT[field]:
            break
    else:
        return _row_rules(row)
    for field, kinds in _ROW_TYPES.items():
        if field in row and not _typed(row[field], kinds):
            return f"has {field} {_type_name(row[field])} ({_shown(row[field])})"
    return _row_rules(row)


def _row_rules(row: dict) -> str | None:
    """:func:`row_problem` past its fields' types."""
    status = row.get("status")
    if status not in (None, "ok", "error"):
        return f"has status {_shown(status)} (neither 'ok' nor 'error')"
    source = row.get("source")
    if source is not None:
        for field, kinds in _SOURCE_TYPES.items():
            if field in source and not _typed(source[field], kinds) or (field != "kind" and field not in source):
                return f"has source.{field} {_type_name(source.get(field))}"
        if source["frames"] < 0 or source["channels"] < 1:
            return "has a source of no channels or negative length"

    supervisions = (row.get("meta") or {}).get("supervisions")
    if supervisions is not None and not (isinstance(supervisions, list) and all(isinstance(s, dict) for s in supervisions)):
        return "has meta.supervisions that are not a list of objects"
    for f in ("frames", "dims", "index", "offset", "nbytes"):  # (a loop, not any(): a generator a row cost 10% of a read)
        if isinstance(value := row.get(f), int) and value < 0:
            return "has a negative count or offset"
    if row.get("shard") is not None and not valid_shard_name(row["shard"]):
        return (f"names {row['shard']!r} as its shard, which is not a shard name this tool writes")
    return None


def committed_problem(row: dict) -> str | None:
    """What a committed ok row lacks of what readers take from it (its shard, frame count, and for
    one with a source, the path, sample rate and duration its cut is made of), or None.  Asked of
    committed rows only: a row naming a shard that never reached its name is a kill's leftover,
    dropped whatever it holds."""
    if row.get("status") != "ok":
        return None
    if row.get("shard") is None or not isinstance(row.get("frames"), int):
        return "is an ok row without its shard and frame count"
    if row.get("source") is not None and not (isinstance(row.get("path"), str) and _typed(row.get("sample_rate"), (int,))
                                              and row["sample_rate"] > 0 and "duration" in row):
        return "is an ok row without the path, sample rate and duration of its source"
    return None


def _shown(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _numbered_rows(files: RunFiles) -> Iterator[tuple[str, int, dict]]:
    """(file, line number, row) of every row of a run directory's manifest (:func:`iter_rows`)."""
    for path, n, line in manifest_lines(files):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        _refuse(path, n, row, row_problem(row))
        yield path, n, row


def _refuse(path: str, n: int, row, problem: str | None) -> None:
    if problem is not None:
        key = f" (key {row['key']!r})" if isinstance(row, dict) and isinstance(row.get("key"), str) else ""
        raise MalformedError(f"{path} line {n}{key} {problem}: the manifest was edited or damaged; "
                             "remove or fix that row")


def iter_rows(run_dir: str, files: RunFiles | None = None) -> Iterator[StoredRow]:
    """Every row of one run directory's manifest, streamed; a torn line (a run killed mid-write:
    not JSON) is ignored.  A line that is JSON but not a row this tool writes (:func:`row_problem`)
    is a :class:`MalformedError` naming the file, the line and the key: the manifest was edited or
    damaged, and no reader guesses what it meant."""
    return map(StoredRow.from_dict, (row for _, _, row in _numbered_rows(files or RunFiles(run_dir))))


def read_rows(run_dir: str) -> list[StoredRow]:
    """All rows of one run directory's manifest (:func:`iter_rows`)."""
    return list(iter_rows(run_dir))


def iter_committed(run_dir: str, files: RunFiles | None = None) -> Iterator[StoredRow]:
    """The committed rows of one run directory, streamed: rows whose shard was never renamed into
    place (a run killed, or a disk filled, between the manifest append and the rename) are left
    out: they are not committed, and resume drops them."""
    return map(StoredRow.from_dict, _committed_json(files or RunFiles(run_dir)))


def _committed_json(files: RunFiles) -> Iterator[dict]:
    """:func:`iter_committed`'s rows as their checked JSON (what ``read_manifest`` gives users)."""
    for path, n, row in _numbered_rows(files):
        shard = row.get("shard")
        if shard and not files.exists(shard):
            continue
        _refuse(path, n, row, committed_problem(row))
        yield row


def committed_rows(run_dir: str, files: RunFiles | None = None) -> list[StoredRow]:
    """:func:`iter_committed` as a list."""
    return list(iter_committed(run_dir, files))


def out_rows(out_dir: str, files: list[RunFiles] | None = None) -> list[StoredRow]:
    """The committed rows of every run directory of OUT (every part of a job array), each row's
    ``shard`` relative to OUT (``part-I-of-N/shard-...``); ``files``: OUT's listing when in hand."""
    rows = []
    for f in files if files is not None else out_files(out_dir):
        prefix = remote.relpath(f.path, out_dir)
        rows += (row.under(prefix) for row in iter_committed(f.path, f))
    return rows


def read_manifest(out_dir: str) -> list[dict]:
    """Committed rows of every run directory of OUT (all parts), ``shard`` relative to OUT: each
    row's own JSON, a plain dict (for users; the package reads :class:`StoredRow`)."""
    rows = []
    for d in run_dirs(out_dir):
        prefix = remote.relpath(d, out_dir)
        for row in _committed_json(RunFiles(d)):
            if row.get("shard") and prefix != ".":
                row["shard"] = f"{prefix}/{row['shard']}"
            rows.append(row)
    return rows


def next_shard_index(run_dir: str) -> int:
    """One more than the highest shard number any file or row of the run directory uses."""
    used = [int(m.group(1)) for name, fmt in format_files(run_dir)
            if (m := fmt.shard_re.fullmatch(name.removesuffix(".tmp")))]
    for r in read_rows(run_dir):
        fmt = format_of(r.shard or "")
        if fmt is not None:
            used.append(int(fmt.shard_re.fullmatch(r.shard).group(1)))
    return max(used, default=-1) + 1

def shard_attrs(out_dir: str, shard: str) -> dict:
    """The settings stored in a shard (relative to OUT)."""
    return format_of_path(shard).attrs(remote.join(out_dir, shard))
