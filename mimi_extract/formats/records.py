"""The typed records of what an OUT holds, read back: a manifest row (:class:`StoredRow`, with its
:class:`RowSource`) and a run directory's ``run.json`` (:class:`RunInfo`).  Both are made by
``from_dict`` from JSON the store has already checked (``store.manifest.row_problem``,
``store.identity.read_run_info``: the one implementation of each rule), so they convert, never check;
the package's readers (the store, audits, readers, formats) then read attributes, not the keys of a
dict whose absence, default and type each call site guessed again (lhotse's manifests, e.g.
``Recording.from_dict``, take the same approach).  They live here, below the store, because a format is handed
rows (``Format.check``, ``load``, ``item_attrs``...) and a run's settings (``Format.out_files``).

Keys neither record knows (a newer version's) are kept in ``extra`` and written back by
``to_dict``: readers ignore them, as they ignore them in the JSON.  The public ``read_manifest()``
still returns each row's own JSON (a plain dict) to users."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import NamedTuple


class RowSource(NamedTuple):
    """A row's ``source``: how to reach its audio again (a lhotse Recording, ``verify --out``): the
    file (``path``, absolute), its length and channels, and for a member of a container its
    ``kind`` and where it sits in it (``loc``, the source's ``Loc`` values).  A tuple, not a
    dataclass: every ok row has one, and a tuple of plain values is one object the garbage
    collector stops tracking (a Reader holds every row of OUT for a whole training run)."""

    path: str
    frames: int
    channels: int
    kind: str | None = None  # None: a plain file
    loc: list | dict | None = None

    @classmethod
    def from_dict(cls, d: dict) -> RowSource:
        return cls(d["path"], d["frames"], d["channels"], d.get("kind"), d.get("loc"))

    def to_dict(self) -> dict:
        out = {"path": self.path, "frames": self.frames, "channels": self.channels}
        if self.kind is not None:  # (as ``ManifestRow.for_item`` writes it: kind and loc together)
            out.update(kind=self.kind, loc=self.loc)
        return out


@dataclass(frozen=True)
class StoredRow:
    """One row of ``manifest.jsonl`` read back: the input item (``key``, ``path``...), its shape and
    where it is (``shard``, ``status``, ``checksum``) or why it is not (``error``), and the fields a
    format stored of where it put the item (``index``: Parquet's row; ``offset``, ``nbytes``,
    ``meta_checksum``, ``cut_checksum``: a Shar member; ``document``: a Megatron document).  A
    field the row does not have is None.  ``store.manifest.ManifestRow`` is the write side."""

    key: str
    path: str | None = None
    dataset: str | None = None
    channel: int | None = None
    sample_rate: int | None = None
    duration: float | None = None
    start: float | None = None
    end: float | None = None
    source: RowSource | None = None
    meta: dict | None = None  # what the input said about the item: its own fields, a dict by nature
    decoder_warnings: str | None = None
    frames: int | None = None
    dims: int | None = None
    shard: str | None = None
    status: str | None = None
    error: str | None = None
    checksum: str | None = None
    shard_checksum: str | None = None
    si_sdr: float | None = None
    mel_distance: float | None = None
    index: int | None = None
    offset: int | None = None
    nbytes: int | None = None
    meta_checksum: str | None = None
    cut_checksum: str | None = None
    document: int | None = None
    extra: dict | None = None  # keys this version does not know (a newer one's), kept for to_dict

    @property
    def ok(self) -> bool:
        """A stored item (not an error row)."""
        return self.status == "ok"

    @classmethod
    def from_dict(cls, d: dict) -> StoredRow:
        """A row from its (checked) JSON (``d`` is not changed)."""
        if _ROW_FIELDS.issuperset(d):
            known = dict(d)
        else:
            known = {k: v for k, v in d.items() if k in _ROW_FIELDS}
            known["extra"] = {k: v for k, v in d.items() if k not in _ROW_FIELDS}
        source = known.get("source")
        if source is not None:
            known["source"] = RowSource.from_dict(source)
        # the checked JSON becomes the record's attributes (a field it lacks reads its class default,
        # None): ``cls(**known)`` -- a frozen dataclass's __init__ setting 27 fields one
        # object.__setattr__ at a time -- made opening a 50,000-row OUT 1.6x slower (0.87 -> 1.39 s CPU)
        record = object.__new__(cls)
        object.__setattr__(record, "__dict__", known)
        return record

    def to_dict(self) -> dict:
        """Its JSON, laid out as ``ManifestRow.as_dict`` writes it: the input's fields always, the
        others when they apply."""
        row = {"path": self.path, "key": self.key, "dataset": self.dataset, "channel": self.channel,
               "sample_rate": self.sample_rate, "duration": self.duration}
        if self.start is not None:
            row["start"], row["end"] = self.start, self.end
        for name in _OPTIONAL:
            value = getattr(self, name)
            if value is not None:
                row[name] = value.to_dict() if name == "source" else value
        if self.status is not None:
            row.update(shard=self.shard, status=self.status, error=self.error)
        for name in ("checksum", "shard_checksum"):
            if getattr(self, name) is not None:
                row[name] = getattr(self, name)
        row.update(self.extra or {})
        return row

    def under(self, prefix: str) -> StoredRow:
        """With ``shard`` relative to OUT (``prefix``: its run directory relative to OUT, "." for OUT)."""
        return self if not self.shard or prefix == "." else replace(self, shard=f"{prefix}/{self.shard}")


_ROW_FIELDS = frozenset(f.name for f in fields(StoredRow)) - {"extra"}
_OPTIONAL = ("source", "meta", "decoder_warnings", "frames", "dims", "si_sdr", "mel_distance", "index", "offset",
             "nbytes", "meta_checksum", "cut_checksum", "document")


@dataclass(frozen=True)
class RunInfo:
    """A run directory's ``run.json`` read back (``store.identity.read_run``): the settings, model
    and input its outputs were made with, each field with what its absence meant when an older
    version wrote the file (no ``format``: HDF5, written before formats existed; no ``framing``,
    ``causal_16k``, ``frames_per_call``: transformers' framing; no ``resampled_length``: the exact
    24 kHz length of an OUT made before 0.3).  The comparisons a resume makes go key by key over the
    JSON itself (``store.identity``), so a key this version does not know still counts there."""

    model: str | None = None
    tap: str = "codes"
    format: str = "hdf5"
    channel: str | int | None = "mix"
    dtype: str | None = None
    feature_dtype: str = "float32"
    framing: str = "transformers"
    causal_16k: bool = True
    frames_per_call: int = 1
    resampled_length: str = "exact"
    num_quantizers: int | None = None
    fidelity: bool = False
    shar_extend: bool = False
    weights: str | None = None
    config_hash: str | None = None
    input: str | None = None
    input_kind: str | None = None
    input_identity: dict | None = None
    part: str | None = None
    part_shards: list | None = None
    items: dict | None = None
    metadata: dict | None = None  # the kept fields' columns: name -> type
    metadata_file: str | None = None
    keep_fields: str | None = None
    decoders: dict | None = None
    resample_on: str | None = None
    versions: dict | None = None
    tool_version: str | None = None
    schema_version: int = 1
    extra: dict | None = None  # the format's own settings (``Format.run_settings``) and keys this version does not know

    @classmethod
    def from_dict(cls, d: dict) -> RunInfo:
        """The record of a (checked) ``run.json``."""
        known = {k: v for k, v in d.items() if k in _INFO_FIELDS}
        if len(known) != len(d):
            known["extra"] = {k: v for k, v in d.items() if k not in _INFO_FIELDS}
        return cls(**known)

    def to_dict(self) -> dict:
        """Its JSON, with what an older ``run.json``'s absent keys meant filled in (its non-None
        fields), then ``extra``."""
        out = {name: getattr(self, name) for name in _INFO_ORDER if getattr(self, name) is not None}
        out.update(self.extra or {})
        return out

    def setting(self, name: str, default=None):
        """One of the format's own settings (``Format.run_settings``: Megatron's ``token_layout``...),
        or a key a newer version wrote; ``default`` when absent."""
        return (self.extra or {}).get(name, default)


_INFO_ORDER = tuple(f.name for f in fields(RunInfo) if f.name != "extra")
_INFO_FIELDS = frozenset(_INFO_ORDER)
