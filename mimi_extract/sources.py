"""Input sources: what to encode, as a list of :class:`Item`, whatever form the input takes.

Every source (a directory, a ``.txt``/``.jsonl``/``.csv`` list, a lhotse manifest) yields
:class:`Entry` rows -- a file, optionally a segment and a channel, optionally an id -- and one
shared :func:`probe` turns entries into items from file headers alone (no decoding), so a
million-file corpus is planned up front.  Keys are unique by construction: a duplicate becomes an
error row, never a second dataset.
"""

from __future__ import annotations

import csv
from decimal import ROUND_HALF_UP, Decimal
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import soundfile as sf

from .audio import Framing

AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".mp3", ".opus", ".aiff", ".aif")
LIST_EXTENSIONS = (".txt", ".lst", ".scp", ".jsonl", ".csv", ".tsv")
LHOTSE_SUFFIXES = (".jsonl.gz", ".json.gz", ".json", ".jsonl")


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


def dataset_name(key: str) -> str:
    """HDF5 dataset name for ``key``: flat and injective ('%' -> %25, '/' -> %2F, leading '.' ->
    %2E), so no key can collide with another key's group (``a.wav#ch0`` vs ``a.wav#ch0/b.wav``)."""
    name = key.replace("%", "%25").replace("/", "%2F")
    return "%2E" + name[1:] if name.startswith(".") else name


def _printable(name: str) -> str | None:
    """None if ``name`` is valid UTF-8, else a readable rendering of its bytes."""
    try:
        name.encode("utf-8")
        return None
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


# -- sources -------------------------------------------------------------------------------
def walk_directory(root: str, warnings: list[str]) -> list[Entry]:
    """Audio files below ``root`` (recursive, sorted for reproducible runs), each real directory once.

    A symlink to a directory inside ``root`` is not followed (the directory is found by its real
    path, so its files get their canonical keys); links to directories elsewhere are followed, and
    a directory reached twice (a loop, two links) is searched once.  Each skip is a warning."""
    found = []
    top = os.path.realpath(root)
    seen: dict[tuple[int, int], str] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        st = os.stat(dirpath)
        here = (st.st_dev, st.st_ino)
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
                shown = _printable(rel)
                error = f"file name is not valid UTF-8 ({shown}); rename the file" if shown else None
                found.append(Entry(path, shown or rel, error=error))
    return found


def _seconds(value, name: str) -> float | None:
    if value in (None, ""):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} {value!r} is not a number") from None


def _list_entry(row: dict, base: str, where: str) -> Entry:
    path = str(row.get("path") or "").strip()
    if not path:
        return Entry("", where, key=row.get("id") or where, error=f"{where}: no path")
    full = path if os.path.isabs(path) else os.path.normpath(os.path.join(base, path))
    entry = Entry(full, path, key=(str(row["id"]) if row.get("id") not in (None, "") else None))
    try:
        entry.start = _seconds(row.get("start"), "start")
        end = _seconds(row.get("end"), "end")
        entry.duration = _seconds(row.get("duration"), "duration")
        if end is not None:
            if entry.duration is not None:
                raise ValueError("give end or duration, not both")
            entry.duration = end - (entry.start or 0.0)
        if entry.duration is not None and entry.start is None:
            entry.start = 0.0
        if row.get("channel") not in (None, ""):
            entry.channel = int(row["channel"])
    except ValueError as e:
        entry.error = f"{where}: {e}"
    return entry


def read_list(path: str) -> list[Entry]:
    """``.txt`` (one path per line) or ``.jsonl``/``.csv``/``.tsv`` with ``path`` and optional
    ``id``, ``start``, ``end`` or ``duration`` (seconds) and ``channel``; relative paths resolve
    against the list's folder."""
    base = os.path.dirname(os.path.abspath(path))
    name = path.lower()
    entries = []
    with open(path, encoding="utf-8", newline="") as f:
        if name.endswith(".jsonl"):
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    if not isinstance(row, dict):
                        raise ValueError("not an object")
                except ValueError as e:
                    entries.append(Entry("", f"line {n}", key=f"line {n}", error=f"line {n}: not a JSON object ({e})"))
                    continue
                entries.append(_list_entry(row, base, f"line {n}"))
        elif name.endswith((".csv", ".tsv")):
            reader = csv.DictReader(f, delimiter="\t" if name.endswith(".tsv") else ",")
            if "path" not in (reader.fieldnames or []):
                raise ValueError(f"{path}: a CSV list needs a 'path' column (has {reader.fieldnames})")
            for n, row in enumerate(reader, 2):
                entries.append(_list_entry(row, base, f"line {n}"))
        else:
            for line in f:
                if line.strip() and not line.lstrip().startswith("#"):
                    entries.append(_list_entry({"path": line.strip()}, base, line.strip()))
    return entries


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


