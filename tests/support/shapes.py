"""The shapes corpora really ship, generated here (no downloads), for tests/audio/test_real_shapes.py
and scripts/real_shapes.py (the table in docs/inputs.md).

MP3 of every MPEG version and rate class (8-48 kHz), mono and joint stereo, CBR/VBR/ABR, with a
Xing, Info or VBRI length header or none, with and without the LAME gapless tag; ID3v2.2/2.3/2.4 tags
from 10 bytes to 500 KB (cover art, unsynchronisation, extended header, footer, two tags stacked),
ID3v1, APEv2 (text, or a binary cover with no ID3v1 after it) and an appended ID3v2.4 tag (cover,
footer) at the end, junk between the tag and the first frame; M4A with its gapless edit list
and cover art; Ogg Opus/Vorbis and FLAC with large picture and comment blocks, FLAC behind an ID3v2
tag; WAV with LIST/bext/iXML chunks (before and after the data), WAVE_FORMAT_EXTENSIBLE, 24-bit
and float.  Audio is encoded by FFmpeg's encoders (PyAV) or libsndfile; the tags and chunks the
encoders do not write are built here byte by byte, and every built ID3v2 tag is read back by
mutagen (a well-kept parser) before it is used, so a fixture cannot be malformed by accident.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import av
import numpy as np
import soundfile as sf


@dataclass(frozen=True)
class Shape:
    """One file shape: ``name`` (the table's row), ``filename``, how to ``make`` it at a path, and
    whether FFmpeg itself fails on it (``ffmpeg_fails``: the only shapes allowed to be error rows).
    ``audio``: for a file with tags appended (APEv2, ID3v2 at the end), its bytes without them, as a
    well-kept parser (mutagen) or the fixture itself strips them: what the reference decodes, and
    then libsndfile's length is checked too; None: the whole file."""

    name: str
    filename: str
    make: Callable[[Path], None]
    ffmpeg_fails: bool = False
    audio: Callable[[Path], bytes] | None = None


def reference_file(shape: Shape, path: Path, folder: Path) -> Path:
    """The file FFmpeg's reference decode reads: ``path`` itself, or its audio alone (``shape.audio``)
    written into ``folder`` (not the corpus: it would be an input)."""
    if shape.audio is None:
        return path
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / path.name
    out.write_bytes(shape.audio(path))
    return out


def signal(rate: int, n: int, channels: int, seed: int) -> np.ndarray:
    """Sines under slow envelopes plus noise bursts, [n, channels] float32 (varied enough for VBR)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate
    x = np.zeros((n, channels))
    for c in range(channels):
        for _ in range(6):
            env = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(0.2, 3) * t + rng.uniform(0, 6))
            x[:, c] += rng.uniform(0.03, 0.1) * env * np.sin(2 * np.pi * rng.uniform(60, rate / 2.5) * t)
        x[:, c] += 0.04 * rng.standard_normal(n) * (0.5 + 0.5 * np.sin(2 * np.pi * 0.9 * t)) ** 4
    return x.astype(np.float32)


def ffmpeg_decode(path) -> np.ndarray:
    """FFmpeg's whole decode through PyAV's plain loop, float32 [samples, channels]."""
    parts = []
    with av.open(str(path)) as f:
        for frame in f.decode(audio=0):
            data = frame.to_ndarray()
            channels = len(frame.layout.channels)
            data = data if frame.format.is_planar else data.reshape(-1, channels).T
            scale = {np.dtype(np.int16): 2.0 ** -15, np.dtype(np.int32): 2.0 ** -31}.get(data.dtype, 1.0)
            parts.append((data * scale).astype(np.float32).T)
    return np.concatenate(parts)


# -- MP3 through FFmpeg's libmp3lame ---------------------------------------------------------
def lame(rate: int, channels: int, mode: str, seconds: float, *, xing: bool = True, seed: int = 0) -> bytes:
    """An MP3 stream (no tag): ``mode`` "cbr", "vbr" (-V 5) or "abr"; ``xing``: the Xing/Info frame
    with FFmpeg's LAME tag (Info for CBR), or no length header at all."""
    import io

    layout = "mono" if channels == 1 else "stereo"
    buffer = io.BytesIO()
    options = {"id3v2_version": "0", "write_xing": "1" if xing else "0"}
    with av.open(buffer, "w", format="mp3", options=options) as out:
        stream = out.add_stream("libmp3lame", rate=rate, layout=layout)
        low = rate < 32_000
        if mode == "vbr":
            stream.codec_context.qscale = True
            stream.codec_context.global_quality = 5 * 118  # FF_QP2LAMBDA: -V 5
        else:
            stream.codec_context.bit_rate = (32_000 if low else 96_000) * channels
            if mode == "abr":
                stream.codec_context.options = {"abr": "1"}
        data = signal(rate, int(seconds * rate), channels, seed)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(data.T), format="fltp", layout=layout)
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buffer.getvalue()


