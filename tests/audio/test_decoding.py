"""Decoding equals a whole-file decode, whatever way the tool reads: in 65,536-frame blocks, from a
segment's start, in chunks -- checked against one whole read by the same library and against
FFmpeg's own decode (PyAV's plain loop), for MP3 at every rate (CBR and VBR, with and without
Xing/LAME and ID3v2 headers) and for the other codecs.  (The wide corpus of tag and container
shapes is tests/audio/test_real_shapes.py.)

Tolerances are measured, not guessed: MP3 and Ogg Opus (FFmpeg, seeking through a pre-roll) equal
FFmpeg's whole decode exactly on the files here, Vorbis through libsndfile to 1.2e-7.  (Not everywhere:
a seek into 10-12 kbit/s wideband-SILK Opus lands on the right sample with values 1e-6-8e-6 off, the
decoder's state after the pre-roll, measured in review, 2026-12-08.)  The bugs these tests catch
were 0.03-0.3 off."""

import numpy as np
import pytest
import soundfile as sf
import torch

import av
from support.shapes import ffmpeg_decode
from support.waits import HANG_S
from mimi_extract.audio.decoders import BLOCK, seek_exact, decoder_for, open_decoder
from mimi_extract.audio.reader import AudioReader, load

SAMPLES = 4 * BLOCK + 12_345  # several blocks, and a partial one


def music(rate: int, n: int, seed: int = 0) -> np.ndarray:
    """Stereo sines with slow envelopes plus bursts of noise: varied enough for VBR to vary."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate
    x = np.zeros(n)
    for _ in range(12):
        env = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(0.1, 3) * t + rng.uniform(0, 6))
        x += rng.uniform(0.02, 0.08) * env * np.sin(2 * np.pi * rng.uniform(80, rate / 2.5) * t + rng.uniform(0, 6))
    x += 0.05 * rng.standard_normal(n) * (0.5 + 0.5 * np.sin(2 * np.pi * 0.7 * t)) ** 4
    return np.stack([x, 0.8 * x[::-1]], 1).astype(np.float32)


def write_mp3(path, rate: int, mode: str, headers: bool, n: int = SAMPLES) -> None:
    """An MP3 through FFmpeg's libmp3lame: ``mode`` "cbr32" (32 kbit/s: a deep bit reservoir, what
    a re-seek broke) or "vbr" (-V 7); ``headers``: a Xing/LAME frame and ID3v2 tags, or neither."""
    options = {} if headers else {"write_xing": "0", "id3v2_version": "0"}
    with av.open(str(path), "w", format="mp3", options=options) as out:
        stream = out.add_stream("libmp3lame", rate=rate, layout="stereo")
        if mode == "vbr":
            stream.codec_context.qscale = True
            stream.codec_context.global_quality = 7 * 118  # FF_QP2LAMBDA
        else:
            stream.codec_context.bit_rate = 32_000
        if headers:
            out.metadata["title"] = "a title for an ID3v2 tag"
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(music(rate, n, rate).T), format="fltp", layout="stereo")
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)


def whole(path) -> np.ndarray:
    """libsndfile's whole-file decode: one read from the start (no seek at all)."""
    with sf.SoundFile(str(path)) as f:
        return f.read(f.frames, dtype="float32", always_2d=True)


def tool_read(path, start: int = 0, frames: int | None = None) -> np.ndarray:
    """The source samples as AudioReader reads them: its decoder, its seek, its block size."""
    f = open_decoder(str(path))
    try:
        if start:
            seek_exact(f, start)
        parts = []
        while True:
            block = f.read(BLOCK, dtype="float32", always_2d=True)
            parts.append(block)
            if len(block) < BLOCK or (frames is not None and sum(map(len, parts)) >= frames):
                break
    finally:
        f.close()
    return np.concatenate(parts)[:frames]


def to_24k(stereo: np.ndarray, rate: int) -> torch.Tensor:
    import torchaudio.functional as taf

    mono = torch.from_numpy(stereo.mean(1, dtype=np.float32))
    return mono if rate == 24_000 else taf.resample(mono, rate, 24_000)


