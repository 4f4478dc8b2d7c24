"""Decoders: which library decodes a file (by its extension), and the decoders themselves --
libsndfile through ``soundfile``, FFmpeg through :class:`PyAVFile`, dr_flac through
:class:`DrFlacFile` for a FLAC file read whole -- behind one interface
(:func:`open_decoder`: ``samplerate``, ``channels``, ``frames``, ``read``, ``seek``, ``close``), with
the seeks that give exactly the samples a decode from the start gives (:func:`seek_exact`).  MPEG audio
(MP3) and Ogg Opus (``.opus``) go through FFmpeg (see the decoder table below), MP3 cut before the
tags appended to it (:mod:`.trailing`); an undecodable packet becomes silence of its length,
counted in the item's ``decoder_warnings``."""

from __future__ import annotations

import collections
import contextlib
import os
import threading

import numpy as np
import soundfile as sf

from .trailing import Window, audio_end

BLOCK = 1 << 16  # source frames decoded per read of a stream
MAX_READ = 1 << 20  # the most a reader that decodes what a chunk needs asks for at once (largest_read)


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
#
# FLAC read whole (from its first sample to its end: a file, or a segment that runs to the end from
# sample 0) goes through dr_flac (the ``miniaudio`` package, :class:`DrFlacFile`) since 0.4: 1.6x
# libsndfile's libFLAC per core, and its samples are libsndfile's, bit for bit (8-, 16- and 24-bit,
# 1-8 channels, tests/audio/test_flac.py; the real-shapes corpus).  What differs is damage: libFLAC
# reports a frame that fails its CRC and libsndfile raises, where dr_flac skips the frame silently
# (every later sample moves a frame earlier) and stops where the bytes stop.  Both leave fewer frames
# than STREAMINFO's total, so DrFlacFile checks the count and makes an error of any shortfall: a read
# that does not reach the end could not see it, and stays with libsndfile, as does what was not
# measured equal (an unknown total, other bit depths, Ogg FLAC, a member too large to hold in memory).
# The samples being the same, which of the two decodes a FLAC file is not a choice an OUT sees.
#
# Ogg Opus (``.opus``) goes through FFmpeg's native Opus decoder since 0.4: 2.2-2.6x libsndfile's
# libopus per core (docs/performance.md).  It decodes at 48 kHz, Opus's own rate, whatever rate the
# header states: RFC 7845 5.1 makes that field informational (the encoder's input rate) and says to
# play at 48 kHz; libsndfile asked libopus for the stated rate instead (16 kHz for most speech
# corpora), so a 0.3 OUT's .opus items had other samples: run.json's ``decoders`` refuses that resume.
# The reference is FFmpeg's whole-file decode: the length is counted from the stream's tail (Ogg
# granule positions give every page's exact time, end trimming applied) and a segment seeks through
# the pre-roll, both equal to the whole decode (tests/audio/test_decoding.py).  An Opus stream named
# ``.ogg`` or ``.oga`` stays with libsndfile, by the extension rule above.
FLAC_EXTENSIONS = (".flac",)  # read whole by dr_flac (DrFlacFile), else by libsndfile
SOUNDFILE_EXTENSIONS = (".wav", ".flac", ".ogg", ".oga", ".aiff", ".aif", ".aifc", ".caf", ".w64", ".rf64",
                        ".au", ".snd")
MPEG_EXTENSIONS = (".mp3", ".mp2", ".mp1", ".mpga")
OPUS_EXTENSIONS = (".opus",)
# containers whose frames carry exact times, so their decoded length is counted from the stream's tail
# (MPEG audio by its demuxer's frame index; MP4/M4A by its sample table, edit lists applied; Ogg Opus
# by its pages' granule positions)
TAIL_COUNTED_EXTENSIONS = MPEG_EXTENSIONS + OPUS_EXTENSIONS + (".m4a", ".mp4")
# ... and those a segment read seeks into through the pre-roll (see _PREROLL), exact
PREROLL_SEEK_EXTENSIONS = MPEG_EXTENSIONS + OPUS_EXTENSIONS
PYAV_EXTENSIONS = MPEG_EXTENSIONS + OPUS_EXTENSIONS + (".m4a", ".mp4", ".aac", ".alac", ".wma", ".asf", ".webm",
                                                       ".mka", ".mkv", ".ac3", ".amr", ".3gp")