_KBPS = {(True, 3): (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
         (False, 3): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)}
_RATES = {3: (44_100, 48_000, 32_000), 2: (22_050, 24_000, 16_000), 0: (11_025, 12_000, 8_000)}


def frame_length(header: bytes) -> int:
    """Bytes of the layer III frame whose 4-byte header is ``header`` (for building fixtures only)."""
    version, index, rate, pad = (header[1] >> 3) & 3, header[2] >> 4, (header[2] >> 2) & 3, (header[2] >> 1) & 1
    kbps, hz = _KBPS[(version == 3, 3)][index - 1], _RATES[version][rate]
    return (144_000 if version == 3 else 72_000) * kbps // hz + pad


def frames_of(stream: bytes) -> list[bytes]:
    """A tagless, headerless MP3 stream cut into its frames (for building fixtures only)."""
    out, i = [], 0
    while i + 4 <= len(stream):
        assert stream[i] == 0xFF and stream[i + 1] & 0xE0 == 0xE0, i
        n = frame_length(stream[i:i + 4])
        out.append(stream[i:i + n])
        i += n
    return out


def with_vbri(stream: bytes) -> bytes:
    """A headerless VBR stream behind a VBRI frame (Fraunhofer's length header, 32 bytes after the
    frame header), as FhG encoders write it."""
    frames = frames_of(stream)
    first = frames[0]
    body = bytearray(len(first))
    body[:4] = first[:4]
    toc = b""
    vbri = b"VBRI" + struct.pack(">HHHIIHHHH", 1, 0x0480, 75, len(stream) + len(first), len(frames), 0, 1, 2, 1) + toc
    body[36:36 + len(vbri)] = vbri
    return bytes(body) + stream


def without_lame_tag(stream: bytes) -> bytes:
    """The Xing frame with its LAME tag (encoder delay and padding: the gapless info) blanked: the
    frame count stays, the decoder trims nothing."""
    data = bytearray(stream)
    for tag in (b"LAME", b"Lavc", b"Lavf"):
        at = data.find(tag, 0, 2000)
        if at != -1:
            data[at:at + 36] = bytes(36)
    return bytes(data)


# -- tags, built byte by byte, checked by mutagen ----------------------------------------------
def syncsafe(n: int) -> bytes:
    return bytes([(n >> 21) & 0x7F, (n >> 14) & 0x7F, (n >> 7) & 0x7F, n & 0x7F])


def cover(size: int, seed: int = 7) -> bytes:
    """A JPEG-looking picture: random bytes, so full of 0xFF 0xEx pairs (false MPEG sync words)."""
    return b"\xff\xd8\xff\xe0" + np.random.default_rng(seed).integers(0, 256, max(0, size - 4), np.uint8).tobytes()


def unsynchronise(data: bytes) -> bytes:
    """ID3v2's unsynchronisation: 0x00 after every 0xFF that precedes 0xE0-0xFF or 0x00 (or ends)."""
    out = bytearray()
    for i, b in enumerate(data):
        out.append(b)
        if b == 0xFF and (i + 1 == len(data) or data[i + 1] >= 0xE0 or data[i + 1] == 0):
            out.append(0)
    return bytes(out)


