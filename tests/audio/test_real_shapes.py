"""The shapes corpora really ship (tests/support/shapes.py: tagged, headerless, gapless, VBRI MP3s of
every MPEG version; M4A, Ogg, FLAC with large pictures; WAV with extra chunks...), each checked
against FFmpeg's own whole-file decode (PyAV's plain loop, written here independently of the tool):
the probe's sample count, every sample of a whole read and of a segment read after a seek, the 24 kHz
encoder input; then the whole corpus end to end (directory and tar shard) through the CLI.

A file is an error row only where FFmpeg fails too.  Bounds are measured: MP3, M4A and Ogg Opus are
decoded by FFmpeg itself (0), FLAC and WAV by libsndfile (0; FLAC read whole -- ``load`` here -- by
dr_flac, bit for bit libsndfile's: tests/audio/test_flac.py), Ogg Vorbis by libsndfile within 9e-8
of FFmpeg's decoder (bound 3e-7)."""

from __future__ import annotations

import json

import av
import numpy as np
import pytest
import torch

import soundfile as sf

from support.shapes import ffmpeg_decode, reference_file, shapes
from mimi_extract.audio.decoders import seek_exact, open_decoder
from mimi_extract.audio.reader import load

# the module's tests in one pytest-xdist process: its corpus (every shape written, ~5 CPU s) is then
# built once, not once in each process that runs one of them (scripts/test.sh: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("real_shapes")

SHAPES = {s.name: s for s in shapes()}
BOUND = {".ogg": 3e-7}  # libsndfile vs FFmpeg (Vorbis); every other shape: 0


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes") / "corpus"
    root.mkdir()
    for shape in SHAPES.values():
        shape.make(root / shape.filename)
    return root


@pytest.fixture(scope="module")
def found(corpus):
    from mimi_extract.sources import discover

    result = discover(str(corpus))
    return {i.key: i for i in result.items}, {b.key: b for b in result.bad}


def to_24k(source: np.ndarray, rate: int) -> torch.Tensor:
    import torchaudio.functional as taf

    mono = torch.from_numpy(source.mean(1, dtype=np.float32))
    return mono if rate == 24_000 else taf.resample(mono, rate, 24_000)


@pytest.mark.parametrize("name", list(SHAPES))
def test_shape_decodes_as_ffmpegs_whole_decode(corpus, found, name):
    """A file with tags appended (APEv2 with a binary cover, an ID3v2.4 tag at the end) is checked
    against FFmpeg's decode of its audio alone (the tags stripped by mutagen or the fixture) and
    libsndfile's length: FFmpeg's whole-file decode reads the tags' bytes as frames (issue 41,
    item 6: +2,304 samples for a 3 KB cover, +1.58 s for a 300 KB appended picture)."""
    shape = SHAPES[name]
    path = corpus / shape.filename
    items, bad = found
    if shape.ffmpeg_fails:
        with pytest.raises(av.error.FFmpegError):
            ffmpeg_decode(path)
        assert shape.filename in bad and shape.filename not in items
        error = bad[shape.filename].error
        assert error == "empty file (0 bytes)" or error.startswith("unreadable or corrupt audio header: Error opening "
                                                                    f"'{shape.filename}': Invalid data found"), error
        return
    assert shape.filename in items, bad.get(shape.filename)
    ref = ffmpeg_decode(reference_file(shape, path, corpus.parent / "references"))
    bound = BOUND.get(path.suffix, 0.0)
    item = items[shape.filename]
    assert item.frames == len(ref) and item.file_channels == ref.shape[1]
    if shape.audio is not None:
        assert sf.info(str(path)).frames == len(ref)  # libmpg123's length, an independent decoder
    f = open_decoder(str(path))
    got = f.read(len(ref) + 1, dtype="float32", always_2d=True)
    f.close()
    assert getattr(f, "decoder_warnings", "") == ""  # (no packet silenced: none of these is damaged)
    assert got.shape == ref.shape and np.abs(got - ref).max() <= bound
    start = len(ref) // 3
    f = open_decoder(str(path))
    seek_exact(f, start)
    seg = f.read(20_000, dtype="float32", always_2d=True)
    f.close()
    want = ref[start: start + 20_000]
    assert seg.shape == want.shape and np.abs(seg - want).max() <= bound
    x, y = load(str(path)), to_24k(ref, item.sample_rate)
    assert x.shape == y.shape and (x - y).abs().max() < 1e-5


def test_shapes_end_to_end_from_a_folder_and_a_tar_shard(corpus, found, tmp_path, tiny_model_dir):
    """The whole corpus through the CLI: every shape FFmpeg reads is an ok row with the frames its
    24 kHz length gives, the rest error rows; the same files as members of a tar shard are probed
    alike (decoded in place from the shard)."""
    import tarfile

    from support import cli

    from mimi_extract import read_manifest
    from mimi_extract.sources import discover

    items, bad = found
    good = [s.filename for s in SHAPES.values() if not s.ffmpeg_fails]
    out = tmp_path / "out"
    result = cli("codes", corpus, out, "--model", tiny_model_dir, "-q", 4, "--device", "cpu", "--cpu-workers", 1,
                 "--num-workers", 2, "--chunk-seconds", 8)
    assert result.exit_code == 0, result.output
    rows = {r["key"]: r for r in read_manifest(out)}
    assert sorted(k for k, r in rows.items() if r["status"] == "ok") == sorted(good)
    assert sorted(k for k, r in rows.items() if r["status"] == "error") == sorted(bad)
    for key in good:
        assert rows[key]["frames"] == -(-items[key].samples // 1920), key
    shard = tmp_path / "shapes-000000.tar"
    with tarfile.open(shard, "w") as tf:
        for name in sorted(good):
            tf.add(corpus / name, name.replace(".", "_", name.count(".") - 1))  # one dot: the sample key's
    members = {i.loc.name: i for i in discover(str(shard)).items}
    assert len(members) == len(good)
    for name in good:
        member = members[name.replace(".", "_", name.count(".") - 1)]
        assert (member.frames, member.sample_rate, member.file_channels) == \
               (items[name].frames, items[name].sample_rate, items[name].file_channels), name
    assert json.loads(cli("info", out, "--json").output)["ok"] == len(good)
