"""Loose files: a directory walked recursively, or a list (``.txt``/``.jsonl``/``.csv``/``.tsv``)."""

from __future__ import annotations

import csv
import json
import os

from ..audio.decoders import DECODED_EXTENSIONS
from ..config.input_options import CSV_FIELD_LIMIT, MAX_ROW_BYTES, Options
from .base import Source, register
from .items import Entry
from .kept import ITEM_FIELDS
from .rows import id_text, json_object, row_failed, segment_fields
from .text import non_utf8_shown, printable, shown_value, text_problem

# what a directory walk picks up: every extension a decoder reads, but not video containers
AUDIO_EXTENSIONS = tuple(e for e in DECODED_EXTENSIONS if e not in (".mp4", ".mkv", ".3gp", ".asf", ".snd", ".au"))

LIST_EXTENSIONS = (".txt", ".lst", ".scp", ".jsonl", ".csv", ".tsv")


def walk_directory(root: str, warnings: list[str], exclude: str | None = None) -> list[Entry]:
    """Audio files below ``root`` (recursive, sorted for reproducible runs), each real directory once.

    A symlink to a directory inside ``root`` is not followed (the directory is found by its real
    path, so its files get their canonical keys); links to directories elsewhere are followed, and
    a directory reached twice (a loop, two links) is searched once.  ``exclude`` (the run's OUT)
    is never searched: what a run writes there (``decode``'s WAVs) must not become the next run's
    input.  Each skip is a warning."""
    found = []
    top = os.path.realpath(root)
    seen: dict[tuple[int, int], str] = {}
    if exclude is not None and os.path.isdir(exclude):
        st = os.stat(exclude)
        seen[(st.st_dev, st.st_ino)] = ""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        st = os.stat(dirpath)
        here = (st.st_dev, st.st_ino)
        if seen.get(here) == "":
            warnings.append(f"skipped {dirpath}: the output directory ({exclude}) is inside the input; "
                            "its files are never inputs")
            dirnames[:] = []
            continue
        if here in seen:
            warnings.append(f"skipped {dirpath}: the same directory as {seen[here]} (symlink), searched once")
            dirnames[:] = []
            continue
        seen[here] = dirpath
        keep = []
        for d in sorted(dirnames):
            full = os.path.join(dirpath, d)
            real = os.path.realpath(full)
            if os.path.islink(full) and (real == top or real.startswith(top + os.sep)):
                warnings.append(f"skipped {full}: a symlink to {os.path.relpath(real, top)} inside the input, "
                                "which is searched once by its real path")
                continue
            keep.append(d)
        dirnames[:] = keep
        for f in sorted(filenames):
            if f.lower().endswith(AUDIO_EXTENSIONS):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                shown = non_utf8_shown(rel)
                error = f"file name is not valid UTF-8 ({shown}); rename the file" if shown else None
                found.append(Entry(path, shown or rel, error=error))
    return found


def _list_entry(row: dict, base: str, where: str, options: Options | None = None) -> Entry:
    """One list row -> its entry.  A NeMo manifest row (``audio_filepath``, ``duration``,
    ``offset``, ``text``) is read as NeMo does: ``offset`` + ``duration`` a segment, a ``duration``
    alone (or with offset 0) the file's length as written (see ``segment_fields``); the row's other
    fields (text, speaker...) are kept as ``--keep-fields`` says."""
    options = options or Options()
    raw_id = row.get("id")
    try:
        key = None if raw_id in (None, "") else id_text(raw_id)
    except ValueError as e:
        return Entry("", where, key=where, where=where, error=f"{where}: {e}")
    nemo = "path" not in row and "audio_filepath" in row
    path = str(row.get("audio_filepath" if nemo else "path") or "").strip()
    if key is not None and (problem := text_problem(key)):
        return Entry("", printable(path) or where, key=printable(key), where=where, error=f"{where}: id {problem}")
    if not path:
        return Entry("", where, key=key or where, where=where, error=f"{where}: no path")
    if problem := text_problem(path):
        return Entry("", printable(path), key=key or printable(path), where=where, error=f"{where}: path {problem}")
    full = path if os.path.isabs(path) else os.path.normpath(os.path.join(base, path))
    entry = Entry(full, path, key=key, where=where)
    try:
        if nemo:
            if row.get("offset") in (0, 0.0, "0"):  # NeMo writes offset 0 for a whole file
                row = {k: v for k, v in row.items() if k != "offset"}
            segment_fields(row, entry, options.sidecar_duration, start_field="offset")
        else:
            segment_fields(row, entry, options.sidecar_duration)
    except ValueError as e:
        entry.error = f"{where}: {e}"
    # the row's other fields (text, speaker...): --keep-fields
    try:
        entry.meta = options.keep.pick(row, skip=(*ITEM_FIELDS, "audio_filepath", "offset") if nemo else ITEM_FIELDS)
    except ValueError as e:  # over the bounds a row's fields may take
        entry.error = entry.error or f"{where}: {e}"
    return entry


def corpus_root(list_path: str, entries: list[Entry]) -> str:
    """The folder a list's rows are keyed from: the list's own folder when every row's file lies
    below it, else the deepest folder holding them all (a NeMo manifest of absolute paths beside,
    or far from, its audio)."""
    base = os.path.dirname(os.path.abspath(list_path))
    paths = [e.path for e in entries if e.path and e.error is None]
    if not paths or all(p.startswith(base + os.sep) for p in paths):
        return base
    return os.path.commonpath([os.path.dirname(p) for p in paths])  # (folders: many segments of one file)