def id3v2(version: int, *, title: str = "a title", picture: int = 0, padding: int = 0, unsync: bool = False,
          extended: bool = False, footer: bool = False) -> bytes:
    """An ID3v2.``version`` tag (2, 3 or 4) with a title, an optional cover of ``picture`` bytes,
    ``padding`` zero bytes; ``unsync`` (v2.3: the whole tag), an ``extended`` header, a ``footer`` (v2.4)."""
    text = b"\x03" + title.encode() if version == 4 else b"\x00" + title.encode("latin-1")
    frames = []
    if version == 2:
        frames.append(b"TT2" + len(text).to_bytes(3, "big") + text)
        if picture:
            pic = b"\x00JPG\x03cover\x00" + cover(picture)
            frames.append(b"PIC" + len(pic).to_bytes(3, "big") + pic)
    else:
        size = syncsafe if version == 4 else (lambda n: n.to_bytes(4, "big"))
        frames.append(b"TIT2" + size(len(text)) + b"\x00\x00" + text)
        if picture:
            pic = b"\x00image/jpeg\x00\x03cover\x00" + cover(picture)
            frames.append(b"APIC" + size(len(pic)) + b"\x00\x00" + pic)
    body = b"".join(frames)
    flags = 0
    if extended:
        flags |= 0x40
        body = (b"\x00\x00\x00\x06\x00\x00\x00\x00\x00\x00" if version == 3 else syncsafe(6) + b"\x01\x00") + body
    if unsync:
        assert version == 3
        flags |= 0x80
        body = unsynchronise(body)
    if footer:
        assert version == 4 and not padding
        flags |= 0x10
    body += bytes(padding)
    head = bytes([version, 0, flags]) + syncsafe(len(body))
    return b"ID3" + head + body + (b"3DI" + head if footer else b"")


def id3v1() -> bytes:
    return b"TAG" + b"a title".ljust(30, b"\0") + b"an artist".ljust(30, b"\0") + bytes(30 + 4 + 30) + b"\x0c"


def apev2(path: Path, cover_size: int = 0) -> None:
    """An APEv2 tag appended by mutagen (after any ID3v1 it moves behind); ``cover_size``: with a
    binary item of that many bytes of cover art, as foobar2000 writes it (``Cover Art (Front)``:
    the file name, a NUL, the picture), else a 3,000-character text comment."""
    from mutagen.apev2 import BINARY, APEv2, APEValue

    tag = APEv2()
    tag["Title"] = "a title"
    if cover_size:
        tag["Cover Art (Front)"] = APEValue(b"cover.jpg\x00" + cover(cover_size), BINARY)
    else:
        tag["Comment"] = "x" * 3000
    tag.save(str(path))


def without_apev2(path: Path) -> bytes:
    """The file's bytes with its APEv2 tag removed by mutagen (a copy; any ID3v1 stays)."""
    import shutil
    import tempfile

    from mutagen.apev2 import delete

    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / path.name
        shutil.copyfile(path, copy)
        delete(str(copy))
        return copy.read_bytes()


def check_id3(path: Path, title: str | None = "a title") -> None:
    """The fixture's ID3v2 tag as mutagen reads it: the title is there (the tag is well formed);
    ``title`` None: an empty tag, no frames."""
    from mutagen.id3 import ID3

    tag = ID3(str(path))
    got = tag.get("TIT2") or tag.get("TT2")
    assert (str(got) == title) if title is not None else not tag, (path, tag.pprint()[:200])


def mp3(name: str, rate: int, channels: int, mode: str, seconds: float = 3.0, *, xing: bool = True, tag: bytes = b"",
        junk: bytes = b"", tail: bytes = b"", vbri: bool = False, lame_tag: bool = True, ape: bool = False,
        ape_cover: int = 0, fails: bool = False, seed: int = 0) -> Shape:
    """An MP3 shape: ``tag`` + ``junk`` + the stream + ``tail``, then an APEv2 tag (``ape``, with a
    binary cover of ``ape_cover`` bytes).  A file with tags appended (APEv2, an ID3v2 ``tail``) is
    decoded by the reference without them (``Shape.audio``)."""
    def make(path: Path) -> None:
        stream = lame(rate, channels, mode, seconds, xing=xing and not vbri, seed=seed)
        if vbri:
            stream = with_vbri(stream)
        if not lame_tag:
            stream = without_lame_tag(stream)
        path.write_bytes(tag + junk + stream + tail)
        if tag.startswith(b"ID3"):
            check_id3(path, "a title" if len(tag) > 10 else None)
        if tail.startswith(b"ID3"):  # (mutagen reads no tag at the end: the same bytes in front)
            front = path.with_name(path.name + ".front")
            front.write_bytes(tail + stream)
            check_id3(front)
            front.unlink()
        if ape:
            apev2(path, ape_cover)
    audio = None
    if ape:
        audio = without_apev2
    elif tail.startswith(b"ID3"):
        audio = lambda path: path.read_bytes()[:-len(tail)]  # noqa: E731
    return Shape(name, f"{name}.mp3", make, fails, audio)


