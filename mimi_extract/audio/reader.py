"""Reading an item: decoded (``decoders``), one channel taken, resampled to Mimi's 24 kHz
(``resample``) and framed (``framing``) -- whole or incrementally, so that a 2-hour file never exists
in memory at once and the streamed samples equal the whole-file ones (:class:`AudioReader`); a piece
of it (:class:`PieceReader`); and :func:`load`, the whole item."""

from __future__ import annotations

import os

import numpy as np

from .lazy import torch  # imported at first use: probing headers (sources, `plan`) needs none of it
from ..config.choices import SAMPLE_RATE
from .decoders import BLOCK, AudioError, read_frames, seek_exact, open_decoder
from .framing import Framing
from .resample import SincResampler

_WARNINGS_KEPT = 1000  # characters of decoder output an item keeps (a damaged file can say thousands of things)


def mix_channels(data: np.ndarray) -> np.ndarray:
    """The channels of ``data`` [frames, channels] averaged, bit for bit what
    ``data.mean(axis=1, dtype=np.float32)`` gives (the rule every reference in the tests uses), at
    a twentieth of its cost: numpy reduces each frame's few channels in a call of its own, ~19 ns a
    frame, which was 930 µs per audio second of 48 kHz stereo, more than dr_flac's whole decode of
    44.1 kHz stereo FLAC (~670, docs/performance.md).  Up to 7 channels numpy's sum is ``((0 + c0) + c1) + ...`` in float32 (its
    pairwise sum's short loop, from a +0: -0.0 becomes +0.0), then divided by their number: done here
    column by column.  8 or more (the pairwise sum's other order) and any dtype but float32 go
    through numpy's own mean."""
    channels = data.shape[1]
    if channels >= 8 or data.dtype != np.float32:
        return data.mean(axis=1, dtype=np.float32)
    out = data[:, 0] + np.float32(0)
    for c in range(1, channels):
        out += data[:, c]
    out /= np.float32(channels)
    return out


def _mono(data: np.ndarray, channel: int | str) -> np.ndarray:
    if channel == "mix":
        return mix_channels(data) if data.shape[1] > 1 else data[:, 0]
    if channel == "first":
        return data[:, 0]
    if int(channel) >= data.shape[1]:
        raise AudioError(f"has {data.shape[1]} channel(s), no channel {channel}")
    return data[:, int(channel)]


class PieceReader:
    """The encoder-input samples ``[begin, end)`` of an item, read through its :class:`AudioReader`
    (which must start at the item's start): what comes before ``begin`` is decoded and dropped, so
    the piece's samples are exactly the unsplit item's (resampling and framing included).  Use a
    reader that seeks instead where nothing before ``begin`` shapes the samples (24 kHz input)."""

    def __init__(self, reader: "AudioReader", begin: int, end: int | None):
        self.reader, self.left = reader, None if end is None else end - begin
        try:
            while begin > 0:
                chunk, final = reader.next_chunk(min(begin, 128 * 1920))  # (whole frames: see NativeReader)
                begin -= len(chunk)
                if final and begin > 0:
                    raise AudioError(f"ends {begin} samples before the piece starts")
        except BaseException:
            reader.close()
            raise

    def next_chunk(self, n: int) -> tuple[torch.Tensor, bool]:
        if self.left is not None:
            n = min(n, self.left)
        chunk, final = self.reader.next_chunk(n)
        if self.left is not None:
            self.left -= len(chunk)
            final = final or self.left <= 0
        if final:
            self.reader.close()
        return chunk, final

    @property
    def warnings(self) -> str:
        return self.reader.warnings

    def close(self) -> None:
        self.reader.close()