STARTS = (1, 30_001, BLOCK + 5, 150_001)  # inside the pre-roll, past it, at a block boundary


def check_reads(path, rate, ref, seek_tolerance):
    """Block reads, segment reads and AudioReader (whole, segments, chunks) against ``ref``."""
    got = tool_read(path)
    assert got.shape == ref.shape and np.array_equal(got, ref)  # every block, exactly
    for s in STARTS:
        seg = tool_read(path, s, 20_000)
        assert seg.shape == (20_000, ref.shape[1]) and np.abs(seg - ref[s: s + 20_000]).max() <= seek_tolerance, s
        x = load(str(path), start=s, frames=20_000)
        want = to_24k(ref[s: s + 20_000], rate)
        assert x.shape == want.shape and (x - want).abs().max() < 1e-5, s
    full = load(str(path))
    want = to_24k(ref, rate)
    assert full.shape == want.shape and (full - want).abs().max() < 1e-5
    reader, parts, final = AudioReader(str(path)), [], False
    while not final:
        piece, final = reader.next_chunk(1920 * 7)
        parts.append(piece)
    assert torch.equal(torch.cat(parts), full)


@pytest.mark.parametrize("rate", [16_000, 24_000, 44_100, 48_000])
@pytest.mark.parametrize("mode,headers", [("cbr32", True), ("cbr32", False), ("vbr", True)])
def test_mp3_reads_equal_whole_and_ffmpeg_decode(tmp_path, rate, mode, headers):
    """MP3 is decoded by FFmpeg: its length counted from the stream's tail, every block, every
    segment read through a seek and pre-roll, and every chunk equal FFmpeg's plain whole decode."""
    path = tmp_path / f"x{rate}.mp3"
    write_mp3(path, rate, mode, headers)
    ref = ffmpeg_decode(path)
    f = open_decoder(str(path))
    assert f.frames == len(ref)
    f.close()
    check_reads(path, rate, ref, 0.0)


@pytest.mark.parametrize("ext", [".mp3", ".opus"])
def test_a_length_is_counted_from_a_few_packets_at_the_tail(tmp_path, monkeypatch, ext):
    """Counting an MP3's or an Ogg Opus file's length (what planning does for every item) decodes
    its first two frames and only the last ``_COUNT_PACKETS`` packets, however long it is (it decoded
    the last 65,536 samples after a pre-roll seek: 57 MP3 frames, and ~100 Opus packets where the
    Ogg seek lands early), and still equals FFmpeg's whole decode."""
    from mimi_extract.audio import decoders

    path = tmp_path / f"long{ext}"
    if ext == ".mp3":
        write_mp3(path, 48_000, "vbr", True, n=48_000 * 20)
    else:
        sf.write(str(path), music(48_000, 48_000 * 20)[:, 0], 48_000, format="OGG", subtype="OPUS")
    ref = ffmpeg_decode(path)
    decoded = []
    plain = decoders.PyAVFile._decode

    def counted(self, packets):
        for frame in plain(self, packets):
            decoded.append(frame)
            yield frame

    monkeypatch.setattr(decoders.PyAVFile, "_decode", counted)
    f = open_decoder(str(path))
    decoded.clear()
    frames = f.frames
    f.close()
    assert frames == len(ref) and 3 <= len(decoded) <= 2 + decoders._COUNT_PACKETS, (frames, len(ref), len(decoded))