DECODED_EXTENSIONS = SOUNDFILE_EXTENSIONS + PYAV_EXTENSIONS


def decoder_for(name: str) -> str:
    """"pyav" for MPEG audio, Ogg Opus and the containers libsndfile cannot read (by extension), else
    "soundfile" (also for a name without a known extension: libsndfile then identifies the format
    from the bytes)."""
    return "pyav" if name.lower().endswith(PYAV_EXTENSIONS) else "soundfile"


def decoder_versions() -> dict:
    """The decoders a run uses and their versions (run.json): a resume must decode the same way."""
    import av

    codec = av.library_versions.get("libavcodec")
    return {"soundfile": f"soundfile {sf.__version__}, libsndfile {sf.__libsndfile_version__}",
            "pyav": f"av {av.__version__}, libavcodec {'.'.join(map(str, codec)) if codec else '?'}",
            "pyav_extensions": list(PYAV_EXTENSIONS), "dr_flac": DrFlacFile.version()}


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
# A stream's length is counted from its tail (PyAVFile.frames): the place of a frame near the end in
# the whole decode (its time, the demuxer's, exact, less the first frame's and the decoder's lag:
# PyAVFile._start) plus the samples decoded from it to the end (end trimming applied by FFmpeg from
# the last packet's side data).  Neither depends on the samples decoded before it, so no pre-roll is needed:
# the demuxer is positioned _COUNT_TAIL samples before the end, its packets read to the end without
# decoding, and only the last _COUNT_PACKETS of them (FFmpeg's closing empty packet included, which
# drains a decoder's delay) decoded: the last frame comes after 7 frames decoded before it, the MP3 bit
# reservoir's reach in an 8 kbit/s MPEG-2.5 stream.  Measured (the bench corpora's 276 items each,
# docs/performance.md): a probe's count of an MP3 2.66 -> 1.51 ms, of an Ogg Opus file 6.12 -> 1.75
# (whose seek lands a page or two early: ~100 packets were decoded); the counts are the same, and the
# real-shapes tests compare every count with FFmpeg's whole decode (3 packets were enough there, counted
# from the last frame's time, before the decoder's lag was measured: the count now needs 2 decoded frames).
_COUNT_TAIL = 1 << 15
_COUNT_PACKETS = 9

# One FFmpeg decode at a time in a process (PyAVFile's reads, seeks and counts).  PyAV releases the
# GIL only inside FFmpeg's calls; around each 20-26 ms frame (packet, frame and array objects) it
# needs it, so two threads decoding at once hand the GIL to and fro some 36 times per audio second
# and run no faster than one: measured on Opus and MP3 48 kHz, two decode threads in one process
# took 1.5-1.8x the CPU per audio second of one thread at the same or lower throughput (575 vs
# 590x, 685 vs 975x), and the same two threads taking turns through this lock took one thread's
# CPU at its throughput (docs/performance.md).  Other decoders (libsndfile, dr_flac) release the
# GIL for a whole read and keep decoding in parallel; more FFmpeg throughput per GPU comes from
# more feeding processes (``--feeders-per-gpu``).  Re-entrant: a seek reads.  Bytes that come over
# the network as FFmpeg reads them take no turns (:func:`_turns_for`).
FFMPEG_TURNS = threading.RLock()


def _turns_for(source):
    """:data:`FFMPEG_TURNS` for bytes read from this machine, none for bytes that come over the
    network as FFmpeg reads them (a tar member of a shard on object storage, whose file object
    says ``over_network``): a turn held through a ranged GET would stall every other FFmpeg decode
    of the process, where threads hide that latency."""
    over_network = getattr(source, "over_network", False) or getattr(getattr(source, "raw", None), "over_network", False)
    return contextlib.nullcontext() if over_network else FFMPEG_TURNS


