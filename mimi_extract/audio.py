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

import contextlib
import math
import os
import sys
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import soundfile as sf

from ._lazy import torch  # imported at first use: probing headers (sources, `plan`) needs none of it
from .choices import FRAMINGS, SAMPLE_RATE

_BLOCK = 1 << 16  # source frames decoded per read of a stream


class AudioError(Exception):
    """A file that cannot be used; the message is what the manifest reports."""


_MPEG = (".mp3", ".mp2", ".mp1", ".mpga", ".mpeg")
_STDERR_LOCK = threading.Lock()
_CAPTURE: list = []  # this process's capture file, made at first use
_WARNINGS_KEPT = 1000  # characters of decoder output an item keeps (a damaged file can print thousands of lines)


@contextlib.contextmanager
def _decoder_stderr(capture: bool):
    """Collect what the decoder library writes to fd 2 while an MPEG file is opened or read
    (libmpg123 prints raw C warnings there, e.g. "part2_3_length too large", "dequantization
    failed": they belong in the item's manifest row, see :attr:`AudioReader.warnings`, not in the
    run's log).  fd 2 is the whole process's: one capture at a time (a lock), held only around the
    C call of an MPEG file's open or read, so that what it collects is that file's (MPEG reads of
    one process's decoding threads take turns; other formats' libraries print nothing)."""
    out: list[str] = []
    if not capture:
        yield out
        return
    with _STDERR_LOCK:
        if not _CAPTURE:
            _CAPTURE.append(tempfile.TemporaryFile())
        tmp = _CAPTURE[0]
        tmp.seek(0)
        tmp.truncate()
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            size = os.fstat(tmp.fileno()).st_size
            text = os.pread(tmp.fileno(), min(size, 1 << 16), 0).decode("utf-8", "replace")
            out.append("\n".join(" ".join(line.split()) for line in text.splitlines() if line.strip()))


def _decoder_error(name: str, is_file: bool, e: Exception, warnings: str) -> AudioError:
    """libsndfile says "File does not exist or is not a regular file (possibly a pipe?)" for a
    file it cannot decode (e.g. a garbage .mp3): say what is true, with the decoder's own words.
    soundfile names the file by its repr, for a member of a shard "<_io.BytesIO object at 0x...>":
    it is named by ``name`` instead, quoted (info's "errors by reason" folds quoted names)."""
    message = f"Error opening {name!r}: {e.error_string}" if isinstance(e, sf.LibsndfileError) else str(e)
    if "does not exist or is not a regular file" in message and is_file:
        kind = os.path.splitext(name)[1].lstrip(".").upper() or "audio"
        message = f"cannot be decoded: not a valid {kind} file, or a format libsndfile cannot read"
    if warnings:
        message += f" (decoder: {warnings[:300]})"
    return AudioError(message)


class ForwardSoundFile(sf.SoundFile):
    """``sf.SoundFile`` whose reads never seek.  soundfile's ``read`` seeks to where it has just read
    up to after every read (its ``_cdata_io``: "update read & write position", for files it calls
    seekable), and libsndfile hands that seek to the codec even though the decoder is already
    there: libmpg123 then re-positions its MP3 stream and re-decodes only 4 frames before the
    position, too few to refill a low-bit-rate file's bit reservoir, so the first ~10k samples of
    every 65,536-frame block came out wrong (up to 0.3 off, 5-7 % of a 32 kbit/s 44.1/48 kHz file's
    samples, measured).  Saying "not seekable" to soundfile skips that seek (libsndfile tracks the
    read position itself); an explicit :meth:`seek` still seeks (it does not ask)."""

    decoder_warnings = ""  # what libmpg123 printed while it was opened (see open_soundfile)

    def seekable(self) -> bool:
        return False