def test_a_low_bit_rate_opus_file_is_counted_and_sought_as_its_whole_decode(tmp_path):
    """At 8 kbit/s Opus codes speech with SILK, which FFmpeg's decoder resamples to 48 kHz with a
    24-sample delay: the second frame's time is 24 after the first one's end, and the 24 samples
    come back at the end in a frame stamped with the last packet's time.  Counted from the last
    frame's time the length was 768 short (an 8 kHz file) or 288 (48 kHz); a segment read through
    the pre-roll seek started 24 samples early (0.03-0.24 off).  Both equal FFmpeg's whole decode."""
    from support.shapes import signal

    path = tmp_path / "low.opus"
    with av.open(str(path), "w", format="ogg") as out:
        stream = out.add_stream("libopus", rate=48_000, layout="mono")
        stream.codec_context.bit_rate = 8_000
        data = signal(48_000, 422_000, 1, 3)
        packets = []
        for i in range(0, len(data), 960):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(data[i:i + 960].T), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 48_000, i
            packets += stream.encode(frame)
        for packet in [*packets, *stream.encode(None)]:
            out.mux(packet)
    ref = ffmpeg_decode(path)
    f = open_decoder(str(path))
    assert f.frames == len(ref), (f.frames, len(ref))
    f.close()
    for start in (140_000, len(ref) - 30_000):
        seg = tool_read(path, start, 20_000)
        assert np.abs(seg - ref[start: start + 20_000]).max() <= 1e-5, start


def test_vbr_mp3_without_xing_header_decodes_to_its_end(tmp_path):
    """libsndfile took the length of an MP3 without a Xing/VBRI header from libmpg123's estimate
    (file size / first frame's bit rate) and decoded no further: a VBR one lost 74 % (it was an
    error row).  FFmpeg decodes every frame: the item is whole, from a path and from a shard's member."""
    import io
    import tarfile

    from mimi_extract.sources import discover

    path = tmp_path / "in" / "v.mp3"
    path.parent.mkdir()
    write_mp3(path, 44_100, "vbr", headers=False)
    true = len(ffmpeg_decode(path))
    assert sf.info(str(path)).frames < true * 0.5  # what libsndfile would have kept
    (tmp_path / "tar").mkdir()
    with tarfile.open(tmp_path / "tar" / "s.tar", "w") as tf:
        tf.add(path, "v.mp3")
    for source in (tmp_path / "in", tmp_path / "tar" / "s.tar"):
        found = discover(str(source))
        assert not found.bad and [i.frames for i in found.items] == [true], source
    f = open_decoder(io.BytesIO(path.read_bytes()), "v.mp3")
    assert f.frames == true and np.array_equal(f.read(true + 1), ffmpeg_decode(path))
    f.close()


def write_other(path, kind: str, rate: int) -> None:
    data = music(rate, SAMPLES, rate)
    if kind == "m4a":
        with av.open(str(path), "w", format="mp4") as out:
            stream = out.add_stream("aac", rate=rate, layout="stereo")
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(data.T), format="fltp", layout="stereo")
            frame.sample_rate = rate
            for packet in [*stream.encode(frame), *stream.encode(None)]:
                out.mux(packet)
        return
    formats = {"flac": {"subtype": "PCM_16"}, "wav": {"subtype": "PCM_16"},
               "ogg": {"format": "OGG", "subtype": "VORBIS"}, "opus": {"format": "OGG", "subtype": "OPUS"}}
    sf.write(str(path), data, rate, **formats[kind])


# (kind, rate, |libsndfile or PyAVFile - FFmpeg| bound: measured 0 / 1.2e-7 (Vorbis) / 0 (PyAV itself: Opus, AAC))
@pytest.mark.parametrize("kind,rate,vs_ffmpeg", [("flac", 44_100, 0.0), ("wav", 16_000, 0.0), ("ogg", 48_000, 3e-7),
                                                 ("opus", 48_000, 0.0), ("m4a", 44_100, 0.0)])
def test_other_codecs_reads_equal_whole_and_ffmpeg_decode(tmp_path, kind, rate, vs_ffmpeg):
    path = tmp_path / f"x.{kind}"
    write_other(path, kind, rate)
    if decoder_for(path.name) == "pyav":  # PyAV's own path: one read of everything is its whole decode
        f = open_decoder(str(path))
        ref = f.read(f.frames)
        f.close()
    else:
        ref = whole(path)
    ff = ffmpeg_decode(path)
    assert ff.shape == ref.shape and np.abs(ff - ref).max() <= vs_ffmpeg
    check_reads(path, rate, ref, 0.0)


