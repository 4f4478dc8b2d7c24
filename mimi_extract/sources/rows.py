"""What a row may hold (a list line, a sidecar, a manifest or Parquet row), read by one rule for every
kind: its JSON object, an id, the segment and channel fields; within bounds, so that one odd row is its
own error row (:func:`row_failed`), never the run's end."""

from __future__ import annotations

import json
import math

from ..config.choices import SIDECAR_DURATION_MODES
from ..config.input_options import MAX_NESTING, MAX_ROW_BYTES, nesting
from .items import Entry
from .text import shown_value

MAX_SECONDS = 1e8  # a start, end or duration past ~3 years is no recording's: refused, not multiplied out
MAX_CHANNEL = 1 << 16


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


# A ``duration`` alone (no start, end or offset) within this many seconds of the file's own length
# is that length, as the corpus wrote it, not a request to cut: Emilia's sidecars round to 3
# decimals (0.5 ms; 6.096 for a 6.09571 s file), other corpora to 2 (5 ms), and a decoder's count
# of an MP3's samples may differ from the writer's by a few samples.  10 ms is an eighth of a
# Mimi frame (80 ms): a deliberate cut is longer than that.  A segment whose end passes the file's
# end by at most this much is clamped to the end (the rounding of the same number), not refused.
DURATION_TOLERANCE = 0.010


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
