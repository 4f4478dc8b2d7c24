"""Packaged corpora as inputs: tar/WebDataset shards, Parquet / HF datasets, lhotse Shar, and the
PyAV decoder.  Every kind is checked against the same audio encoded as loose files (the arrays of
every key equal), plus the single-item reference (``verify_outputs`` re-encodes each item alone
with transformers' MimiModel and compares with what OUT stores)."""

import gzip
import io
import json
import os
import tarfile

import numpy as np
import pytest
import soundfile as sf

from mimi_extract.config.settings import Part
from support import extract
from mimi_extract.sources import Options, discover, open_audio
from support import check_consistency
from mimi_extract.audit.verify import verify_outputs, verify_source
from mimi_extract.store.files import OutputError
from mimi_extract.store.identity import read_run_info
from support import cli
from support.corpora import FILES, add_bytes, assert_equal_arrays, settings, write_tar

# the module's tests in one pytest-xdist process: its packaged corpora (tar shards, a datasets Parquet
# and folder, a lhotse Shar) and the loose files' run are then made once, not once in each process that
# runs one of them (scripts/test.sh: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("packed_sources")


def test_tar_equals_loose_files_and_single_item_reference(shards, loose_run, tiny_model_dir, tmp_path):
    out = str(tmp_path / "out")
    summary = extract(os.path.join(shards, "en-{000000..000001}.tar"), out, settings(tiny_model_dir),
                      options=Options(id_field="id"))
    assert summary.ok == len(FILES) and summary.errors == 0
    assert_equal_arrays(check_consistency(out), loose_run)
    info = read_run_info(out)
    assert info["input_kind"] == "tar" and [os.path.basename(s[0]) for s in info["input_identity"]["shards"]] == [
        "en-000000.tar", "en-000001.tar"]
    checks, problems = verify_outputs(out, sample=None)  # reopens each member by offset, encodes it alone
    assert not problems and len(checks) == len(FILES)
    assert all(c.error is None and not [m for m in c.mismatches if not m.tie] for c in checks), checks
    checks = verify_source(shards, settings(tiny_model_dir, batch_size=4), options=Options(id_field="id"))
    assert len(checks) == len(FILES) and all(c.error is None and c.note is None for c in checks)
    assert all(not [m for m in c.mismatches if not m.tie] for c in checks)
    # default keys: <shard file name>/<sample key>; the folder form finds the same shards
    found = discover(shards)
    assert found.kind == "tar" and sorted(it.key for it in found.items) == sorted(
        f"en-00000{int(i >= 3)}.tar/{n.split('.')[0]}" for i, n in enumerate(sorted(FILES)))


def test_tar_parts_union_resume_identity_and_cli(shards, loose_run, tiny_model_dir, tmp_path):
    """--part by key hash: the union of the parts is the whole; a rewritten shard is refused on
    resume (its size and mtime are the input's identity); info, status and decode read a tar OUT."""
    out = str(tmp_path / "out")
    for i in range(2):
        extract(shards, out, settings(tiny_model_dir), part=Part(i, 2), options=Options(id_field="id"))
    assert_equal_arrays(check_consistency(out), loose_run)
    assert cli("info", out).exit_code == 0 and cli("status", out).exit_code == 0
    wav = str(tmp_path / "a.wav")
    result = cli("decode", out, "a.flac", "--output", wav, "--device", "cpu")
    assert result.exit_code == 0, result.text
    assert sf.info(wav).frames == round(FILES["a.flac"][0] * 24_000)
    whole = str(tmp_path / "whole")
    extract(shards, whole, settings(tiny_model_dir), options=Options(id_field="id"))
    os.utime(os.path.join(shards, "en-000001.tar"), ns=(1, 1))
    try:
        with pytest.raises(OutputError, match="input_identity"):
            extract(shards, whole, settings(tiny_model_dir), options=Options(id_field="id"))
    finally:
        now = os.stat(os.path.join(shards, "en-000000.tar")).st_mtime_ns
        os.utime(os.path.join(shards, "en-000001.tar"), ns=(now, now))


def test_tar_parts_take_whole_shards(shards, tiny_model_dir, tmp_path, monkeypatch):
    """--part I/N over tar shards divides whole shards (shard i -> part i % N) before any is opened:
    each part indexes only its own shard and records only its size and mtime; the union equals a
    whole run (--channel each: a stereo file's keys too); a rewritten shard refuses only its part,
    naming that shard alone; parts that divide by key and by shard are never mixed in one OUT."""
    import mimi_extract.sources.tar as tar

    opened = []
    index_tar = tar.index_tar
    monkeypatch.setattr(tar, "index_tar", lambda path, *a, **k: opened.append(os.path.basename(path))
                        or index_tar(path, *a, **k))
    run = settings(tiny_model_dir, channel="each")
    whole = str(tmp_path / "whole")
    extract(shards, whole, run, options=Options(id_field="id"))
    assert opened == ["en-000000.tar", "en-000001.tar"]
    reference = check_consistency(whole)
    assert {"d.wav#ch0", "d.wav#ch1"} < set(reference)
    out = str(tmp_path / "out")
    for i in range(2):
        opened.clear()
        summary = extract(shards, out, run, part=Part(i, 2), options=Options(id_field="id"))
        assert opened == [f"en-00000{i}.tar"] and summary.ok == summary.inputs > 0
        info = read_run_info(summary.run_dir)
        assert [os.path.basename(s[0]) for s in info["input_identity"]["shards"]] == [f"en-00000{i}.tar"]
        assert [os.path.basename(s) for s in info["part_shards"]] == ["en-000000.tar", "en-000001.tar"]
        if i == 0:  # part 1 not yet run: its shard is what is missing
            missing = cli("status", out, "--missing", "--shards")
            assert missing.exit_code == 1 and missing.output == os.path.join(shards, "en-000001.tar") + "\n"
            assert cli("status", out, "--missing").output == "1\n"
    union = check_consistency(out)
    assert union.keys() == reference.keys() and all(np.array_equal(union[k], reference[k]) for k in union)
    assert cli("status", out, "--missing").exit_code == 0
    before = os.stat(os.path.join(shards, "en-000001.tar")).st_mtime_ns
    os.utime(os.path.join(shards, "en-000001.tar"), ns=(1, 1))
    try:
        assert extract(shards, out, run, part=Part(0, 2), options=Options(id_field="id")).skipped > 0
        with pytest.raises(OutputError, match=r"input shards changed .*rewritten: \S*en-000001.tar \(modified\)") as e:
            extract(shards, out, run, part=Part(1, 2), options=Options(id_field="id"))
        assert "en-000000.tar" not in str(e.value)
        again = extract(shards, out, run, part=Part(1, 2), options=Options(id_field="id"), reencode_changed=True)
        assert again.skipped == 0 and again.ok == again.inputs > 0  # its part: only that shard's items
        union = check_consistency(out)
        assert union.keys() == reference.keys() and all(np.array_equal(union[k], reference[k]) for k in union)
    finally:
        os.utime(os.path.join(shards, "en-000001.tar"), ns=(before, before))
    first = os.path.join(out, Part(0, 2).dirname, "run.json")  # as a part begun before parts took whole shards
    with open(first) as f:
        old = json.load(f)
    del old["part_shards"]
    old["input_identity"] = read_run_info(whole)["input_identity"]  # (then every shard's)
    with open(first, "w") as f:
        json.dump(old, f)
    with pytest.raises(OutputError, match="divide whole input shards, this one its items by key") as e:
        extract(shards, out, run, part=Part(1, 2), options=Options(id_field="id"))
    assert len(str(e.value)) < 600
    limited = extract(shards, str(tmp_path / "limited"), run, part=Part(0, 2), limit=3, options=Options(id_field="id"))
    assert "part_shards" not in read_run_info(limited.run_dir)  # --limit: the first 3 inputs, divided by key