@pytest.mark.parametrize("stated", [16_000, 24_000, 48_000])
def test_ogg_opus_is_decoded_by_ffmpeg_at_48k_whatever_rate_its_header_states(tmp_path, stated):
    """``.opus`` goes through FFmpeg (2.2-2.6x libsndfile's libopus per core), at Opus's own 48 kHz
    (RFC 7845 5.1: the header's rate is the encoder input's, informational; libsndfile decoded at
    it): the reference is FFmpeg's whole decode, independent of the tool.  The length, counted from
    the stream's tail (Ogg granule positions), equals it; so does every block read, every segment
    (past the pre-roll too: the container seek) and the 24 kHz input -- from a path and from a
    file-like object (a tar member)."""
    import io

    path = tmp_path / "speech.opus"
    sf.write(str(path), music(stated, SAMPLES, stated)[:, :1], stated, format="OGG", subtype="OPUS")
    ref = ffmpeg_decode(path)
    assert decoder_for(path.name) == "pyav" and len(ref) == SAMPLES * 48_000 // stated
    for source in (str(path), io.BytesIO(path.read_bytes())):
        f = open_decoder(source, "speech.opus")
        assert (f.samplerate, f.channels, f.frames) == (48_000, 1, len(ref))
        f.close()
    check_reads(path, 48_000, ref, 0.0)
    for start in (2 * BLOCK + 1, len(ref) - 30_000):  # seeks through the container (past 2 pre-rolls)
        seg = tool_read(path, start, 20_000)
        assert np.array_equal(seg, ref[start: start + 20_000]), start


def test_mp3_44k_codes_equal_the_reference_from_ffmpegs_decode(tmp_path, tiny_model, tiny_model_dir):
    """End to end: what OUT stores for a 32 kbit/s 44.1 kHz MP3 is what MimiModel gives FFmpeg's
    whole-file decode of it, resampled by torchaudio (the tool's resampler equals it to 1e-6)."""
    from support import cli

    from mimi_extract import read

    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / "m.mp3"
    write_mp3(path, 44_100, "cbr32", True)
    out = tmp_path / "out"
    result = cli("codes", tmp_path / "in", out, "--model", tiny_model_dir, "--device", "cpu", "--cpu-workers", "1",
                 "--num-workers", "1", "--chunk-seconds", "3")
    assert result.exit_code == 0, result.output
    with torch.no_grad():
        ref = tiny_model.encode(to_24k(ffmpeg_decode(path), 44_100)[None, None], num_quantizers=8).audio_codes[0].T
    got = torch.from_numpy(read(out, "m.mp3").astype(np.int64))
    assert got.shape == ref.shape and torch.equal(got, ref)