def decode_turn(file):
    """One turn for a run of reads of ``file`` (an opened decoder): its :data:`FFMPEG_TURNS` where it
    takes turns, else nothing.  A reader that decodes what a chunk needs in several reads takes its
    turn once for all of them (:class:`~mimi_extract.audio.device.NativeReader`): two threads taking
    turns read by read alternate two FFmpeg decoders every ``BLOCK``, and each finds its state out
    of the cache (one thread 1,134-1,150 us per audio second of MP3, two taking turns by the read
    1,251-1,272, docs/performance.md).  Re-entrant: the reads inside take it again at no cost."""
    return getattr(file, "turns", None) or contextlib.nullcontext()


class PyAVFile:
    """What AudioReader needs of ``sf.SoundFile`` (``samplerate``, ``channels``, ``frames``,
    ``read``, ``seek``, ``close``), decoded by PyAV (FFmpeg) from a path or a seekable file-like
    object.

    A packet FFmpeg cannot decode (a damaged frame) becomes silence of its duration, so every later
    sample keeps its place, and is counted in :attr:`decoder_warnings` (FFmpeg's own command line
    skips such a packet too; PyAV's plain loop stops the whole file there).

    ``frames``, the decoded length, is what the decoder outputs, which no header of these formats
    states exactly for every file (AAC priming and edit lists; an MP3 without a Xing/VBRI header,
    or a LAME gapless tag).  For MPEG audio, Ogg Opus and MP4/M4A it is counted from the time of the first
    decoded sample to a frame near the end, plus what is decoded from there, decoding only the stream's last :data:`_COUNT_PACKETS`
    packets (the packet times come from the demuxer's frame index, the MP4 sample table or the Ogg
    pages' granule positions, read without decoding); for the other containers by a full decode.
    Both are checked against a whole decode in tests/audio/test_real_shapes.py.  ``seek`` of MPEG
    audio and Ogg Opus seeks (see ``_PREROLL``); of the others, decodes and drops from where the stream is (an AAC frame read
    after a container seek differs from the whole decode by up to 8e-3 even after a pre-roll:
    measured, so AAC is not sought)."""

    def __init__(self, source, name: str = ""):
        import av

        self.source = source
        self.name = name or (os.fspath(source) if isinstance(source, (str, os.PathLike)) else getattr(source, "name", ""))
        self.mpeg = str(self.name).lower().endswith(MPEG_EXTENSIONS)
        self.tail_counted = str(self.name).lower().endswith(TAIL_COUNTED_EXTENSIONS)
        self.preroll_seek = str(self.name).lower().endswith(PREROLL_SEEK_EXTENSIONS)
        self._skipped: list[str] = []  # why each undecodable packet was silenced
        self.container = None
        self.turns = _turns_for(source)
        # what FFmpeg reads: an MPEG file's bytes before its trailing APEv2 / ID3v2 tags (audio.trailing)
        self._input = _before_trailing_tags(source) if self.mpeg else source
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
        if not isinstance(self._input, (str, os.PathLike)):
            self._input.seek(0)
        # the MP3 demuxer seeks by its index of frame headers (exact times), never by a Xing TOC
        options = {"usetoc": "0"} if self.mpeg else {}
        self.container = av.open(self._input, mode="r", metadata_errors="ignore", options=options)
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
            counter._input = self._input
            counter.tail_counted, counter.preroll_seek = self.tail_counted, self.preroll_seek
            counter.samplerate, counter.channels = self.samplerate, self.channels
            counter._open(av)
            try:
                with self.turns:
                    self._frames = counter._count_to_end()
            finally:
                counter.close()
            if not isinstance(self.source, (str, os.PathLike)):  # one handle: rewind this reader
                self.container.close()
                self._open(av)
        return self._frames

    def _start(self):
        """(the stream time of the first decoded sample, in samples; the first frame's samples; the
        decoder's ``lag``) from the stream's first two frames, or None where a frame has no time.
        ``lag``: how far after the first frame's end the second one's time is.  0 for most decoders;
        24 for FFmpeg's Opus decoder where SILK (narrow or medium band: low bit rates) is resampled
        to 48 kHz: every frame's time after the first is its place in the whole decode plus 24, and
        the 24 samples come back at the end, in a frame from the closing empty packet stamped with
        the last packet's time (measured: an 8 kbit/s Ogg Opus file counted and sought 24 early)."""
        t1, first = next(self._decoded, (None, None))
        t2, second = next(self._decoded, (None, None))
        if t1 is None or t2 is None or first is None or second is None:
            return None
        origin = self._samples(t1)
        return origin, len(first[0]), self._samples(t2) - origin - len(first[0])

    def _count_to_end(self) -> int:
        """The samples a decode from the start gives (see the class docstring).  Counted from a
        frame's place in the whole decode (its time, less the start's, less ``lag``: :meth:`_start`)
        plus the samples decoded from it to the end: not from the last frame's time, which the
        closing packet's frame (Opus's SILK delay) or a damaged packet after an end-trimmed one
        (silence of its whole duration) does not follow.  That frame is the second one decoded
        after the seek: a decoder with a delay gives the first one ``lag`` samples short."""
        if not self.tail_counted:
            return sum(len(a[0]) for _, a in self._decoded)
        import av

        start = self._start()
        if start is None:  # a frame without a time, or a stream of one frame: decode it all, from the start
            self.container.close()
            self._open(av)
            return sum(len(a[0]) for _, a in self._decoded)
        origin, first, lag = start
        self.container.seek(2 ** 62, stream=self.stream, backward=True)  # indexes every frame: the last one
        last = next((p for p in self.container.demux(self.stream) if p.pts is not None), None)
        end = self._samples(last.pts) if last is not None else origin
        if end - _COUNT_TAIL <= origin + first:  # a short stream: decode it all, from the start
            self.container.close()
            self._open(av)
            return sum(len(a[0]) for _, a in self._decoded)
        self._position(end - _COUNT_TAIL)
        tail = collections.deque(self.container.demux(self.stream), maxlen=_COUNT_PACKETS)  # (demuxed, not decoded)
        decoded = list(self._decode(iter(tail)))
        if len(decoded) < 2 or decoded[1][0] is None:
            raise AudioError("a frame without a time after a seek")
        return self._samples(decoded[1][0]) - lag - origin + sum(len(block[0]) for _, block in decoded[1:])

    def _position(self, t: int) -> None:
        """Position the demuxer at the frame holding stream sample ``t`` or before it (decoder flushed)."""
        self.container.seek(int(t / (self.stream.time_base * self.samplerate)), stream=self.stream, backward=True)

    def _seek_to(self, t: int) -> None:
        """:meth:`_position` at ``t``, the frames decoded from there on."""
        self._position(t)
        self._decoded = self._decode(self.container.demux(self.stream))

    def read(self, n: int, dtype: str = "float32", always_2d: bool = True) -> np.ndarray:
        with self.turns:
            return self._read(n)

    def _read(self, n: int) -> np.ndarray:
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
        with self.turns:
            return self._seek(frames)

    def _seek(self, frames: int) -> int:
        if self.preroll_seek and self.position == 0 and frames > 2 * _PREROLL and self._preroll_seek(frames):
            return frames
        left = frames - self.position
        while left > 0:
            got = len(self.read(min(left, 1 << 16)))
            if got == 0:
                raise AudioError(f"cannot seek past the end ({left} samples short)")
            left -= got
        return frames

    def _preroll_seek(self, target: int) -> bool:
        """Seek to ``target`` through a pre-roll (see ``_PREROLL``); False (nothing consumed that a
        decode from the start needs: the stream is reopened) where frame times are missing."""
        import av

        start = self._start()
        if start is None:
            self.container.close()
            self._open(av)
            return False
        origin, _, lag = start
        origin += lag  # a frame's place in the whole decode: its time less this (see _start)
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