class AudioReader:
    """One item (a file, a segment of it, one channel) decoded incrementally to the encoder's input.

    ``next_chunk(n)`` returns the next ``n`` samples and whether they end the item (it reads ahead
    to know), so a 2-hour file never exists in memory at once; ``read_all()`` is the whole item.
    ``start``/``frames`` select a segment, in source samples.  ``path`` is a file name or a
    seekable binary file-like object (a member of a tar shard, a Parquet cell: see
    ``sources.open_audio``), which the reader closes with itself: one decoding path for every kind
    of input.  ``warnings`` is what the decoder said of the item while reading it (the engines put
    it in the item's manifest row, ``decoder_warnings``; see :class:`PyAVFile`)."""

    def __init__(self, path, channel: int | str = "mix", framing: Framing = Framing(), start: int = 0,
                 frames: int | None = None):
        self.path, self.channel, self.framing = path, channel, framing
        self.handle = None if isinstance(path, (str, bytes, os.PathLike)) else path
        self._warnings = ""
        try:
            self.file = open_decoder(path, span=(start, frames))  # (a FLAC file read whole: dr_flac)
        except AudioError as e:
            self._close_handle()
            raise AudioError(f"cannot decode: {e}") from e
        self.rate = self.file.samplerate
        if channel not in ("mix", "first") and int(channel) >= self.file.channels:
            channels = self.file.channels
            self.close()
            raise AudioError(f"has {channels} channel(s), no channel {channel}")
        self.remaining = frames  # None: to the end of the stream
        if start:
            try:
                seek_exact(self.file, start)
            except Exception as e:
                self.close()
                raise AudioError(f"cannot seek to sample {start}: {e}{self._said()}") from e
        self.resampler = SincResampler(self.rate, SAMPLE_RATE, framing.delay(self.rate)) if self.rate != SAMPLE_RATE else None
        self.source_samples = 0
        self.emitted = 0
        self.pending: list[torch.Tensor] = []
        self.pending_len = 0
        self.done = False  # the source is exhausted and `pending` holds the rest of the item

    @property
    def warnings(self) -> str:
        """What the decoder said of the item so far (kept after the reader closes)."""
        if getattr(self, "file", None) is not None:
            self._warnings = getattr(self.file, "decoder_warnings", "")
        text = self._warnings
        return text if len(text) <= _WARNINGS_KEPT else text[: _WARNINGS_KEPT - 1] + "…"

    def _said(self) -> str:
        return f" (decoder: {self.warnings[:300]})" if self.warnings else ""

    def close(self) -> None:
        if getattr(self, "file", None) is not None:
            self._warnings = getattr(self.file, "decoder_warnings", "")
            self.file.close()
            self.file = None
        self._close_handle()

    def _close_handle(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None

    def _decode_block(self, dtype: str = "float32", size: int = BLOCK) -> tuple[np.ndarray, bool]:
        """The next block of the item's source samples (``size`` or fewer), one channel (``_mono``),
        and whether it ends the item.  ``dtype`` int16: only for a 16-bit PCM file with one channel
        taken (see :mod:`~mimi_extract.audio.device`)."""
        want = min(size, self.remaining) if self.remaining is not None else size
        try:
            data = read_frames(self.file, want, dtype) if want > 0 else np.zeros((0, 1), dtype)
        except AudioError:
            raise
        except Exception as e:
            raise AudioError(f"cannot decode at sample {self.source_samples}: {e}{self._said()}") from e
        if len(data) and data.dtype.kind == "f" and not np.isfinite(data).all():
            raise AudioError("contains NaN or infinite samples")
        self.source_samples += len(data)
        if self.remaining is not None:
            self.remaining -= len(data)
        end = len(data) < want or (self.remaining is not None and self.remaining <= 0)
        return np.ascontiguousarray(_mono(data, self.channel)), end

    def _read_block(self) -> None:
        data, end = self._decode_block()
        x = torch.from_numpy(data) if len(data) else torch.zeros(0)
        if self.resampler is not None:
            x = self.resampler.push(x)
            if end:
                x = torch.cat([x, self.resampler.finish()])
        self.pending.append(x)
        self.pending_len += len(x)
        if end:
            self.close()
            if self.source_samples == 0:
                raise AudioError("no audio samples (zero-length)")
            # trim to the framing's length, then zero-pad to its frame multiple
            total = self.framing.input_length(self.source_samples, self.rate)
            target = min(total, self.framing.resampled_length(self.source_samples, self.rate))
            self._truncate(target - self.emitted)
            self.pending.append(torch.zeros(total - self.emitted - self.pending_len))
            self.pending_len = total - self.emitted
            self.done = True

    def _truncate(self, n: int) -> None:
        flat = torch.cat(self.pending) if self.pending else torch.zeros(0)
        self.pending, self.pending_len = [flat[:n]], min(n, len(flat))

    def _safe_len(self) -> int:
        """Samples that can be returned before the end is known (never past the final length)."""
        if self.done:
            return self.pending_len
        lower = self.framing.resampled_length(self.source_samples, self.rate) - 1  # final length >= this
        return max(0, min(self.pending_len, lower - self.emitted))

    def next_chunk(self, n: int) -> tuple[torch.Tensor, bool]:
        while not self.done and self._safe_len() <= n:
            self._read_block()
        flat = torch.cat(self.pending) if len(self.pending) != 1 else self.pending[0]
        take = min(n, len(flat))
        final = self.done and take == len(flat)
        chunk, rest = flat[:take], flat[take:]
        self.pending, self.pending_len = [rest], len(rest)
        self.emitted += take
        return chunk, final

    def read_all(self) -> torch.Tensor:
        chunk, final = self.next_chunk(1 << 62)
        assert final
        return chunk


def load(path: str, channel: int | str = "mix", causal_16k: bool = False, framing: Framing | None = None,
         start: int = 0, frames: int | None = None) -> torch.Tensor:
    """Decode ``path`` (or the segment ``start``..``start+frames``) to the encoder's mono float32
    24 kHz input [T]. ``channel``: "mix" (mean of channels), "first", or a channel index."""
    reader = AudioReader(path, channel, framing or Framing("transformers", causal_16k), start, frames)
    try:
        return reader.read_all()
    finally:
        reader.close()
