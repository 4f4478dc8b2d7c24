"""The sources' common ground: :class:`Entry`, :class:`Item`, the :class:`Source` interface and
its registry, the shared header probe and the key rules.

A *source kind* (a directory, a list, a lhotse manifest, tar shards, Parquet...) is one class
registered here under its name.  It says whether it recognises an INPUT (``detect``), lists its
:class:`Entry` rows (``entries``), opens one entry's or item's bytes (``open``: a path or a
seekable file-like object that soundfile reads) and describes the input's identity for run.json
(``identity``).  Everything else -- probing headers, segments, channels, framing, keys and their
uniqueness -- is shared, so a kind is one small module.  Items are small and picklable: an item
names *where* its bytes are (``kind`` + ``loc``, e.g. a shard's path and a member's offset and
size), and whoever encodes it (a worker process, a Ray actor) opens them itself.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, fields
from decimal import ROUND_HALF_UP, Decimal


from ..common import remote
from ..audio.decoders import DECODED_EXTENSIONS, open_decoder
from ..audio.framing import Framing
from ..config.choices import SIDECAR_DURATION_MODES
from ..config.input_options import MAX_NESTING, MAX_ROW_BYTES, Options, is_scalar, is_utf8, nesting

# what a directory walk picks up: every extension a decoder reads, but not video containers
AUDIO_EXTENSIONS = tuple(e for e in DECODED_EXTENSIONS if e not in (".mp4", ".mkv", ".3gp", ".asf", ".snd", ".au"))


class SourceError(Exception):
    """An entry whose bytes cannot be reached (missing file, truncated shard...): its error row."""


class Loc:
    """Where an entry's bytes are inside its ``path`` (a shard), one frozen dataclass per source kind
    that has them (the Source's ``loc_type``); None on an entry or item: the file itself.  Its last
    field is ``name``: what the bytes are called (a member's name), told to the decoder.  The
    manifest stores it as the list of its fields (``source.loc``), which :func:`loc_of` reads back."""

    name: str

    def values(self) -> list:
        """The fields, in order: the manifest's ``source.loc``."""
        return [getattr(self, f.name) for f in fields(self)]


@dataclass
class Entry:
    """One thing a source asks for: ``path`` (absolute), shown as ``rel``; a segment in seconds."""

    path: str
    rel: str
    key: str | None = None  # None: derived from rel (and the segment)
    start: float | None = None
    duration: float | None = None
    channel: int | None = None
    error: str | None = None
    where: str | None = None  # the row it came from ("line 12"), named in its error messages
    kind: str = "file"  # the source kind that opens its bytes
    loc: Loc | None = None  # where the bytes are within ``path``, for that kind (None: the file)
    # a ``duration`` with no start, end or offset (Emilia's sidecars, NeMo manifests): the file's
    # length as the corpus wrote it (rounded), a segment only when clearly shorter (see probe_info)
    duration_only: bool = False
    key_base: str | None = None  # what derived keys start from instead of ``rel`` (``--key stem``)
    meta: dict | None = None  # what the input says about it, kept for the outputs (see :class:`Keep`)
    # its audio header when the source already has it (anything :func:`probe_info` takes: a compressed
    # tar probes each member from the bytes streaming by): probing then opens nothing
    header: object | None = None


@dataclass(frozen=True)
class SplitPiece:
    """Piece ``index`` of ``count`` of a split recording (see ``plan.split_items``), in encoder-input
    samples of the recording: decoding starts at ``begin``, the warm-up before ``first`` (its frames
    belong to the piece before: they are encoded, then dropped), and the piece ends at ``end``."""

    index: int
    count: int
    begin: int
    first: int
    end: int

    @property
    def last(self) -> bool:
        return self.index == self.count - 1


@dataclass
class Item:
    """One utterance to encode: a file, a segment of it, or one channel of either."""

    path: str  # absolute
    rel: str  # as the user named it (relative to the input dir or list)
    key: str  # unique name in the output
    channel: int | str = "mix"
    sample_rate: int = 0
    start: int = 0  # first source sample
    frames: int = 0  # source samples
    samples: int = 0  # 24 kHz encoder input samples (after the framing's padding)
    error: str | None = None
    segment: tuple[float, float] | None = None  # (start, end) seconds, for segment items
    file_frames: int = 0  # the whole file's samples and channels (for lhotse recordings)
    file_channels: int = 0
    where: str | None = None  # the input row it came from, for messages ("line 12")
    kind: str = "file"  # see Entry
    loc: Loc | None = None
    # one piece of a split recording (see plan.split_items); ``samples`` is then the piece's own
    # stream length (end - begin)
    piece: SplitPiece | None = None
    # what the input says about the item (sidecar/list/Parquet fields, a lhotse cut's custom fields
    # and ``supervisions``: lhotse dicts, times relative to the item's start), JSON-able and small:
    # it rides with the item to the manifest row, the cuts and the Parquet columns (see :class:`Keep`)
    meta: dict | None = None

    @property
    def uid(self) -> str:
        """What the engines track a unit of work by: the key, or the key and the piece."""
        return self.key if self.piece is None else f"{self.key}\x00piece{self.piece.index}"

    @property
    def duration(self) -> float:
        """Seconds of source audio."""
        return self.frames / self.sample_rate if self.sample_rate else 0.0


@dataclass
class Discovered:
    items: list[Item]  # encodable
    bad: list[Item]  # error rows (unreadable, duplicate, bad segment...)
    warnings: list[str] = field(default_factory=list)
    root: str = ""  # the input's identity, recorded in run.json
    kind: str = "directory"
    identity: dict = field(default_factory=dict)  # the kind's own description (shards, sizes, mtimes)
    metadata: dict = field(default_factory=dict)  # the kept fields' output columns: name -> type (metadata_columns)
    # a job array's part divided by whole input shards (see :func:`discover`'s ``part``): every shard
    # of the input, in order (part I of N took shards I, I+N, I+2N...); None: not divided by shard
    part_shards: list[str] | None = None


def dataset_name(key: str) -> str:
    """HDF5 dataset name for ``key``: flat and injective ('%' -> %25, '/' -> %2F, leading '.' ->
    %2E), so no key can collide with another key's group (``a.wav#ch0`` vs ``a.wav#ch0/b.wav``)."""
    name = key.replace("%", "%25").replace("/", "%2F")
    return "%2E" + name[1:] if name.startswith(".") else name


def non_utf8_shown(name: str) -> str | None:
    """None if ``name`` is valid UTF-8, else a readable rendering of its bytes."""
    try:
        name.encode("utf-8")
        return None
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


# -- what a row may hold (bounds, so one odd row is its own error row, never the run's end) ---
MAX_SECONDS = 1e8  # a start, end or duration past ~3 years is no recording's: refused, not multiplied out
MAX_NAME_BYTES = 4096  # a key, id or path (Linux's PATH_MAX)
MAX_CHANNEL = 1 << 16


def shown_value(value, limit: int = 60) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters (a 401-digit number, a 1 MB
    string), never raising (Python refuses str() of an int over 4,300 digits)."""
    try:
        text = repr(value)
    except ValueError:
        return f"<a number of {value.bit_length()} bits>" if isinstance(value, int) else f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _seconds(value, name: str) -> float | None:
    """Seconds from a row, or None; anything but a finite number within :data:`MAX_SECONDS` is
    refused (NaN, infinity and a 401-digit integer would otherwise reach the sample arithmetic and
    abort the whole run)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        if isinstance(value, bool):
            raise TypeError
        seconds = float(value)
    except OverflowError:
        raise ValueError(f"{name} {shown_value(value)} is out of range (over {MAX_SECONDS:g} s)") from None
    except (TypeError, ValueError):
        raise ValueError(f"{name} {shown_value(value)} is not a number") from None
    if not math.isfinite(seconds):
        raise ValueError(f"{name} {shown_value(value)} is not a finite number")
    if abs(seconds) > MAX_SECONDS:
        raise ValueError(f"{name} {seconds:g} s is out of range (over {MAX_SECONDS:g} s)")
    return seconds


def json_object(text: str | bytes, what: str = "row") -> dict:
    """A row's JSON object (a list line, a sidecar, a manifest row), or a ValueError that says why
    not in one line: not JSON, not an object, over :data:`MAX_ROW_BYTES`, nested deeper than
    :data:`MAX_NESTING` (Python's parser gives up near 1,000 levels with a RecursionError, and a
    row nested almost that deep would fail later in a writer's ``json.dumps`` instead)."""
    if len(text) > MAX_ROW_BYTES:
        raise ValueError(f"{what} is {len(text)} bytes long, over the {MAX_ROW_BYTES} a row may take")
    try:
        row = json.loads(text)
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply to parse (over {MAX_NESTING} levels)") from None
    except ValueError as e:  # (JSONDecodeError, UnicodeDecodeError, an int over 4,300 digits)
        raise ValueError(f"{what} is not valid JSON ({e})") from None
    if not isinstance(row, dict):
        raise ValueError(f"{what} is not a JSON object ({type(row).__name__})")
    if nesting(row) > MAX_NESTING:
        raise ValueError(f"{what} is nested over {MAX_NESTING} levels deep")
    return row


def row_failed(where: str, error: Exception, path: str = "", kind: str = "file") -> Entry:
    """The error row of a row whose reading raised what no rule foresaw: named by its ``where``
    (``shard:member``, ``line 12``), so that one row never ends the run or loses its neighbours."""
    return Entry(path, where, key=where, where=where, kind=kind,
                 error=f"{where}: cannot read this row ({type(error).__name__}: {shown_value(str(error), 200)})")


def id_text(value) -> str:
    """An id from a row as text: a string or a whole number; anything else (a list, an object, a
    float, a boolean) is refused -- its Python repr (``{'a': 1}``) is no one's id."""
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) >= 10 ** 64:
            raise ValueError(f"id {shown_value(value)} is not an id (a number of over 64 digits)")
        return str(value)
    if not isinstance(value, str):
        raise ValueError(f"id {shown_value(value)} is not a string or a whole number")
    if climbs(value):
        raise ValueError(f"id {value!r} climbs out of its folder (a '..' component): a key names a member of "
                         "OUT's files (a Shar tar's), never a path outside them")
    return value


def climbs(name: str) -> bool:
    """Whether ``name``, as a '/'-separated path, has a '..' component (path traversal)."""
    return ".." in name.split("/")


def _channel(value) -> int | None:
    """A channel index from a row: a whole number >= 0 (``1.7`` or ``-1`` is an error, not channel 1)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 6:
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_CHANNEL:
        return value
    raise ValueError(f"channel {shown_value(value)} is not a channel index (a whole number from 0 to "
                     f"{MAX_CHANNEL - 1})")


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be a key or a name in the outputs (HDF5 names and attributes, JSON
    rows), or None: an embedded NUL, or a lone surrogate (not encodable as UTF-8)."""
    if "\x00" in text:
        return "contains a NUL character"
    if len(text) > MAX_NAME_BYTES // 4 and len(text.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"is longer than {MAX_NAME_BYTES} bytes"
    if not is_utf8(text):
        return "is not valid Unicode (a lone surrogate)"
    return None


def printable(text: str) -> str:
    """``text`` with NULs and lone surrogates escaped: safe as an error row's key."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


# A ``duration`` alone (no start, end or offset) within this many seconds of the file's own length
# is that length, as the corpus wrote it, not a request to cut: Emilia's sidecars round to 3
# decimals (0.5 ms; 6.096 for a 6.09571 s file), other corpora to 2 (5 ms), and a decoder's count
# of an MP3's samples may differ from the writer's by a few samples.  10 ms is an eighth of a
# Mimi frame (80 ms): a deliberate cut is longer than that.  A segment whose end passes the file's
# end by at most this much is clamped to the end (the rounding of the same number), not refused.
DURATION_TOLERANCE = 0.010
# the row fields that say where the audio is and which part of it: not the item's ``meta``
SEGMENT_FIELDS = ("start", "end", "duration", "offset", "channel")


def segment_fields(row: dict, entry: Entry, sidecar_duration: str = "auto", start_field: str = "start") -> None:
    """``start`` (or ``start_field``: NeMo's ``offset``), ``end`` or ``duration`` (seconds) and
    ``channel`` of a list row or a sidecar into ``entry``; raises ValueError naming the field.

    A ``duration`` alone is, by ``sidecar_duration``: ``auto`` the file's length as written when it
    matches it within :data:`DURATION_TOLERANCE` (the whole file), else a segment from 0;
    ``segment`` always a segment from 0; ``ignore`` not read (the whole file)."""
    if sidecar_duration not in SIDECAR_DURATION_MODES:
        raise ValueError(f"sidecar duration mode {sidecar_duration!r}: choose from {', '.join(SIDECAR_DURATION_MODES)}")
    entry.start = _seconds(row.get(start_field), start_field)
    end = _seconds(row.get("end"), "end")
    entry.duration = _seconds(row.get("duration"), "duration")
    if end is not None:
        if entry.duration is not None:
            raise ValueError("give end or duration, not both")
        entry.duration = end - (entry.start or 0.0)
    elif entry.duration is not None and entry.start is None:
        if sidecar_duration == "ignore":
            entry.duration = None
        else:
            entry.duration_only = sidecar_duration == "auto"
    if entry.duration is not None and entry.start is None:
        entry.start = 0.0
    entry.channel = _channel(row.get("channel"))


# -- metadata kept for the outputs (--keep-fields: input_options.Keep) ------------------------
# what a list row or a sidecar already says about the item itself (read, never kept as metadata)
ITEM_FIELDS = ("id", "path", "start", "end", "duration", "channel")


def _value_kind(name: str, value) -> str:
    if name == "supervisions" or not is_scalar(value):
        return "json"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64" if -2**63 <= value < 2**63 else "json"
    return "float64" if isinstance(value, float) else "string"


def metadata_columns(metas) -> dict[str, str]:
    """The output columns of the kept fields over all of an input's ``meta`` dicts: name -> type
    (``string``, ``int64``, ``float64``, ``bool``; ``json``: a JSON string, for nested or mixed
    values and lhotse ``supervisions``).  Decided over the whole input before any shard is written
    (and recorded in run.json), so every shard, and every part of a job array, has the same schema."""
    kinds: dict[str, set] = {}
    for meta in metas:
        for name, value in (meta or {}).items():
            kinds.setdefault(name, set()).add(_value_kind(name, value))
    out = {}
    for name, found in sorted(kinds.items()):
        if len(found) == 1:
            out[name] = found.pop()
        elif found == {"int64", "float64"}:
            out[name] = "float64"
        else:
            out[name] = "json"
    return out


def supervisions_for_channel(meta: dict | None, channel: int) -> dict | None:
    """``meta`` for one channel of a multi-channel item: only the supervisions on that channel."""
    if not meta or "supervisions" not in meta:
        return meta
    sups = [s for s in meta["supervisions"] if s.get("channel") is None or s["channel"] == channel
            or (isinstance(s["channel"], list) and channel in s["channel"])]
    return {**meta, "supervisions": sups}


# -- probing -------------------------------------------------------------------------------
def seconds_to_samples(seconds: float, rate: int) -> int:
    """lhotse's rounding (``compute_num_samples``: round to 8 digits, then half up), so a segment
    read here starts and ends on the very samples lhotse's ``load_audio`` reads."""
    return int(Decimal(round(seconds * rate, 8)).quantize(0, rounding=ROUND_HALF_UP))


def _key_seconds(seconds: float) -> str:
    """Seconds in a segment key, to the microsecond (below one sample at any audio rate), so that
    distinct segments of a long recording get distinct keys (``%g`` kept six digits: 1234.56 and
    1234.564 collided)."""
    return f"{seconds:.6f}".rstrip("0").rstrip(".")


def segment_key(rel: str, start: float, end: float) -> str:
    return f"{rel}@{_key_seconds(start)}-{_key_seconds(end)}"


def key_stem(name: str) -> str:
    """``--key stem``: a file or member name's base name up to its first dot (WebDataset's sample
    key; VoxPopuli's and most corpus TSVs' utterance id): ``en/x/abc.flac`` -> ``abc``."""
    return name.rstrip("/").rpartition("/")[2].partition(".")[0]


# The input options that decide which items an input yields, what audio each one is and its key
# (Options field -> its command-line flag).  They are the run's item identity, recorded in run.json
# (``items``, see :func:`item_identity`): a resume that changes one is refused, since its items would
# be stored a second time under other keys (or other audio under the same keys).  A new option that
# shapes items or keys is one line here.  (The kind read, ``--input-format`` or detected, is recorded
# as ``input_kind``, and ``--channel`` as ``channel``: both are compared the same way.)
ITEM_OPTIONS: dict[str, str] = {
    "list_keys": "--list-keys",
    "audio_ext": "--audio-ext",
    "id_field": "--id-field",
    "audio_column": "--audio-column",
    "id_column": "--id-column",
    "key": "--key",
    "sidecar_duration": "--sidecar-duration",
}


def item_identity(options: Options | None, kind: str | None = None) -> dict[str, str]:
    """{flag: value} of the :data:`ITEM_OPTIONS` given a value other than their default.  Only those
    are recorded, so an option added later (absent from an older run.json) reads as its default,
    which is how that older run made its items -- except ``--list-keys``, whose default changed (a
    list's rows were keyed as written): it is recorded for every list input, and its absence from an
    older list OUT's run.json reads as ``written`` (``store.identity``; the runner resumes such an OUT
    with its keys)."""
    options = options or Options()
    default = Options()
    out = {}
    for name, flag in ITEM_OPTIONS.items():
        value = getattr(options, name)
        if value != getattr(default, name):
            out[flag] = ",".join(value) if isinstance(value, (tuple, list)) else value
    if kind == "list":
        out["--list-keys"] = options.list_keys or "root"
    else:
        out.pop("--list-keys", None)
    return out


class Source:
    """One kind of input.  Subclasses set ``kind`` and implement ``detect``, ``entries`` and,
    when their bytes are not plain files, ``open``; ``register`` makes them known."""

    kind = ""
    summary = ""  # shown beside ``kind`` in ``--input-format``'s help (when the name alone is not enough)
    loc_type: type[Loc] | None = None  # where an entry's bytes are in a shard (None: entries are files)
    # where detection asks this kind (lower first; then in the order modules register): a container
    # (a lhotse manifest, shards, a Shar or Parquet folder) before any directory and any list
    detect_order: int = 50

    def __init__(self, path: str, options: Options):
        self.path, self.options = path, options

    @classmethod
    def detect(cls, path: str) -> bool:
        raise NotImplementedError

    def entries(self, warnings: list[str]) -> list[Entry]:
        raise NotImplementedError

    def identity(self) -> dict:
        """What run.json records about the input beyond its path (e.g. the shard list)."""
        return {}

    # which of ``input_shards()`` this run reads (their indices: a job array's part); None: all
    only: frozenset[int] | None = None

    def input_shards(self) -> list[str] | None:
        """The input's whole shards (absolute paths, in the input's order), found without opening
        any: what a job array's part takes whole; None when the input is not sharded."""
        return None

    def mine(self, shards: list) -> list:
        """The members of ``shards`` (one per input shard, in order) that this run reads."""
        return shards if self.only is None else [s for n, s in enumerate(shards) if n in self.only]

    @staticmethod
    def open(entry: Entry | Item):
        """A path or a seekable binary file-like object with the entry's audio bytes; raises
        :class:`SourceError` when they cannot be reached.  Runs wherever the item is encoded."""
        if not os.path.exists(entry.path):
            raise SourceError("file not found")
        if os.path.getsize(entry.path) == 0:
            raise SourceError("empty file (0 bytes)")
        return entry.path

    @classmethod
    def why_not(cls, path: str) -> str | None:
        """When no kind detects ``path``: why this kind does not, if it can say more than
        "matches nothing" (a shard pattern naming a shard that does not exist)."""
        return None

    @classmethod
    def open_header(cls, entry: Entry):
        """What planning probes (header only): :meth:`open` unless a kind has something cheaper."""
        return cls.open(entry)

    def probe(self, entry: Entry, channel_mode: str, framing: Framing) -> list[Item]:
        return probe(entry, channel_mode, framing)

    @staticmethod
    def plan_group(item: Item) -> int:
        """Items are length-sorted within their group only, and groups run in order (0: one global
        sort; a compressed tar, which can only be read forward, sorts within each buffer-full)."""
        return 0


REGISTRY: dict[str, type[Source]] = {}


def register(cls: type[Source]) -> type[Source]:
    """Class decorator: make a kind of input known (``--input-format KIND``, and detection, in the
    order of ``detect_order``)."""
    REGISTRY[cls.kind] = cls
    ordered = sorted(REGISTRY.items(), key=lambda kv: kv[1].detect_order)
    REGISTRY.clear()
    REGISTRY.update(ordered)
    return cls


def plan_group(item: Item) -> int:
    """See :meth:`Source.plan_group`."""
    return REGISTRY.get(item.kind, Source).plan_group(item)


def loc_of(kind: str, values: list | None) -> Loc | None:
    """A manifest row's ``source.loc`` (what :meth:`Loc.values` gave) as its kind's :class:`Loc`."""
    return None if values is None else REGISTRY[kind].loc_type(*values)


def bytes_name(thing: Entry | Item) -> str:
    """What an entry's or item's bytes are called (a member's name, a plain file's path): the name a
    decoder guesses their format from."""
    return thing.loc.name if thing.loc is not None else thing.path


def open_source(thing: Entry | Item):
    """The bytes of an entry or item, opened by its kind (a path or a file-like object); plain
    files (kind "file", what directories, lists and lhotse manifests name) by :meth:`Source.open`."""
    return REGISTRY.get(thing.kind, Source).open(thing)


def probe(entry: Entry, channel_mode: str = "mix", framing: Framing = Framing()) -> list[Item]:
    """Header-only look at one entry -> its items (one per channel with ``each``), or one error item."""
    if entry.error:
        return probe_info(entry, None, channel_mode, framing)
    if entry.header is not None:
        return probe_info(entry, entry.header, channel_mode, framing)
    handle = None
    try:
        handle = REGISTRY.get(entry.kind, Source).open_header(entry)
        f = open_decoder(handle, bytes_name(entry), entry.rel)  # accurate message naming shard/member, decoder warnings captured
        try:
            return probe_info(entry, f, channel_mode, framing)
        finally:
            f.close()
    except SourceError as e:
        return probe_info(entry, str(e), channel_mode, framing)
    except Exception as e:  # soundfile raises several types for garbage
        return probe_info(entry, e, channel_mode, framing)
    finally:
        if handle is not None and not isinstance(handle, str):
            handle.close()


def probe_info(entry: Entry, info, channel_mode: str = "mix", framing: Framing = Framing()) -> list[Item]:
    """Items of ``entry`` given its opened header ``info`` (anything with ``samplerate``, ``frames``
    and ``channels``; a string: why its bytes cannot be reached; an exception: why they are not
    audio; None: ``entry.error`` says why).

    A segment given by ``start`` alone runs to the end of the file, and its key, its manifest
    start/end and its lhotse cut all say so (they said start..start).  Every error names the
    entry's row."""
    base = entry.key_base or entry.rel  # what a derived key starts from
    key = entry.key or base
    segment = None
    if entry.start is not None and entry.duration is not None and not entry.duration_only:
        segment = (entry.start, entry.start + entry.duration)

    def error(message: str, segment=segment) -> list[Item]:
        k = key if entry.key is not None or segment is None else segment_key(base, *segment)
        if entry.channel is not None and entry.key is None:
            k = f"{k}#ch{entry.channel}"
        if entry.where and not message.startswith(entry.where + ":"):
            message = f"{entry.where}: {message}"
        return [Item(entry.path, entry.rel, k, error=message, segment=segment, where=entry.where, kind=entry.kind,
                     loc=entry.loc, meta=entry.meta)]

    if entry.error:
        return error(entry.error)
    for name, value in (("start", entry.start), ("duration", entry.duration)):  # (every kind's numbers: one rule)
        if value is not None and not (math.isfinite(value) and abs(value) <= MAX_SECONDS):
            return error(f"segment {name} {shown_value(value)} is out of range (a finite number of at most "
                         f"{MAX_SECONDS:g} s)")
    if info is None or isinstance(info, str):
        return error(info or "cannot open")
    if isinstance(info, BaseException):
        return error(f"unreadable or corrupt audio header: {info}")
    if info.frames <= 0:
        return error("no audio samples (zero-length)")
    rate = info.samplerate
    start, frames = 0, info.frames
    whole = entry.duration_only and abs(entry.duration - info.frames / rate) <= DURATION_TOLERANCE
    if entry.start is not None and not whole:
        if entry.start < 0:
            return error(f"segment start {entry.start:g} s is negative")
        open_ended = entry.duration is None
        duration = info.frames / rate - entry.start if open_ended else entry.duration
        segment = (entry.start, info.frames / rate) if open_ended else (entry.start, entry.start + duration)
        if duration <= 0:
            return error(f"segment duration {duration:g} s is not positive", segment)
        start, frames = seconds_to_samples(entry.start, rate), seconds_to_samples(duration, rate)
        if open_ended:
            frames = min(frames, info.frames - start)
        if frames < 1:
            return error(f"segment of {duration:g} s is shorter than one sample at {rate} Hz", segment)
        if entry.key is None:
            key = segment_key(base, *segment)
        if start + frames > info.frames:
            if start >= info.frames or (start + frames - info.frames) / rate > DURATION_TOLERANCE:
                return error(f"segment {entry.start:g}-{entry.start + duration:g} s is past the end of the file "
                             f"({info.frames / rate:g} s)", segment)
            # past the end by no more than the rounding of its numbers: up to the end (the key
            # keeps the numbers as written, the segment says what is read)
            frames = info.frames - start
            segment = (entry.start, info.frames / rate)
    if entry.channel is not None and entry.channel >= info.channels:
        return error(f"has {info.channels} channel(s), no channel {entry.channel}", segment)
    if entry.channel is not None and entry.key is None:
        key = f"{key}#ch{entry.channel}"
    samples = framing.input_length(frames, rate)
    if channel_mode == "each" and entry.channel is None:
        channels = list(range(info.channels))
    else:
        channels = [entry.channel if entry.channel is not None else channel_mode]
    return [
        Item(entry.path, entry.rel, f"{key}#ch{c}" if channel_mode == "each" and entry.channel is None else key,
             c, rate, start, frames, samples, segment=segment, file_frames=info.frames, file_channels=info.channels,
             where=entry.where, kind=entry.kind, loc=entry.loc,
             meta=supervisions_for_channel(entry.meta, c) if len(channels) > 1 else entry.meta)
        for c in channels
    ]


def safe_probe(source: Source, entry: Entry, channel: str, framing: Framing) -> list[Item]:
    """``source.probe``, and any surprise it raises is this entry's error row, never the run's end."""
    try:
        return source.probe(entry, channel, framing)
    except Exception as e:
        return probe_info(Entry(entry.path, entry.rel, entry.key, where=entry.where, kind=entry.kind, loc=entry.loc,
                                error=f"cannot probe: {type(e).__name__}: {e}"), None, channel, framing)


def dedup(probed: list[Item]) -> tuple[list[Item], list[Item]]:
    """(items, error items) with unique keys.  Only an encodable item reserves its key: a later
    item with a taken key is a "duplicate key" error, but a bad row never shadows a good one.  An
    error item whose key is taken gets its row's name appended, so every manifest row has its own
    key and a resume (which skips keys already done) writes the same error rows again."""
    seen: dict[str, Item] = {}
    items, bad = [], []
    for it in probed:
        if it.error is not None:
            bad.append(it)
        elif it.key in seen:
            first = seen[it.key]
            it.error = f"duplicate key {it.key!r} (also {first.where + ': ' if first.where else ''}{first.rel})"
            if it.where:
                it.error = f"{it.where}: {it.error}"
            bad.append(it)
        else:
            seen[it.key] = it
            items.append(it)
    taken = set(seen)
    for it in bad:
        if it.key in taken:
            base, n = f"{it.key} [{it.where or it.rel}]", 1
            it.key = base
            while it.key in taken:
                n += 1
                it.key = f"{base} ({n})"
        taken.add(it.key)
    return items, bad




def source_kind(source: str, input_format: str | None = None) -> str:
    """The registered kind that reads ``source``; one clear error when none does."""
    if input_format:
        if input_format not in REGISTRY:
            raise ValueError(f"--input-format {input_format!r}: choose from {', '.join(sorted(REGISTRY))}")
        return input_format
    if not remote.exists(source) and not any(c in source for c in "*?{["):
        raise FileNotFoundError(f"input {source!r} does not exist")
    for kind, cls in REGISTRY.items():
        if cls.detect(source):
            return kind
    if os.path.isfile(source):
        raise ValueError(f"input {source!r} is a file but not a list (.txt .jsonl .csv .tsv, a NeMo .json), a lhotse manifest "
                         "(.jsonl.gz) or another known input (" + ", ".join(sorted(REGISTRY)) + ")")
    for cls in REGISTRY.values():
        if why := cls.why_not(source):
            raise FileNotFoundError(why)
    raise FileNotFoundError(f"input {source!r} matches nothing")