_DRFLAC_BITS = (8, 16, 24)  # bit depths measured bit-identical to libsndfile (tests/audio/test_flac.py)
_DRFLAC_SUBTYPES = {8: "PCM_S8", 16: "PCM_16", 24: "PCM_24"}  # libsndfile's names for them
DRFLAC_IN_MEMORY = 256 << 20  # a file-like object (a tar member) is handed to dr_flac in memory up to this size


class DrFlacFile:
    """A FLAC stream read whole, from its first sample to STREAMINFO's total, by dr_flac (the
    ``miniaudio`` package): what AudioReader needs of ``sf.SoundFile`` (``samplerate``,
    ``channels``, ``frames``, ``subtype``, ``read``, ``close``), with libsndfile's samples (its
    float32 is dr_flac's, whose int16 / 32768 and int24 / 2^23 are exact, as libsndfile's are).

    dr_flac skips a frame whose CRC fails and ends where the bytes end, without a word; libsndfile
    raises.  So every read is checked against STREAMINFO's total: a decode that ends before it is
    an :class:`AudioError` (the item's error row, as libsndfile's "flac decoder lost sync" was),
    and nothing is read past it (libsndfile stops there too, where frames follow it).  STREAMINFO's
    MD5 is not checked: libsndfile does not check it (a file whose MD5 is wrong decodes), and hashing
    costs 54-65 us per audio second of 16 kHz mono, a third of dr_flac's decode (docs/performance.md).
    The reads release the GIL (cffi), as libsndfile's do.  Open with :meth:`open_whole`, which says
    where dr_flac is not used."""

    def __init__(self, handle, data, name: str):
        import miniaudio

        self._lib, self._ffi = miniaudio.lib, miniaudio.ffi
        self._handle, self._data, self.name = handle, data, name  # (``data``: the bytes dr_flac reads, kept alive)
        self.samplerate, self.channels = int(handle.sampleRate), int(handle.channels)
        self.frames, self.bits = int(handle.totalPCMFrameCount), int(handle.bitsPerSample)
        self.subtype = _DRFLAC_SUBTYPES.get(self.bits, "")
        self.position = 0  # samples decoded so far
        self._first = None  # the first sample, decoded by open_whole and not read yet

    @staticmethod
    def version() -> str:
        """The package and dr_flac's version (run.json's ``decoders``)."""
        import miniaudio

        return f"miniaudio {miniaudio.__version__}, miniaudio.h {miniaudio.ffi.string(miniaudio.lib.ma_version_string()).decode()}"

    @classmethod
    def open_whole(cls, source, name: str, frames: int | None) -> "DrFlacFile | None":
        """``source`` (a path, or a seekable binary file-like object: rewound when None is returned)
        opened by dr_flac to be read whole (``frames``: the samples the reader takes, None to the
        end); None where libsndfile decodes it instead: a read that stops before the end (a
        dropped frame would go unseen), an unknown total, a bit depth not measured, Ogg FLAC, a
        file-like object over :data:`DRFLAC_IN_MEMORY`, or bytes dr_flac cannot open (libsndfile
        then says why)."""
        import miniaudio

        lib, ffi = miniaudio.lib, miniaudio.ffi
        if isinstance(source, (str, os.PathLike)):
            path = os.fspath(source)
            try:
                with open(path, "rb") as f:
                    magic = f.read(4)
            except OSError:
                return None
            data = None
            handle = lib.ma_dr_flac_open_file(os.fsencode(path), ffi.NULL) if magic != b"OggS" else ffi.NULL
        else:
            try:
                size = source.seek(0, os.SEEK_END)
                source.seek(0)
                if size > DRFLAC_IN_MEMORY:
                    return None
                data = source.getvalue() if hasattr(source, "getvalue") else source.read()
                source.seek(0)
            except OSError:  # (bytes that cannot be read: libsndfile's open says so, as before)
                with contextlib.suppress(OSError):
                    source.seek(0)
                return None
            handle = lib.ma_dr_flac_open_memory(data, len(data), ffi.NULL) if data[:4] != b"OggS" else ffi.NULL
        if handle == ffi.NULL:
            return None
        file = cls(handle, data, name)
        if file.frames <= 0 or file.bits not in _DRFLAC_BITS or (frames is not None and frames < file.frames) \
                or not file._first_sample():
            file.close()
            return None
        return file

    def _first_sample(self) -> bool:
        """Decode the first sample (dr_flac decodes its whole frame), kept for the first read: False
        where dr_flac decodes none -- a STREAMINFO whose maximum block size or bit depth the frames
        contradict, which libsndfile reads by the frames' own headers (measured: an error from
        dr_flac at sample 0, libsndfile's samples unchanged), or a first frame that is damaged
        (libsndfile then says so).  No frame is decoded twice."""
        first = np.empty((1, self.channels), np.float32)
        if self._lib.ma_dr_flac_read_pcm_frames_f32(self._handle, 1, self._ffi.from_buffer("float[]", first)) != 1:
            return False
        self._first, self.position = first, 1
        return True

    def read(self, n: int, dtype: str = "float32", always_2d: bool = True) -> np.ndarray:
        """The next ``n`` samples or fewer at the end [samples, channels], float32 or (16-bit
        only) int16; AudioError where the stream ends before STREAMINFO's total."""
        if self._handle is None:
            raise AudioError("read after close")
        int16 = dtype == "int16"
        if int16 and self.bits != 16:
            raise ValueError(f"int16 reads of a {self.bits}-bit FLAC")
        held = int(self._first is not None)  # the first sample, decoded by open_whole
        want = max(0, min(n, self.frames - self.position + held))
        out = np.empty((want, self.channels), np.int16 if int16 else np.float32)
        if want and held:  # (16-bit: its float32 is k / 32768, so k exactly)
            out[0] = (self._first[0] * 32768).astype(np.int16) if int16 else self._first[0]
            self._first = None
        ask = want - held if want else 0
        if ask:
            ffi, rest = self._ffi, out[held:]
            if int16:
                got = self._lib.ma_dr_flac_read_pcm_frames_s16(self._handle, ask, ffi.from_buffer("ma_dr_flac_int16[]", rest))
            else:
                got = self._lib.ma_dr_flac_read_pcm_frames_f32(self._handle, ask, ffi.from_buffer("float[]", rest))
            self.position += int(got)
            out = out[:held + got]
            if got < ask:
                raise AudioError(f"damaged or cut short: its FLAC frames decode to {self.position:,} samples, its "
                                 f"STREAMINFO header states {self.frames:,} (a frame failed its CRC, or the file ends early)")
        return out

    def close(self) -> None:
        if self._handle is not None:
            self._lib.ma_dr_flac_close(self._handle)
            self._handle, self._data = None, None

    def __del__(self) -> None:  # (as sf.SoundFile: a reader dropped unclosed still frees dr_flac's file)
        self.close()