_MPEG_KBPS = {  # (MPEG-1?, layer) -> bit rates of indices 1..14, kbit/s
    (True, 1): (32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (True, 2): (32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 3): (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 1): (32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (False, 2): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    (False, 3): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)}
_MPEG_RATES = {3: (44_100, 48_000, 32_000), 2: (22_050, 24_000, 16_000), 0: (11_025, 12_000, 8_000)}


def _mpeg_frame(data: bytes, i: int):
    """(length in bytes, samples) of the MPEG audio frame header at ``data[i:]``, or None."""
    if i + 4 > len(data) or data[i] != 0xFF or data[i + 1] & 0xE0 != 0xE0:
        return None
    version, layer = (data[i + 1] >> 3) & 3, 4 - ((data[i + 1] >> 1) & 3)
    bitrate, rate, pad = data[i + 2] >> 4, (data[i + 2] >> 2) & 3, (data[i + 2] >> 1) & 1
    if version == 1 or layer == 4 or bitrate in (0, 15) or rate == 3:
        return None
    kbps, hz = _MPEG_KBPS[(version == 3, layer)][bitrate - 1], _MPEG_RATES[version][rate]
    if layer == 1:
        return (12_000 * kbps // hz + pad) * 4, 384
    lsf = version != 3 and layer == 3  # MPEG-2/2.5 layer III: half the samples per frame
    return (72_000 if lsf else 144_000) * kbps // hz + pad, 576 if lsf else 1152


def _first_mpeg_frame(data: bytes) -> int | None:
    """Where the first MPEG audio frame of ``data`` starts (after an ID3v2 tag and any junk)."""
    i = _id3_size(data)
    while i < len(data) and _mpeg_frame(data, i) is None:
        i += 1
    return i if i < len(data) else None


def _has_length_header(data: bytes, i: int) -> bool:
    """Whether the frame at ``i`` is a Xing/Info (after the side info) or VBRI (at 32) header."""
    return any(tag in data[i + 4: i + 4 + 40] for tag in (b"Xing", b"Info", b"VBRI"))


def _id3_size(head: bytes) -> int:
    """Bytes of an ID3v2 tag at the start of ``head`` (its first 10 bytes), 0 if none."""
    if head[:3] != b"ID3" or len(head) < 10:
        return 0
    return 10 + int.from_bytes(bytes(b & 0x7F for b in head[6:10]), "big") + (10 if head[5] & 0x10 else 0)


def mpeg_samples(read) -> int | None:
    """The samples in an MPEG audio file's frames, counted from their headers, when its first frame
    is no Xing/Info/VBRI header (None when it is one, or when no frame is found); ``read(n)`` reads
    the file from its start (its whole length only in that case, 1 MB at a time).

    Without such a header libsndfile takes the length from libmpg123's estimate (file size / the
    first frame's bit rate), and decodes no further: a VBR file is cut short (a -V 7 file: 73,008
    of 200,448 samples, measured), so opening compares the two (:func:`open_soundfile`).  Equal to
    FFmpeg's count on every such test file (CBR and VBR, 16-48 kHz)."""
    buf = read(10)
    buf += read(_id3_size(buf) + (1 << 16))
    i = _first_mpeg_frame(buf)
    if i is None or _has_length_header(buf, i):
        return None
    total, eof = 0, False
    while True:
        if not eof and len(buf) - i < 1 << 16:  # at least 64 KB ahead (a frame is under 3 KB)
            more = read(1 << 20)
            eof = not more
            buf, i = buf[i:] + more, 0
        frame = _mpeg_frame(buf, i)
        if frame is not None:
            total, i = total + frame[1], i + frame[0]
            continue
        if i + 4 > len(buf) and eof:
            return total
        # junk or a tag: resync as libmpg123 does, at a header followed by another one
        j = buf.find(b"\xff", i + 1)
        while j != -1 and (_mpeg_frame(buf, j) is None or _mpeg_frame(buf, j + _mpeg_frame(buf, j)[0]) is None):
            j = buf.find(b"\xff", j + 1)
        if j == -1 and eof:
            return total
        i = j if j != -1 else max(i + 1, len(buf) - 8192)


def _short_mpeg(result, source) -> str | None:
    """Why libsndfile would cut an MPEG file short (see :func:`mpeg_samples`), or None."""
    if not (isinstance(result, sf.SoundFile) and result.subtype.startswith("MPEG_")):
        return None
    f = open(source, "rb") if isinstance(source, (str, os.PathLike)) else source  # noqa: SIM115 (closed below)
    at = f.tell()
    try:
        f.seek(0)
        true = mpeg_samples(f.read)
    finally:
        f.seek(at)
        if f is not source:
            f.close()
    if true is None or result.frames >= true:
        return None
    return (f"VBR MPEG audio without a Xing/VBRI header: libsndfile would decode only {result.frames} of its {true} "
            f"samples (it estimates the length from the file size); re-mux it to add the header "
            f"(ffmpeg -i IN -c:a copy OUT.mp3) or convert it")


def open_soundfile(source, info_only: bool = False, shown: str | None = None):
    """``sf.info`` (``info_only``) or ``sf.SoundFile`` of ``source`` (a path, or a seekable binary
    file-like object such as a tar member), an :class:`AudioError` with an accurate message if it
    cannot be decoded (naming it ``shown``, e.g. ``shard/member``, else by its path or name); what
    the decoder printed while opening a file that opens is its ``decoder_warnings``."""
    is_path = isinstance(source, (str, os.PathLike))
    name = os.fspath(source) if is_path else str(getattr(source, "name", "") or "")
    with _decoder_stderr(name.lower().endswith(_MPEG)) as captured:
        try:
            result = sf.info(source) if info_only and is_path else ForwardSoundFile(source)
        except Exception as e:  # soundfile raises several types for garbage
            error = e
        else:
            error = None
    warnings = captured[0] if captured else ""
    if error is not None:
        raise _decoder_error(shown or name, (not is_path) or os.path.isfile(name), error, warnings) from error
    result.decoder_warnings = warnings  # the reader keeps them (probing drops them: the reader sees them again)
    short = None if info_only else _short_mpeg(result, source)
    if short:
        result.close()
        raise AudioError(short)
    return result


# -- decoders ------------------------------------------------------------------------------
# Which library decodes a file is decided by its extension alone (never by trying one and falling
# back per file), so every file of one format in a run -- and in its resumes -- goes through the same
# decoder: MP3 priming and AAC edit lists are handled differently by libsndfile and FFmpeg, and two
# decoders' sample counts for one format must never meet in one OUT.  run.json records both
# libraries' versions (``decoder_versions``); a resume with other versions is refused.
SOUNDFILE_EXTENSIONS = (".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aiff", ".aif", ".aifc", ".caf", ".w64",
                        ".rf64", ".au", ".snd")
PYAV_EXTENSIONS = (".m4a", ".mp4", ".aac", ".alac", ".wma", ".asf", ".webm", ".mka", ".mkv", ".ac3", ".amr", ".3gp")
DECODED_EXTENSIONS = SOUNDFILE_EXTENSIONS + PYAV_EXTENSIONS


def decoder_for(name: str) -> str:
    """"pyav" for the containers libsndfile cannot read (by extension), else "soundfile" (also for a
    name without a known extension: libsndfile then identifies the format from the bytes)."""
    return "pyav" if name.lower().endswith(PYAV_EXTENSIONS) else "soundfile"


def decoder_versions() -> dict:
    """The decoders a run uses and their versions (run.json): a resume must decode the same way."""
    versions = {"soundfile": f"soundfile {sf.__version__}, libsndfile {sf.__libsndfile_version__}",
                "pyav": None, "pyav_extensions": list(PYAV_EXTENSIONS)}
    try:
        import av

        codec = av.library_versions.get("libavcodec")
        versions["pyav"] = f"av {av.__version__}, libavcodec {'.'.join(map(str, codec)) if codec else '?'}"
    except ImportError:
        pass
    return versions


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


class PyAVFile:
    """What AudioReader needs of ``sf.SoundFile`` (``samplerate``, ``channels``, ``frames``,
    ``read``, ``seek``, ``close``), decoded by PyAV (FFmpeg) from a path or a seekable file-like
    object.  ``frames`` is counted by a full decode (these containers do not state the decoded
    length exactly: AAC priming, edit lists), once, when asked (probing); ``seek`` decodes and drops."""

    def __init__(self, source):
        import av

        self.source = source
        self.name = os.fspath(source) if isinstance(source, (str, os.PathLike)) else getattr(source, "name", "")
        self._open(av)
        ctx = self.stream.codec_context
        self.samplerate = int(ctx.sample_rate or 0)
        self.channels = int(ctx.channels if hasattr(ctx, "channels") else len(ctx.layout.channels))
        if self.samplerate <= 0 or self.channels <= 0:
            self.close()
            raise AudioError("no audio stream with a sample rate and channels")
        self._frames = None

    def _open(self, av) -> None:
        if not isinstance(self.source, (str, os.PathLike)):
            self.source.seek(0)
        self.container = av.open(self.source, mode="r", metadata_errors="ignore")
        if not self.container.streams.audio:
            self.container.close()
            raise AudioError("no audio stream")
        self.stream = self.container.streams.audio[0]
        self.stream.thread_type = "SLICE"
        self._decoded = self._frames_of(self.container.decode(self.stream))
        self.buffer = np.zeros((0, 0), np.float32)

    @staticmethod
    def _frames_of(frames):
        for frame in frames:
            yield _frame_array(frame)

    @property
    def frames(self) -> int:
        if self._frames is None:
            import av

            counter = PyAVFile.__new__(PyAVFile)
            counter.source, counter.name = self.source, self.name
            if isinstance(self.source, (str, os.PathLike)):
                counter._open(av)
                self._frames = sum(len(a) for a in counter._decoded)
                counter.container.close()
            else:  # one handle: count, then rewind this reader
                self._frames = sum(len(a) for a in self._decoded)
                self.container.close()
                self._open(av)
        return self._frames

    def read(self, n: int, dtype: str = "float32", always_2d: bool = True) -> np.ndarray:
        parts, have = [self.buffer] if len(self.buffer) else [], len(self.buffer)
        while have < n:
            block = next(self._decoded, None)
            if block is None:
                break
            parts.append(block)
            have += len(block)
        data = np.concatenate(parts) if parts else np.zeros((0, self.channels), np.float32)
        self.buffer = data[n:]
        return data[:n]

    def seek(self, frames: int) -> int:
        while frames > 0:
            got = len(self.read(min(frames, 1 << 16)))
            if got == 0:
                raise AudioError(f"cannot seek past the end ({frames} samples short)")
            frames -= got
        return frames

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
    try:
        import av
    except ImportError:
        raise AudioError(f"{os.path.splitext(name)[1]} files are decoded by PyAV: pip install 'mimi-extract[av]'") from None
    try:
        return PyAVFile(source)
    except AudioError:
        raise
    except (av.error.FFmpegError, ValueError, OSError, StopIteration) as e:
        raise AudioError(f"cannot be decoded by FFmpeg: {e}") from e


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
        if rate == SAMPLE_RATE:
            return n
        if self.name == "muvap" and rate == 16_000:
            return round(n * 1.5)  # Python's round: halves to even, as the MuVAP recipe does
        orig, new = _reduced(rate, SAMPLE_RATE)
        return math.ceil(new * n / orig)

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


# Lossy codecs carry decoder state across frames (MP3's bit reservoir reaches up to 511 bytes back:
# 85 frames of an 8 kbit/s MPEG-2 file; overlapped transforms), which libsndfile's seek does not
# fully rebuild: libmpg123 re-decodes 4 frames before the target, so a segment of a 32 kbit/s MP3
# read after a seek was up to 0.27 off the whole-file decode (measured).  They are read from
# _PREROLL frames before the start and the pre-roll dropped: MPEG-1 (32-48 kHz), Vorbis and Opus
# then equal the whole-file decode exactly, MPEG-2 (16-24 kHz) MP3 to 6e-8 (libmpg123's synthesis
# rounds differently after any seek; measured, see tests/audio/test_decoding.py).
_PREROLL = 1 << 16
_PREROLL_SUBTYPES = ("MPEG_LAYER_I", "MPEG_LAYER_II", "MPEG_LAYER_III", "VORBIS", "OPUS")
EXACT_SEEK_EXTENSIONS = (".wav", ".flac", ".aiff", ".aif", ".aifc", ".caf", ".w64", ".rf64", ".au", ".snd")


def seek_is_exact(name: str) -> bool:
    """Whether a seek into ``name`` (by extension) gives exactly the samples a decode from the start
    gives at that point: PCM and FLAC, not lossy codecs (see ``_PREROLL``), whose split pieces are
    decoded from the item's start and dropped instead (:class:`PieceReader`)."""
    return name.lower().endswith(EXACT_SEEK_EXTENSIONS)


def _is_mpeg(file) -> bool:
    return isinstance(file, sf.SoundFile) and file.subtype.startswith("MPEG_")


def _decoding(call, file, warn):
    """``call()`` (a read or seek of ``file``), what an MPEG decoder prints meanwhile given to ``warn``
    (a callable taking the text), never to fd 2; raises what ``call`` raised, after that."""
    error = None
    with _decoder_stderr(_is_mpeg(file)) as said:
        try:
            result = call()
        except Exception as e:
            error = e
    if said and said[0] and warn is not None:
        warn(said[0])
    if error is not None:
        raise error
    return result


def _read(file, n: int, warn=None, dtype: str = "float32") -> np.ndarray:
    """``n`` frames of ``file`` as ``dtype`` (float32, or int16 for 16-bit PCM: libsndfile's float
    is that int16 / 32768, exactly) [frames, channels] (see :func:`_decoding` for ``warn``)."""
    return _decoding(lambda: file.read(n, dtype=dtype, always_2d=True), file, warn)


def _seek(file, start: int, warn=None) -> None:
    """Position ``file`` (an opened decoder) at source sample ``start``, lossy libsndfile codecs
    through a pre-roll (see ``_PREROLL``); PyAVFile decodes and drops from where it is."""
    if not (isinstance(file, sf.SoundFile) and file.subtype in _PREROLL_SUBTYPES):
        file.seek(start)
        return
    at = max(0, start - _PREROLL)
    if at:
        _decoding(lambda: file.seek(at), file, warn)
    while at < start:
        got = len(_read(file, min(start - at, _BLOCK), warn))
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
    of input.  ``warnings`` is what the decoder library printed while opening and reading it (the
    engines put it in the item's manifest row, ``decoder_warnings``; see :func:`_decoder_stderr`)."""

    def __init__(self, path, channel: int | str = "mix", framing: Framing = Framing(), start: int = 0,
                 frames: int | None = None):
        self.path, self.channel, self.framing = path, channel, framing
        self.handle = None if isinstance(path, (str, bytes, os.PathLike)) else path
        self._lines: dict[str, int] = {}
        try:
            self.file = open_decoder(path)
        except AudioError as e:
            self._close_handle()
            raise AudioError(f"cannot decode: {e}") from e
        self._warn(getattr(self.file, "decoder_warnings", ""))
        self.rate = self.file.samplerate
        if channel not in ("mix", "first") and int(channel) >= self.file.channels:
            channels = self.file.channels
            self.close()
            raise AudioError(f"has {channels} channel(s), no channel {channel}")
        self.remaining = frames if frames is not None else max(0, self.file.frames - start)
        if start:
            try:
                _seek(self.file, start, self._warn)
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
        """The decoder's lines, each once, with how often it said it ("...; error: x (7 times)")."""
        text = "; ".join(line if n == 1 else f"{line} ({n} times)" for line, n in self._lines.items())
        return text if len(text) <= _WARNINGS_KEPT else text[: _WARNINGS_KEPT - 1] + "…"

    def _warn(self, text: str) -> None:
        for line in text.splitlines():
            if line in self._lines or len(self._lines) < 50:
                self._lines[line] = self._lines.get(line, 0) + 1

    def _said(self) -> str:
        return f" (decoder: {self.warnings[:300]})" if self.warnings else ""

    def close(self) -> None:
        if getattr(self, "file", None) is not None:
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
            data = _read(self.file, want, self._warn, dtype) if want > 0 else np.zeros((0, 1), dtype)
        except AudioError:
            raise
        except Exception as e:
            raise AudioError(f"cannot decode at sample {self.source_samples}: {e}{self._said()}") from e
        if len(data) and data.dtype.kind == "f" and not np.isfinite(data).all():
            raise AudioError("contains NaN or infinite samples")
        self.source_samples += len(data)
        self.remaining -= len(data)
        return np.ascontiguousarray(_mono(data, self.channel)), len(data) < want or self.remaining <= 0

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
