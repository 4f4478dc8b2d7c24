"""lhotse out (a CutSet pointing into the shards) and in (recordings, supervisions, cuts), for real."""

import os

import numpy as np
import pytest
import soundfile as sf
import torch

lhotse = pytest.importorskip("lhotse")

from mimi_extract import read, read_cuts  # noqa: E402
from mimi_extract.audio.reader import load  # noqa: E402
from mimi_extract.codec.reference import reference_single  # noqa: E402
from mimi_extract.config.settings import Part  # noqa: E402
from support import extract  # noqa: E402
from mimi_extract.config.settings import Settings  # noqa: E402
from mimi_extract.sources import Options  # noqa: E402
from support import check_consistency  # noqa: E402
from support import write_noise  # noqa: E402
from support import rhu  # noqa: E402


def test_cutset_loads_exactly_what_read_returns(corpus, tiny_model_dir, tmp_path):
    root, _ = corpus
    out = str(tmp_path / "out")
    extract(root, out, Settings(model=tiny_model_dir, tap="codes", num_workers=0))
    cuts = lhotse.CutSet.from_file(os.path.join(out, "cuts.jsonl.gz"))
    assert len(cuts) == 7
    for cut in cuts:
        stored = read(out, cut.id)
        got = cut.load_custom("mimi_codes")
        assert got.dtype == stored.dtype and np.array_equal(got, stored), cut.id  # trailing partial frame included
        assert cut.custom["mimi_codes"].frame_shift == 0.08
        for offset, duration in ((0.0, 0.4), (0.13, 0.5), (0.28, 0.36), (0.5, None)):
            if offset >= cut.duration:
                continue
            part = cut.truncate(offset=offset, duration=duration)
            lo, n = rhu(offset / 0.08), rhu(part.duration / 0.08)
            assert np.array_equal(part.load_custom("mimi_codes"), stored[lo : lo + n]), (cut.id, offset, duration)
    stereo = next(c for c in cuts if c.id == "stereo.wav")
    assert isinstance(stereo, lhotse.MultiCut) and stereo.load_audio().shape[0] == 2  # the mix of both channels
    assert isinstance(next(c for c in cuts if c.id == "sine_440.wav"), lhotse.MonoCut)


def test_cutset_features_and_encoder_tap(corpus, tiny_model_dir, tmp_path):
    root, _ = corpus
    out = str(tmp_path / "enc")
    extract(root, out, Settings(model=tiny_model_dir, tap="encoder", num_workers=0))
    cut = next(c for c in lhotse.CutSet.from_file(os.path.join(out, "cuts.jsonl.gz")) if c.id == "sine_440.wav")
    assert cut.custom["mimi_encoder"].frame_shift == 0.04
    assert np.array_equal(cut.load_custom("mimi_encoder"), read(out, "sine_440.wav"))
    assert np.array_equal(cut.truncate(offset=0.52, duration=0.4).load_custom("mimi_encoder"),
                          read(out, "sine_440.wav")[13:23])