def test_rewritten_shard_is_encoded_again_alone(shards, loose_run, tiny_model_dir, tmp_path):
    """A re-downloaded shard (same name, new mtime) refuses the resume naming that shard alone;
    --reencode-changed quarantines the output shards holding its items and encodes only those
    again (one item per output shard here: the other shard's items are all skipped)."""
    from support import ONE_WORKER

    out = str(tmp_path / "out")
    extract(shards, out, settings(tiny_model_dir), shard_size=1, options=Options(id_field="id"))
    in_second = {k for k in loose_run if k in FILES and sorted(FILES).index(k) >= 3}
    by_key = str(tmp_path / "by-key")  # (--limit: parts divided by key, each recording every shard)
    extract(shards, by_key, settings(tiny_model_dir), part=Part(0, 2), limit=5, options=Options(id_field="id"))
    path = os.path.join(shards, "en-000001.tar")
    before = os.stat(path).st_mtime_ns
    os.utime(path, ns=(before + 10**9, before + 10**9))
    try:
        with pytest.raises(OutputError, match="divide their items by key"):
            extract(shards, by_key, settings(tiny_model_dir), part=Part(0, 2), limit=5, options=Options(id_field="id"),
                    reencode_changed=True)
        args = ("codes", shards, out, "--model", tiny_model_dir, "--id-field", "id", "--shard-size", 1, *ONE_WORKER)
        refused = cli(*args)
        assert refused.exit_code == 2 and "rewritten: " in refused.text and "--reencode-changed" in refused.text
        assert "en-000001.tar (modified)" in refused.text and "en-000000.tar" not in refused.text, refused.text
        with pytest.raises(OutputError, match="num_quantizers"):  # anything else changed too: refused, nothing moved
            extract(shards, out, settings(tiny_model_dir, num_quantizers=4), shard_size=1,
                    options=Options(id_field="id"), reencode_changed=True)
        assert not os.path.exists(os.path.join(out, "quarantine"))
        summary = extract(shards, out, settings(tiny_model_dir), shard_size=1, options=Options(id_field="id"),
                          reencode_changed=True)
        assert summary.ok == len(in_second) and summary.skipped == len(FILES) - len(in_second), summary
        assert "1 rewritten input shard(s) (en-000001.tar)" in summary.notes[0]
        assert len(os.listdir(os.path.join(out, "quarantine"))) == len(in_second)
        assert_equal_arrays(check_consistency(out), loose_run)
        assert cli(*args).exit_code == 0  # run.json took the new identity
        assert cli(*args, "--reencode-changed").exit_code == 0  # nothing rewritten since: nothing to do
    finally:
        os.utime(path, ns=(before, before))


