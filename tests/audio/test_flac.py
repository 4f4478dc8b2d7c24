"""FLAC read whole goes through dr_flac (:class:`~mimi_extract.audio.decoders.DrFlacFile`, the
``miniaudio`` package), everything else about FLAC through libsndfile; the samples are the same
either way, and damage is an error either way.

Checked against two references written independently of the tool: libsndfile's whole-file decode
(``sf.read``) and FFmpeg's (PyAV's plain loop), on the real-shapes corpus's FLAC shapes
(tests/support/shapes.py: a 500 KB picture and 70 KB comment, 24-bit behind an ID3v2 tag) and on
8-, 16- and 24-bit files of 1, 2 and 6 channels at 16 and 48 kHz: bit for bit, read whole, as
segments (offset, duration, a seek) and as members of a tar shard.  Damage (a cut, zeroed or random
bytes, a flipped bit, a STREAMINFO total past the audio) is an error where libsndfile's is: dr_flac
alone returns the frames it could decode and skips the rest without a word, so these tests fail
without DrFlacFile's count check."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest
import soundfile as sf
from hypothesis import HealthCheck, given, settings, strategies as st

from support.shapes import ffmpeg_decode, shapes, signal
from mimi_extract.audio import decoders
from mimi_extract.audio.decoders import BLOCK, AudioError, DrFlacFile, open_decoder
from mimi_extract.audio.reader import AudioReader

FLAC_SHAPES = {s.name: s for s in shapes() if s.filename.endswith(".flac")}
# (subtype, channels, rate): every bit depth dr_flac is used for, mono to 5.1
VARIANTS = [("PCM_16", 1, 16_000), ("PCM_16", 2, 48_000), ("PCM_24", 1, 16_000), ("PCM_24", 6, 48_000),
            ("PCM_S8", 2, 16_000)]
SAMPLES = 2 * BLOCK + 9_999  # several of the reader's blocks and a partial one


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("flac")
    files = {}
    for name, shape in FLAC_SHAPES.items():
        shape.make(root / shape.filename)
        files[name] = root / shape.filename
    for subtype, channels, rate in VARIANTS:
        path = root / f"{subtype}-{channels}ch-{rate}.flac"
        sf.write(str(path), signal(rate, SAMPLES, channels, seed=channels), rate, subtype=subtype)
        files[path.stem] = path
    return files


def member(blob: bytes, name: str = "a.flac") -> io.BytesIO:
    """``blob`` as a source hands a member's bytes over: a named file-like object."""
    view = io.BytesIO(blob)
    view.name = name
    return view


def source_samples(source, start: int = 0, frames: int | None = None) -> tuple[np.ndarray, type]:
    """What the tool's reader decodes of ``source`` (a path, or bytes: a member) from ``start``
    (``frames`` of it, or to the end), every channel [samples, channels], and the decoder it used:
    AudioReader's own open, seek and block reads, one reader per channel."""
    columns, used = [], None
    channels = sf.info(source if isinstance(source, str) else io.BytesIO(source)).channels
    for c in range(channels):
        reader = AudioReader(source if isinstance(source, str) else member(source), c, start=start, frames=frames)
        used, parts, end = type(reader.file), [], False
        while not end:
            block, end = reader._decode_block()
            parts.append(block)
        reader.close()
        columns.append(np.concatenate(parts))
    return np.stack(columns, 1), used


def libsndfile_whole(path) -> np.ndarray:
    return sf.read(str(path), dtype="float32", always_2d=True)[0]