def probe(entry: Entry, channel_mode: str = "mix", framing: Framing = Framing()) -> list[Item]:
    """Header-only look at one entry -> its items (one per channel with ``each``), or one error item."""
    key = entry.key or entry.rel
    if entry.start is not None and entry.key is None:
        end = entry.start + (entry.duration or 0.0)
        key = f"{entry.rel}@{_key_seconds(entry.start)}-{_key_seconds(end)}"
    if entry.channel is not None and entry.key is None:
        key = f"{key}#ch{entry.channel}"
    segment = (entry.start, entry.start + entry.duration) if entry.start is not None and entry.duration is not None else None

    def error(message: str) -> list[Item]:
        return [Item(entry.path, entry.rel, key, error=message, segment=segment)]

    if entry.error:
        return error(entry.error)
    try:
        if not os.path.exists(entry.path):
            return error("file not found")
        if os.path.getsize(entry.path) == 0:
            return error("empty file (0 bytes)")
        info = sf.info(entry.path)
    except (OSError, RuntimeError, sf.LibsndfileError) as e:
        return error(f"unreadable or corrupt audio header: {e}")
    except Exception as e:  # soundfile raises several types for garbage
        return error(f"unreadable or corrupt audio header: {e}")
    if info.frames <= 0:
        return error("no audio samples (zero-length)")
    rate = info.samplerate
    start, frames = 0, info.frames
    if entry.start is not None:
        if entry.start < 0:
            return error(f"segment start {entry.start:g} s is negative")
        duration = entry.duration if entry.duration is not None else info.frames / rate - entry.start
        if duration <= 0:
            return error(f"segment duration {duration:g} s is not positive")
        start, frames = seconds_to_samples(entry.start, rate), seconds_to_samples(duration, rate)
        if start + frames > info.frames:
            return error(f"segment {entry.start:g}-{entry.start + duration:g} s is past the end of the file "
                         f"({info.frames / rate:g} s)")
    samples = framing.input_length(frames, rate)
    if channel_mode == "each" and entry.channel is None:
        channels = list(range(info.channels))
    else:
        channels = [entry.channel if entry.channel is not None else channel_mode]
    if entry.channel is not None and entry.channel >= info.channels:
        return error(f"has {info.channels} channel(s), no channel {entry.channel}")
    return [
        Item(entry.path, entry.rel, f"{key}#ch{c}" if channel_mode == "each" and entry.channel is None else key,
             c, rate, start, frames, samples, segment=segment, file_frames=info.frames, file_channels=info.channels)
        for c in channels
    ]


def discover(source: str, channel: str = "mix", framing: Framing = Framing(), limit: int | None = None,
             recordings: str | None = None) -> Discovered:
    """Every item of ``source`` (a directory, a list file or a lhotse manifest), probed."""
    warnings: list[str] = []
    if os.path.isdir(source):
        entries, kind = walk_directory(source, warnings), "directory"
    elif os.path.isfile(source):
        if is_lhotse_manifest(source):
            from .lhotse_io import read_lhotse_manifest

            entries, kind = read_lhotse_manifest(source, recordings), "lhotse"
        elif source.lower().endswith(LIST_EXTENSIONS):
            entries, kind = read_list(source), "list"
        else:
            raise ValueError(f"input {source!r} is a file but not a list (.txt .jsonl .csv .tsv) or a lhotse "
                             "manifest (.jsonl.gz)")
    else:
        raise FileNotFoundError(f"input {source!r} does not exist")
    entries = entries[:limit]
    with ThreadPoolExecutor(16) as pool:  # header reads are I/O bound (network file systems)
        probed = [it for found in pool.map(lambda e: probe(e, channel, framing), entries) for it in found]
    seen: dict[str, Item] = {}
    items, bad = [], []
    for it in probed:
        if it.key in seen:
            first = seen[it.key]
            if it.error is None:
                it.error = f"duplicate key {it.key!r} (also {first.rel})"
            bad.append(it)
            continue
        seen[it.key] = it
        (bad if it.error else items).append(it)
    return Discovered(items, bad, warnings, os.path.realpath(source), kind)