# -- error rows: named by shard/member, grouped by reason -----------------------------------
def test_error_rows_name_the_member_and_info_groups_them(tmp_path, tiny_model_dir):
    """A garbage member's row names ``shard/member`` (soundfile wrote ``<_io.BytesIO object at
    0x...>``), and ``info`` groups equal reasons of tar, .tar.gz and list inputs (each was prefixed
    with its own location, so every row was a group of one)."""
    import io
    import json
    import tarfile

    from mimi_extract.audit.outputs import info_report
    from support import extract
    from mimi_extract.config.settings import Settings

    ok = io.BytesIO()
    sf.write(ok, np.zeros(2400, np.float32), 24_000, format="WAV")
    members = {"a.flac": b"fLaC garbage" * 10, "b.flac": b"fLaC garbage" * 11, "c.flac": b"fLaC garbage" * 12,
               "d.wav": b"RIFF garbage" * 10, "e.wav": b"RIFF garbage" * 11, "ok.wav": ok.getvalue()}
    inputs = {}
    for suffix, mode in ((".tar", "w"), (".tar.gz", "w:gz")):
        (tmp_path / suffix).mkdir()
        path = tmp_path / suffix / f"s-000000{suffix}"
        with tarfile.open(path, mode) as tf:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        inputs[suffix] = path
    (tmp_path / "list").mkdir()
    inputs["list"] = tmp_path / "list" / "files.jsonl"
    inputs["list"].write_text("".join(json.dumps(r) + "\n" for r in [{"path": ""}, {"path": ""}, {"id": "x", "path": ""}]))
    for kind, path in inputs.items():
        out = str(tmp_path / f"out{kind}")
        extract(str(path), out, Settings(model=tiny_model_dir, tap="codes", num_workers=1))
        report = info_report(out)
        if kind == "list":
            assert report["errors_by_reason"] == {"no path": 3}, report["errors_by_reason"]
            continue
        assert report["errors_by_reason"] == {
            "unreadable or corrupt audio header: Error opening '…': Error : unknown error in flac decoder.": 3,
            "unreadable or corrupt audio header: Error opening '…': Format not recognised.": 2}, report["errors_by_reason"]
        for failed in report["failed"]:
            assert "BytesIO" not in failed["reason"] and f"'s-000000{kind}/{failed['key'].rpartition('/')[2]}." in failed["reason"]