def _before_trailing_tags(source):
    """``source`` (a path or a seekable binary file object) as FFmpeg is to read it: cut before the
    APEv2 / ID3v2 tags appended to it (:func:`~mimi_extract.audio.trailing.audio_end`) -- a path by
    FFmpeg's ``subfile`` protocol (still read by FFmpeg's own file calls), a file object by a
    :class:`~mimi_extract.audio.trailing.Window` -- or ``source`` itself when it has none (the common
    case: FFmpeg reads it as before)."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        with open(path, "rb") as f:
            end = audio_end(lambda at, n: (f.seek(at), f.read(n))[1], os.fstat(f.fileno()).st_size)
            size = f.seek(0, os.SEEK_END)
        return source if end == size else f"subfile,,start,0,end,{end},,:file:{path}"
    size = source.seek(0, os.SEEK_END)
    end = audio_end(lambda at, n: (source.seek(at), source.read(n))[1], size)
    source.seek(0)
    return source if end == size else Window(source, end)


def open_decoder(source, name: str | None = None, shown: str | None = None,
                 span: tuple[int, int | None] | None = None):
    """The decoder for ``source`` (a path or a seekable file-like object; ``name`` or its name
    decides the format, see :func:`decoder_for`): ``sf.SoundFile`` or :class:`PyAVFile`, opened --
    or, for a FLAC file read whole (``span``: the read's first sample and its length, None to the
    end; None: a header probe), :class:`DrFlacFile` where it gives libsndfile's samples; AudioError
    with an accurate message if it cannot be decoded (naming it ``shown``, if given)."""
    if name is None:
        name = os.fspath(source) if isinstance(source, (str, os.PathLike)) else str(getattr(source, "name", "") or "")
    if span is not None and span[0] == 0 and name.lower().endswith(FLAC_EXTENSIONS):
        whole = DrFlacFile.open_whole(source, name, span[1])
        if whole is not None:
            return whole
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


# Vorbis and Opus carry decoder state across packets (overlapped transforms), which libsndfile's
# seek does not fully rebuild: they are read from _PREROLL samples before the start and the pre-roll
# dropped, and then equal the whole-file decode exactly (measured, see tests/audio/test_decoding.py).
# MPEG audio and .opus seek through FFmpeg the same way (PyAVFile); OPUS below is an Opus stream
# named .ogg or .oga, which libsndfile decodes.
_PREROLL_SUBTYPES = ("VORBIS", "OPUS")
EXACT_SEEK_EXTENSIONS = (".wav", ".flac", ".aiff", ".aif", ".aifc", ".caf", ".w64", ".rf64", ".au", ".snd")


def seek_is_exact(name: str) -> bool:
    """Whether a seek into ``name`` (by extension) gives exactly the samples a decode from the start
    gives at that point: PCM and FLAC, not lossy codecs (see ``_PREROLL``), whose split pieces are
    decoded from the item's start and dropped instead (:class:`PieceReader`)."""
    return name.lower().endswith(EXACT_SEEK_EXTENSIONS)