# -- other containers ------------------------------------------------------------------------
def soundfile_shape(name: str, ext: str, rate: int, channels: int, seconds: float, after=None, seed: int = 0,
                    **write) -> Shape:
    def make(path: Path) -> None:
        sf.write(str(path), signal(rate, int(seconds * rate), channels, seed), rate, **write)
        if after is not None:
            after(path)
    return Shape(name, f"{name}.{ext}", make)


def flac_picture(size: int):
    def add(path: Path) -> None:
        from mutagen.flac import FLAC, Picture

        f = FLAC(str(path))
        picture = Picture()
        picture.type, picture.mime, picture.data = 3, "image/jpeg", cover(size)
        f.add_picture(picture)
        f["DESCRIPTION"] = "y" * 70_000
        f.save()
    return add


def ogg_picture(size: int):
    def add(path: Path) -> None:
        import base64

        from mutagen import File
        from mutagen.flac import Picture

        f = File(str(path))
        picture = Picture()
        picture.type, picture.mime, picture.data = 3, "image/jpeg", cover(size)
        f["METADATA_BLOCK_PICTURE"] = [base64.b64encode(picture.write()).decode("ascii")]
        f["DESCRIPTION"] = "z" * 70_000
        f.save()
    return add


def id3_in_front(path: Path) -> None:
    path.write_bytes(id3v2(3, picture=20_000) + path.read_bytes())
    check_id3(path)


def riff_chunks(path: Path) -> None:
    """LIST/INFO, bext and an odd-sized iXML chunk between fmt and data, a LIST after the data."""
    data = path.read_bytes()
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    chunks, i = [], 12
    while i + 8 <= len(data):
        cid, size = data[i:i + 4], struct.unpack("<I", data[i + 4:i + 8])[0]
        chunks.append((cid, data[i + 8:i + 8 + size]))
        i += 8 + size + (size & 1)

    def chunk(cid: bytes, body: bytes) -> bytes:
        return cid + struct.pack("<I", len(body)) + body + (b"\0" if len(body) & 1 else b"")
    info = b"INFO" + chunk(b"INAM", b"a title\0") + chunk(b"IART", b"an artist\0")
    bext = b"a description".ljust(256, b"\0") + b"originator".ljust(32, b"\0") + bytes(32 + 10 + 8 + 8 + 2 + 64 + 190)
    extra = chunk(b"LIST", info) + chunk(b"bext", bext) + chunk(b"iXML", b"<BWFXML><a>odd</a></BWFXML>!")
    body = b"".join(chunk(c, b) + (extra if c == b"fmt " else b"") for c, b in chunks) + chunk(b"LIST", info)
    path.write_bytes(b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WAVE" + body)


def m4a(name: str, rate: int, channels: int, seconds: float, cover_size: int = 0) -> Shape:
    def make(path: Path) -> None:
        layout = "mono" if channels == 1 else "stereo"
        with av.open(str(path), "w", format="ipod") as out:  # .m4a: FFmpeg's ipod muxer (edit list: gapless)
            stream = out.add_stream("aac", rate=rate, layout=layout)
            data = signal(rate, int(seconds * rate), channels, 3)
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(data.T), format="fltp", layout=layout)
            frame.sample_rate = rate
            for packet in [*stream.encode(frame), *stream.encode(None)]:
                out.mux(packet)
        if cover_size:
            from mutagen.mp4 import MP4, MP4Cover

            f = MP4(str(path))
            f["\xa9nam"] = "a title"
            f["covr"] = [MP4Cover(cover(cover_size), MP4Cover.FORMAT_JPEG)]
            f.save()
    return Shape(name, f"{name}.m4a", make)


def raw(name: str, filename: str, data: bytes, fails: bool = True) -> Shape:
    def make(path: Path) -> None:
        path.write_bytes(data)
    return Shape(name, filename, make, fails)


