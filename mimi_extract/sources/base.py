"""The :class:`Source` interface and its registry, and what goes through an entry's kind: opening
its bytes (:func:`open_source`), probing its header (:func:`probe`; :func:`safe_probe`: a surprise is
the entry's error row), reading its ``loc`` back.

A *source kind* (a directory, a list, a lhotse manifest, tar shards, Parquet...) is one class
registered here under its name.  It says whether it recognises an INPUT (``detect``), lists its
:class:`~.items.Entry` rows (``entries``), opens one entry's or item's bytes (``open``: a path or a
seekable file-like object that soundfile reads) and describes the input's identity for run.json
(``identity``).  Everything else is shared -- probing headers, segments and channels
(``probing.py``), the rules of a row's fields (``rows.py``) and of names (``text.py``), keys and
their uniqueness (``keys.py``), kept metadata (``kept.py``) -- so a kind is one small module."""

from __future__ import annotations

import os

from ..audio.decoders import open_decoder
from ..audio.framing import Framing
from ..config.input_options import Options
from .items import Entry, Item, Loc, SourceError, bytes_name
from .probing import probe_info


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


def safe_probe(source: Source, entry: Entry, channel: str, framing: Framing) -> list[Item]:
    """``source.probe``, and any surprise it raises is this entry's error row, never the run's end."""
    try:
        return source.probe(entry, channel, framing)
    except Exception as e:
        return probe_info(Entry(entry.path, entry.rel, entry.key, where=entry.where, kind=entry.kind, loc=entry.loc,
                                error=f"cannot probe: {type(e).__name__}: {e}"), None, channel, framing)
