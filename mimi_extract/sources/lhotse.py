"""lhotse manifests as inputs: a RecordingSet, a CutSet, or a SupervisionSet with its recordings.

Rows are deserialized one by one with lhotse's own ``deserialize_item``, so a malformed row is
that row's error and never the manifest's; needs lhotse (``pip install 'mimi-extract[lhotse]'``).
"""

from __future__ import annotations

import json
import os

from ..common import remote
from ..common.optional import lhotse as _lhotse
from ..config.input_options import Keep
from .base import Source, register
from .items import Entry
from .kept import supervisions_for_channel
from .rows import json_object
from .text import printable, text_problem


def is_lhotse_manifest(path: str) -> bool:
    return path.lower().endswith((".jsonl.gz", ".json.gz")) or (
        path.lower().endswith((".json", ".jsonl")) and _looks_lhotse(path)
    )


def _looks_lhotse(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            first = json.loads(f.readline() or "{}")
    except (OSError, ValueError):
        return False
    if isinstance(first, list):
        first = first[0] if first else {}
    return isinstance(first, dict) and ("recording_id" in first or "sources" in first or "type" in first)


def _file_source(recording, channel: int):
    """(audio path, channel within that file) for a lhotse recording's channel."""
    for src in recording.sources:
        chans = src.channels if isinstance(src.channels, list) else [src.channels]
        if channel in chans:
            if src.type != "file":
                raise ValueError(f"audio source type {src.type!r} (only 'file' sources can be read)")
            return src.source, chans.index(channel)
    raise ValueError(f"recording {recording.id!r} has no channel {channel}")


def _manifest_rows(path: str):
    """(where, row) for each row of a lhotse manifest, parsed one at a time: a JSONL file (gzipped
    or not) by line, a JSON list by item; a row that is not JSON comes as its ValueError."""
    with remote.open_text(path) as f:
        if ".jsonl" in os.path.basename(path):
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield f"line {n}", json_object(line, "the row")
                    except ValueError as e:
                        yield f"line {n}", e
        else:
            try:
                data = json.load(f)
            except RecursionError:
                raise ValueError(f"{path}: nested too deeply to parse as JSON") from None
            for n, row in enumerate(data if isinstance(data, list) else [data], 1):
                yield f"item {n}", row


def _is_manifest(value) -> bool:
    """A lhotse object (array, recording, image) or its serialised dict: not metadata to copy (an
    input's own field would point at storage that the outputs do not have)."""
    if isinstance(value, dict):
        return bool({"storage_type", "array", "sources", "width"} & set(value))
    return not isinstance(value, (str, bool, int, float, list))


def cut_meta(obj, keep: Keep, start: float | None) -> dict | None:
    """What a cut (or a supervision) carries into the outputs: its ``supervisions`` as lhotse dicts,
    with times relative to the item's ``start`` (None: the recording's start), and its ``custom``
    fields that ``keep`` keeps (never a lhotse array or recording: those point at the input's
    storage).  A SupervisionSet's item is the supervision itself: it is its own one supervision."""
    if not keep.keeps_supervisions:
        return None
    if type(obj).__name__ == "SupervisionSegment":
        sups = [{**obj.to_dict(), "start": 0.0}]
        custom = None
    else:
        shift = obj.start - (start or 0.0)  # the cut's supervisions are relative to the cut's own start
        sups = [s.to_dict() for s in obj.supervisions]
        if abs(shift) > 1e-9:
            sups = [{**s, "start": round(s["start"] + shift, 8)} for s in sups]
        custom = keep.pick({k: v for k, v in (obj.custom or {}).items() if not _is_manifest(v)})
    meta = dict(custom or {})
    if sups:
        meta["supervisions"] = json.loads(json.dumps(sups, default=str))
    return meta or None


_KINDS = {"Recording": "RecordingSet", "SupervisionSegment": "SupervisionSet", "MonoCut": "CutSet",
          "MultiCut": "CutSet", "MixedCut": "CutSet"}


def manifest_items(path: str):
    """(where, lhotse object or the reason it is none, manifest kind) per row: every row is
    deserialized alone, so one malformed row is that row's error, not the manifest's."""
    from lhotse.serialization import deserialize_item

    for where, row in _manifest_rows(path):
        if isinstance(row, Exception):
            yield where, str(row), None, None
            continue
        if not isinstance(row, dict):
            yield where, f"not a JSON object ({type(row).__name__})", None, None
            continue
        ident = row.get("id") if isinstance(row.get("id"), str) else None
        try:
            obj = deserialize_item(dict(row))
        except Exception as e:
            yield where, f"not a valid lhotse manifest row ({type(e).__name__}: {e})", ident, None
            continue
        kind = _KINDS.get(type(obj).__name__)
        if kind is None:
            yield where, f"a {type(obj).__name__} is not an input (use recordings, supervisions or cuts)", ident, None
        else:
            yield where, obj, ident, kind


def read_lhotse_manifest(path: str, recordings: str | None = None, keep: Keep | None = None) -> list[Entry]:
    """Entries of a lhotse RecordingSet, CutSet or SupervisionSet (with ``recordings``):
    recordings are whole files (one entry per channel), cuts and supervisions are segments keyed
    by their ids.  Rows are read one by one: a malformed row, or a row of another kind than the
    manifest's first, is an error entry naming its line.  ``keep``: what a cut's supervisions and
    custom fields, or a supervision, give its item's ``meta`` (:func:`cut_meta`)."""
    keep = keep or Keep()
    _lhotse()
    entries: list[Entry] = []

    def fail(where, key, message):
        key = key if key and text_problem(key) is None else printable(key) if key else where
        entries.append(Entry("", where, key=key, where=where, error=f"{where}: {message}"))

    def add(where, key, recording, start, duration, channels, meta=None):
        if problem := text_problem(key):
            return fail(where, key, f"id {problem}")
        channels = channels if isinstance(channels, list) else [channels]
        if not channels:  # (a row naming no channel would otherwise vanish without a row)
            return fail(where, key, "names no channel")
        for ch in channels:
            k = key if len(channels) == 1 else f"{key}#ch{ch}"
            try:
                if getattr(recording, "transforms", None):
                    raise ValueError("recordings with transforms (speed/volume perturbation) are not supported")
                audio, index = _file_source(recording, ch)
                if problem := text_problem(audio):
                    raise ValueError(f"audio path {problem}")
                full = audio if os.path.isabs(audio) else os.path.abspath(audio)
                entries.append(Entry(full, audio, key=k, start=start, duration=duration, where=where,
                                     channel=index if len(recording.channel_ids) > 1 else None,
                                     meta=supervisions_for_channel(meta, ch) if len(channels) > 1 else meta))
            except Exception as e:  # a row lhotse accepted but that names no readable audio
                fail(where, k, str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}")

    recs = None
    kind = None
    for where, obj, ident, row_kind in manifest_items(path):
        if isinstance(obj, str):
            fail(where, ident, obj)
            continue
        kind = kind or row_kind
        if row_kind != kind:
            fail(where, ident, f"a {type(obj).__name__} in a {kind}")
            continue
        try:
            if kind == "RecordingSet":
                add(where, obj.id, obj, None, None, obj.channel_ids if len(obj.channel_ids) > 1 else obj.channel_ids[0])
            elif kind == "SupervisionSet":
                if recs is None:
                    if not recordings:
                        raise ValueError(f"{path} is a SupervisionSet: give the recordings too "
                                         "(--recordings recordings.jsonl.gz)")
                    recs = {r.id: r for _, r, _, k in manifest_items(recordings) if k == "RecordingSet"}
                if obj.recording_id not in recs:
                    fail(where, obj.id, f"recording {obj.recording_id!r} not in {recordings}")
                    continue
                add(where, obj.id, recs[obj.recording_id], obj.start, obj.duration, obj.channel,
                    cut_meta(obj, keep, obj.start))
            else:
                if getattr(obj, "recording", None) is None or type(obj).__name__ == "MixedCut":
                    fail(where, obj.id, "only cuts with one recording (MonoCut) are supported")
                    continue
                add(where, obj.id, obj.recording, obj.start, obj.duration, obj.channel, cut_meta(obj, keep, obj.start))
        except ValueError as e:
            if kind == "SupervisionSet" and recs is None:
                raise
            fail(where, ident, str(e))
        except Exception as e:
            fail(where, ident, f"{type(e).__name__}: {e}")
    return entries


@register
class LhotseSource(Source):
    """A lhotse manifest (``.jsonl.gz``, or a ``.json``/``.jsonl`` that looks like one)."""

    kind = "lhotse"
    detect_order = 10

    @classmethod
    def detect(cls, path: str) -> bool:
        return os.path.isfile(path) and is_lhotse_manifest(path)

    def entries(self, warnings: list[str]) -> list[Entry]:
        return read_lhotse_manifest(self.path, self.options.recordings, self.options.keep)
