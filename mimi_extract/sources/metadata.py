"""``--metadata FILE``: transcripts and fields that ship beside the audio (a VoxPopuli-style TSV beside
its ``.tar.gz`` parts, a CSV of speakers, a JSONL of texts), joined to the items of any input.

A row joins the item whose id is its key column's value (``--metadata-key``, default ``id``), or, for
an item without an id, whose file or member name's stem is (``en/x/abc.flac`` -> ``abc``, the
WebDataset sample key).  The row's other fields become the item's metadata -- beside what the input
itself says, which wins where both name a field -- and go where every kept field goes (the manifest
row's ``meta``, the cuts' supervisions and custom fields, Parquet columns), chosen by
``--keep-fields`` as the input's own.  What matched nothing, and how many items found no row, is said
in the run's warnings (rows matching nothing only when the whole input was read, not in a part of a
job array).  CSV and TSV are read by Python's ``csv``, JSONL row by row (``json_object``): a malformed
row is skipped and counted, never the run's end."""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field

from ..config.input_options import CSV_FIELD_LIMIT, Keep
from .base import Entry, json_object, key_stem, shown_value

_SHOWN = 5  # ids named in a warning


@dataclass
class MetadataTable:
    """The rows of a metadata file by their key column's value."""

    path: str
    key: str
    rows: dict[str, dict] = field(default_factory=dict)
    duplicates: list[str] = field(default_factory=list)  # keys given again (the first row is kept)
    malformed: list[str] = field(default_factory=list)  # lines that are no row (where, why)

    @classmethod
    def load(cls, path: str, key: str = "id") -> "MetadataTable":
        """Read ``path`` (``.tsv``, ``.csv``, ``.jsonl``/``.json`` lines); ValueError naming the file
        when it has no ``key`` column at all (a wrong ``--metadata-key``: one clear error)."""
        table = cls(path, key)
        name = path.lower()
        with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:  # (as a list's: see files.py)
            if name.endswith((".jsonl", ".json")):
                rows = table._json_rows(f)
            elif name.endswith((".csv", ".tsv", ".txt")):
                rows = table._csv_rows(f, "," if name.endswith(".csv") else "\t")
            else:
                raise ValueError(f"--metadata {path}: a .tsv, .csv or .jsonl file")
            seen_key = False
            for where, row in rows:
                if key not in row:
                    continue
                seen_key = True
                ident = row.pop(key)
                if ident in (None, ""):
                    table.malformed.append(f"{where}: no {key!r}")
                    continue
                ident = str(ident) if isinstance(ident, (str, int)) and not isinstance(ident, bool) else None
                if ident is None:
                    table.malformed.append(f"{where}: {key!r} is not a string or a whole number")
                elif ident in table.rows:
                    table.duplicates.append(ident)
                else:
                    table.rows[ident] = row
        if not seen_key and (table.rows or table.malformed or os.path.getsize(path)):
            raise ValueError(f"--metadata {path}: no row has a {key!r} column (name the id column with "
                             "--metadata-key)")
        return table

    def _csv_rows(self, f, delimiter: str):
        csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_LIMIT))  # (as a list's: long transcripts)
        reader = csv.DictReader(f, delimiter=delimiter)
        while True:
            where = f"line {reader.line_num + 1}"
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                self.malformed.append(f"{where}: {e}")
                continue
            yield where, {k: v for k, v in row.items() if isinstance(k, str) and v not in (None, "")}

    def _json_rows(self, f):
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield f"line {n}", json_object(line, f"line {n}")
            except ValueError as e:
                self.malformed.append(str(e))

    def join(self, entries: list[Entry], keep: Keep, whole_input: bool = True) -> list[str]:
        """Each entry's row, the fields ``keep`` keeps (``--keep-fields``), added to its ``meta`` (the
        input's own fields win); the warnings to show.  A row over the bounds a row's fields may take
        is its item's error."""
        used: set[str] = set()
        without = []
        for e in entries:
            candidates = [e.key] if e.key is not None else []
            candidates.append(key_stem(e.loc.name if e.loc is not None else e.rel))
            ident = next((c for c in candidates if c in self.rows), None)
            if ident is None:
                if e.error is None:
                    without.append(e.key or e.rel)
                continue
            used.add(ident)
            try:
                picked = keep.pick(self.rows[ident])
            except ValueError as error:
                e.error = e.error or f"--metadata {os.path.basename(self.path)} row {ident!r}: {error}"
                continue
            if picked:
                e.meta = {**picked, **(e.meta or {})}
        warnings = []
        name = os.path.basename(self.path)
        if without:
            warnings.append(f"--metadata {name}: {len(without)} item(s) have no row (first: "
                            f"{', '.join(map(shown_value, without[:_SHOWN]))})")
        unused = [k for k in self.rows if k not in used]
        if unused and whole_input:
            warnings.append(f"--metadata {name}: {len(unused)} row(s) match no item (first: "
                            f"{', '.join(map(shown_value, unused[:_SHOWN]))})")
        if self.duplicates:
            warnings.append(f"--metadata {name}: {len(self.duplicates)} {self.key!r} value(s) given again (the first "
                            f"row kept: {', '.join(map(shown_value, self.duplicates[:_SHOWN]))})")
        if self.malformed:
            warnings.append(f"--metadata {name}: {len(self.malformed)} line(s) skipped ({self.malformed[0]})")
        return warnings