@pytest.mark.parametrize("kind", ["tgz", "parquet"])
def test_parts_take_whole_tgz_and_parquet_files(kind, loose, loose_run, tiny_model_dir, tmp_path):
    """Three .tar.gz shards or Parquet files, two parts: part 0 takes files 0 and 2, part 1 file 1
    (shard i -> part i % N); each part's identity lists only its files; the union is the loose run."""
    names = sorted(FILES)
    root = tmp_path / "in"
    root.mkdir()
    for n in range(3):
        group = names[2 * n: 2 * n + 2]
        if kind == "tgz":
            with open(write_tar(tmp_path / f"{n}.tar", loose, group), "rb") as f, \
                    gzip.open(root / f"s-{n:06d}.tar.gz", "wb") as g:
                g.write(f.read())
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            audio = pa.array([{"bytes": open(os.path.join(loose, x), "rb").read(), "path": x} for x in group],
                             pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
            pq.write_table(pa.table({"id": group, "audio": audio}), root / f"s-{n:06d}.parquet")
    ext = ".tar.gz" if kind == "tgz" else ".parquet"
    options = Options(id_field="id") if kind == "tgz" else Options(id_column="id")
    out = str(tmp_path / "out")
    for i, mine in enumerate([[0, 2], [1]]):
        summary = extract(str(root), out, settings(tiny_model_dir), part=Part(i, 2), options=options)
        info = read_run_info(summary.run_dir)
        assert [os.path.basename(s[0]) for s in info["input_identity"]["shards" if kind == "tgz" else "files"]] == [
            f"s-{n:06d}{ext}" for n in mine]
        assert summary.ok == 2 * len(mine) and len(info["part_shards"]) == 3
    assert_equal_arrays(check_consistency(out), loose_run)


def test_tar_sidecar_segment_and_channel(loose, tmp_path):
    """A sidecar's start/end are a segment (keys stay the sample's), its channel picks one."""
    with open(os.path.join(loose, "d.wav"), "rb") as f:
        data = f.read()
    path = str(tmp_path / "seg.tar")
    with tarfile.open(path, "w") as tf:
        add_bytes(tf, "x.wav", data)
        add_bytes(tf, "x.json", json.dumps({"start": 0.25, "end": 0.5, "channel": 1}).encode())
    (item,) = discover(path).items
    assert (item.key, item.start, item.frames, item.channel, item.segment) == ("seg.tar/x", 6000, 6000, 1, (0.25, 0.5))
    from mimi_extract.audio.reader import load

    want = load(os.path.join(loose, "d.wav"), 1, start=6000, frames=6000)
    assert np.array_equal(load(open_audio(item), item.channel, start=item.start, frames=item.frames), want)


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_header_index_equals_tarfile(tmp_path, fmt):
    """The header-only indexer gives tarfile's offsets and sizes, long and non-ASCII names too."""
    from mimi_extract.sources.tar import _index_with_tarfile, index_tar

    path = tmp_path / "x.tar"
    names = ["a.wav", "dir/b.flac", "d" * 90 + "/" + "e" * 60 + ".json", "caf\u00e9.json", "big.wav"]
    if fmt == tarfile.USTAR_FORMAT:
        names[3] = "plain.json"
    with tarfile.open(path, "w", format=fmt) as tf:
        for i, name in enumerate(names):
            add_bytes(tf, name, bytes(range(256)) * (i * 7 + 1) if name != "big.wav" else b"x" * 100_000)
    keep = lambda name: name.endswith(".json")  # noqa: E731
    fast, damage = index_tar(str(path), keep)
    assert damage is None and fast == _index_with_tarfile(str(path), keep)[0]
    assert [m[0] for m in fast] == names and all((m[3] is not None) == m[0].endswith(".json") for m in fast)


def test_tar_bad_inputs_are_error_rows(loose, tmp_path):
    """Truncated shard (the samples before the damage are kept), a sample without audio, a member
    that is not audio, duplicate keys inside a shard and across shards, a bad sidecar."""
    good = write_tar(tmp_path / "s-0.tar", loose, ["a.flac", "b.wav", "c.flac"],
                     extra=[("noaudio.json", b'{"id": "n"}'), ("garbage.flac", b"not audio at all" * 10),
                            ("garbage.json", b'{"id": "g"}'),
                            ("a.flac", open(os.path.join(loose, "e.flac"), "rb").read()),
                            ("badjson.wav", open(os.path.join(loose, "f.wav"), "rb").read()),
                            ("badjson.json", b"[1, 2")])
    with open(good, "rb") as f:
        data = f.read()
    from mimi_extract.sources.tar import index_tar

    b_offset = index_tar(good)[0][2][1]  # (name, offset, size) of b.wav
    with open(tmp_path / "s-1.tar", "wb") as f:  # truncated inside its second sample's audio
        f.write(data[: b_offset + 2000])
    write_tar(tmp_path / "s-2.tar", loose, ["b.wav"])  # the same id as in s-0: duplicate across shards
    found = discover(str(tmp_path / "s-*.tar"), options=Options(id_field="id"))
    errors = {it.key: it.error for it in found.bad}
    assert {it.key for it in found.items} == {"a.flac", "b.wav", "c.flac"}
    assert "no audio member" in errors["s-0.tar/noaudio"]
    assert "unreadable or corrupt audio header" in errors["g"]
    assert "no .json sidecar" in errors["s-0.tar/a"]  # the second 'a' sample, with no sidecar
    assert "is not valid JSON" in errors["s-0.tar/badjson"]
    assert "truncated at byte" in errors["s-1.tar@damage"]
    assert any("duplicate key 'a.flac'" in e for e in errors.values())  # s-1's first sample (intact)
    assert any("duplicate key 'b.wav'" in e for e in errors.values())  # s-2


@pytest.mark.parametrize("form", ["data", "saved"])
def test_parquet_equals_loose_files(hf_dataset, loose_run, tiny_model_dir, tmp_path, form):
    out = str(tmp_path / "out")
    summary = extract(os.path.join(hf_dataset, form), out, settings(tiny_model_dir), options=Options(id_column="id"))
    assert summary.ok == len(FILES)
    assert_equal_arrays(check_consistency(out), loose_run)
    if form == "data":
        checks, problems = verify_outputs(out, sample=2)
        assert not problems and all(c.error is None for c in checks)
        found = discover(os.path.join(hf_dataset, form, "train-*.parquet"))  # a pattern; keys <file>/<row>
        assert found.kind == "parquet"
        assert sorted(it.key for it in found.items)[0] == "train-00000-of-00001.parquet/0"
        assert {it.loc.group for it in found.items} == {0, 1, 2}  # three row groups of two rows


def test_parquet_bad_inputs(loose, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a", "b"]}), tmp_path / "noaudio.parquet")
    with pytest.raises(ValueError, match="no audio column"):
        discover(str(tmp_path / "noaudio.parquet"))
    good = open(os.path.join(loose, "a.flac"), "rb").read()
    audio = pa.array([{"bytes": good, "path": "a.flac"}, {"bytes": None, "path": "gone.flac"},
                      {"bytes": b"garbage" * 20, "path": "g.flac"}] * 2,
                     pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"audio": audio}), path, row_group_size=3, compression="snappy")
    found = discover(str(path))
    errors = {it.key: it.error for it in found.bad}
    assert sorted(it.key for it in found.items) == ["x.parquet/0", "x.parquet/3"]
    assert "null audio bytes" in errors["x.parquet/1"] and "corrupt audio header" in errors["x.parquet/2"]
    # a corrupt row group: the second group's pages overwritten with garbage
    md = pq.ParquetFile(path).metadata
    col = md.row_group(1).column(0)
    raw = bytearray(open(path, "rb").read())
    start = col.data_page_offset
    raw[start: start + 64] = b"\xff" * 64
    (tmp_path / "bad").mkdir()
    open(tmp_path / "bad" / "x.parquet", "wb").write(bytes(raw))
    found = discover(str(tmp_path / "bad" / "x.parquet"))
    assert [it.key for it in found.items] == ["x.parquet/0"]
    assert all("row group 1 unreadable" in it.error for it in found.bad if it.key in ("x.parquet/3", "x.parquet/4"))


def test_shar_equals_its_members_as_loose_files(shar, tiny_model_dir, tmp_path):
    """Cut ids are the keys; the arrays equal the very members extracted as loose files; a cut's
    start/duration within its recording is a segment; a MultiCut follows --channel."""
    members = tmp_path / "members"
    for name in sorted(os.listdir(shar)):
        if name.startswith("recording."):
            with tarfile.open(os.path.join(shar, name)) as tf:
                tf.extractall(members, filter="data")
    loose_out, shar_out = str(tmp_path / "loose-out"), str(tmp_path / "shar-out")
    extract(str(members), loose_out, settings(tiny_model_dir))
    summary = extract(shar, shar_out, settings(tiny_model_dir))
    assert summary.ok == len(FILES) and read_run_info(shar_out)["input_kind"] == "shar"
    assert_equal_arrays(check_consistency(shar_out), check_consistency(loose_out), lambda k: k + ".flac")
    each = discover(shar, "each")
    assert {"d#ch0", "d#ch1"} <= {it.key for it in each.items}  # d.wav is stereo: a MultiCut
    # as the docs say (docs/inputs.md): the cuts' recording is the input's recording tar, which lhotse
    # cannot load as audio (the input's own Shar fields give it); the features load
    from lhotse.audio.utils import AudioLoadingError

    import mimi_extract

    cut = next(iter(mimi_extract.read_cuts(shar_out)))
    assert cut.load_custom("mimi_codes").shape[0] > 0
    with pytest.raises(AudioLoadingError):
        cut.load_audio()
    # a cut with an offset: rewrite shard 0's first cut as 0.2 s from 0.1 s
    cuts_file = os.path.join(shar, "cuts.000000.jsonl.gz")
    lines = gzip.open(cuts_file, "rt").read().splitlines()
    first = json.loads(lines[0])
    first.update(start=0.1, duration=0.2)
    seg = tmp_path / "seg"
    seg.mkdir()
    with gzip.open(seg / "cuts.000000.jsonl.gz", "wt") as f:
        f.write("\n".join([json.dumps(first)] + lines[1:]) + "\n")
    os.symlink(os.path.join(shar, "recording.000000.tar"), seg / "recording.000000.tar")
    with gzip.open(seg / "cuts.000001.jsonl.gz", "wt") as f:  # its recording tar is missing
        f.write(gzip.open(os.path.join(shar, "cuts.000001.jsonl.gz"), "rt").read())
    found = discover(str(seg))
    item = next(it for it in found.items if it.key == first["id"])
    rate = FILES[first["id"] + ".flac"][1] if first["id"] + ".flac" in FILES else FILES[first["id"] + ".wav"][1]
    assert (item.start, item.frames, item.segment) == (round(0.1 * rate), round(0.2 * rate), (0.1, 0.30000000000000004))
    assert all("recording.000001.tar is missing" in it.error for it in found.bad) and len(found.bad) == 2


