"""How INPUT is read: the input options (:class:`Options`, the command line's ``--input-format``,
``--id-column``, ``--keep-fields``...) and what metadata its items keep (:class:`Keep`).

Plain values, torch-free: the command line builds them and a run request carries them before torch
is imported; ``sources`` reads the input by them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property

# names a kept field may not have: the outputs' own (Parquet columns, the cuts' array fields);
# ``supervisions`` is lhotse's, in ``meta``
RESERVED_FIELDS = frozenset({"key", "path", "start", "end", "duration", "channel", "frames", "dims", "sample_rate",
                             "codes", "latent", "encoder", "mimi_codes", "mimi_latent", "mimi_encoder", "supervisions"})


# bounds on what one row may hold, so one odd row is its own error row, never the run's end (a row's
# kept fields travel into the manifest's JSON rows, the cuts and Parquet columns)
MAX_ROW_BYTES = 1 << 20  # a list line, sidecar, manifest row or a row's kept fields (a transcript: a few KB)
MAX_NESTING = 64  # levels of nested lists/objects (Python's JSON gives up near 1,000, and a writer's dumps too)
CSV_FIELD_LIMIT = 8 << 20  # a CSV/TSV field (csv's own 128 KiB limit made a long transcript an error that also
# swallowed the rows after it); a row over MAX_ROW_BYTES is then its own error row


def is_scalar(value) -> bool:
    return isinstance(value, (str, bool, int, float))


def is_utf8(text: str) -> bool:
    """Whether ``text`` can be stored as UTF-8: False with a lone surrogate (a ``"\\udc80"`` escape in
    JSON, or a byte of a file that is not UTF-8, kept so by ``surrogateescape``), which no output stores."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def nesting(value) -> int:
    """Levels of lists/objects in a JSON-like value (0: a scalar), counted without recursion."""
    depth, level = 0, [value]
    while True:
        level = [x for x in level if isinstance(x, (dict, list, tuple))]
        if not level:
            return depth
        depth += 1
        level = [v for x in level for v in (x.values() if isinstance(x, dict) else x)]


@dataclass
class Keep:
    """Which fields of an input row an item carries into the outputs (``--keep-fields``, alias
    ``--keep-columns``): ``default`` every scalar field (string, number, boolean); ``all`` nested
    values too (lists and objects: JSON); ``none`` nothing (not even a lhotse cut's supervisions);
    or the names listed.  Never the fields that made the item (``skip``: a list row's id, path and
    segment, the ``--id-field``, the audio and id columns), nor one named as an output's own column
    (:data:`RESERVED_FIELDS`: ``duration``, ``path``...): that one is left out and named in a
    warning (``dropped``), or refused when listed by name."""

    mode: str = "default"  # default | all | none | names
    names: tuple[str, ...] = ()
    dropped: set = field(default_factory=set)  # reserved names seen (and not kept) in default/all mode

    @classmethod
    def parse(cls, spec: str | None) -> "Keep":
        """``None`` (default), ``all``, ``none`` or ``a,b,c``; ValueError for a reserved name."""
        if spec is None or spec.strip() == "":
            return cls()
        if spec.strip().lower() in ("all", "none"):
            return cls(spec.strip().lower())
        names = tuple(dict.fromkeys(n.strip() for n in spec.split(",") if n.strip()))
        taken = [n for n in names if n in RESERVED_FIELDS]
        if taken:
            raise ValueError(f"--keep-fields {taken[0]!r}: the outputs have their own {taken[0]!r} column or field, "
                             "so it cannot be kept as metadata")
        return cls("names", names)

    @property
    def keeps_supervisions(self) -> bool:
        return self.mode != "none"

    def wants(self, name: str, scalar: bool) -> bool:
        """Whether a field (a Parquet column: ``scalar`` from its type) is read at all."""
        if self.mode == "names":
            return name in self.names
        if self.mode == "none":
            return False
        if name in RESERVED_FIELDS:
            self.dropped.add(name)
            return False
        return scalar or self.mode == "all"

    def pick(self, row: dict, skip=()) -> dict | None:
        """The kept fields of one row (a sidecar, a list row, a Parquet row, a cut's ``custom``),
        JSON-able; None when nothing is kept.  ``skip``: fields that already made the item (the
        ``--id-field``, the audio and id columns).  A null or absent field is not kept."""
        if self.mode == "none":
            return None
        out = {}
        for name in (self.names if self.mode == "names" else row):
            value = row.get(name)
            if value is None or name in skip or not isinstance(name, str):
                continue  # (a name listed that is an item field: the names mode's own choice, skipped too)
            if self.mode != "names":
                if name in RESERVED_FIELDS:
                    self.dropped.add(name)
                    continue
                if self.mode == "default" and not is_scalar(value):
                    continue
            if isinstance(value, (bytes, bytearray)):
                continue
            if not is_scalar(value):  # nested (or a type JSON lacks: a date): its JSON form
                if nesting(value) > MAX_NESTING:
                    raise ValueError(f"field {name!r} is nested over {MAX_NESTING} levels deep")
                value = json.loads(json.dumps(value, default=str))
            if not (is_utf8(name) and is_utf8(value if isinstance(value, str) else
                                              json.dumps(value, ensure_ascii=False, default=str))):
                raise ValueError(f"field {name.encode('utf-8', 'backslashreplace').decode()!r} is not valid "
                                 "UTF-8 text (a lone surrogate: a \\udcXX escape, or a file in another "
                                 "encoding)")
            out[name] = value
        if out and len(json.dumps(out, default=str)) > MAX_ROW_BYTES:
            raise ValueError(f"the kept fields take over {MAX_ROW_BYTES} bytes (--keep-fields names fewer)")
        return out or None


@dataclass(frozen=True)
class Options:
    """What a kind may need besides INPUT (the CLI's input options).  Frozen: whoever reads an input
    by them (``sources.discover``) leaves its caller's as they were."""

    recordings: str | None = None  # lhotse supervisions: their recordings
    exclude: str | None = None  # the run's OUT: never an input
    audio_ext: tuple[str, ...] | None = None  # tar: which members are the audio (".flac",)
    id_field: str | None = None  # tar: the sidecar field holding the id
    audio_column: str | None = None  # parquet
    id_column: str | None = None  # parquet
    input_format: str | None = None  # a registered kind, instead of detecting it
    sort_buffer_mb: float = 256  # compressed tar: the bounded sorting buffer (MiB)
    keep_fields: str | None = None  # --keep-fields / --keep-columns: what metadata items carry (Keep)
    sidecar_duration: str = "auto"  # a duration alone in a sidecar or list row: see segment_fields
    key: str = "path"  # keys without an id: "path" (as named) or "stem" (the file or member name's stem)
    # a list's rows without an id: keyed by their path relative to the corpus root ("root", the default
    # when None) or as the list writes it ("written": what an OUT made before 0.3 keyed them by)
    list_keys: str | None = None
    metadata: str | None = None  # --metadata: a TSV/CSV/JSONL file of fields joined to the items (sources.metadata)
    metadata_key: str = "id"  # --metadata-key: its column holding the id or the file stem

    @cached_property
    def keep(self) -> Keep:
        """:class:`Keep` of ``keep_fields``, parsed once (it collects the reserved names it met)."""
        return Keep.parse(self.keep_fields)