def shapes() -> list[Shape]:
    """Every shape, in the table's order."""
    return [
        # MPEG versions and rate classes, mono / joint stereo, CBR / VBR / ABR
        mp3("mpeg1-44k-stereo-cbr-info", 44_100, 2, "cbr"),
        mp3("mpeg1-48k-mono-vbr-xing", 48_000, 1, "vbr"),
        mp3("mpeg1-32k-stereo-abr-xing", 32_000, 2, "abr"),
        mp3("mpeg2-24k-mono-vbr-xing", 24_000, 1, "vbr"),
        mp3("mpeg2-22k-stereo-cbr-info", 22_050, 2, "cbr"),
        mp3("mpeg2-16k-mono-cbr-info", 16_000, 1, "cbr"),
        mp3("mpeg25-12k-mono-vbr-xing", 12_000, 1, "vbr"),
        mp3("mpeg25-11k-stereo-cbr-info", 11_025, 2, "cbr"),
        mp3("mpeg25-8k-mono-cbr-info", 8_000, 1, "cbr"),
        # length headers
        mp3("vbr-no-length-header", 44_100, 2, "vbr", xing=False),
        mp3("cbr-no-length-header", 16_000, 1, "cbr", xing=False),
        mp3("vbr-vbri-header", 44_100, 2, "vbr", vbri=True),
        mp3("vbr-xing-without-lame-tag", 48_000, 2, "vbr", lame_tag=False),
        # ID3v2 in front: versions, sizes, cover art, unsynchronisation, extended header, footer
        mp3("id3v23-300b-issue-repro", 44_100, 1, "cbr", tag=id3v2(3, padding=270)),
        mp3("id3v22-cover-40k", 22_050, 1, "vbr", tag=id3v2(2, picture=40_000)),
        mp3("id3v23-cover-500k", 44_100, 2, "vbr", seconds=6.0, tag=id3v2(3, picture=500_000, padding=1024)),
        mp3("id3v24-cover-100k-footer", 48_000, 2, "cbr", tag=id3v2(4, picture=100_000, footer=True)),
        mp3("id3v23-unsync-cover", 44_100, 2, "cbr", tag=id3v2(3, picture=30_000, unsync=True)),
        mp3("id3v23-extended-header", 24_000, 1, "cbr", tag=id3v2(3, extended=True, padding=200)),
        mp3("id3v24-extended-header", 32_000, 1, "vbr", tag=id3v2(4, extended=True, padding=300)),
        mp3("id3v24-empty-10-bytes", 44_100, 1, "cbr", tag=b"ID3\x04\x00\x00\x00\x00\x00\x00"),
        mp3("two-id3v2-tags-stacked", 44_100, 2, "vbr", tag=id3v2(3, picture=5_000) + id3v2(4, title="b")),
        # tags at the end, junk after the tag
        mp3("id3v1-at-end", 44_100, 2, "cbr", tag=id3v2(3), tail=id3v1()),
        mp3("apev2-and-id3v1-at-end", 48_000, 1, "vbr", tail=id3v1(), ape=True),
        mp3("apev2-binary-cover-at-end", 44_100, 2, "vbr", tag=id3v2(3), ape=True, ape_cover=3_000),
        mp3("id3v24-appended-cover-300k", 44_100, 1, "cbr", seconds=3.7, tail=id3v2(4, picture=300_000, footer=True),
            seed=1),
        mp3("junk-between-tag-and-audio", 44_100, 2, "cbr", tag=id3v2(3, padding=100), junk=bytes(700) + b"junk" * 50),
        mp3("long-40s-podcast-cover", 44_100, 1, "cbr", seconds=40.0, tag=id3v2(3, picture=250_000)),
        # other containers
        m4a("m4a-aac-gapless-cover", 44_100, 2, 3.0, cover_size=200_000),
        m4a("m4a-aac-mono-16k", 16_000, 1, 2.5),
        soundfile_shape("ogg-opus-picture-300k", "opus", 48_000, 2, 3.0, ogg_picture(300_000), format="OGG",
                        subtype="OPUS"),
        soundfile_shape("ogg-vorbis-picture-300k", "ogg", 44_100, 2, 3.0, ogg_picture(300_000), format="OGG",
                        subtype="VORBIS"),
        soundfile_shape("flac-picture-500k-comment", "flac", 44_100, 2, 3.0, flac_picture(500_000), subtype="PCM_16"),
        soundfile_shape("flac-24bit-id3v2-in-front", "flac", 48_000, 1, 3.0, id3_in_front, subtype="PCM_24"),
        soundfile_shape("wav-list-bext-ixml-chunks", "wav", 16_000, 1, 3.0, riff_chunks, subtype="PCM_16"),
        soundfile_shape("wav-extensible-4ch-24bit", "wav", 48_000, 4, 2.0, format="WAVEX", subtype="PCM_24"),
        soundfile_shape("wav-float32", "wav", 22_050, 2, 2.0, subtype="FLOAT"),
        # what no decoder reads: error rows (FFmpeg fails too)
        raw("mp3-empty-file", "mp3-empty-file.mp3", b""),
        raw("mp3-tag-only-no-audio", "mp3-tag-only-no-audio.mp3", id3v2(3, picture=2_000)),
    ]