# -- PyAV decoder ---------------------------------------------------------------------------
def write_with_pyav(path: str, container: str, codec: str, rate: int, samples: int, seed: int = 0) -> None:
    av = pytest.importorskip("av")
    rng = np.random.default_rng(seed)
    data = (0.2 * rng.standard_normal(samples)).astype(np.float32)
    with av.open(path, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout="mono")
        fmt = stream.codec_context.codec.audio_formats[0].name
        for i in range(0, samples, 1024):
            block = data[i: i + 1024]
            frame = av.AudioFrame.from_ndarray(block[None] if fmt.endswith("p") else block[None], format="fltp" if fmt.endswith("p") else "flt", layout="mono")
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


def ffmpeg_samples(path: str) -> int:
    """What FFmpeg itself decodes (PyAV's plain decode loop, outside the tool)."""
    import av

    with av.open(path) as f:
        return sum(frame.samples for frame in f.decode(audio=0))


def test_pyav_formats_decode_and_encode(tmp_path, tiny_model_dir):
    """m4a/AAC and Opus-in-WebM made here through PyAV: decoded by PyAV (chosen by extension),
    their lengths are FFmpeg's, and they encode; run.json records both decoders."""
    from mimi_extract.audio.decoders import decoder_for
    from mimi_extract.audio.reader import load

    root = tmp_path / "in"
    root.mkdir()
    write_with_pyav(str(root / "x.m4a"), "mp4", "aac", 44_100, 30_000)
    write_with_pyav(str(root / "y.webm"), "webm", "libopus", 48_000, 40_000, seed=1)
    assert decoder_for("x.m4a") == decoder_for("y.webm") == decoder_for("z.mp3") == "pyav"
    assert decoder_for("w.flac") == "soundfile"
    found = discover(str(root))
    assert not found.bad
    for it in found.items:
        assert it.frames == ffmpeg_samples(it.path)
        assert load(it.path).shape[-1] == -(-it.frames * 24_000 // it.sample_rate)
    out = str(tmp_path / "out")
    assert extract(str(root), out, settings(tiny_model_dir)).ok == 2
    decoders = read_run_info(out)["decoders"]
    assert decoders["soundfile"].startswith("soundfile") and decoders["pyav"].startswith("av ")
    assert decoders["dr_flac"].startswith("miniaudio ")  # (FLAC read whole, since 0.4)
    # verify: the engine vs each item alone
    checks = verify_source(str(root), settings(tiny_model_dir, batch_size=4))
    assert all(c.error is None and c.note is None for c in checks)
    # the same files as tar members: decoded through PyAV from the shard, in place
    shard = write_tar(tmp_path / "av.tar", str(root), ["x.m4a", "y.webm"], sidecar=False)
    for it in discover(shard).items:
        name = it.loc.name
        assert np.array_equal(load(open_audio(it), start=it.start, frames=it.frames), load(str(root / name)))


def test_mp3_decoder_is_fixed_and_recorded(tmp_path, tiny_model_dir, monkeypatch):
    """MP3 goes to FFmpeg (priming and gapless trimming differ between decoders: one decoder per
    format); a resume whose decoders differ from run.json's is refused, never mixed."""
    import mimi_extract.audio.decoders as audio
    import mimi_extract.store.run_info as run_info

    root = tmp_path / "mp3"
    root.mkdir()
    for i in range(2):
        write_with_pyav(str(root / f"m{i}.mp3"), "mp3", "libmp3lame", 24_000, 12_000 + 5000 * i, seed=i)
    found = discover(str(root))
    assert len(found.items) == 2
    assert [it.frames for it in found.items] == [ffmpeg_samples(it.path) for it in found.items]  # FFmpeg's count
    out = str(tmp_path / "out")
    assert extract(str(root), out, settings(tiny_model_dir), limit=1).ok == 1
    decoders = read_run_info(out)["decoders"]
    assert "libavcodec" in decoders["pyav"] and ".mp3" in decoders["pyav_extensions"]
    other = dict(audio.decoder_versions(), pyav="av 0.0, libavcodec 0.0")
    monkeypatch.setattr(run_info, "decoder_versions", lambda: other)
    with pytest.raises(OutputError, match="decoders"):
        extract(str(root), out, settings(tiny_model_dir))
    monkeypatch.undo()
    assert extract(str(root), out, settings(tiny_model_dir)).ok == 1  # same decoders: resumes
    info_path = os.path.join(out, "run.json")  # an OUT made before decoders were recorded resumes
    info = read_run_info(out)
    del info["decoders"]
    with open(info_path, "w") as f:
        json.dump(info, f)
    assert extract(str(root), out, settings(tiny_model_dir)).skipped == 2


# -- compressed tar --------------------------------------------------------------------------
def test_tgz_in_buffer_groups_equals_loose_files(loose, loose_run, tiny_model_dir, tmp_path):
    """A .tar.gz read forward in groups of --sort-buffer-mb (here ~40 KB: several groups) gives
    the loose files' arrays; each group is length-sorted alone; a truncated .tgz keeps the samples
    before the damage and names it in an error row."""
    import gzip as gz

    plain = write_tar(tmp_path / "x.tar", loose, sorted(FILES))
    with open(plain, "rb") as f:
        raw = f.read()
    (tmp_path / "z").mkdir()
    with gz.open(tmp_path / "z" / "x.tar.gz", "wb") as f:
        f.write(raw)
    options = Options(id_field="id", sort_buffer_mb=0.04)
    found = discover(str(tmp_path / "z" / "x.tar.gz"), options=options)
    assert found.kind == "tgz" and not found.bad
    groups = sorted({it.loc.group for it in found.items})
    assert len(groups) >= 3 and groups == list(range(len(groups)))
    out = str(tmp_path / "out")
    summary = extract(str(tmp_path / "z" / "x.tar.gz"), out, settings(tiny_model_dir), options=options)
    assert summary.ok == len(FILES)
    assert_equal_arrays(check_consistency(out), loose_run)
    checks, problems = verify_outputs(out, sample=2)
    assert not problems and all(c.error is None for c in checks)
    with gz.open(tmp_path / "cut.tgz", "wb") as f:  # the stream ends inside the fourth sample's audio
        from mimi_extract.sources.tar import index_tar

        f.write(raw[: index_tar(plain)[0][6][1] + 1000])
    found = discover(str(tmp_path / "cut.tgz"), options=Options(id_field="id"))
    assert sorted(it.key for it in found.items) == sorted(FILES)[:3]
    assert [it.key for it in found.bad] == ["cut.tgz@damage"] and "truncated" in found.bad[0].error


def test_tgz_members_over_the_spill_size_go_through_temporary_files(loose, loose_run, tiny_model_dir, tmp_path,
                                                                     monkeypatch):
    """A .tar.gz member over ``SPILL_BYTES`` (64 MiB; here 50 kB, so that two of the six are) is never
    held in memory: probing and encoding stream it into an unlinked temporary file, it sits in a group
    of its own (its bytes alone), and the arrays equal the loose files'.  (The peak RSS of a real 3 GiB bomb:
    ``scripts/bench_memory.py``, docs/inputs.md.)"""
    import gzip as gz

    from mimi_extract.sources import tgz

    plain = write_tar(tmp_path / "x.tar", loose, sorted(FILES))
    with open(plain, "rb") as f, gz.open(tmp_path / "x.tar.gz", "wb") as g:
        g.write(f.read())
    monkeypatch.setattr(tgz, "SPILL_BYTES", 50_000)
    spilled = []
    real_spill = tgz.spill

    def counted(source, size, name, where):
        spilled.append((name, size))
        return real_spill(source, size, name, where)

    monkeypatch.setattr(tgz, "spill", counted)
    big = sorted(n for n in FILES if os.path.getsize(os.path.join(loose, n)) > 50_000)
    assert len(big) == 2, big
    found = discover(str(tmp_path / "x.tar.gz"), options=Options(id_field="id"))
    assert not found.bad and sorted(it.key for it in found.items) == sorted(FILES)
    assert sorted({n for n, _ in spilled}) == big and all(size > 50_000 for _, size in spilled)  # probing
    for it in found.items:  # a group of its own, just its bytes (never read whole with its neighbours')
        if it.key in big:
            assert (it.loc.start, it.loc.end) == (it.loc.offset, it.loc.offset + it.loc.size), it.loc
            assert [o.key for o in found.items if o.loc.group == it.loc.group] == [it.key]
    spilled.clear()
    out = str(tmp_path / "out")
    summary = extract(str(tmp_path / "x.tar.gz"), out, settings(tiny_model_dir),
                      options=Options(id_field="id"))
    assert summary.ok == len(FILES) and summary.errors == 0
    assert sorted({n for n, _ in spilled}) == big  # encoding
    assert_equal_arrays(check_consistency(out), loose_run)


def test_cli_input_flags(shards, loose_run, tiny_model_dir, tmp_path):
    """The Input flags reach the source: --id-field keys, --input-format named, a bad kind refused."""
    from support import ONE_WORKER

    out = tmp_path / "out"
    result = cli("codes", shards, out, "--model", tiny_model_dir, *ONE_WORKER, "--id-field", "id",
                 "--input-format", "tar", "--audio-ext", "flac,wav")
    assert result.exit_code == 0, result.output
    assert_equal_arrays(check_consistency(str(out)), loose_run)
    result = cli("codes", shards, tmp_path / "o2", "--model", tiny_model_dir, *ONE_WORKER, "--input-format", "zip")
    assert result.exit_code == 2 and "choose from" in result.text
    assert "--sort-buffer-mb" in cli("codes", "--help", env={"COLUMNS": "300"}).text


# -- sidecar durations (Emilia), NeMo manifests, --key stem --------------------------------------
def emilia_shard(tmp_path, count=6):
    """An Emilia-shaped WebDataset: ``<id>.mp3`` + ``<id>.json`` with Emilia's fields, the duration
    rounded to 3 decimals as Emilia writes it (above the file's length for some, below for others);
    the same mp3s as loose files in ``loose/``."""
    loose = tmp_path / "loose"
    loose.mkdir()
    shard = str(tmp_path / "EN-B000000.tar")
    overshoot = []
    with tarfile.open(shard, "w") as tf:
        for i in range(count):
            ident = f"EN_B00000_S0000{i}_W000000"
            path = str(loose / f"{ident}.mp3")
            write_with_pyav(path, "mp3", "libmp3lame", 24_000, 9000 + 1237 * i, seed=i)
            seconds = sf.info(path).frames / 24_000
            overshoot.append(round(seconds, 3) > seconds)
            with open(path, "rb") as f:
                add_bytes(tf, f"{ident}.mp3", f.read())
            add_bytes(tf, f"{ident}.json", json.dumps(
                {"id": ident, "wav": f"EN_B00000/EN_B00000_S0000{i}/mp3/{ident}.mp3", "text": f" Words {i}.",
                 "duration": round(seconds, 3), "speaker": f"EN_B00000_S0000{i}", "language": "en",
                 "dnsmos": 3.25}).encode())
    assert any(overshoot) and not all(overshoot)  # both roundings are exercised
    return shard, str(loose)


def test_emilia_sidecar_duration_is_the_whole_file(tmp_path, tiny_model_dir):
    """A sidecar's 3-decimal duration is the file's length as written, not a segment: every item is
    encoded whole and equals the same mp3 encoded as a loose file (frame counts and values); the
    sidecar's other fields are the item's ``meta``.  (Before: past-the-end error rows for those
    rounded up, the others cut short by up to 0.5 ms.)"""
    from support import ONE_WORKER

    shard, loose = emilia_shard(tmp_path)
    found = discover(shard, options=Options(id_field="id"))
    assert not found.bad and all(it.segment is None and it.frames == it.file_frames for it in found.items)
    assert found.items[0].meta == {"wav": "EN_B00000/EN_B00000_S00000/mp3/EN_B00000_S00000_W000000.mp3",
                                   "text": " Words 0.", "speaker": "EN_B00000_S00000", "language": "en",
                                   "dnsmos": 3.25}
    out = tmp_path / "out"
    result = cli("codes", shard, out, "--model", tiny_model_dir, *ONE_WORKER, "--id-field", "id")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in open(out / "manifest.jsonl")]
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows), rows
    reference = str(tmp_path / "ref")  # the whole files, loose
    assert extract(loose, reference, settings(tiny_model_dir)).ok == 6
    assert_equal_arrays(check_consistency(str(out)), check_consistency(reference), lambda k: k + ".mp3")
    checks, problems = verify_outputs(str(out), sample=None)  # each item alone (transformers), from the shard
    assert not problems and len(checks) == 6
    assert all(c.error is None and not [m for m in c.mismatches if not m.tie] for c in checks), checks
    assert "--sidecar-duration" not in read_run_info(str(out))["items"]
    # --sidecar-duration segment: the old reading (cut at the rounded length), recorded in run.json;
    # a resume with another choice is refused
    result = cli("codes", shard, tmp_path / "seg", "--model", tiny_model_dir, *ONE_WORKER, "--id-field", "id",
                 "--sidecar-duration", "segment")
    assert result.exit_code == 0, result.output
    assert read_run_info(str(tmp_path / "seg"))["items"]["--sidecar-duration"] == "segment"
    found = discover(shard, options=Options(id_field="id", sidecar_duration="segment"))
    assert all(it.segment is not None and it.segment[0] == 0 for it in found.items) and not found.bad
    assert any(it.frames < it.file_frames for it in found.items)  # rounded down: cut there
    assert any(it.frames == it.file_frames for it in found.items)  # rounded up, < 10 ms: clamped to the end
    result = cli("codes", shard, tmp_path / "seg", "--model", tiny_model_dir, *ONE_WORKER, "--id-field", "id")
    assert result.exit_code == 2 and "--sidecar-duration: 'segment' -> not given" in result.text, result.text
    # ignore: the whole file, whatever the duration says
    assert all(it.frames == it.file_frames for it in discover(shard, options=Options(sidecar_duration="ignore")).items)


