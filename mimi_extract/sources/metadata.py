"""``--metadata FILE``: transcripts and fields that ship beside the audio (a VoxPopuli-style TSV beside
its ``.tar.gz`` parts, a CSV of speakers, a JSONL of texts), joined to the items of any input.

A row joins the item whose id is its key column's value (``--metadata-key``, default ``id``), or whose
file or member name it is: the name with its extension, a relative path to it, or its stem
(``en/x/abc.flac`` -> ``abc``, the WebDataset sample key); see :func:`names_of`.  The row's other fields become the item's metadata -- beside what the input
itself says, which wins where both name a field -- and go where every kept field goes (the manifest
row's ``meta``, the cuts' supervisions and custom fields, Parquet columns), chosen by
``--keep-fields`` as the input's own.  What matched nothing, and how many items found no row, is said
in the run's warnings (rows matching nothing only when the whole input was read, not in a part of a
job array), with how the keys were compared; a join of the whole input that matches nothing is an
error before anything is encoded.  CSV and TSV are read by Python's ``csv``, JSONL row by row (``json_object``): a malformed
row is skipped and counted, never the run's end."""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field

from ..config.input_options import CSV_FIELD_LIMIT, Keep
from .items import Entry
from .keys import key_stem
from .rows import json_object
from .text import shown_value

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
        is its item's error.  An entry's row is the first of :func:`names_of` that a row's key value
        is, or ends with after a '/' (Common Voice's ``path`` column names ``x.mp3``, an item is
        keyed ``clips/x.mp3`` or ``x.mp3``; a value ``clips/x.mp3`` names the item ``x.mp3``).  A join
        of the whole input that matches no row to any item is a ValueError that shows how the keys
        were compared: a wrong ``--metadata-key`` or file, before anything is encoded."""
        used: set[str] = set()
        without: list[Entry] = []
        tails = self._tails()
        for e in entries:
            names = names_of(e)
            ident = next((n for n in names if n in self.rows), None) or next((tails[n] for n in names if n in tails),
                                                                              None)
            if ident is None:
                if e.error is None:
                    without.append(e)
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
        unused = [k for k in self.rows if k not in used]
        if without and not used and self.rows and whole_input:
            raise ValueError(f"--metadata {name}: no row matches any of the {len(without)} item(s) ("
                             f"{self._compared(without, unused)}); name the column that holds the items' ids or "
                             "file names with --metadata-key")
        if without:
            warnings.append(f"--metadata {name}: {len(without)} item(s) have no row ({self._compared(without, unused)})")
        if unused and whole_input:
            warnings.append(f"--metadata {name}: {len(unused)} row(s) match no item (first: "
                            f"{', '.join(map(shown_value, unused[:_SHOWN]))})")
        if self.duplicates:
            warnings.append(f"--metadata {name}: {len(self.duplicates)} {self.key!r} value(s) given again (the first "
                            f"row kept: {', '.join(map(shown_value, self.duplicates[:_SHOWN]))})")
        if self.malformed:
            warnings.append(f"--metadata {name}: {len(self.malformed)} line(s) skipped ({self.malformed[0]})")
        return warnings

    def _tails(self) -> dict[str, str]:
        """A row key value that is a relative path (``clips/x.mp3``) by each of its trailing parts
        (``x.mp3``), where no other value has the same one (an ambiguous part names no row)."""
        tails: dict[str, str | None] = {}
        for ident in self.rows:
            parts = ident.removeprefix("./").split("/")
            for i in range(len(parts)):
                tail = "/".join(parts[i:])
                if tail and tail != ident:
                    tails[tail] = None if tail in tails and tails[tail] != ident else ident
        return {t: ident for t, ident in tails.items() if ident is not None}

    def _compared(self, without: list[Entry], unused: list[str]) -> str:
        """How the first items without a row were looked up, and the first values left unmatched:
        the two sides of a join that failed, so a wrong column or a wrong form shows at once."""
        items = ", ".join(shown_value(e.key or e.rel) for e in without[:_SHOWN])
        names = " or ".join(map(shown_value, names_of(without[0])))
        rows = ", ".join(map(shown_value, unused[:_SHOWN])) or "none"
        return (f"first: {items}; the first looked up as {names} in column {shown_value(self.key)}, whose first "
                f"unmatched values are {rows}")


def names_of(e: Entry) -> list[str]:
    """What a metadata row's key value may be to name entry ``e``, most specific first: its id, its
    file or member name (a path relative to the input) and each trailing part of it after a '/'
    (``clips/x.mp3``, ``x.mp3``), and its stem (``x``: the WebDataset sample key, VoxPopuli's id)."""
    name = e.loc.name if e.loc is not None else e.rel
    parts = name.strip("/").split("/")
    names = [e.key] if e.key is not None else []
    names += ["/".join(parts[i:]) for i in range(len(parts))]
    names.append(key_stem(name))
    return list(dict.fromkeys(n for n in names if n))