def key_from_root(entries: list[Entry], root: str) -> None:
    """Rows without an id are keyed (and shown) by their file's path relative to ``root``, '/'-separated:
    the same keys on every machine, wherever the corpus is mounted (an absolute path is no key)."""
    for e in entries:
        if e.key is None and e.path and e.error is None:
            e.rel = os.path.relpath(e.path, root).replace(os.sep, "/")


def read_list(path: str, options: Options | None = None) -> list[Entry]:
    """``.txt`` (one path per line) or ``.jsonl``/``.csv``/``.tsv`` with ``path`` and optional
    ``id``, ``start``, ``end`` or ``duration`` (seconds) and ``channel``, or a NeMo manifest (JSON
    lines, ``.json`` or ``.jsonl``, with ``audio_filepath``); relative paths resolve against the
    list's folder (as NeMo resolves them).  ``options.keep``: which other fields of a row its item
    carries.  Rows without an id are keyed by their path relative to the corpus root
    (:func:`corpus_root`), or as written with ``options.list_keys == "written"``."""
    entries = _read_rows(path, options)
    if (options or Options()).list_keys != "written":
        key_from_root(entries, corpus_root(path, entries))
    return entries


def _read_rows(path: str, options: Options | None = None) -> list[Entry]:
    base = os.path.dirname(os.path.abspath(path))
    name = path.lower()
    entries = []
    # (bytes that are not UTF-8, a Latin-1 list: lone surrogates in that row's fields, which make it an
    # error row by the rules every key, path and kept field meets, instead of a decode error ending the run)
    with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
        if name.endswith((".jsonl", ".json")):
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json_object(line, f"line {n}")
                except ValueError as e:
                    entries.append(Entry("", f"line {n}", key=f"line {n}", where=f"line {n}", error=str(e)))
                    continue
                entries.append(_guarded_entry(row, base, f"line {n}", options))
        elif name.endswith((".csv", ".tsv")):
            csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_LIMIT))
            reader = csv.DictReader(f, delimiter="\t" if name.endswith(".tsv") else ",")
            if "path" not in (reader.fieldnames or []):
                raise ValueError(f"{path}: a CSV list needs a 'path' column (has {shown_value(reader.fieldnames, 200)})")
            while True:
                where = f"line {reader.line_num + 1}"
                try:
                    row = next(reader)
                except StopIteration:
                    break
                except csv.Error as e:  # (a field over csv's limit, 128 KiB): that row; the reader goes on
                    entries.append(Entry("", where, key=where, where=where, error=f"{where}: not a CSV row ({e})"))
                    continue
                entries.append(_guarded_entry(row, base, where, options))
        else:
            for n, line in enumerate(f, 1):
                if line.strip() and not line.lstrip().startswith("#"):
                    entries.append(_guarded_entry({"path": line.strip()}, base, f"line {n}", options))
    return entries


def _guarded_entry(row: dict, base: str, where: str, options: Options | None) -> Entry:
    """:func:`_list_entry`, whatever the row holds: what it raises is that row's error row, and a row
    over ``MAX_ROW_BYTES`` is one before it is read further."""
    size = sum(len(v) for v in row.values() if isinstance(v, str))
    if size > MAX_ROW_BYTES:
        return Entry("", where, key=where, where=where, error=f"{where}: the row is {size} characters long, over the "
                     f"{MAX_ROW_BYTES} a row may take")
    try:
        return _list_entry(row, base, where, options)
    except Exception as e:
        return row_failed(where, e)


def is_nemo_manifest(path: str) -> bool:
    """A NeMo manifest (``manifest.json``: JSON lines, each with ``audio_filepath``), told by its
    first line.  Read as :func:`_read_rows` reads it (bytes that are not UTF-8 as lone surrogates):
    a strict decode fails on a bad byte anywhere in the first block read, and the whole manifest
    was refused as "not a list" for one Latin-1 byte on any early line, which is that row's error."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
            first = json.loads(f.readline(MAX_ROW_BYTES + 1) or "null")
    except (OSError, ValueError):
        return False
    return isinstance(first, dict) and "audio_filepath" in first


@register
class DirectorySource(Source):
    """A directory of audio files (recursive); see :func:`walk_directory`."""

    kind = "directory"
    detect_order = 90

    @classmethod
    def detect(cls, path: str) -> bool:
        return os.path.isdir(path)

    def entries(self, warnings: list[str]) -> list[Entry]:
        return walk_directory(self.path, warnings, self.options.exclude)


@register
class ListSource(Source):
    """A list of files, optionally with ids, segments and channels; see :func:`read_list`."""

    kind = "list"
    detect_order = 91

    @classmethod
    def detect(cls, path: str) -> bool:
        from .lhotse import LhotseSource

        if not os.path.isfile(path) or LhotseSource.detect(path):
            return False
        return path.lower().endswith(LIST_EXTENSIONS) or (path.lower().endswith(".json") and is_nemo_manifest(path))

    def entries(self, warnings: list[str]) -> list[Entry]:
        return read_list(self.path, self.options)