# -- decoder warnings: in the item's row, never on stderr ------------------------------------
def damaged_mp3(path) -> None:
    """A 32 kbit/s MP3 with 40 bytes flipped: FFmpeg cannot decode 4 of its packets."""
    write_mp3(path, 44_100, "cbr32", True, n=100_000)
    data = bytearray(path.read_bytes())
    rng = np.random.default_rng(1)
    for pos in rng.integers(len(data) // 4, len(data) * 3 // 4, 40):
        data[pos] ^= 0x5A
    path.write_bytes(bytes(data))


def test_decoder_warnings_are_the_readers_not_stderrs(tmp_path, capfd):
    path = tmp_path / "damaged.mp3"
    damaged_mp3(path)
    ref = ffmpeg_decode_tolerant(path)
    for start in (0, 30_000):  # read from the start, and after a seek
        reader = AudioReader(str(path), start=start)
        got = reader.read_all()
        assert reader.warnings == ("5 undecodable packet(s) replaced by silence (Invalid data found when processing "
                                   "input; a frame of 32000 Hz, 2 channel(s))")
        want = to_24k(ref[start:], 44_100)
        assert got.shape == want.shape and (got - want).abs().max() < 1e-5
    assert capfd.readouterr().err == ""  # nothing reached fd 2


def ffmpeg_decode_tolerant(path) -> np.ndarray:
    """FFmpeg's whole decode, packet by packet, an undecodable packet as silence of its duration
    (the timeline kept): the rule the tool follows, written independently of it."""
    parts = []
    with av.open(str(path)) as f:
        stream = f.streams.audio[0]
        rate, channels = stream.sample_rate, stream.channels  # (a damaged header can change the stream's)
        for packet in f.demux(stream):
            try:
                frames = packet.decode()
            except av.error.InvalidDataError:
                n = round(packet.duration * packet.time_base * rate)
                parts.append(np.zeros((n, channels), np.float32))
                continue
            for frame in frames:  # a damaged header read as another rate: silence of the frame's duration
                other = frame.sample_rate != rate
                n = round(frame.samples * rate / frame.sample_rate)
                parts.append(np.zeros((n, channels), np.float32) if other else frame.to_ndarray().T)
    return np.concatenate(parts).astype(np.float32)


@pytest.mark.slow
def test_decoder_warnings_go_into_the_manifest_row(tmp_path, tiny_model_dir):
    """A real run (its own process, stdout and stderr read): what the decoder said is in the damaged
    item's row, ``decoder_warnings``, and in the row of a file it cannot read at all (random bytes
    with MPEG sync words: its error, test_daily_use.py's test_failing_items_named_with_true_decoder_errors),
    and nowhere in the run's output; the clean item has none."""
    from support import cli_process, garbage_mp3

    from mimi_extract import read_manifest

    (tmp_path / "in").mkdir()
    damaged_mp3(tmp_path / "in" / "damaged.mp3")
    write_mp3(tmp_path / "in" / "clean.mp3", 44_100, "cbr32", True, n=50_000)
    garbage_mp3(tmp_path / "in" / "broken.mp3")
    out = tmp_path / "out"
    proc = cli_process("codes", tmp_path / "in", out, "--model", tiny_model_dir, "--device", "cpu",
                       "--cpu-workers", "1", "--num-workers", "2")
    output, _ = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0, output
    assert ("Invalid data" not in output and "undecodable" not in output and "mpg123" not in output
            and "mp3float" not in output), output  # the decoder's words are not in the log
    rows = {r["key"]: r for r in read_manifest(out)}
    assert rows["damaged.mp3"]["status"] == "ok" and "5 undecodable packet(s)" in rows["damaged.mp3"]["decoder_warnings"]
    assert rows["clean.mp3"]["status"] == "ok" and "decoder_warnings" not in rows["clean.mp3"]
    assert rows["broken.mp3"]["error"].startswith("unreadable or corrupt audio header: "), rows["broken.mp3"]


@pytest.mark.slow
def test_split_24k_mp3_equals_its_single_item_reference(tmp_path, tiny_model, tiny_model_dir):
    """A 24 kHz MP3 long enough to be split: its pieces used to seek straight to their start (0.2
    off after a re-seek into a 32 kbit/s file); they now decode from the recording's start, so the
    stored codes are MimiModel's on FFmpeg's whole decode."""
    from support import cli
    from mimi_extract import read
    from mimi_extract.codec.reference import reference_single

    (tmp_path / "in").mkdir()
    write_mp3(tmp_path / "in" / "long24.mp3", 24_000, "cbr32", True, n=30 * 24_000 + 777)
    for i in range(2):
        write_mp3(tmp_path / "in" / f"short{i}.mp3", 24_000, "cbr32", True, n=24_000 + 500 * i)
    out = tmp_path / "out"
    result = cli("codes", tmp_path / "in", out, "--model", tiny_model_dir, "-q", 8, "--device", "cpu",
                 "--cpu-workers", 2, "--num-workers", 1, "--chunk-seconds", 1, "--max-batch-seconds", 8)
    assert result.exit_code == 0 and "split 1 long recording(s) into" in result.text, result.text
    ref = reference_single(tiny_model, load(str(tmp_path / "in" / "long24.mp3")), 8)["codes"].numpy()
    got = read(out, "long24.mp3")
    assert got.shape == ref.shape and np.array_equal(got, ref)


class CountedTurns:
    """A re-entrant lock that counts how often it is taken (``decoders.FFMPEG_TURNS``'s stand-in)."""

    def __init__(self):
        import threading

        self.inner, self.taken = threading.RLock(), 0

    def __enter__(self):
        self.inner.acquire()
        self.taken += 1

    def __exit__(self, *exc):
        self.inner.release()


def test_ffmpeg_decodes_take_turns_in_a_process_and_give_the_same_samples(tmp_path, monkeypatch):
    """FFmpeg's reads and seeks go through ``decoders.FFMPEG_TURNS`` (two threads decoding through
    PyAV at once cost 1.5-1.8x the CPU of one at no more throughput: the GIL around each frame), and
    two threads reading two MP3s at once get exactly FFmpeg's whole decode of each."""
    import threading

    from mimi_extract.audio import decoders

    turns = CountedTurns()
    monkeypatch.setattr(decoders, "FFMPEG_TURNS", turns)
    paths = [tmp_path / "a.mp3", tmp_path / "b.mp3"]
    write_mp3(paths[0], 44_100, "vbr", True)
    write_mp3(paths[1], 48_000, "cbr32", False)
    refs = [ffmpeg_decode(p) for p in paths]
    got = [None, None]

    def read(i):
        got[i] = tool_read(paths[i])

    threads = [threading.Thread(target=read, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_S)
    assert all(np.array_equal(g, r) for g, r in zip(got, refs))
    assert turns.taken >= sum(-(-len(r) // BLOCK) for r in refs)  # every read took its turn
    taken = turns.taken
    seg = tool_read(paths[0], 3 * BLOCK // 2, 20_000)  # a seek (through its pre-roll) takes turns too
    assert np.array_equal(seg, refs[0][3 * BLOCK // 2: 3 * BLOCK // 2 + 20_000]) and turns.taken > taken + 1


class OuterTurns(CountedTurns):
    """... that also counts its outermost takes (a thread taking it again inside its turn is not one)."""

    def __init__(self):
        import threading

        super().__init__()
        self.depth, self.outer = threading.local(), 0

    def __enter__(self):
        super().__enter__()
        self.depth.n = getattr(self.depth, "n", 0) + 1
        self.outer += self.depth.n == 1

    def __exit__(self, *exc):
        self.depth.n -= 1
        super().__exit__()


def test_a_device_chunk_decodes_in_one_ffmpeg_turn(tmp_path, monkeypatch):
    """The device path's reader decodes what a chunk needs from FFmpeg in ``BLOCK`` reads, all in
    one turn (two threads taking turns by the read alternate two decoders every ``BLOCK``: 10% more
    CPU, docs/performance.md): one outermost turn for the chunk, every read inside it, and the
    chunk's samples are FFmpeg's whole decode."""
    from mimi_extract.audio import decoders
    from mimi_extract.audio.device import NativeReader

    turns = OuterTurns()
    monkeypatch.setattr(decoders, "FFMPEG_TURNS", turns)
    path = tmp_path / "a.mp3"
    write_mp3(path, 48_000, "cbr32", False)
    ref = ffmpeg_decode(path)[:, 0]
    reader = NativeReader(str(path), "first")
    lead = len(reader.padded[0])  # P: zeros, then the item
    taken, outer = turns.taken, turns.outer
    chunk, final = reader.next_chunk(1 << 20)  # the whole item: 5 reads of a BLOCK
    assert final and turns.outer == outer + 1 and turns.taken >= taken + -(-len(ref) // BLOCK), (turns.outer, turns.taken)
    samples = np.concatenate(chunk.parts)
    assert np.array_equal(samples[lead: lead + len(ref)], ref) and not samples[:lead].any()


def test_a_member_read_over_the_network_takes_no_ffmpeg_turns(tmp_path, monkeypatch):
    """A tar member whose bytes come by ranged GETs as FFmpeg reads them decodes without a turn (a
    turn held through a GET would stall the process's other FFmpeg decodes); the same member read
    from a local shard takes its turns.  The samples are FFmpeg's whole decode either way."""
    import tarfile

    from mimi_extract.audio import decoders
    from mimi_extract.sources.tar import MemberView, open_member

    path = tmp_path / "a.mp3"
    write_mp3(path, 48_000, "vbr", True)
    with tarfile.open(tmp_path / "s.tar", "w") as tf:
        tf.add(path, "a.mp3")
    with tarfile.open(tmp_path / "s.tar") as tf:
        member = tf.getmember("a.mp3")
    ref = ffmpeg_decode(path)
    for remote_bytes in (False, True):
        turns = CountedTurns()
        monkeypatch.setattr(decoders, "FFMPEG_TURNS", turns)
        monkeypatch.setattr(MemberView, "over_network", property(lambda self, r=remote_bytes: r))
        f = open_decoder(open_member(str(tmp_path / "s.tar"), member.offset_data, member.size, "a.mp3"), "a.mp3")
        got = np.concatenate([f.read(BLOCK) for _ in range(-(-len(ref) // BLOCK) + 1)])
        f.close()
        assert np.array_equal(got, ref)
        assert (turns.taken == 0) == remote_bytes, (remote_bytes, turns.taken)