def test_duration_alone_segment_rules(tmp_path):
    """In a list (and a sidecar): a duration alone within 10 ms of the file's length is the whole
    file; clearly shorter, a segment from 0; longer by more than 10 ms, an error row.  A segment
    whose end passes the file's end by <= 10 ms is clamped to the end, by more: an error row."""
    sf.write(str(tmp_path / "a.wav"), np.zeros(16_000, np.float32), 16_000)  # 1 s
    rows = [{"path": "a.wav", "id": "whole", "duration": 1.004}, {"path": "a.wav", "id": "under", "duration": 0.9965},
            {"path": "a.wav", "id": "short", "duration": 0.5}, {"path": "a.wav", "id": "long", "duration": 1.02},
            {"path": "a.wav", "id": "clamp", "start": 0.5, "end": 1.0004}, {"path": "a.wav", "id": "past",
                                                                              "start": 0.5, "end": 1.2},
            {"path": "a.wav", "duration": 0.999}]
    with open(tmp_path / "l.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    found = discover(str(tmp_path / "l.jsonl"))
    got = {it.key: (it.start, it.frames, it.segment) for it in found.items}
    assert got == {"whole": (0, 16_000, None), "under": (0, 16_000, None), "short": (0, 8000, (0.0, 0.5)),
                   "clamp": (8000, 8000, (0.5, 1.0)), "a.wav": (0, 16_000, None)}
    assert {it.key: "past the end" in it.error for it in found.bad} == {"long": True, "past": True}


def test_nemo_manifest_equals_single_item_references(tmp_path, tiny_model_dir):
    """A NeMo manifest (``manifest.json``, JSON lines: audio_filepath relative to the manifest's
    folder, duration, offset, text) is a list: offset + duration a segment, a duration alone (offset
    0) the whole file; ``text`` is the item's meta.  Each item equals its own single-item reference."""
    (tmp_path / "wavs").mkdir()
    rng = np.random.default_rng(5)
    rows = []
    for i, n in enumerate((20_000, 13_337, 31_001)):
        sf.write(str(tmp_path / "wavs" / f"u{i}.wav"), (0.2 * rng.standard_normal(n)).astype(np.float32), 16_000,
                 subtype="PCM_16")
        rows.append({"audio_filepath": f"wavs/u{i}.wav", "duration": round(n / 16_000, 2), "offset": 0.0,
                     "text": f"utterance {i}"})
    rows.append({"audio_filepath": "wavs/u2.wav", "duration": 0.5, "offset": 0.25, "text": "a segment"})
    manifest = tmp_path / "manifest.json"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = discover(str(manifest))
    assert found.kind == "list" and not found.bad
    got = {it.key: (it.start, it.frames, it.meta) for it in found.items}
    assert got == {"wavs/u0.wav": (0, 20_000, {"text": "utterance 0"}), "wavs/u1.wav": (0, 13_337, {"text": "utterance 1"}),
                   "wavs/u2.wav": (0, 31_001, {"text": "utterance 2"}),
                   "wavs/u2.wav@0.25-0.75": (4000, 8000, {"text": "a segment"})}
    out = str(tmp_path / "out")
    assert extract(str(manifest), out, settings(tiny_model_dir)).ok == 4
    checks, problems = verify_outputs(out, sample=None)  # each item alone, from its stored start/frames
    assert not problems and len(checks) == 4
    assert all(c.error is None and not [m for m in c.mismatches if not m.tie] for c in checks), checks
    stored = check_consistency(out)  # the whole files: as the same files in a directory
    loose = str(tmp_path / "loose")
    assert extract(str(tmp_path / "wavs"), loose, settings(tiny_model_dir)).ok == 3
    want = check_consistency(loose)
    for i in range(3):
        assert np.array_equal(stored[f"wavs/u{i}.wav"], want[f"u{i}.wav"])


def test_key_stem(shards, loose, tmp_path, tiny_model_dir):
    """--key stem: a tar sample's and a list's or directory's file's stem is its key (joins with a
    corpus TSV); recorded in run.json, a resume with the default refused."""
    from support import ONE_WORKER

    assert sorted(it.key for it in discover(shards, options=Options(key="stem")).items) == sorted(
        n.split(".")[0] for n in FILES)
    assert sorted(it.key for it in discover(loose, options=Options(key="stem")).items) == sorted(
        n.split(".")[0] for n in FILES)
    out = tmp_path / "out"
    result = cli("codes", shards, out, "--model", tiny_model_dir, *ONE_WORKER, "--key", "stem", "--limit", "2")
    assert result.exit_code == 0, result.output
    assert {json.loads(line)["key"] for line in open(out / "manifest.jsonl")} == {"a", "b"}
    assert read_run_info(str(out))["items"]["--key"] == "stem"
    result = cli("codes", shards, out, "--model", tiny_model_dir, *ONE_WORKER, "--limit", "2")
    assert result.exit_code == 2 and "--key: 'stem' -> not given" in result.text, result.text


def test_hostile_names_never_reach_out(loose, tmp_path, tiny_model_dir):
    """Member names ``../x`` and ``/abs`` are error rows (not keys ``t.tar/../x``); ``./a`` is
    ``a``; a list id that climbs (``../../pwn/y``) is an error row; a list path that climbs is no
    Shar member name (an error row with --format shar): OUT's tars name nothing outside."""
    from support import ONE_WORKER

    wav = open(os.path.join(loose, "b.wav"), "rb").read()
    shard = str(tmp_path / "t.tar")
    with tarfile.open(shard, "w") as tf:
        for name in ("../x.wav", "../../pwn/y.wav", "./z.wav", "/abs/w.wav", "ok.wav"):
            add_bytes(tf, name, wav)
    found = discover(shard)
    assert sorted(it.key for it in found.items) == ["t.tar/ok", "t.tar/z"]
    assert sorted(it.key for it in found.bad) == ["t.tar/%2Fabs%2Fw", "t.tar/..%2F..%2Fpwn%2Fy", "t.tar/..%2Fx"]
    assert all("climbs out of the shard" in it.error for it in found.bad)
    (tmp_path / "lists").mkdir()
    with open(tmp_path / "lists" / "l.jsonl", "w") as f:
        f.write(json.dumps({"path": "../in/b.wav", "id": "../../pwn/y"}) + "\n")
        f.write(json.dumps({"path": "../in/b.wav"}) + "\n")
        f.write(json.dumps({"path": "../in/b.wav", "id": "fine/b"}) + "\n")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "b.wav").write_bytes(wav)
    for source, ok in ((shard, 2), (str(tmp_path / "lists" / "l.jsonl"), 2)):
        out = tmp_path / ("out-" + os.path.basename(source))
        result = cli("codes", source, out, "--model", tiny_model_dir, *ONE_WORKER, "--format", "shar")
        assert result.exit_code == 0, result.output
        rows = [json.loads(line) for line in open(out / "manifest.jsonl")]
        assert sum(r["status"] == "ok" for r in rows) == ok and all(
            ".." not in r["key"].split("/") and not r["key"].startswith("/") for r in rows if r["status"] == "ok")
        for name in os.listdir(out / "shar"):
            if name.endswith(".tar"):
                with tarfile.open(out / "shar" / name) as tf:
                    assert all(".." not in m.split("/") and not m.startswith("/") for m in tf.getnames())
    errors = {r["key"]: r["error"] for r in rows if r["status"] == "error"}
    assert list(errors) == ["line 1"] and "climbs out of its folder" in errors["line 1"]
    # a path that climbs out of the list's folder is keyed from the corpus root, where it does not climb
    assert sorted(r["key"] for r in rows if r["status"] == "ok") == ["b.wav", "fine/b"]


