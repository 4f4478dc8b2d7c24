"""lhotse Shar output (``--format shar``), read by lhotse itself: ``CutSet.from_shar`` +
``cut.load_custom`` equal ``mimi_extract.read`` and the single-item reference, samplers work,
every reader works, and the HDF5 guarantees hold (damaged shards, error rows, parts; kill -9: the
formats' own in test_integrity.py, through ``check_shar``)."""

import gzip
import io
import json
import os
import shutil

import numpy as np
import pytest
import soundfile as sf

lhotse = pytest.importorskip("lhotse")

import mimi_extract  # noqa: E402
from support import ONE_WORKER, cli, write_noise  # noqa: E402
from support.waits import HANG_S
from mimi_extract import read, read_cuts, read_manifest  # noqa: E402
from mimi_extract.audio.reader import load  # noqa: E402
from mimi_extract.codec.reference import reference_single  # noqa: E402
from mimi_extract.formats import get_format  # noqa: E402
from mimi_extract.formats.records import StoredRow  # noqa: E402
from mimi_extract.store.manifest import committed_rows, run_dirs  # noqa: E402
from mimi_extract.store.read import shar_fields  # noqa: E402
from mimi_extract.audit.decode import decode_items  # noqa: E402
from mimi_extract.audit.outputs import info_report, status_report  # noqa: E402
from mimi_extract.config.settings import Part  # noqa: E402
from support import extract  # noqa: E402
from mimi_extract.config.settings import Settings  # noqa: E402
from support import rhu  # noqa: E402
from support.outs import check_shar  # noqa: E402

SHAR = get_format("shar")