def test_lhotse_manifests_as_inputs(tmp_path, tiny_model, tiny_model_dir):
    rng = np.random.default_rng(0)
    write_noise(tmp_path / "long16k.wav", 16_000 * 6, 16_000, rng, channels=2, subtype="FLOAT")
    write_noise(tmp_path / "mono24k.flac", 24_000 * 3, rng=rng)
    recs = lhotse.RecordingSet.from_recordings(
        lhotse.Recording.from_file(str(tmp_path / n)) for n in ("long16k.wav", "mono24k.flac"))
    sups = lhotse.SupervisionSet.from_segments([
        lhotse.SupervisionSegment("s1", "long16k", start=1.23456789, duration=2.5, channel=0),
        lhotse.SupervisionSegment("s2", "long16k", start=0.5, duration=3.33, channel=1),
        lhotse.SupervisionSegment("s3", "mono24k", start=0.25, duration=1.0, channel=0),
        lhotse.SupervisionSegment("bad", "long16k", start=5.5, duration=2.0, channel=0),  # past the end
    ])
    good = lhotse.SupervisionSet.from_segments([s for s in sups if s.id != "bad"])
    cuts = lhotse.CutSet.from_manifests(recs, good).trim_to_supervisions(keep_overlapping=False)
    for name, manifest in (("recs", recs), ("sups", sups), ("cuts", cuts)):
        manifest.to_file(str(tmp_path / f"{name}.jsonl.gz"))
    for name, expected in (("recs", {"long16k#ch0", "long16k#ch1", "mono24k"}), ("sups", {"s1", "s2", "s3"}),
                           ("cuts", None)):
        out = str(tmp_path / f"out-{name}")
        kwargs = {"options": Options(recordings=str(tmp_path / "recs.jsonl.gz"))} if name == "sups" else {}
        summary = extract(str(tmp_path / f"{name}.jsonl.gz"), out, Settings(model=tiny_model_dir, tap="codes", num_workers=0),
                          **kwargs)
        arrays = check_consistency(out)
        if expected is not None:
            assert set(arrays) == expected, arrays.keys()
        if name == "sups":
            assert summary.errors == 1  # the segment past the end of its recording: an error row
        for key, stored in arrays.items():
            cut = next(iter(lhotse.CutSet.from_file(os.path.join(out, "cuts.jsonl.gz")).filter(lambda c: c.id == key)))
            assert np.array_equal(cut.load_custom("mimi_codes"), stored)
        if name == "cuts":
            cut = next(iter(lhotse.load_manifest(str(tmp_path / "cuts.jsonl.gz"))))
            ch = cut.channel if isinstance(cut.channel, int) else cut.channel[0]
            # only the segment is decoded: the same samples lhotse reads, then encoded alone
            start, frames = round(cut.start * 16_000), round(cut.duration * 16_000)
            ours = load(str(tmp_path / "long16k.wav"), ch, start=start, frames=frames)
            ref = reference_single(tiny_model, ours, 8)["codes"].numpy()
            key = next(k for k in arrays if k == cut.id or k.startswith(cut.id))
            assert np.array_equal(arrays[key], ref)
            raw = torch.from_numpy(sf.read(str(tmp_path / "long16k.wav"), start=start, frames=frames, dtype="float32")[0][:, ch])
            assert np.array_equal(cut.load_audio()[0], raw.numpy())


def test_one_cutset_per_part_and_union(corpus, tiny_model_dir, tmp_path):
    root, _ = corpus
    out = str(tmp_path / "parts")
    for i in range(2):
        extract(root, out, Settings(model=tiny_model_dir, tap="codes", num_workers=0), part=Part(i, 2))
    assert all(os.path.exists(os.path.join(out, Part(i, 2).dirname, "cuts.jsonl.gz")) for i in range(2))
    cuts = read_cuts(out)
    assert sorted(c.id for c in cuts) == sorted(check_consistency(out))


def test_cuts_of_an_interrupted_run_and_after_a_kill(tmp_path, tiny_model_dir):
    """An interrupted run still writes the cuts of what it committed; after a kill (cuts file lagging
    or missing) read_cuts still equals the committed manifest, and the next run rewrites the file."""
    import threading

    from mimi_extract import read_manifest

    root = tmp_path / "in"
    root.mkdir()
    rng = np.random.default_rng(5)
    for i in range(12):
        write_noise(root / f"u{i:02d}.wav", 6000 + 500 * i, rng=rng)
    out = str(tmp_path / "out")
    stop = threading.Event()
    settings = Settings(model=tiny_model_dir, tap="codes", num_workers=0, batch_size=1)
    seen = []
    summary = extract(str(root), out, settings, shard_size=2, stop=stop,
                      on_progress=lambda *a: seen.append(1) or (len(seen) == 4 and stop.set()))
    assert summary.ok < 12
    committed = sorted(r["key"] for r in read_manifest(out) if r["status"] == "ok")
    assert 0 < len(committed) < 12, committed
    cuts_file = os.path.join(out, "cuts.jsonl.gz")
    assert sorted(c.id for c in lhotse.CutSet.from_file(cuts_file)) == committed
    os.remove(cuts_file)  # as after a kill -9 before the cuts were written
    assert sorted(c.id for c in read_cuts(out)) == committed
    extract(str(root), out, settings, shard_size=2)
    everything = sorted(check_consistency(out))
    assert len(everything) == 12 and sorted(c.id for c in lhotse.CutSet.from_file(cuts_file)) == everything
    assert sorted(c.id for c in read_cuts(out)) == everything