@pytest.mark.parametrize("compressed", [False, True])
def test_tar_cut_between_members_is_damage(tmp_path, compressed):
    """A shard cut exactly at a member boundary or inside a member's padding (no end-of-archive
    marker), or whose size is not a multiple of 512: the samples before are kept and one
    ``<shard>@damage`` error row names the offset (the rest of the shard was lost unsaid)."""
    import gzip as gz

    from mimi_extract.sources.tar import index_tar

    full = str(tmp_path / "full.tar")
    with tarfile.open(full, "w") as tf:
        for i in range(10):
            wav = io.BytesIO()
            sf.write(wav, np.full(1000 + 37 * i, 0.1, np.float32), 16_000, format="WAV", subtype="PCM_16")
            add_bytes(tf, f"s{i}.wav", wav.getvalue())
            add_bytes(tf, f"s{i}.json", json.dumps({"text": "x" * (i + 1)}).encode())
    raw = open(full, "rb").read()
    _, offset, size, _ = index_tar(full)[0][9]  # s4.json: the fifth sample's last member
    boundary, padding = offset + -(-size // 512) * 512, offset + size + 10
    ext = ".tar.gz" if compressed else ".tar"
    for label, cut in (("boundary", boundary), ("padding", padding), ("odd", len(raw) - 100)):
        path = str(tmp_path / f"{label}{ext}")
        with (gz.open(path, "wb") if compressed else open(path, "wb")) as f:
            f.write(raw[:cut])
        found = discover(path)
        kept = 10 if label == "odd" else 5
        assert sorted(it.key for it in found.items) == [f"{label}{ext}/s{i}" for i in range(kept)], label
        (bad,) = found.bad
        assert bad.key == f"{label}{ext}@damage"
        assert (f"at byte {cut}" if label != "odd" else f"({cut} bytes) is not a multiple of 512") in bad.error
    assert not discover(full).bad


def test_cli_shard_pattern_messages(shards, tiny_model_dir, tmp_path):
    """A brace pattern naming a shard that does not exist says which (it said "matches nothing"
    unless --input-format tar); a pattern the shell expanded into several arguments gets a hint
    to quote it (it got typer's bare "unexpected extra argument")."""
    from support import ONE_WORKER

    result = cli("codes", os.path.join(shards, "en-{000000..000002}.tar"), tmp_path / "o1", "--model", tiny_model_dir,
                 *ONE_WORKER)
    assert result.exit_code == 2 and "en-000002.tar" in result.text and "does not exist" in result.text, result.text
    result = cli("codes", os.path.join(shards, "en-000000.tar"), os.path.join(shards, "en-000001.tar"),
                 tmp_path / "o2", "--model", tiny_model_dir, *ONE_WORKER)
    assert result.exit_code == 2 and "unexpected extra argument" in result.text and "quote" in result.text, result.text
    result = cli("verify", os.path.join(shards, "en-000000.tar"), os.path.join(shards, "en-000001.tar"))
    assert result.exit_code == 2 and "quote" in result.text, result.text


def test_a_large_cell_alone_in_its_row_group_is_refused_from_the_footer_unread(loose, tmp_path, monkeypatch):
    """A cell in a one-row row group (as large cells are written) over MIMI_EXTRACT_MAX_CELL_MB is
    refused from the file's footer: its row group is never read (a 300 MB cell costs no memory)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mimi_extract.sources import parquet as parquet_source

    small = open(os.path.join(loose, "a.flac"), "rb").read()
    big = small + b"\0" * (1_000_000 - len(small))  # 0.95 MiB: over a 0.25 MiB limit, footer slack included
    audio = pa.array([{"bytes": small, "path": "a.flac"}, {"bytes": big, "path": "big.flac"}],
                     pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"audio": audio}), path, row_group_size=1)
    monkeypatch.setenv(parquet_source.MAX_CELL_ENV, "0.25")
    read_groups = []
    real = parquet_source._group_column

    def counted(path, group, column):
        read_groups.append(group)
        return real(path, group, column)

    monkeypatch.setattr(parquet_source, "_group_column", counted)
    found = discover(str(path))
    assert [it.key for it in found.items] == ["x.parquet/0"]
    (bad,) = found.bad
    assert bad.key == "x.parquet/1" and "audio cell of about 1.0 MiB is over the 0.25 MiB limit" in bad.error, bad.error
    assert 1 not in read_groups and 0 in read_groups, read_groups


PEAK_CHILD = r"""
import json, sys


def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024


from mimi_extract.sources import discover

discover(sys.argv[2])  # every import that probing takes, before the peak is reset
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak RSS (VmHWM) is reset to the RSS now
base = status("VmRSS")
found = discover(sys.argv[1])
print(json.dumps({"growth_mib": status("VmHWM") - base, "items": sorted(it.key for it in found.items),
                  "errors": [it.error for it in found.bad]}))
"""


@pytest.mark.slow
def test_refusing_a_large_cell_that_shares_its_row_group_does_not_decode_it(loose, tmp_path):
    """A 64 MiB cell over an 8 MiB MIMI_EXTRACT_MAX_CELL_MB, written with two small cells in one row
    group (one page), is refused from its page without pyarrow decoding the row group: the peak RSS
    of a fresh process probing the file grows by a few MiB where the codec streams (zstd; pyarrow's
    read took 200-330 MiB more), and by at most the page's stored and uncompressed bytes where it
    does not (snappy: the page decompressed whole; pyarrow: about 3x).  Measured from the process's
    own peak (``/proc/self/clear_refs``), nothing timed; the good cells still probe."""
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    small = open(os.path.join(loose, "a.flac"), "rb").read()
    dither = np.random.default_rng(0).integers(-1, 2, 32 << 20).astype("<i2").tobytes()  # like a quiet WAV
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    cells = [{"bytes": small, "path": "a.flac"}, {"bytes": small + dither, "path": "big.wav"},
             {"bytes": small, "path": "c.flac"}]
    pq.write_table(pa.table({"audio": pa.array(cells[:1], kind)}), tmp_path / "warm.parquet")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MIMI_EXTRACT_MAX_CELL_MB": "8"}
    for codec, bound_mib in (("zstd", lambda stored: 16), ("snappy", lambda stored: 64 + stored + 16)):
        path = tmp_path / f"{codec}.parquet"
        pq.write_table(pa.table({"audio": pa.array(cells, kind)}), path, compression=codec, row_group_size=3)
        stored = os.path.getsize(path) / (1 << 20)
        run = subprocess.run([sys.executable, "-c", PEAK_CHILD, str(path), str(tmp_path / "warm.parquet")],
                             capture_output=True, text=True, env=env)
        assert run.returncode == 0, run.stderr
        result = json.loads(run.stdout.strip().splitlines()[-1])
        assert result["items"] == [f"{codec}.parquet/0", f"{codec}.parquet/2"], result
        assert result["errors"] == [f"{codec}.parquet:row 1: audio cell of 64.0 MiB is over the 8 MiB limit of one "
                                    "Parquet cell (set MIMI_EXTRACT_MAX_CELL_MB to raise it)"], result
        assert result["growth_mib"] < bound_mib(stored), (codec, stored, result)


@pytest.mark.parametrize("encoding", ["PLAIN", "DELTA_LENGTH_BYTE_ARRAY"])
def test_a_shared_cell_over_the_limit_is_refused_whether_or_not_the_page_reader_knows_its_encoding(
        loose, tmp_path, monkeypatch, encoding):
    """A row group with a page over the cell limit is read page by page where the page reader knows
    the encoding (PLAIN), by pyarrow as before where it does not (a delta encoding): either way the
    cell over the limit is the same error row and the others are items, equal to pyarrow's cells."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mimi_extract.sources import parquet as parquet_source

    small = open(os.path.join(loose, "a.flac"), "rb").read()
    other = open(os.path.join(loose, "c.flac"), "rb").read()
    big = small + b"\0" * (300_000 - len(small))  # 0.29 MiB: over a 0.25 MiB limit
    audio = pa.array([{"bytes": small, "path": "a.flac"}, {"bytes": big, "path": "big.flac"}, {"bytes": other,
                      "path": None}], pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"audio": audio}), path, row_group_size=3, use_dictionary=False,
                   column_encoding={"audio.bytes": encoding})
    monkeypatch.setenv(parquet_source.MAX_CELL_ENV, "0.25")
    column = parquet_source._group_column(str(path), 0, "audio")
    assert isinstance(column, parquet_source.PageCells) == (encoding == "PLAIN")
    found = discover(str(path))
    assert sorted(it.key for it in found.items) == ["x.parquet/0", "x.parquet/2"]
    assert [it.error for it in found.bad] == ["x.parquet:row 1: audio cell of 0.3 MiB is over the 0.25 MiB limit of "
                                              "one Parquet cell (set MIMI_EXTRACT_MAX_CELL_MB to raise it)"]
    for row, (expected, name) in {0: (small, "a.flac"), 2: (other, None)}.items():
        buffer, path_value = parquet_source._cell(str(path), 0, row, "audio")
        assert buffer.to_pybytes() == expected and path_value == name


