"""Decoding, channel handling, resampling to Mimi's 24 kHz and input framing -- whole or incremental.

One windowed-sinc resampler (torchaudio's kernel formula: Hann window, 6 zero crossings, 0.99
roll-off) serves every rate and both uses: a whole item is one block, a long recording is fed
block by block through :class:`AudioReader` with the filter's history carried, so the streamed
samples equal the whole-file ones.  The filter can be *delayed*: with no delay (the default, for
every rate) it is ``torchaudio.functional.resample``, what a user's own torchaudio + MimiModel loop
computes; ``causal_16k`` delays 16 kHz input by its look-ahead (8 input samples), so no 24 kHz
sample depends on later 16 kHz input and Mimi's causal encoder stays causal end to end.

A *framing* says what the encoder is fed, so that codes match the stack a user trains with:
``transformers`` (MimiModel.encode of the resampled audio), ``moshi`` (the same, zero-padded to a
whole 1920-sample frame, as Kyutai's ``moshi`` package pads: moshi's *non-streaming* ``encode``),
``moshi-stream`` (the same padding, encoded as moshi's *streaming* mode encodes it when fed
``frames_per_call`` frames per call: its attention window differs from the non-streaming one past
the window's length, 10 s for Mimi; see ``PaddedMimiEncoder``) and ``muvap`` (the MuVAP front end:
16 kHz delayed by 16 samples through torchaudio's resampler, trimmed to round(1.5 n) samples, then
zero-padded to a multiple of 960).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import soundfile as sf

from ._lazy import torch  # imported at first use: probing headers (sources, `plan`) needs none of it
from .choices import FRAMINGS, SAMPLE_RATE

_BLOCK = 1 << 16  # source frames decoded per read of a stream


class AudioError(Exception):
    """A file that cannot be used; the message is what the manifest reports."""


_WARNINGS_KEPT = 1000  # characters of decoder output an item keeps (a damaged file can say thousands of things)


def _decoder_error(name: str, is_file: bool, e: Exception) -> AudioError:
    """libsndfile says "File does not exist or is not a regular file (possibly a pipe?)" for a
    file it cannot decode (e.g. a garbage .wav): say what is true, with the decoder's own words.
    soundfile names the file by its repr, for a member of a shard "<_io.BytesIO object at 0x...>":
    it is named by ``name`` instead, quoted (info's "errors by reason" folds quoted names)."""
    message = f"Error opening {name!r}: {e.error_string}" if isinstance(e, sf.LibsndfileError) else str(e)
    if "does not exist or is not a regular file" in message and is_file:
        kind = os.path.splitext(name)[1].lstrip(".").upper() or "audio"
        message = f"cannot be decoded: not a valid {kind} file, or a format libsndfile cannot read"
    return AudioError(message)


def open_soundfile(source, info_only: bool = False, shown: str | None = None):
    """``sf.info`` (``info_only``) or ``sf.SoundFile`` of ``source`` (a path, or a seekable binary
    file-like object such as a tar member), an :class:`AudioError` with an accurate message if it
    cannot be decoded (naming it ``shown``, e.g. ``shard/member``, else by its path or name)."""
    is_path = isinstance(source, (str, os.PathLike))
    name = os.fspath(source) if is_path else str(getattr(source, "name", "") or "")
    try:
        return sf.info(source) if info_only and is_path else sf.SoundFile(source)
    except Exception as e:  # soundfile raises several types for garbage
        raise _decoder_error(shown or name, (not is_path) or os.path.isfile(name), e) from e


# -- decoders ------------------------------------------------------------------------------
# Which library decodes a file is decided by its extension alone (never by trying one and falling
# back per file), so every file of one format in a run -- and in its resumes -- goes through the same
# decoder: MP3 priming and AAC edit lists are handled differently by libsndfile and FFmpeg, and two
# decoders' sample counts for one format must never meet in one OUT.  run.json records both
# libraries' versions (``decoders``); a resume with other versions is refused.
#
# MPEG audio goes through FFmpeg (PyAV), not libsndfile's libmpg123: FFmpeg's demuxer reads every
# tag shape corpora ship (ID3v2.2-2.4 with unsynchronisation, extended headers and footers, cover
# art of any size, APEv2 and ID3v1 at the end, junk before the first frame), decodes a VBR file
# without a Xing/VBRI header to its end (libsndfile stopped at a length estimated from the file
# size), applies the LAME gapless tag, and lets a process's decoding threads run in parallel
# (libmpg123 prints its warnings on the process's fd 2, which had to be captured under one lock).
# Measured per core (docs/inputs.md): FFmpeg decodes MP3 at 0.84-0.95x libsndfile's speed alone,
# and the tool's old libsndfile path ran one MP3 read at a time per process.
SOUNDFILE_EXTENSIONS = (".wav", ".flac", ".ogg", ".oga", ".opus", ".aiff", ".aif", ".aifc", ".caf", ".w64", ".rf64",
                        ".au", ".snd")
MPEG_EXTENSIONS = (".mp3", ".mp2", ".mp1", ".mpga")
PYAV_EXTENSIONS = MPEG_EXTENSIONS + (".m4a", ".mp4", ".aac", ".alac", ".wma", ".asf", ".webm", ".mka", ".mkv", ".ac3",
                                     ".amr", ".3gp")
DECODED_EXTENSIONS = SOUNDFILE_EXTENSIONS + PYAV_EXTENSIONS


def decoder_for(name: str) -> str:
    """"pyav" for MPEG audio and the containers libsndfile cannot read (by extension), else
    "soundfile" (also for a name without a known extension: libsndfile then identifies the format
    from the bytes)."""
    return "pyav" if name.lower().endswith(PYAV_EXTENSIONS) else "soundfile"


def decoder_versions() -> dict:
    """The decoders a run uses and their versions (run.json): a resume must decode the same way."""
    import av

    codec = av.library_versions.get("libavcodec")
    return {"soundfile": f"soundfile {sf.__version__}, libsndfile {sf.__libsndfile_version__}",
            "pyav": f"av {av.__version__}, libavcodec {'.'.join(map(str, codec)) if codec else '?'}",
            "pyav_extensions": list(PYAV_EXTENSIONS)}


_SCALE = {"s16": 1 / 32768, "s32": 1 / 2147483648, "flt": None, "dbl": None, "u8": 1 / 128, "s64": 2.0 ** -63}


def _frame_array(frame) -> np.ndarray:
    """An FFmpeg audio frame as float32 [samples, channels] (integer formats scaled as libsndfile
    scales them: s16 / 32768, s32 / 2^31, u8 centred)."""
    fmt = frame.format.name.rstrip("p")
    data = frame.to_ndarray()
    channels = len(frame.layout.channels)
    data = data if frame.format.is_planar else data.reshape(-1, channels).T
    if fmt == "u8":
        data = data.astype(np.float32) - 128
    scale = _SCALE.get(fmt)
    data = data.astype(np.float32) if scale is None else data.astype(np.float32) * np.float32(scale)
    return np.ascontiguousarray(data.T)


# A lossy stream read from a seek point needs what came before it: MP3's bit reservoir reaches up to
# 511 bytes back (85 frames of an 8 kbit/s MPEG-2 file), overlapped transforms one frame.  A seek
# goes this many source samples before its target and decodes forward (dropping them); FFmpeg's
# MPEG demuxer then gives every packet its exact time (it seeks by its own index of the frames, not
# by a Xing table of contents), so the samples from the target on equal the whole-file decode's.
_PREROLL = 1 << 16


class PyAVFile:
    """What AudioReader needs of ``sf.SoundFile`` (``samplerate``, ``channels``, ``frames``,
    ``read``, ``seek``, ``close``), decoded by PyAV (FFmpeg) from a path or a seekable file-like
    object.

    A packet FFmpeg cannot decode (a damaged frame) becomes silence of its duration, so every later
    sample keeps its place, and is counted in :attr:`decoder_warnings` (FFmpeg's own command line
    skips such a packet too; PyAV's plain loop stops the whole file there).

    ``frames``, the decoded length, is what the decoder outputs, which no header of these formats
    states exactly for every file (AAC priming and edit lists; an MP3 without a Xing/VBRI header,
    or a LAME gapless tag).  For MPEG audio it is counted from the time of the first decoded sample
    to the end of the last frame, decoding only the stream's last :data:`_PREROLL` samples (the
    packet times come from the demuxer's frame index, which reads every frame header but decodes
    none); for the other containers by a full decode.  Both are checked against a whole decode in
    tests/audio/test_real_shapes.py.  ``seek`` of MPEG audio seeks (see ``_PREROLL``); of the
    others, decodes and drops from where the stream is."""

    def __init__(self, source, name: str = ""):
        import av

        self.source = source
        self.name = name or (os.fspath(source) if isinstance(source, (str, os.PathLike)) else getattr(source, "name", ""))
        self.mpeg = str(self.name).lower().endswith(MPEG_EXTENSIONS)
        self._skipped: list[str] = []  # why each undecodable packet was silenced
        self.container = None
        self._open(av)
        ctx = self.stream.codec_context
        self.samplerate = int(ctx.sample_rate or 0)
        self.channels = int(ctx.channels if hasattr(ctx, "channels") else len(ctx.layout.channels))
        if self.samplerate <= 0 or self.channels <= 0:
            self.close()
            raise AudioError("no audio stream with a sample rate and channels")
        self._frames = None
        self._origin = None  # the stream time of the first decoded sample (MPEG seeks count from it)

    def _open(self, av) -> None:
        if not isinstance(self.source, (str, os.PathLike)):
            self.source.seek(0)
        # the MP3 demuxer seeks by its index of frame headers (exact times), never by a Xing TOC
        options = {"usetoc": "0"} if self.mpeg else {}
        self.container = av.open(self.source, mode="r", metadata_errors="ignore", options=options)
        if not self.container.streams.audio:
            self.container.close()
            raise AudioError("no audio stream")
        self.stream = self.container.streams.audio[0]
        self._decoded = self._decode(self.container.demux(self.stream))
        self.buffer: tuple = ()  # the samples decoded and not read yet: one 1-D array per channel
        self.position = 0  # source samples read or dropped so far

    def _decode(self, packets):
        """(its stream time in the stream's time base, or None; its samples: a float32 1-D array per
        channel) per decoded frame; an undecodable packet: silence of its duration.  The hot loop of
        every MPEG read: nothing here but what each frame needs (times are converted only by seeks,
        channels interleaved once per read, not per frame)."""
        import av

        rate, channels = self.samplerate, self.channels
        for packet in packets:
            try:
                frames = packet.decode()
            except (av.error.FFmpegError, ValueError) as e:
                n = self._samples(packet.duration) or 0
                self._skipped.append(getattr(e, "strerror", None) or str(e))
                if n > 0:
                    yield packet.pts, (np.zeros(n, np.float32),) * channels
                continue
            for frame in frames:
                if frame.sample_rate != rate or frame.layout.nb_channels != channels:
                    # a damaged header read as another rate or layout: not this stream's audio
                    self._skipped.append(f"a frame of {frame.sample_rate} Hz, {frame.layout.nb_channels} channel(s)")
                    yield frame.pts, (np.zeros(round(frame.samples * rate / frame.sample_rate), np.float32),) * channels
                elif frame.format.name == "fltp":  # (MP3, AAC, Vorbis, Opus: FFmpeg's float decoders)
                    n = frame.samples
                    yield frame.pts, tuple(np.frombuffer(p, np.float32, n) for p in frame.planes[:channels])
                else:
                    yield frame.pts, tuple(_frame_array(frame).T)

    def _samples(self, t: int | None) -> int | None:
        """Stream time ``t`` (in the stream's time base) in samples, rounded; None if unknown."""
        if t is None:
            return None
        tb = self.stream.time_base
        num, den = tb.numerator * self.samplerate, tb.denominator
        return (2 * t * num + den) // (2 * den)

    @property
    def decoder_warnings(self) -> str:
        if not self._skipped:
            return ""
        reasons = "; ".join(dict.fromkeys(self._skipped))
        return f"{len(self._skipped)} undecodable packet(s) replaced by silence ({reasons})"

    @property
    def frames(self) -> int:
        if self._frames is None:
            import av

            counter = PyAVFile.__new__(PyAVFile)
            counter.source, counter.name, counter.mpeg, counter._skipped = self.source, self.name, self.mpeg, []
            counter.samplerate, counter.channels = self.samplerate, self.channels
            counter._open(av)
            try:
                self._frames = counter._count_to_end()
            finally:
                counter.close()
            if not isinstance(self.source, (str, os.PathLike)):  # one handle: rewind this reader
                self.container.close()
                self._open(av)
        return self._frames

    def _count_to_end(self) -> int:
        """The samples a decode from the start gives (see the class docstring)."""
        if not self.mpeg:
            return sum(len(a[0]) for _, a in self._decoded)
        origin, first = next(self._decoded, (None, None))
        if first is None:
            return 0
        if origin is None:
            return len(first[0]) + sum(len(a[0]) for _, a in self._decoded)
        origin = self._samples(origin)
        self.container.seek(2 ** 62, stream=self.stream, backward=True)  # indexes every frame: the last one
        last = next((p for p in self.container.demux(self.stream) if p.pts is not None), None)
        end = self._samples(last.pts) if last is not None else origin
        if end - _PREROLL <= origin + len(first[0]):  # a short stream: decode it all, from the start
            import av

            self.container.close()
            self._open(av)
            return sum(len(a[0]) for _, a in self._decoded)
        self._seek_to(end - _PREROLL)
        at, size = origin, 0
        for t, block in self._decoded:
            if t is None:
                raise AudioError("a frame without a time after a seek")
            at, size = self._samples(t), len(block[0])
        return at + size - origin

    def _seek_to(self, t: int) -> None:
        """Position the demuxer at the frame holding stream sample ``t`` or before it (decoder flushed)."""
        self.container.seek(int(t / (self.stream.time_base * self.samplerate)), stream=self.stream, backward=True)
        self._decoded = self._decode(self.container.demux(self.stream))

    def read(self, n: int, dtype: str = "float32", always_2d: bool = True) -> np.ndarray:
        parts, have = [self.buffer] if self.buffer and len(self.buffer[0]) else [], len(self.buffer[0]) if self.buffer else 0
        while have < n:
            _, block = next(self._decoded, (None, None))
            if block is None:
                break
            parts.append(block)
            have += len(block[0])
        if not parts:
            return np.zeros((0, self.channels), np.float32)
        columns = [np.concatenate([p[c] for p in parts]) if len(parts) > 1 else parts[0][c] for c in range(self.channels)]
        self.buffer = tuple(c[n:] for c in columns)
        data = columns[0][:n, None] if self.channels == 1 else np.stack([c[:n] for c in columns], 1)
        self.position += len(data)
        return data

    def seek(self, frames: int) -> int:
        """Position at source sample ``frames`` (from the start only: the reader seeks once)."""
        if self.mpeg and self.position == 0 and frames > 2 * _PREROLL and self._mpeg_seek(frames):
            return frames
        left = frames - self.position
        while left > 0:
            got = len(self.read(min(left, 1 << 16)))
            if got == 0:
                raise AudioError(f"cannot seek past the end ({left} samples short)")
            left -= got
        return frames

    def _mpeg_seek(self, target: int) -> bool:
        """Seek to ``target`` through a pre-roll (see ``_PREROLL``); False (nothing consumed that a
        decode from the start needs: the stream is reopened) where frame times are missing."""
        import av

        origin, first = next(self._decoded, (None, None))
        if origin is None or first is None:
            self.container.close()
            self._open(av)
            return False
        origin = self._samples(origin)
        self._seek_to(origin + target - _PREROLL)
        landed = False
        for t, block in self._decoded:
            at = self._samples(t)
            if at is None or (not landed and at - origin > target - _PREROLL // 2):  # too late to be exact
                break
            landed = True
            if at - origin + len(block[0]) > target:
                self.buffer, self.position = tuple(c[target - (at - origin):] for c in block), target
                return True
        self.container.close()
        self._open(av)
        return False

    def close(self) -> None:
        container = getattr(self, "container", None)
        if container is not None:
            container.close()
            self.container = None


def open_decoder(source, name: str | None = None, shown: str | None = None):
    """The decoder for ``source`` (a path or a seekable file-like object; ``name`` or its name
    decides the format, see :func:`decoder_for`): ``sf.SoundFile`` or :class:`PyAVFile`, opened;
    AudioError with an accurate message if it cannot be decoded (naming it ``shown``, if given)."""
    if name is None:
        name = os.fspath(source) if isinstance(source, (str, os.PathLike)) else str(getattr(source, "name", "") or "")
    if decoder_for(name) == "soundfile":
        return open_soundfile(source, shown=shown)
    import av

    try:
        return PyAVFile(source, name)
    except AudioError:
        raise
    except (av.error.FFmpegError, ValueError, OSError, StopIteration) as e:
        # FFmpeg's words, naming the bytes as the user knows them (shard/member), not a temporary path
        said = getattr(e, "strerror", None) or str(e) or type(e).__name__
        raise AudioError(f"Error opening {shown or name!r}: {said} (FFmpeg)") from e


@lru_cache(maxsize=16)
def _sinc_kernel(orig: int, new: int, width_zeros: int = 6, rolloff: float = 0.99) -> tuple[torch.Tensor, int]:
    """Hann-windowed sinc polyphase kernel [new, 1, 2*width + orig] (torchaudio's formula).

    ``orig``/``new`` are already divided by their gcd; returns (kernel, width in input samples)."""
    base = min(orig, new) * rolloff
    width = math.ceil(width_zeros * orig / base)
    idx = torch.arange(-width, width + orig, dtype=torch.float64)[None, :] / orig
    t = (idx - torch.arange(new, dtype=torch.float64)[:, None] / new) * base
    t = t.clamp(-width_zeros, width_zeros)
    window = torch.cos(t * math.pi / width_zeros / 2) ** 2
    t = t * math.pi
    kernel = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t) * window * (base / orig)
    return kernel[:, None].float(), width


def _reduced(orig_sr: int, new_sr: int) -> tuple[int, int]:
    g = math.gcd(orig_sr, new_sr)
    return orig_sr // g, new_sr // g


def causal_lookahead(orig_sr: int, new_sr: int) -> int:
    """Input samples the causal resampler delays by (its filter's look-ahead)."""
    orig, new = _reduced(orig_sr, new_sr)
    _, width = _sinc_kernel(orig, new)
    return width + orig - 1


class SincResampler:
    """Streaming polyphase resampler over the last axis: ``push`` blocks, then ``finish``; outputs
    concatenate to torchaudio's ``resample`` of the whole input delayed by ``delay`` input samples
    (before any trimming to a target length, which the caller applies)."""

    def __init__(self, orig_sr: int, new_sr: int, delay: int = 0):
        self.orig, self.new = _reduced(orig_sr, new_sr)
        self.kernel, self.width = _sinc_kernel(self.orig, self.new)
        self.size = self.kernel.shape[-1]
        self.left = self.width + delay  # left padding (width) + delay, as torchaudio pads
        self.buffer: torch.Tensor | None = None  # [rows, samples] not yet consumed

    def _frames(self, final: bool) -> torch.Tensor:
        if final:
            self.buffer = torch.nn.functional.pad(self.buffer, (0, self.width + self.orig))
        length = self.buffer.shape[-1]
        n = (length - self.size) // self.orig + 1 if length >= self.size else 0
        if n <= 0:
            return self.buffer.new_zeros(self.buffer.shape[0], 0)
        x = self.buffer[:, : (n - 1) * self.orig + self.size]
        y = torch.nn.functional.conv1d(x[:, None], self.kernel, stride=self.orig)  # [rows, new, n]
        self.buffer = self.buffer[:, n * self.orig :]
        return y.transpose(1, 2).reshape(x.shape[0], -1)

    def push(self, block: torch.Tensor) -> torch.Tensor:
        shape = block.shape[:-1]
        rows = block.reshape(-1, block.shape[-1]).float()
        if self.buffer is None:
            self.buffer = rows.new_zeros(rows.shape[0], self.left)
        self.buffer = torch.cat([self.buffer, rows], dim=-1)
        out = self._frames(final=False)
        return out.reshape(*shape, out.shape[-1])

    def finish(self) -> torch.Tensor:
        if self.buffer is None:
            self.buffer = torch.zeros(1, self.left)
        out = self._frames(final=True)
        return out[0] if out.shape[0] == 1 else out


@dataclass(frozen=True)
class Framing:
    """How a source of ``n`` samples at ``rate`` becomes the encoder's 24 kHz input."""

    name: str = "transformers"
    causal_16k: bool = False  # True: 16 kHz input through the causal (delayed) resampler
    frames_per_call: int = 1  # moshi-stream: 1920-sample frames per moshi streaming call
    # the 24 kHz length of resampled input: "torchaudio" (its float32 rounding: what a user's loop
    # encodes) or "exact" (ceil(n * 24000 / rate): how OUTs made before 0.3 were cut; run.json's
    # ``resampled_length``, so a resume or an audit of such an OUT cuts its items alike)
    length: str = "torchaudio"

    @property
    def stream_frames(self) -> int | None:
        """Frames per moshi streaming call the encoder's attention reproduces (None: not streaming)."""
        return self.frames_per_call if self.name == "moshi-stream" else None

    def delay(self, rate: int) -> int:
        if self.name == "muvap" and rate == 16_000:
            return 16
        if rate == 16_000 and self.causal_16k and self.name != "muvap":
            return causal_lookahead(rate, SAMPLE_RATE)
        return 0

    def resampled_length(self, n: int, rate: int) -> int:
        """24 kHz samples of ``n`` source samples at ``rate``, before :meth:`input_length`'s padding.

        The sinc resampler's is ``torchaudio.functional.resample``'s own length, what a user's
        torchaudio + MimiModel loop encodes: the ceiling of ``new * n / orig`` (the rates reduced by their
        gcd) after torchaudio rounds that quotient to float32 (``torch.as_tensor`` of a Python float: torch's
        default dtype), capped at what its convolution gives, ``(n // orig + 1) * new``.  It is the exact
        ``ceil(n * 24000 / rate)`` while float32 keeps the fraction: from 131,072 samples (5.5 s) on, some
        lengths get one sample fewer; past 2^24 (11.6 min) also one or two more (docs/inputs.md).  The
        causal 16 kHz resampler keeps its nominal ``ceil(1.5 n)``, MuVAP its recipe's ``round(1.5 n)``."""
        if rate == SAMPLE_RATE:
            return n
        if self.name == "muvap" and rate == 16_000:
            return round(n * 1.5)  # Python's round: halves to even, as the MuVAP recipe does
        orig, new = _reduced(rate, SAMPLE_RATE)
        if (rate == 16_000 and self.causal_16k) or self.length == "exact":
            return math.ceil(new * n / orig)
        return min(math.ceil(float(np.float32(new * n / orig))), (n // orig + 1) * new)

    @property
    def multiple(self) -> int:
        """The encoder input is zero-padded to a multiple of this many samples."""
        return {"transformers": 1, "moshi": 1920, "moshi-stream": 1920, "muvap": 960}[self.name]

    def input_length(self, n: int, rate: int) -> int:
        """24 kHz samples the encoder gets for ``n`` source samples at ``rate``."""
        m = self.resampled_length(n, rate)
        return -(-m // self.multiple) * self.multiple


def framing_of(name: str, causal_16k: bool = False, frames_per_call: int = 1) -> Framing:
    if name not in FRAMINGS:
        raise ValueError(f"unknown framing {name!r}; choose from {', '.join(FRAMINGS)}")
    if frames_per_call < 1:
        raise ValueError(f"frames per call must be >= 1, not {frames_per_call}")
    return Framing(name, causal_16k, frames_per_call)


def causal_resample(wav: torch.Tensor, orig_sr: int, new_sr: int) -> torch.Tensor:
    """Resample 1-D ``wav`` so output n only uses inputs m with m / orig_sr <= n / new_sr.

    Equals a symmetric sinc resampler applied to the input delayed by ``causal_lookahead`` samples;
    the output keeps the nominal length ceil(T * new_sr / orig_sr)."""
    if orig_sr == new_sr:
        return wav
    r = SincResampler(orig_sr, new_sr, causal_lookahead(orig_sr, new_sr))
    head = r.push(wav)
    tail = r.finish().reshape(*wav.shape[:-1], -1)
    y = torch.cat([head, tail], dim=-1)
    return y[..., : math.ceil(r.new * wav.shape[-1] / r.orig)].to(wav.dtype)


def _mono(data: np.ndarray, channel: int | str) -> np.ndarray:
    if channel == "mix":
        return data.mean(axis=1, dtype=np.float32) if data.shape[1] > 1 else data[:, 0]
    if channel == "first":
        return data[:, 0]
    if int(channel) >= data.shape[1]:
        raise AudioError(f"has {data.shape[1]} channel(s), no channel {channel}")
    return data[:, int(channel)]


# Vorbis and Opus carry decoder state across packets (overlapped transforms), which libsndfile's
# seek does not fully rebuild: they are read from _PREROLL samples before the start and the pre-roll
# dropped, and then equal the whole-file decode exactly (measured, see tests/audio/test_decoding.py).
# MPEG audio seeks through FFmpeg the same way (PyAVFile).
_PREROLL_SUBTYPES = ("VORBIS", "OPUS")
EXACT_SEEK_EXTENSIONS = (".wav", ".flac", ".aiff", ".aif", ".aifc", ".caf", ".w64", ".rf64", ".au", ".snd")


def seek_is_exact(name: str) -> bool:
    """Whether a seek into ``name`` (by extension) gives exactly the samples a decode from the start
    gives at that point: PCM and FLAC, not lossy codecs (see ``_PREROLL``), whose split pieces are
    decoded from the item's start and dropped instead (:class:`PieceReader`)."""
    return name.lower().endswith(EXACT_SEEK_EXTENSIONS)


def _read(file, n: int, dtype: str = "float32") -> np.ndarray:
    """``n`` frames of ``file`` as ``dtype`` (float32, or int16 for 16-bit PCM: libsndfile's float
    is that int16 / 32768, exactly) [frames, channels]."""
    return file.read(n, dtype=dtype, always_2d=True)


def _seek(file, start: int) -> None:
    """Position ``file`` (an opened decoder) at source sample ``start``, lossy libsndfile codecs
    through a pre-roll (see ``_PREROLL``); PyAVFile seeks itself."""
    if not (isinstance(file, sf.SoundFile) and file.subtype in _PREROLL_SUBTYPES):
        file.seek(start)
        return
    at = max(0, start - _PREROLL)
    if at:
        file.seek(at)
    while at < start:
        got = len(_read(file, min(start - at, _BLOCK)))
        if got == 0:
            raise AudioError(f"ends at sample {at}")
        at += got


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
            self.file = open_decoder(path)
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
                _seek(self.file, start)
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

    def _decode_block(self, dtype: str = "float32") -> tuple[np.ndarray, bool]:
        """The next block of the item's source samples, one channel (``_mono``), and whether it ends
        the item.  ``dtype`` int16: only for a 16-bit PCM file with one channel taken (see
        :mod:`~mimi_extract.device_resample`)."""
        want = min(_BLOCK, self.remaining) if self.remaining is not None else _BLOCK
        try:
            data = _read(self.file, want, dtype) if want > 0 else np.zeros((0, 1), dtype)
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
