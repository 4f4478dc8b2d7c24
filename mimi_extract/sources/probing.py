"""Probing: an entry's items from its audio header alone (no decoding, so a million-file corpus is
planned up front) -- segments, channels, the framing's encoder-input length, and every error the
entry's row can have, named by its row."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

from ..audio.framing import Framing
from .items import Entry, Item
from .keys import segment_key
from .kept import supervisions_for_channel
from .rows import DURATION_TOLERANCE, MAX_SECONDS
from .text import shown_value


def seconds_to_samples(seconds: float, rate: int) -> int:
    """lhotse's rounding (``compute_num_samples``: round to 8 digits, then half up), so a segment
    read here starts and ends on the very samples lhotse's ``load_audio`` reads."""
    return int(Decimal(round(seconds * rate, 8)).quantize(0, rounding=ROUND_HALF_UP))


def probe_info(entry: Entry, info, channel_mode: str = "mix", framing: Framing = Framing()) -> list[Item]:
    """Items of ``entry`` given its opened header ``info`` (anything with ``samplerate``, ``frames``
    and ``channels``; a string: why its bytes cannot be reached; an exception: why they are not
    audio; None: ``entry.error`` says why).

    A segment given by ``start`` alone runs to the end of the file, and its key, its manifest
    start/end and its lhotse cut all say so (they said start..start).  Every error names the
    entry's row."""
    base = entry.key_base or entry.rel  # what a derived key starts from
    key = entry.key or base
    segment = None
    if entry.start is not None and entry.duration is not None and not entry.duration_only:
        segment = (entry.start, entry.start + entry.duration)

    def error(message: str, segment=segment) -> list[Item]:
        k = key if entry.key is not None or segment is None else segment_key(base, *segment)
        if entry.channel is not None and entry.key is None:
            k = f"{k}#ch{entry.channel}"
        if entry.where and not message.startswith(entry.where + ":"):
            message = f"{entry.where}: {message}"
        return [Item(entry.path, entry.rel, k, error=message, segment=segment, where=entry.where, kind=entry.kind,
                     loc=entry.loc, meta=entry.meta)]

    if entry.error:
        return error(entry.error)
    for name, value in (("start", entry.start), ("duration", entry.duration)):  # (every kind's numbers: one rule)
        if value is not None and not (math.isfinite(value) and abs(value) <= MAX_SECONDS):
            return error(f"segment {name} {shown_value(value)} is out of range (a finite number of at most "
                         f"{MAX_SECONDS:g} s)")
    if info is None or isinstance(info, str):
        return error(info or "cannot open")
    if isinstance(info, BaseException):
        return error(f"unreadable or corrupt audio header: {info}")
    if info.frames <= 0:
        return error("no audio samples (zero-length)")
    rate = info.samplerate
    start, frames = 0, info.frames
    whole = entry.duration_only and abs(entry.duration - info.frames / rate) <= DURATION_TOLERANCE
    if entry.start is not None and not whole:
        if entry.start < 0:
            return error(f"segment start {entry.start:g} s is negative")
        open_ended = entry.duration is None
        duration = info.frames / rate - entry.start if open_ended else entry.duration
        segment = (entry.start, info.frames / rate) if open_ended else (entry.start, entry.start + duration)
        if duration <= 0:
            return error(f"segment duration {duration:g} s is not positive", segment)
        start, frames = seconds_to_samples(entry.start, rate), seconds_to_samples(duration, rate)
        if open_ended:
            frames = min(frames, info.frames - start)
        if frames < 1:
            return error(f"segment of {duration:g} s is shorter than one sample at {rate} Hz", segment)
        if entry.key is None:
            key = segment_key(base, *segment)
        if start + frames > info.frames:
            if start >= info.frames or (start + frames - info.frames) / rate > DURATION_TOLERANCE:
                return error(f"segment {entry.start:g}-{entry.start + duration:g} s is past the end of the file "
                             f"({info.frames / rate:g} s)", segment)
            # past the end by no more than the rounding of its numbers: up to the end (the key
            # keeps the numbers as written, the segment says what is read)
            frames = info.frames - start
            segment = (entry.start, info.frames / rate)
    if entry.channel is not None and entry.channel >= info.channels:
        return error(f"has {info.channels} channel(s), no channel {entry.channel}", segment)
    if entry.channel is not None and entry.key is None:
        key = f"{key}#ch{entry.channel}"
    samples = framing.input_length(frames, rate)
    if channel_mode == "each" and entry.channel is None:
        channels = list(range(info.channels))
    else:
        channels = [entry.channel if entry.channel is not None else channel_mode]
    return [
        Item(entry.path, entry.rel, f"{key}#ch{c}" if channel_mode == "each" and entry.channel is None else key,
             c, rate, start, frames, samples, segment=segment, file_frames=info.frames, file_channels=info.channels,
             where=entry.where, kind=entry.kind, loc=entry.loc,
             meta=supervisions_for_channel(entry.meta, c) if len(channels) > 1 else entry.meta)
        for c in channels
    ]