def test_a_parquet_cell_over_the_size_limit_is_an_error_row_before_it_is_copied(loose, tiny_model_dir, tmp_path,
                                                                                monkeypatch):
    """MIMI_EXTRACT_MAX_CELL_MB bounds one audio cell: a larger one is a clear error row, its size
    read from the column's offsets (never copied out, never decoded); the others encode as usual."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mimi_extract.sources import parquet as parquet_source

    small = open(os.path.join(loose, "a.flac"), "rb").read()
    big = small + b"\0" * (300_000 - len(small))  # 0.29 MiB: over a 0.25 MiB limit
    audio = pa.array([{"bytes": small, "path": "a.flac"}, {"bytes": big, "path": "big.flac"},
                      {"bytes": small, "path": "a2.flac"}], pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"audio": audio}), path, row_group_size=2)
    monkeypatch.setenv(parquet_source.MAX_CELL_ENV, "0.25")
    found = discover(str(path))
    errors = {it.key: it.error for it in found.bad}
    assert sorted(it.key for it in found.items) == ["x.parquet/0", "x.parquet/2"]
    assert errors == {"x.parquet/1": "x.parquet:row 1: audio cell of 0.3 MiB is over the 0.25 MiB limit of one "
                                     "Parquet cell (set MIMI_EXTRACT_MAX_CELL_MB to raise it)"}
    out = str(tmp_path / "out")
    summary = extract(str(path), out, settings(tiny_model_dir))
    assert summary.ok == 2 and summary.errors == 1
    arrays = check_consistency(out)
    assert np.array_equal(arrays["x.parquet/0"], arrays["x.parquet/2"])  # the same audio: the same codes
    monkeypatch.setenv(parquet_source.MAX_CELL_ENV, "1")
    assert sorted(it.key for it in discover(str(path)).items) == ["x.parquet/0", "x.parquet/1", "x.parquet/2"]