@pytest.mark.parametrize("name", list(FLAC_SHAPES) + [f"{s}-{c}ch-{r}" for s, c, r in VARIANTS])
def test_whole_and_segment_reads_equal_libsndfile_and_ffmpeg(corpus, name):
    """Read whole: dr_flac, bit for bit libsndfile's and FFmpeg's whole decode, from a path and from
    a file-like object (a member's bytes); a segment (from an offset, or from 0 short of the end):
    libsndfile, bit for bit the same whole decode's samples there."""
    path = corpus[name]
    ref = libsndfile_whole(path)
    assert np.array_equal(ffmpeg_decode(path), ref)  # the two references agree
    got, used = source_samples(str(path))
    assert used is DrFlacFile and got.shape == ref.shape and np.array_equal(got, ref)
    got, used = source_samples(path.read_bytes())
    assert used is DrFlacFile and np.array_equal(got, ref)
    total = len(ref)
    for start, frames in ((total // 3, 20_000), (total // 2, None), (BLOCK + 1, total - BLOCK - 1), (0, total - 1)):
        got, used = source_samples(str(path), start, frames)
        want = ref[start: None if frames is None else start + frames]
        assert used is sf.SoundFile and np.array_equal(got, want), (start, frames)
    got, used = source_samples(str(path), 0, total)  # an item's frames are the probe's: the whole file
    assert used is DrFlacFile and np.array_equal(got, ref)


def test_int16_reads_are_libsndfiles(corpus):
    """The device path's int16 transport (16-bit files): dr_flac's int16 is libsndfile's; a 24-bit
    file has none."""
    path = corpus["PCM_16-2ch-48000"]
    f = open_decoder(str(path), span=(0, None))
    assert isinstance(f, DrFlacFile) and f.subtype == "PCM_16"
    got = np.concatenate([f.read(BLOCK, dtype="int16") for _ in range(SAMPLES // BLOCK + 1)])
    f.close()
    assert np.array_equal(got, sf.read(str(path), dtype="int16", always_2d=True)[0])
    f = open_decoder(str(corpus["PCM_24-1ch-16000"]), span=(0, None))
    with pytest.raises(ValueError):
        f.read(10, dtype="int16")
    f.close()


def test_tar_members_read_whole_by_dr_flac(corpus, tmp_path):
    """A member of a tar shard, decoded in place from the shard (the tar source's own file view)."""
    from mimi_extract.sources.tar import open_member

    shard = tmp_path / "flac-000000.tar"
    with tarfile.open(shard, "w") as tf:
        for name, path in corpus.items():
            tf.add(path, f"{name}.flac")
    with tarfile.open(shard) as tf:
        members = tf.getmembers()
    for member in members:
        ref = libsndfile_whole(corpus[member.name[:-5]])
        view = open_member(str(shard), member.offset_data, member.size, member.name)
        f = open_decoder(view, member.name, span=(0, None))
        assert isinstance(f, DrFlacFile), member.name
        got = f.read(len(ref) + 1)
        f.close()
        view.close()
        assert np.array_equal(got, ref), member.name


def test_libsndfile_keeps_what_dr_flac_is_not_measured_for(corpus, tmp_path, monkeypatch):
    """An unknown total (STREAMINFO says 0), a header probe, a member over DRFLAC_IN_MEMORY, bytes
    that are not FLAC: libsndfile, as before."""
    data = bytearray(corpus["PCM_16-1ch-16000"].read_bytes())
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0  # STREAMINFO first: its total is bytes 21..25's low 36 bits
    data[21] &= 0xF0
    data[22:26] = bytes(4)
    unknown = tmp_path / "unknown-total.flac"
    unknown.write_bytes(bytes(data))
    f = open_decoder(str(unknown), span=(0, None))
    assert isinstance(f, sf.SoundFile)
    f.close()
    path = str(corpus["PCM_16-1ch-16000"])
    f = open_decoder(path)  # a probe
    assert isinstance(f, sf.SoundFile)
    f.close()
    monkeypatch.setattr(decoders, "DRFLAC_IN_MEMORY", 1000)
    f = open_decoder(member(corpus["PCM_16-1ch-16000"].read_bytes()), span=(0, None))
    assert isinstance(f, sf.SoundFile)
    f.close()
    garbage = tmp_path / "garbage.flac"
    garbage.write_bytes(b"not a flac file at all" * 100)
    with pytest.raises(AudioError, match="Format not recognised"):  # libsndfile's words
        open_decoder(str(garbage), span=(0, None))


@pytest.mark.parametrize("field", ["maximum block size 0", "maximum block size 2,048", "8 bits per sample"])
def test_a_streaminfo_the_frames_contradict_is_read_as_libsndfile_reads_it(corpus, field):
    """A STREAMINFO whose maximum block size (4,096 here) or bit depth (16) the frames contradict:
    dr_flac decodes no sample where libsndfile may decode by the frames' own headers (found by the
    hypothesis test below: SMALL's samples, unchanged); open_whole's first sample sees it and leaves
    the file to libsndfile, whose outcome it then is (this file: its samples with the bit depth
    changed, an error for the block sizes, in the reader's block reads)."""
    for data in (bytearray(corpus["PCM_16-1ch-16000"].read_bytes()), bytearray(SMALL)):
        if field.startswith("maximum"):
            data[10:12] = (0 if field.endswith(" 0") else 2048).to_bytes(2, "big")  # STREAMINFO's bytes 2..3
        else:
            data[21] ^= 0x80  # bits per sample - 1: 15 -> 7
        f = open_decoder(member(bytes(data)), span=(0, None))
        f.close()
        assert isinstance(f, sf.SoundFile)
        want, got = _outcome(_libsndfile, bytes(data)), _outcome(_tool, bytes(data))
        assert got == want if isinstance(want, str) else np.array_equal(got, want)
    assert not isinstance(_outcome(_libsndfile, bytes(data)), str)  # (SMALL: libsndfile decodes each)


def test_damaged_metadata_with_every_frame_intact_decodes(corpus):
    """STREAMINFO's "last metadata block" flag cleared (the blocks after it read from the audio's
    bytes): libsndfile refuses the file ("Internal psf_fseek() failed"), dr_flac finds the frames by
    their sync codes, every one passes its CRC and the count is STREAMINFO's: the tool reads the
    file's own samples (the one difference from libsndfile the hypothesis test allows)."""
    data = bytearray(corpus["PCM_16-1ch-16000"].read_bytes())
    ref = libsndfile_whole(corpus["PCM_16-1ch-16000"])
    assert data[4] & 0x80 == 0  # (a VORBIS_COMMENT block follows)
    data[4] |= 0x80
    with pytest.raises(Exception):  # noqa: B017
        libsndfile_whole_bytes = sf.read(io.BytesIO(bytes(data)), dtype="float32", always_2d=True)[0]
        assert not np.array_equal(libsndfile_whole_bytes, ref)  # (where it decodes, it is not the audio)
    got, used = source_samples(bytes(data))
    assert used is DrFlacFile and np.array_equal(got, ref)


def damaged(data: bytes) -> dict[str, bytes]:
    """The damage the tests inflict: cut in half, 1,000 bytes zeroed, one bit flipped in the audio,
    cut where a frame starts, STREAMINFO's total past the audio."""
    middle = len(data) // 2
    flipped = bytearray(data)
    flipped[middle] ^= 0x10
    frame = data.index(b"\xff\xf8", middle)  # a frame's sync code (or one inside a frame: a cut either way)
    more = bytearray(data)
    total = int.from_bytes(more[21:26], "big") & ((1 << 36) - 1)
    more[21:26] = ((int.from_bytes(more[21:26], "big") & ~((1 << 36) - 1)) | (total + 5_000)).to_bytes(5, "big")
    return {"cut in half": data[:middle], "1,000 bytes zeroed": data[:middle] + bytes(1000) + data[middle + 1000:],
            "one bit flipped": bytes(flipped), "cut at a frame": data[:frame], "total past the audio": bytes(more)}


@pytest.mark.parametrize("damage", ["cut in half", "1,000 bytes zeroed", "one bit flipped", "cut at a frame",
                                    "total past the audio"])
def test_damaged_flac_is_an_error_as_libsndfiles(corpus, tmp_path, damage):
    """libsndfile raises on each; dr_flac alone returns what it decoded (half the samples, or every
    sample after a skipped frame a frame early): the reader raises AudioError, naming the count."""
    blob = damaged(corpus["PCM_16-2ch-48000"].read_bytes())[damage]
    path = tmp_path / "damaged.flac"
    path.write_bytes(blob)
    with pytest.raises(Exception):  # noqa: B017 -- libsndfile's own errors (LibsndfileError, "lost sync")
        libsndfile_whole(path)
    with pytest.raises(AudioError, match="STREAMINFO header states"):
        source_samples(str(path))
    with pytest.raises(AudioError, match="STREAMINFO header states"):
        source_samples(blob)


def test_frames_past_the_stated_total_are_not_read(corpus, tmp_path):
    """A stream with more frames than STREAMINFO states (a smaller total; two streams' frames
    concatenated): libsndfile stops at the total, and so does the reader."""
    data = corpus["PCM_16-1ch-16000"].read_bytes()
    twice = tmp_path / "frames-appended.flac"
    twice.write_bytes(data + data[data.index(b"\xff\xf8"):])
    ref = libsndfile_whole(twice)
    assert len(ref) == SAMPLES
    got, used = source_samples(str(twice))
    assert used is DrFlacFile and np.array_equal(got, ref)


def test_damaged_flacs_are_error_rows_end_to_end(corpus, tmp_path, tiny_model_dir):
    """Through the CLI: the damaged files are error rows, the intact one an ok row."""
    from support import cli

    from mimi_extract import read_manifest

    folder = tmp_path / "in"
    folder.mkdir()
    data = corpus["PCM_16-1ch-16000"].read_bytes()
    (folder / "intact.flac").write_bytes(data)
    for i, blob in enumerate(damaged(data).values()):
        (folder / f"damaged{i}.flac").write_bytes(blob)
    out = tmp_path / "out"
    result = cli("codes", folder, out, "--model", tiny_model_dir, "-q", 4, "--device", "cpu", "--cpu-workers", 1)
    assert result.exit_code == 0, result.output
    rows = {r["key"]: r for r in read_manifest(out)}
    assert rows.pop("intact.flac")["status"] == "ok"
    assert len(rows) == 5 and all(r["status"] == "error" for r in rows.values()), rows


def _outcome(read, blob: bytes):
    try:
        return read(blob)
    except Exception:  # noqa: BLE001 -- any error: an error row
        return "error"


def _libsndfile(blob: bytes) -> np.ndarray:
    parts = []
    with sf.SoundFile(io.BytesIO(blob)) as f:
        while len(block := f.read(BLOCK, dtype="float32", always_2d=True)):
            parts.append(block)
    return np.concatenate(parts)


def _tool(blob: bytes) -> np.ndarray:
    f, parts = open_decoder(member(blob), span=(0, None)), []
    try:
        while len(block := f.read(BLOCK, dtype="float32", always_2d=True)):  # (as the reader reads either decoder)
            parts.append(block)
    finally:
        f.close()
    return np.concatenate(parts)


_SMALL = io.BytesIO()
with sf.SoundFile(_SMALL, "w", 16_000, 1, format="FLAC", subtype="PCM_16") as _f:  # 8 frames of 4,096
    _f.title = "a title in a VORBIS_COMMENT block"
    _f.write(signal(16_000, 8 * 4096 - 1234, 1, seed=3))
SMALL = _SMALL.getvalue()
AUDIO_AT = SMALL.index(b"\xff\xf8")  # the first frame's sync code: metadata blocks before it
SMALL_SAMPLES = sf.read(io.BytesIO(SMALL), dtype="float32", always_2d=True)[0]


@given(op=st.sampled_from(["zero", "random", "flip", "cut"]), where=st.floats(0, 1), size=st.integers(1, 3000),
       head=st.booleans(), data=st.data())
@settings(deadline=None, suppress_health_check=list(HealthCheck))  # examples: the profile's (conftest.py)
def test_any_damage_ends_as_libsndfiles(op, where, size, head, data):
    """Any damage -- a byte range zeroed or randomised, a bit flipped, a cut, anywhere or in the
    metadata blocks (``head``) -- gives the tool's FLAC read libsndfile's samples where libsndfile
    decodes the file, and an error where it fails, with one exception: damage confined to the
    metadata blocks, every audio frame intact, which libsndfile may refuse ("Internal psf_fseek()
    failed" for a STREAMINFO minimum block size or MD5 zeroed, a VORBIS_COMMENT header zeroed) and
    dr_flac reads past.  The tool's read is then the file's own samples, in place, up to the total
    STREAMINFO states (fewer where the damage lowered it, as libsndfile reads a lowered total):
    never a sample that is not in the file where it was.  (A file libsndfile cannot open is its
    probe's error row, never read.)"""
    blob = bytearray(SMALL)
    at = int(where * (200 if head else len(blob) - 1))
    end = at + 1 if op == "flip" else len(blob) if op == "cut" else at + size
    if op == "zero":
        blob[at: at + size] = bytes(len(blob[at: at + size]))
    elif op == "random":
        blob[at: at + size] = data.draw(st.binary(min_size=len(blob[at: at + size]), max_size=len(blob[at: at + size])))
    elif op == "flip":
        blob[at] ^= 1 << (size % 8)
    else:
        del blob[at:]
    blob = bytes(blob)
    try:
        sf.info(io.BytesIO(blob))
    except Exception:  # noqa: BLE001
        return
    want, got = _outcome(_libsndfile, blob), _outcome(_tool, blob)
    if not isinstance(want, str):
        assert not isinstance(got, str) and got.shape == want.shape and np.array_equal(got, want)
    elif not isinstance(got, str):
        assert end <= AUDIO_AT, (op, at, end)  # libsndfile refused, dr_flac decoded: the frames were spared
        assert np.array_equal(got, SMALL_SAMPLES[: len(got)])
