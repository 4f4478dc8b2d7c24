"""What the sources hand on: an :class:`Entry` (what a kind lists: a file or a member of a shard, a
segment, a channel), an :class:`Item` (an entry probed: what is encoded), the :class:`Loc` of bytes
inside a shard, and :class:`Discovered` (an input's items).  Plain data: an item is small and
picklable, naming *where* its bytes are (``kind`` + ``loc``, e.g. a shard's path and a member's
offset and size), so that whoever encodes it (a worker process, a Ray actor) opens them itself."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ..config.rates import CodecMix


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

    @property
    def codec_mix(self) -> CodecMix:
        """The items' audio seconds per codec class and sample rate (``plan``'s costs, and the run's
        default feeding processes per GPU: ``Settings.fed``)."""
        return CodecMix.of((bytes_name(it), it.sample_rate, it.duration) for it in self.items)


def bytes_name(thing: Entry | Item) -> str:
    """What an entry's or item's bytes are called (a member's name, a plain file's path): the name a
    decoder guesses their format from."""
    return thing.loc.name if thing.loc is not None else thing.path