def largest_read(file) -> int:
    """The most frames worth asking ``file`` (an opened decoder) for in one read: :data:`MAX_READ`
    where a read is one library call into one buffer (libsndfile, dr_flac: a larger read saves the
    per-read Python, ~20 us, at the same cost per sample), :data:`BLOCK` for FFmpeg's
    (:class:`PyAVFile` joins its decoded frames in Python: a read of 2^20 frames passes over 8 MB
    out of the cache three times, and the feed's decode pool cost 2.2x per audio second for MP3
    and Opus at 48 kHz with it, docs/performance.md).  :data:`MAX_READ` counts samples over all
    the file's channels (frames x channels, never under a ``BLOCK`` of frames): a read decodes
    every channel before one is taken or mixed, so 2^20 frames of a 32-channel file were a 128 MB
    array per decoding thread (a GPU node runs ~100 of them), 16 times a ``BLOCK``'s; a mono
    file's reads, the common case, are unchanged."""
    if isinstance(file, PyAVFile):
        return BLOCK
    return max(BLOCK, MAX_READ // max(1, file.channels))


def read_frames(file, n: int, dtype: str = "float32") -> np.ndarray:
    """``n`` frames of ``file`` as ``dtype`` (float32, or int16 for 16-bit PCM: libsndfile's float
    is that int16 / 32768, exactly) [frames, channels]."""
    return file.read(n, dtype=dtype, always_2d=True)


def seek_exact(file, start: int) -> None:
    """Position ``file`` (an opened decoder) at source sample ``start``, lossy libsndfile codecs
    through a pre-roll (see ``_PREROLL``); PyAVFile seeks itself."""
    if not (isinstance(file, sf.SoundFile) and file.subtype in _PREROLL_SUBTYPES):
        file.seek(start)
        return
    at = max(0, start - _PREROLL)
    if at:
        file.seek(at)
    while at < start:
        got = len(read_frames(file, min(start - at, BLOCK)))
        if got == 0:
            raise AudioError(f"ends at sample {at}")
        at += got