@pytest.fixture(scope="module")
def shar_input(tmp_path_factory):
    """Files and a list with whole files, segments, a channel, a stereo mix, bad rows."""
    root = tmp_path_factory.mktemp("shar-in")
    rng = np.random.default_rng(3)
    write_noise(root / "a.wav", 24_000 * 2 + 77, rng=rng)
    write_noise(root / "b16k.wav", 16_000 * 3, 16_000, rng)
    write_noise(root / "stereo.wav", 24_000, rng=rng, channels=2)
    write_noise(root / "long.wav", 24_000 * 5 + 1000, rng=rng, subtype="FLOAT")
    (root / "corrupt.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt garbage")
    rows = [{"path": "a.wav"}, {"path": "b16k.wav"}, {"path": "stereo.wav"},
            {"path": "stereo.wav", "channel": 1, "id": "stereo-right"},
            {"path": "long.wav", "start": 1.23, "end": 3.5},
            {"path": "long.wav", "start": 0.5, "duration": 0.3, "id": "seg/short"},
            {"path": "corrupt.wav"}, {"path": "missing.wav"},
            {"path": "a.wav", "id": "odd//id"}]  # lhotse would read this cut id back as "odd/id"
    (root / "list.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_from_shar_loads_exactly_what_read_returns(shar_input, tiny_model, tiny_model_dir, tmp_path):
    out = str(tmp_path / "out")
    summary = extract(str(shar_input / "list.jsonl"), out,
                      Settings(model=tiny_model_dir, tap="codes", num_workers=0, format="shar"), shard_size=2)
    assert summary.ok == 6 and summary.errors == 3, summary
    shar_dir = os.path.join(out, "shar")
    names = sorted(os.listdir(shar_dir))
    assert names == [f"{f}.{i:06d}.{x}" for f, x in (("cuts", "jsonl.gz"), ("mimi_codes", "tar")) for i in range(3)]
    assert not os.path.exists(os.path.join(out, "cuts.jsonl.gz"))  # the Shar cuts are the cuts
    rows = {r["key"]: r for r in read_manifest(out)}
    errors = {k: r["error"] for k, r in rows.items() if r["status"] == "error"}
    assert set(errors) == {"corrupt.wav", "missing.wav", "odd//id"} and "lhotse Shar" in errors["odd//id"]

    cuts = lhotse.CutSet.from_shar(in_dir=shar_dir)  # lhotse's own reader, as a user calls it
    seen = set()
    for cut in cuts:
        row = rows[cut.id]
        stored = read(out, cut.id)
        got = cut.load_custom("mimi_codes")
        assert got.dtype == np.int16 and np.array_equal(got, stored), cut.id
        channel = row["channel"] if row["channel"] is not None else "mix"
        start = round(row.get("start", 0) * row["sample_rate"])
        frames = round((row["end"] - row["start"]) * row["sample_rate"]) if "end" in row else None
        audio = load(row["source"]["path"], channel, start=start, frames=frames)
        assert np.array_equal(stored, reference_single(tiny_model, audio, 8)["codes"].numpy()), cut.id
        for offset, duration in ((0.0, 0.4), (0.13, 0.5), (0.28, None)):
            part = cut.truncate(offset=offset, duration=duration)
            lo, n = rhu(offset / 0.08), rhu(part.duration / 0.08)
            assert np.array_equal(part.load_custom("mimi_codes"), stored[lo: lo + n]), (cut.id, offset)
        seen.add(cut.id)
    assert seen == {k for k, r in rows.items() if r["status"] == "ok"}

    # the cuts carry their recording: a segment's audio is that segment of the source file
    seg = next(c for c in cuts if c.id == "long.wav@1.23-3.5")
    assert seg.start == 1.23 and seg.recording.sources[0].source == str(shar_input / "long.wav")
    raw = sf.read(str(shar_input / "long.wav"), start=round(1.23 * 24_000), frames=round(2.27 * 24_000), dtype="float32")[0]
    assert np.array_equal(seg.truncate(duration=2.27).load_audio()[0], raw)
    assert isinstance(next(c for c in cuts if c.id == "stereo.wav"), lhotse.MultiCut)
    assert next(c for c in cuts if c.id == "stereo-right").channel == 1

    sampler = lhotse.dataset.DynamicBucketingSampler(cuts, max_duration=3.0, num_buckets=2, buffer_size=20,
                                                     shuffle=True, seed=0)
    assert sorted(c.id for batch in sampler for c in batch) == sorted(seen)
    assert sorted(c.id for c in read_cuts(out)) == sorted(seen)

    # every reader
    reader = mimi_extract.open(out)
    assert sorted(reader.keys()) == sorted(seen) and all(np.array_equal(reader[k], read(out, k)) for k in seen)
    info = info_report(out)
    assert info["ok"] == 6 and info["errors"] == 3 and len(info["shards"]) == 3
    assert info["bytes"] == sum(os.path.getsize(os.path.join(shar_dir, n)) for n in names)  # tars and cuts files
    assert info["settings"]["format"] == "shar"
    assert status_report(out)["complete"]
    result = cli("verify", "--out", out, "--sample", 3, "--device", "cpu")
    assert result.exit_code == 0, result.output
    wav = decode_items(out, ["a.wav"], str(tmp_path / "a.wav"))
    assert sf.info(wav[0]).frames == 24_000 * 2 + 77
    result = cli("cuts", out, "-o", str(tmp_path / "c.jsonl.gz"))
    assert result.exit_code != 0 and "from_shar" in result.text
    check_shar(out)


@pytest.mark.parametrize("tap,field,shift", [("latent", "mimi_latent", 0.08), ("encoder", "mimi_encoder", 0.04)])
def test_feature_taps_name_their_field(shar_input, tiny_model_dir, tmp_path, tap, field, shift):
    out = str(tmp_path / "out")
    (tmp_path / "one.txt").write_text(str(shar_input / "a.wav") + "\n")
    extract(str(tmp_path / "one.txt"), out, Settings(model=tiny_model_dir, tap=tap, num_workers=0, format="shar"))
    assert sorted(os.listdir(os.path.join(out, "shar"))) == ["cuts.000000.jsonl.gz", f"{field}.000000.tar"]
    (cut,) = lhotse.CutSet.from_shar(in_dir=os.path.join(out, "shar"))
    assert cut.custom[field].frame_shift == shift
    assert np.array_equal(cut.load_custom(field), read(out, cut.id))


def test_parts_union_and_resume_refuses_another_format(shar_input, tiny_model_dir, tmp_path):
    out = str(tmp_path / "parts")
    settings = Settings(model=tiny_model_dir, tap="codes", num_workers=0, format="shar")
    for i in range(2):
        extract(str(shar_input / "list.jsonl"), out, settings, part=Part(i, 2), shard_size=2)
    union = check_shar(out)
    assert len(union) == 6
    for i in range(2):  # each part's folder is a Shar dataset of its own
        folder = os.path.join(out, Part(i, 2).dirname, "shar")
        assert {c.id for c in lhotse.CutSet.from_shar(in_dir=folder)} < set(union)
    fields = shar_fields(run_dirs(out))
    assert len(fields["cuts"]) == len(fields["mimi_codes"]) >= 2
    with pytest.raises(Exception, match="format"):
        extract(str(shar_input / "list.jsonl"), out, Settings(model=tiny_model_dir, tap="codes", num_workers=0),
                part=Part(0, 2))


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """60 short files: a run of a few seconds on the tiny model."""
    root = tmp_path_factory.mktemp("many-shar")
    rng = np.random.default_rng(0)
    for i in range(60):
        rate = 16_000 if i % 3 == 0 else 24_000
        write_noise(root / f"f{i:03d}.wav", int(rate * (0.2 + rng.random())), rate, rng)
    return str(root)


@pytest.fixture(scope="module")
def shar_reference(many, tiny_model_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("shar-ref") / "out")
    assert extract(many, out, Settings(model=tiny_model_dir, tap="codes", num_workers=1, format="shar"),
                   shard_size=7).ok == 60
    hdf5 = str(tmp_path_factory.mktemp("hdf5-ref") / "out")
    extract(many, hdf5, Settings(model=tiny_model_dir, tap="codes", num_workers=1), shard_size=7)
    arrays = check_shar(out)
    for key, data in arrays.items():  # the same arrays as the HDF5 output
        assert np.array_equal(data, read(hdf5, key)), key
    return out, arrays


def assert_same(out, reference):
    reference = reference[1]
    arrays = check_shar(out)
    assert sorted(arrays) == sorted(reference)
    for key, data in reference.items():
        assert np.array_equal(arrays[key], data), key


def test_damaged_shar_shards_are_quarantined_and_redone(many, tiny_model_dir, shar_reference, tmp_path):
    out = str(tmp_path / "out")
    shutil.copytree(shar_reference[0], out)  # an uninterrupted run's OUT, then damaged
    shar = os.path.join(out, "shar")
    # as a kill between the two renames leaves it: rows appended, cuts renamed in, the tar not (yet)
    os.remove(os.path.join(shar, "mimi_codes.000008.tar"))
    lost = {r["key"] for r in read_manifest(shar_reference[0]) if r["shard"] == "shar/mimi_codes.000008.tar"}
    assert len(lost) == 4 and not lost & {c.id for c in read_cuts(out)} and len(list(read_cuts(out))) == 56  # not committed: never read
    with pytest.raises(AssertionError):  # lhotse's own in_dir reader refuses the folder until the next run
        lhotse.CutSet.from_shar(in_dir=shar)
    with open(os.path.join(shar, "mimi_codes.000001.tar"), "r+b") as f:  # truncated
        f.truncate(3000)
    size = os.path.getsize(os.path.join(shar, "mimi_codes.000004.tar"))
    with open(os.path.join(shar, "mimi_codes.000004.tar"), "r+b") as f:  # zeroed
        f.write(b"\0" * size)
    with gzip.open(os.path.join(shar, "cuts.000006.jsonl.gz"), "wt") as f:  # its cuts lost
        f.write("")
    summary = extract(many, out, Settings(model=tiny_model_dir, tap="codes", num_workers=1, format="shar"), shard_size=7)
    notes = "\n".join(summary.notes)
    assert notes.count("moved damaged shard") == 3 and all(f"mimi_codes.00000{i}.tar" in notes for i in (1, 4, 6)), notes
    assert "shar/cuts.000008.jsonl.gz" in notes and "never committed" in notes, notes
    quarantined = sorted(os.listdir(os.path.join(out, "quarantine")))
    assert quarantined == sorted([f"shar__{f}.{i:06d}.{x}" for i in (1, 4, 6)
                                  for f, x in (("cuts", "jsonl.gz"), ("mimi_codes", "tar"))]
                                 + ["shar__cuts.000008.jsonl.gz"]), quarantined
    assert summary.skipped == 35 and summary.ok == 25  # 3 damaged shards of 7 and the 4 uncommitted again
    assert_same(out, shar_reference)


def test_commit_renames_into_shar_from_the_run_dir_and_survives_a_full_disk(shar_input, tiny_model_dir, tmp_path,
                                                                           monkeypatch):
    """Each pair is written as temporaries in the run directory (lhotse's ``from_shar(in_dir)``
    would take a temporary inside ``shar/`` for a field) and renamed in, the cuts first and the
    tar (the commit point) last.  ENOSPC part-way: a clean error, a consistent OUT, and a resume
    that ends equal to an uninterrupted run."""
    import errno

    from mimi_extract.store.files import OutputError

    settings = Settings(model=tiny_model_dir, tap="codes", num_workers=0, format="shar")
    source = str(shar_input / "list.jsonl")
    ref = str(tmp_path / "ref")
    extract(source, ref, settings, shard_size=2)
    reference = check_shar(ref)

    out = str(tmp_path / "out")
    from mimi_extract.store import files

    renames, real_rename, real_write = [], files.rename, files.write_all
    total = sum(os.path.getsize(os.path.join(ref, "shar", n)) for n in os.listdir(os.path.join(ref, "shar")))
    budget = {"left": total // 2}  # the disk fills half-way through the shards

    def replace(src, dst):
        renames.append((os.path.relpath(src, out), os.path.relpath(dst, out)))
        return real_rename(src, dst)

    def write_all(fd, data):
        if budget["left"] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        budget["left"] -= len(data)
        return real_write(fd, data)

    monkeypatch.setattr(files, "rename", replace)  # the store's one rename
    monkeypatch.setattr(files, "write_all", write_all)  # the store's one byte writer, not the global os.write
    with pytest.raises(OutputError, match="no space left on device while writing"):
        extract(source, out, settings, shard_size=2)
    monkeypatch.setattr(files, "write_all", real_write)
    pairs = [(s, d) for s, d in renames if d.startswith("shar/")]
    assert pairs and all(s == d.replace("/", "__") + ".tmp" and "/" not in s for s, d in pairs), renames
    assert [d.split(".")[0] for _, d in pairs[:2]] == ["shar/cuts", "shar/mimi_codes"]
    partial = check_shar(out)
    assert 0 < len(partial) < len(reference)
    extract(source, out, settings, shard_size=2)
    assert check_shar(out).keys() == reference.keys()
    assert all(np.array_equal(check_shar(out)[k], v) for k, v in reference.items())


# -- --shar-extend -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shar_dataset(tmp_path_factory):
    """A Shar dataset written by lhotse itself (flac recordings, 3 cuts a shard: 3 + 3 + 1), one
    recording's bytes garbage (its cut fails to decode; lhotse iterates it all the same), and the
    recordings as loose files (the single-item reference reads them)."""
    root = tmp_path_factory.mktemp("shar-dataset")
    loose = root / "loose"
    loose.mkdir()
    rng = np.random.default_rng(7)
    for i, seconds in enumerate([0.5, 2.1, 1.3, 0.9, 2.6, 1.7, 0.33]):
        rate = 16_000 if i == 2 else 24_000
        write_noise(loose / f"r{i}.wav", int(seconds * rate), rate, rng, channels=2 if i == 4 else 1)
    recs = [lhotse.Recording.from_file(str(loose / f"r{i}.wav"), recording_id=f"utt/{i}") for i in range(7)]
    cuts = lhotse.CutSet.from_manifests(recordings=lhotse.RecordingSet.from_recordings(recs))
    cuts = lhotse.CutSet.from_cuts(c.with_id(c.recording_id) for c in cuts)
    shar = root / "shar"
    shar.mkdir()
    cuts.to_shar(str(shar), fields={"recording": "flac"}, shard_size=3)
    import tarfile

    tar = shar / "recording.000001.tar"
    with tarfile.open(tar) as tf:
        members = [(m, tf.extractfile(m).read()) for m in tf.getmembers()]
    with tarfile.open(tar, "w") as tf:
        for m, data in members:
            if m.name.startswith("utt/4."):
                data = b"not flac" * 10 if m.name.endswith(".flac") else data
                m.size = len(data)
            tf.addfile(m, io.BytesIO(data))
    return str(shar), str(loose)


def test_shar_extend_adds_a_field_aligned_with_each_input_shard(shar_dataset, tiny_model, tiny_model_dir, tmp_path,
                                                                monkeypatch):
    """One mimi_codes.NNNNNN.tar per input shard, in its cut order: lhotse's from_shar lines it up
    1:1 with the input's cuts and recordings; arrays equal the single-item reference; a cut that
    fails gets lhotse's placeholder (no field) and an error row; an interrupted run commits whole
    shards only and resumes; a damaged tar is quarantined and redone; held memory is about one
    shard's outputs."""
    import threading

    shar, loose = shar_dataset
    settings = Settings(model=tiny_model_dir, tap="codes", num_workers=0, format="shar", shar_extend=True, batch_size=1)
    out = str(tmp_path / "out")
    stop, armed, done = threading.Event(), threading.Event(), []
    import mimi_extract.run.modes as shar_format  # (the --shar-extend mode plans its units with store.shar_extend.extend_units)

    class _UntilLastShard(list):
        """Units as planned; the engine's walk over them (once planning is over: ``armed``) waits at
        the first unit of the last input shard until the consumer has every item of the shards
        before it (``stop`` is then set), and ends there: an interruption between shards, the same on every machine (a count of progress
        calls raced the encoder, which could finish every shard before the 5th call).  With
        ``batch_size=1`` the feeder has handed on everything it took when it asks for a unit."""

        def __iter__(self):
            for unit in super().__iter__():
                if armed.is_set() and any(self.shard_of[it.key] == self.last for it in unit.items):
                    assert stop.wait(timeout=HANG_S), "the shards before the last never completed"
                    return
                yield unit

    planned = shar_format.extend_units

    def extend_units(todo, layout, plan):
        units = _UntilLastShard(planned(todo, layout, plan))
        units.shard_of, units.last = {k: n for n, ids in layout.items() for k in ids}, list(layout)[-1]
        before_last.append(sum(len(ids) for n, ids in layout.items() if n != units.last))
        return units

    def on_progress(items, seconds, errors):
        done.append(items)
        if sum(done) >= before_last[0]:
            stop.set()

    before_last: list[int] = []
    monkeypatch.setattr(shar_format, "extend_units", extend_units)
    extract(shar, out, settings, stop=stop, on_progress=on_progress, on_plan=lambda summary: armed.set())
    monkeypatch.undo()
    partial = sorted(os.listdir(os.path.join(out, "shar")))
    assert partial == ["mimi_codes.000000.tar", "mimi_codes.000001.tar"], partial
    summary = extract(shar, out, settings)
    ours = sorted(os.path.join(out, "shar", n) for n in os.listdir(os.path.join(out, "shar")))
    assert [os.path.basename(p) for p in ours] == [f"mimi_codes.{i:06d}.tar" for i in range(3)]
    theirs = lambda field: sorted(os.path.join(shar, n) for n in os.listdir(shar) if n.startswith(field + "."))  # noqa: E731
    shard_bytes = [sum(r["nbytes"] for r in read_manifest(out) if r.get("shard", "").endswith(f"{i:06d}.tar")
                       and r["status"] == "ok") for i in range(3)]
    assert 0 < summary.held_peak_bytes <= 2 * max(shard_bytes), (summary.held_peak_bytes, shard_bytes)

    rows = {r["key"]: r for r in read_manifest(out)}
    assert rows["utt/4"]["status"] == "error" and rows["utt/4"]["shard"] == "shar/mimi_codes.000001.tar"
    cuts = lhotse.CutSet.from_shar(fields={"cuts": theirs("cuts"), "recording": theirs("recording"),
                                           "mimi_codes": ours})
    ids = []
    for cut in cuts:
        ids.append(cut.id)
        if cut.id == "utt/4":
            assert not cut.has_custom("mimi_codes")  # the placeholder: lined up, no array
            continue
        stored = read(out, cut.id)
        audio = load(os.path.join(loose, f"r{cut.id.split('/')[1]}.wav"))
        assert np.array_equal(stored, reference_single(tiny_model, audio, 8)["codes"].numpy()), cut.id
        n = rhu(cut.duration / 0.08)  # the input cut's duration decides what lhotse loads
        assert np.array_equal(cut.load_custom("mimi_codes"), stored[:n]) and n >= len(stored) - 1, cut.id
        assert cut.load_audio().shape[-1] == cut.recording.num_samples  # the input's own recording field
    assert ids == [f"utt/{i}" for i in range(7)]
    assert [c.id for c in read_cuts(out) if c.has_custom("mimi_codes")] == [f"utt/{i}" for i in range(7) if i != 4]

    with open(ours[2], "r+b") as f:  # damaged: quarantined and redone
        f.truncate(1000)
    summary = extract(shar, out, settings)
    assert summary.ok == 1 and any("mimi_codes.000002.tar" in n for n in summary.notes), summary.notes
    assert np.array_equal(read(out, "utt/6"), reference_single(tiny_model, load(os.path.join(loose, "r6.wav")), 8)[
        "codes"].numpy())
    assert extract(shar, out, settings).todo == 0  # the error placeholder is part of its committed shard

    with pytest.raises(Exception, match="Shar folder"):
        extract(loose, str(tmp_path / "bad"), settings)
    cli_out = str(tmp_path / "cli")  # the flag (implies --format shar), same tars
    result = cli("codes", shar, cli_out, "--shar-extend", "--model", tiny_model_dir, *ONE_WORKER)
    assert result.exit_code == 0, result.output
    for name in os.listdir(os.path.join(cli_out, "shar")):
        assert get_format("shar").check(os.path.join(cli_out, "shar", name), [
            StoredRow.from_dict(r) for r in read_manifest(cli_out) if r["shard"] == f"shar/{name}"]) is None
    assert all(np.array_equal(read(cli_out, k), read(out, k)) for k in rows if rows[k]["status"] == "ok")
    from mimi_extract.audit.verify import verify_outputs

    checks, problems = verify_outputs(cli_out, sample=2)  # re-reads the input's tar members, encodes alone
    assert not problems and len(checks) == 2 and all(c.error is None and not c.mismatches for c in checks), checks
    assert info_report(cli_out)["errors"] == 1 and status_report(cli_out)["complete"]


def test_bit_rot_in_a_shar_tar_is_found_and_reencoded(many, tiny_model_dir, shar_reference, tmp_path):
    """A flipped byte inside a stored array (the tar's structure intact, so a plain resume's check
    passes): read raises DamagedError, verify --out --checksums lists it, --reencode-damaged redoes
    its shard (cuts file and tar quarantined together)."""
    from mimi_extract.store.files import DamagedError

    out = str(tmp_path / "out")
    shutil.copytree(shar_reference[0], out)
    victim = next(r for r in read_manifest(out) if r["shard"] == "shar/mimi_codes.000002.tar")
    with open(os.path.join(out, victim["shard"]), "r+b") as f:
        f.seek(victim["offset"] + victim["nbytes"] - 1)
        byte = f.read(1)
        f.seek(victim["offset"] + victim["nbytes"] - 1)
        f.write(bytes([byte[0] ^ 0x5A]))
    with pytest.raises(DamagedError, match="fails its checksum"):
        read(out, victim["key"])
    result = cli("verify", "--out", out, "--checksums")
    assert result.exit_code == 1 and "1 damaged; FAIL" in result.text and victim["key"] in result.text, result.output
    result = cli("codes", many, out, "--model", tiny_model_dir, "--format", "shar", "--shard-size", 7,
                 "--reencode-damaged", *ONE_WORKER)
    assert result.exit_code == 0 and "moved damaged shard shar/mimi_codes.000002.tar" in result.text, result.output
    assert sorted(os.listdir(os.path.join(out, "quarantine"))) == ["shar__cuts.000002.jsonl.gz",
                                                                  "shar__mimi_codes.000002.tar"]
    assert cli("verify", "--out", out, "--checksums").exit_code == 0
    assert_same(out, shar_reference)


def test_long_and_non_ascii_keys_round_trip_through_lhotse(tmp_path):
    """Keys that need PAX headers in a tar (over 100 bytes, non-ASCII): each row's offset is the
    member's data, the format's check passes, and lhotse reads every array back under its id."""
    attrs = {"tap": "codes", "frame_rate": 12.5, "num_quantizers": 8}
    fmt = SHAR.for_run(attrs)
    shard = fmt.builder(attrs)
    rng = np.random.default_rng(0)
    keys = ["d/" * 60 + "long name.wav", "ünï/cödé ß.flac", "plain.wav@1.5-2.25", "x.wav#ch1"]
    arrays, rows = {}, []
    for i, key in enumerate(keys):
        arrays[key] = rng.integers(0, 2048, (5 + i, 8)).astype(np.int16)
        row = {"path": key, "key": key, "dataset": key, "channel": None, "sample_rate": 24_000, "duration": 0.5,
               "source": {"path": "/abs/x.wav", "frames": 48_000, "channels": 1}}
        rows.append({**row, **shard.add(key, arrays[key], StoredRow.from_dict(row), {}), "frames": 5 + i, "status": "ok",
                     "shard": fmt.shard_name(0)})
    for name, data in shard.files(fmt.shard_name(0)).items():
        os.makedirs(os.path.dirname(tmp_path / name), exist_ok=True)
        (tmp_path / name).write_bytes(data)
    path = str(tmp_path / fmt.shard_name(0))
    rows = [StoredRow.from_dict(r) for r in rows]
    assert fmt.check(path, rows) is None and fmt.attrs(path) == attrs
    assert all(np.array_equal(fmt.load(path, r), arrays[r.key]) for r in rows)
    got = {c.id: c.load_custom("mimi_codes") for c in lhotse.CutSet.from_shar(in_dir=str(tmp_path / "shar"))}
    assert got.keys() == arrays.keys() and all(np.array_equal(got[k], arrays[k]) for k in keys)


def test_shar_extend_in_parts_divides_whole_input_shards(shar_dataset, tiny_model_dir, tmp_path):
    """--part I/N with --shar-extend: each input shard goes whole to one part (a tar must hold all
    of its shard's cuts); the parts' tars together are one per input shard; read_cuts is the union."""
    shar, _ = shar_dataset
    settings = Settings(model=tiny_model_dir, tap="codes", num_workers=0, format="shar", shar_extend=True)
    out = str(tmp_path / "parts")
    for i in range(2):
        extract(shar, out, settings, part=Part(i, 2))
    tars = sorted(n for d in run_dirs(out) if os.path.isdir(os.path.join(d, "shar"))
                  for n in os.listdir(os.path.join(d, "shar")))
    assert tars == [f"mimi_codes.{i:06d}.tar" for i in range(3)]
    cuts = list(read_cuts(out))
    assert sorted(c.id for c in cuts) == [f"utt/{i}" for i in range(7)]
    assert sorted(c.id for c in cuts if c.has_custom("mimi_codes")) == [f"utt/{i}" for i in range(7) if i != 4]
    assert all(np.array_equal(c.load_custom("mimi_codes"), read(out, c.id)[: rhu(c.duration / 0.08)])
               for c in cuts if c.has_custom("mimi_codes"))
    # the README's listing by hand: the parts' tars sorted by file name (not by path: the parts
    # hold the input shards by a hash of their number) line up with the input's own fields
    import glob

    theirs = sorted(glob.glob(f"{out}/part-*-of-*/shar/mimi_codes.*.tar"), key=os.path.basename)
    assert [os.path.basename(t) for t in theirs] == [f"mimi_codes.{i:06d}.tar" for i in range(3)]
    listed = lhotse.CutSet.from_shar(fields={"cuts": sorted(glob.glob(f"{shar}/cuts.*.jsonl.gz")),
                                             "recording": sorted(glob.glob(f"{shar}/recording.*.tar")),
                                             "mimi_codes": theirs})
    got = {c.id: c.load_custom("mimi_codes") for c in listed if c.has_custom("mimi_codes")}
    assert sorted(got) == [f"utt/{i}" for i in range(7) if i != 4]
    assert all(np.array_equal(a, read(out, k)[: a.shape[0]]) and a.shape[0] >= read(out, k).shape[0] - 1
               for k, a in got.items())


def _lhotse_view(out: str) -> dict:
    """What lhotse's own ``from_shar`` gives for OUT: {cut id: (cut dict, loaded array)} (paths
    made relative, so two copies of one OUT compare equal)."""
    cuts = lhotse.CutSet.from_shar(fields=shar_fields(run_dirs(out)))
    view = {}
    for c in cuts:
        text = json.dumps(c.to_dict(), sort_keys=True, default=lambda o: o.hex() if isinstance(o, bytes) else repr(o))
        view[c.id] = (text.replace(os.path.abspath(out), "OUT"), c.load_custom("mimi_codes"))
    return view


@pytest.mark.slow  # ~45 s: some 2,500 flips, each checked and read by lhotse
def test_a_flipped_byte_anywhere_in_a_shar_shard_is_found_or_harmless_to_lhotse(shar_reference, tmp_path):
    """Every Shar byte outside the arrays too: a flip in a tar member header, a ``.json`` member or
    the cuts file is listed by ``verify --out --checksums`` (and a resume's check) unless lhotse's
    ``from_shar`` still sees exactly the same cuts and arrays (a gzip header's mtime, tar padding).
    Before the ``.json`` member and cut line checksums, 4,382 of the 10,624 flips of one shard
    were unnoticed and changed (or broke) what lhotse reads; since the shard checksum (the crc32 of
    the tar as committed), every byte of the tar is found, and the harmless flips left are in the
    cuts file's bytes that decompress to the same text: its gzip header's mtime, XFL and OS (no
    reader checks them) and, in some runs, the unused bits of the deflate stream's last byte (CI
    found one at offset 460 of 469, where the end-of-block code left them free)."""
    from mimi_extract.store.read import scan_checksums

    out = str(tmp_path / "out")
    shutil.copytree(shar_reference[0], out)
    shard = "shar/mimi_codes.000003.tar"
    rows = [r for r in committed_rows(out) if r.shard == shard]
    for name in os.listdir(os.path.join(out, "shar")):  # an OUT of that one shard (a flip costs 9x less)
        if f"shar/{name}" not in (shard, SHAR.companions(shard)[0]):
            os.remove(os.path.join(out, "shar", name))
    with open(os.path.join(out, "manifest.jsonl"), "w") as f:
        f.writelines(json.dumps(r.to_dict()) + "\n" for r in rows)
    reference = _lhotse_view(out)
    assert len(reference) == 7
    found = harmless = 0
    harmless_in = set()
    for name in (shard, SHAR.companions(shard)[0]):
        path = os.path.join(out, name)
        original = open(path, "rb").read()
        stride = 1 if name.endswith(".gz") else 5  # every cuts byte; every 5th tar byte (each of its 512-byte blocks)
        for offset in range(0, len(original), stride):
            flipped = bytearray(original)
            flipped[offset] ^= 0x5A
            with open(path, "wb") as f:
                f.write(flipped)
            damaged = scan_checksums(out)["damaged"]
            if damaged:
                # an array's own bytes: that item; anything else: its shard fails the check, all its items
                keys = {d["key"] for d in damaged}
                assert keys == {r.key for r in rows} or (len(keys) == 1 and keys <= {r.key for r in rows}
                                                             and damaged[0]["problem"] == "checksum mismatch (crc32)"), (
                    name, offset, damaged)
                found += 1
                continue
            assert SHAR.check(os.path.join(out, shard), rows) is None, (name, offset)
            view = _lhotse_view(out)
            assert view.keys() == reference.keys(), (name, offset)
            for key, (text, array) in reference.items():
                assert view[key][0] == text and np.array_equal(view[key][1], array), (name, offset, key)
            harmless += 1
            # which bytes no reader can see: the gzip header's mtime/XFL/OS, and the unused bits after
            # the deflate stream's end-of-block code (where that falls moves with the cuts' text)
            unseen = name.endswith(".gz") and gzip.decompress(bytes(flipped)) == gzip.decompress(original)
            harmless_in.add((name, offset, unseen))
        with open(path, "wb") as f:
            f.write(original)
    print(f"shar flip study: {found} found, {harmless} harmless (at {sorted(o for _, o, _ in harmless_in)} "
          f"of the cuts file)")
    assert found > 4000 and all(unseen for _, _, unseen in harmless_in), harmless_in
    assert {o for _, o, _ in harmless_in} >= {4, 5, 6, 7}, harmless_in  # (the study reached the header's mtime)


def test_damage_to_a_json_member_or_an_edited_cuts_file_is_quarantined_on_resume(many, tiny_model_dir,
                                                                                   shar_reference, tmp_path):
    """The two Shar damages a resume used to keep: a byte of a ``.json`` member (lhotse then fails
    to parse it) and a cuts file edited and recompressed (its gzip crc fine, a cut changed)."""
    out = str(tmp_path / "out")
    shutil.copytree(shar_reference[0], out)
    rows = [r for r in read_manifest(out) if r["shard"] == "shar/mimi_codes.000001.tar"]
    import tarfile

    with tarfile.open(os.path.join(out, rows[0]["shard"])) as tar:
        meta = tar.getmember(f"{rows[0]['key']}.json")
    with open(os.path.join(out, rows[0]["shard"]), "r+b") as f:
        f.seek(meta.offset_data + 5)
        byte = f.read(1)
        f.seek(meta.offset_data + 5)
        f.write(bytes([byte[0] ^ 0x5A]))
    cuts = os.path.join(out, "shar", "cuts.000005.jsonl.gz")
    with gzip.open(cuts, "rt", encoding="utf-8") as f:
        lines = f.readlines()
    lines[2] = lines[2].replace('"duration": ', '"duration": 1', 1)
    with gzip.open(cuts, "wt", encoding="utf-8") as f:
        f.writelines(lines)
    result = cli("verify", "--out", out, "--checksums")
    assert result.exit_code == 1 and "14 damaged; FAIL" in result.text, result.output
    assert "member fails its checksum" in result.text and "cuts.000005.jsonl.gz fails its checksum" in result.text
    summary = extract(many, out, Settings(model=tiny_model_dir, tap="codes", num_workers=1, format="shar"), shard_size=7)
    notes = "\n".join(summary.notes)
    assert notes.count("moved damaged shard") == 2 and summary.ok == 14, notes
    assert cli("verify", "--out", out, "--checksums").exit_code == 0
    assert_same(out, shar_reference)
    view = _lhotse_view(out)
    reference = _lhotse_view(shar_reference[0])
    assert view.keys() == reference.keys() and all(np.array_equal(view[k][1], reference[k][1]) for k in view)


@pytest.mark.parametrize("extend", [False, True])
def test_a_member_is_a_c_order_npy_whatever_the_array_s_layout(extend):
    """A Shar member is a C-order ``.npy`` (``fortran_order: False``) for an array in any layout: the
    encoder's codes reach the format as a transposed view, which ``np.save`` would store in Fortran
    order; the writer makes its arrays contiguous first (``ShardWriter._fill``), ``--shar-extend``
    hands them as they come, and both must store the same bytes."""
    import tarfile

    from mimi_extract.formats.records import RowSource
    from mimi_extract.formats.shar import SharShard

    codes = np.arange(8 * 13, dtype=np.int16).reshape(8, 13).T  # [frames, q], Fortran-ordered
    images = []
    for data in (codes, np.ascontiguousarray(codes)):
        shard = SharShard({"tap": "codes", "shar_extend": extend})
        row = StoredRow("a.wav", path="a.wav", dataset="a.wav", sample_rate=16_000, duration=1.04,
                        source=RowSource(path="/a.wav", frames=16_640, channels=1))
        shard.add("a.wav", data, row, {})
        image = shard.files("shar/mimi_codes.000000.tar")["shar/mimi_codes.000000.tar"]
        with tarfile.open(fileobj=io.BytesIO(image)) as tar:
            npy = io.BytesIO(tar.extractfile("a.wav.npy").read())
        np.lib.format.read_magic(npy)
        assert np.lib.format.read_array_header_1_0(npy) == ((13, 8), False, np.dtype(np.int16))
        images.append(image)
    assert images[0] == images[1]
