"""Input metadata reaches the outputs (``--keep-fields`` / ``--keep-columns``): tar sidecars, list
rows and Parquet columns become Parquet columns (read by ``datasets``) and the cuts' supervisions
and custom fields (read by lhotse); a lhotse CutSet's or Shar's supervisions become the output
cuts' own, at the same times.  Everything is read back by the real libraries."""

import io
import json
import os
import tarfile

import numpy as np
import pytest
import soundfile as sf

lhotse = pytest.importorskip("lhotse")
datasets = pytest.importorskip("datasets")

from support import ONE_WORKER, cli, write_noise  # noqa: E402
from mimi_extract import read, read_cuts, read_manifest  # noqa: E402
from support import extract  # noqa: E402
from mimi_extract.config.settings import Settings  # noqa: E402
from mimi_extract.sources import Options, discover  # noqa: E402
from mimi_extract.store.files import OutputError  # noqa: E402
from mimi_extract.store.identity import read_run_info

# sample -> its sidecar: the first has no speaker (a column null there), one has an int field
SIDECARS = {"u0": {"text": "hello world", "language": "en", "score": 1},
            "u1": {"text": "bonjour", "speaker": "spk-b", "language": "fr", "score": 2, "nested": {"a": [1, 2]}},
            "u2": {"text": "hallo", "speaker": "spk-c", "language": "de", "score": 3.5},
            "u3": {"text": "ciao", "speaker": "spk-d", "start": 0.1, "duration": 0.5}}


def settings(model_dir, fmt="hdf5", **kw):
    return Settings(model=model_dir, tap="codes", num_workers=0, format=fmt, **kw)


def add_bytes(tf, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def webdataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("wds")
    rng = np.random.default_rng(5)
    with tarfile.open(root / "train-000000.tar", "w") as tf:
        for i, (stem, side) in enumerate(SIDECARS.items()):
            buffer = io.BytesIO()
            sf.write(buffer, (0.2 * rng.standard_normal(24_000 + 3000 * i)).astype(np.float32), 24_000, format="FLAC")
            add_bytes(tf, f"{stem}.flac", buffer.getvalue())
            add_bytes(tf, f"{stem}.json", json.dumps(side).encode())
    return str(root / "train-000000.tar")


def key(stem):
    return f"train-000000.tar/{stem}"


def test_sidecars_reach_the_cuts_as_supervisions_and_custom_fields(webdataset, tiny_model_dir, tmp_path):
    out = str(tmp_path / "out")
    summary = extract(webdataset, out, settings(tiny_model_dir), shard_size=2)
    assert summary.ok == 4 and summary.errors == 0
    # lhotse reads OUT's cuts.jsonl.gz itself, and read_cuts builds the same from the manifests
    for cuts in (lhotse.CutSet.from_file(os.path.join(out, "cuts.jsonl.gz")), read_cuts(out)):
        cuts = {c.id: c for c in cuts}
        assert sorted(cuts) == sorted(key(s) for s in SIDECARS)
        for stem, side in SIDECARS.items():
            cut = cuts[key(stem)]
            (sup,) = cut.supervisions
            assert sup.text == side["text"] and sup.speaker == side.get("speaker")
            assert sup.language == side.get("language")
            assert sup.start == 0 and sup.recording_id == cut.recording_id and sup.channel == cut.channel
            assert abs(sup.duration - cut.duration) < 0.08  # the audio, within the cut's frame grid
            assert cut.custom.get("score") == side.get("score")  # the rest: custom fields
            assert "nested" not in cut.custom and "start" not in cut.custom  # default: scalars; the segment is the cut
            assert np.array_equal(cut.load_custom("mimi_codes"), read(out, cut.id))
        assert cuts[key("u3")].start == 0.1 and cuts[key("u3")].supervisions[0].duration == 0.5
    assert cli("info", out).exit_code == 0 and cli("status", out).exit_code == 0
    info = read_run_info(out)
    assert info["metadata"] == {"language": "string", "score": "float64", "speaker": "string", "text": "string"}
    # a resume with other metadata settings is refused (the shards would differ), the same one resumes
    with pytest.raises(OutputError, match="metadata"):
        extract(webdataset, out, settings(tiny_model_dir), options=Options(keep_fields="text"))
    assert extract(webdataset, out, settings(tiny_model_dir)).skipped == 4


def test_an_out_written_before_metadata_was_kept_resumes_with_keep_fields_none(webdataset, tiny_model_dir, tmp_path):
    out = str(tmp_path / "out")
    extract(webdataset, out, settings(tiny_model_dir), options=Options(keep_fields="none"), limit=2)
    path = os.path.join(out, "run.json")
    info = json.load(open(path))
    assert "metadata" not in info and info.pop("keep_fields") == "none"
    json.dump(info, open(path, "w"))  # run.json as the tool wrote it before --keep-fields existed
    with pytest.raises(OutputError, match="--keep-fields none"):
        extract(webdataset, out, settings(tiny_model_dir))  # the new shards would have columns the old lack
    summary = extract(webdataset, out, settings(tiny_model_dir), options=Options(keep_fields="none"))
    assert summary.skipped == 2 and summary.ok == 2
    assert all(not c.supervisions for c in read_cuts(out))


def test_sidecars_become_parquet_columns_aligned_with_the_keys(webdataset, tiny_model_dir, tmp_path):
    out = str(tmp_path / "out")
    assert extract(webdataset, out, settings(tiny_model_dir, "parquet"), shard_size=2).ok == 4  # two shards
    ds = datasets.load_dataset("parquet", data_files=os.path.join(out, "shard-*.parquet"), split="train")
    assert ds.features["text"].dtype == "string" and ds.features["score"].dtype == "float64"
    assert ds.features["speaker"].dtype == "string"  # null in the first shard's first row, string in the schema
    for row in ds:
        stem = row["key"].rsplit("/", 1)[1]
        side = SIDECARS[stem]
        assert (row["text"], row["speaker"], row["language"], row["score"]) == (
            side["text"], side.get("speaker"), side.get("language"), side.get("score"))
        assert np.array_equal(np.array(row["codes"], np.int16), read(out, row["key"]))
    assert "nested" not in ds.features
    assert "| `text` | string or null |" in open(os.path.join(out, "README.md")).read()
    # --keep-fields all: nested values too, as JSON text; a field named by an output column is refused
    out_all = str(tmp_path / "all")
    extract(webdataset, out_all, settings(tiny_model_dir, "parquet"), options=Options(keep_fields="all"))
    ds = datasets.load_dataset("parquet", data_files=os.path.join(out_all, "shard-*.parquet"), split="train")
    nested = {r["key"]: r["nested"] for r in ds}
    assert json.loads(nested[key("u1")]) == {"a": [1, 2]} and nested[key("u0")] is None
    result = cli("codes", webdataset, str(tmp_path / "refused"), "--model", tiny_model_dir, *ONE_WORKER,
                 "--keep-fields", "text,duration")
    assert result.exit_code == 2 and "'duration'" in result.text and not os.path.exists(tmp_path / "refused")
    # --keep-columns text (the same option): only that column; none: no column, no supervision
    out_text = str(tmp_path / "text")
    result = cli("codes", webdataset, out_text, "--model", tiny_model_dir, *ONE_WORKER, "--format", "parquet",
                 "--keep-columns", "text")
    assert result.exit_code == 0, result.text
    ds = datasets.load_dataset("parquet", data_files=os.path.join(out_text, "shard-*.parquet"), split="train")
    assert "text" in ds.features and "speaker" not in ds.features and read_run_info(out_text)["keep_fields"] == "text"
    found = discover(webdataset, options=Options(keep_fields="none"))
    assert all(it.meta is None for it in found.items) and found.metadata == {}


def test_parquet_text_column_reaches_both_outputs(tmp_path, tiny_model_dir):
    rng = np.random.default_rng(9)
    audio, texts = [], ["first", "second", None, "fourth"]
    for i in range(4):
        buffer = io.BytesIO()
        sf.write(buffer, (0.2 * rng.standard_normal(20_000 + 2000 * i)).astype(np.float32), 16_000, format="WAV")
        audio.append({"bytes": buffer.getvalue(), "path": f"x{i}.wav"})
    ds = datasets.Dataset.from_dict({"audio": audio, "id": [f"utt{i}" for i in range(4)], "text": texts,
                                     "speaker_id": [10, 11, 12, 13], "duration": [1.0] * 4}
                                    ).cast_column("audio", datasets.Audio())
    ds.to_parquet(str(tmp_path / "in.parquet"), batch_size=2)
    found = discover(str(tmp_path / "in.parquet"), options=Options(id_column="id"))
    assert found.metadata == {"speaker_id": "int64", "text": "string"}  # never the audio, the id, nor 'duration'
    assert any("duration" in w for w in found.warnings)
    out = str(tmp_path / "pq")
    assert extract(str(tmp_path / "in.parquet"), out, settings(tiny_model_dir, "parquet"),
                   options=Options(id_column="id")).ok == 4
    back = datasets.load_dataset("parquet", data_files=os.path.join(out, "shard-*.parquet"), split="train")
    assert back.features["speaker_id"].dtype == "int64"
    assert {r["key"]: (r["text"], r["speaker_id"]) for r in back} == {
        f"utt{i}": (texts[i], 10 + i) for i in range(4)}
    out = str(tmp_path / "h5")
    extract(str(tmp_path / "in.parquet"), out, settings(tiny_model_dir), options=Options(id_column="id"))
    cuts = {c.id: c for c in read_cuts(out)}
    for i in range(4):
        cut = cuts[f"utt{i}"]
        sup = cut.supervisions[0]  # speaker_id is the supervision's speaker (as text), even without a text
        assert (sup.text, sup.speaker) == (texts[i], str(10 + i)) and "speaker_id" not in cut.custom


def test_list_rows_keep_their_other_fields(tmp_path):
    write_noise(tmp_path / "a.wav", 24_000)
    rows = [{"path": "a.wav", "id": "x", "text": "one", "start": 0.1, "end": 0.5}, {"path": "a.wav", "id": "y"}]
    (tmp_path / "list.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = discover(str(tmp_path / "list.jsonl"))
    assert {it.key: it.meta for it in found.items} == {"x": {"text": "one"}, "y": None}


def lhotse_corpus(root):
    """A stereo and a mono recording; cuts with supervisions (text, speaker, language, custom), one
    a segment with an offset (its supervisions relative to its start), one a MultiCut."""
    rng = np.random.default_rng(11)
    write_noise(root / "talk.wav", 24_000 * 3, rng=rng)
    write_noise(root / "stereo.wav", 16_000 * 2, 16_000, rng=rng, channels=2)
    talk = lhotse.Recording.from_file(str(root / "talk.wav"), recording_id="talk")
    stereo = lhotse.Recording.from_file(str(root / "stereo.wav"), recording_id="stereo")
    sups = [lhotse.SupervisionSegment("t1", "talk", 0.2, 0.8, channel=0, text="good morning", speaker="ann",
                                      language="en", custom={"emotion": "happy"}),
            lhotse.SupervisionSegment("t2", "talk", 1.5, 1.0, channel=0, text="good night", speaker="bob"),
            lhotse.SupervisionSegment("s1", "stereo", 0.1, 0.5, channel=0, text="left"),
            lhotse.SupervisionSegment("s2", "stereo", 0.7, 0.6, channel=1, text="right")]
    cuts = lhotse.CutSet.from_manifests(lhotse.RecordingSet.from_recordings([talk, stereo]),
                                        lhotse.SupervisionSet.from_segments(sups))
    talk_cut = next(c for c in cuts if c.recording_id == "talk").with_custom("corpus", "demo")
    segment = talk_cut.truncate(offset=1.2, duration=1.6).with_id("talk-seg")  # t2 only, at 0.3 s into it
    assert [s.id for s in segment.supervisions] == ["t2"] and abs(segment.supervisions[0].start - 0.3) < 1e-9
    stereo_cut = next(c for c in cuts if c.recording_id == "stereo")
    return lhotse.CutSet.from_cuts([talk_cut, segment, stereo_cut])


def absolute(cut):
    """(id, absolute start in the recording, duration, text, speaker, language) of each supervision."""
    return sorted((s.id, round(cut.start + s.start, 6), round(s.duration, 6), s.text, s.speaker, s.language)
                  for s in cut.supervisions)


def test_cutset_supervisions_and_custom_fields_carry_over(tmp_path, tiny_model_dir):
    cuts = lhotse_corpus(tmp_path)
    cuts.to_file(str(tmp_path / "cuts.jsonl.gz"))
    stereo = cuts[2].id  # a MultiCut: one item per channel, each with the supervisions on its channel
    for fmt in ("hdf5", "parquet"):
        out = str(tmp_path / f"out-{fmt}")
        assert extract(str(tmp_path / "cuts.jsonl.gz"), out, settings(tiny_model_dir, fmt)).ok == 4
        got = {c.id: c for c in read_cuts(out)}
        assert sorted(got) == sorted([cuts[0].id, "talk-seg", f"{stereo}#ch0", f"{stereo}#ch1"])
        assert [s.text for s in got[f"{stereo}#ch0"].supervisions] == ["left"]
        assert [s.text for s in got[f"{stereo}#ch1"].supervisions] == ["right"]
        for cut in cuts[:2]:
            mine = got[cut.id]
            assert abs(mine.start - cut.start) < 1e-9
            assert absolute(mine) == absolute(cut), cut.id  # the same supervisions at the same times
            assert all(s.recording_id == mine.recording_id for s in mine.supervisions)
            assert np.array_equal(mine.load_custom("mimi_codes"), read(out, cut.id))
        assert got["talk-seg"].custom["corpus"] == "demo" and got["talk-seg"].supervisions[0].start == pytest.approx(0.3)
        assert next(s for s in got[cuts[0].id].supervisions if s.id == "t1").custom == {"emotion": "happy"}
        # lhotse's own trimming finds the same audio spans as in the input
        trimmed = {c.supervisions[0].id: (round(c.start, 6), round(c.duration, 6))
                   for c in lhotse.CutSet.from_cuts([got["talk-seg"]]).trim_to_supervisions()}
        want = {c.supervisions[0].id: (round(c.start, 6), round(c.duration, 6))
                for c in lhotse.CutSet.from_cuts([cuts[1]]).trim_to_supervisions()}
        assert trimmed == want
    rows = {r["key"]: r for r in read_manifest(str(tmp_path / "out-parquet"))}
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "out-parquet" / "shard-*.parquet"), split="train")
    sups = {r["key"]: json.loads(r["supervisions"]) for r in ds}
    assert [s["text"] for s in sups["talk-seg"]] == ["good night"] and sups["talk-seg"][0]["start"] == pytest.approx(0.3)
    assert {r["key"]: r["corpus"] for r in ds}["talk-seg"] == "demo" and rows["talk-seg"]["meta"]["corpus"] == "demo"


def test_shar_input_supervisions_reach_the_shar_output(tmp_path, tiny_model_dir):
    cuts = lhotse_corpus(tmp_path)
    shar = tmp_path / "shar-in"
    shar.mkdir()
    cuts.to_shar(str(shar), fields={"recording": "flac"}, shard_size=2)
    out = str(tmp_path / "out")
    summary = extract(str(shar), out, settings(tiny_model_dir, "shar"))
    assert summary.ok == 3 and summary.errors == 0
    theirs = {c.id: c for c in lhotse.CutSet.from_shar(in_dir=str(shar))}
    got = {c.id: c for c in lhotse.CutSet.from_shar(in_dir=os.path.join(out, "shar"))}
    assert sorted(got) == sorted(theirs)
    for cid, cut in theirs.items():
        assert absolute(got[cid]) == absolute(cut), cid
        assert np.array_equal(got[cid].load_custom("mimi_codes"), read(out, cid))
    assert got["talk-seg"].supervisions[0].text == "good night" and got["talk-seg"].custom["corpus"] == "demo"
    # --channel each on a stereo recording: each channel's item keeps the supervisions on that channel
    out = str(tmp_path / "each")
    extract(str(shar), out, settings(tiny_model_dir, "shar", channel="each"))
    got = {c.id: c for c in lhotse.CutSet.from_shar(in_dir=os.path.join(out, "shar"))}
    stereo = cuts[2].id
    assert [s.text for s in got[f"{stereo}#ch0"].supervisions] == ["left"]
    assert [s.text for s in got[f"{stereo}#ch1"].supervisions] == ["right"]


# -- --metadata FILE: a corpus TSV beside the audio (VoxPopuli: train_part_N.tar.gz + a TSV by id) ---------
def test_a_corpus_tsv_joins_a_tar_gz_part_by_member_stem(tmp_path, tiny_model_dir):
    """A VoxPopuli-shaped part (``<id>.ogg`` members in a ``.tar.gz``, no sidecars) and its TSV
    (``id``, ``raw_text``, ``speaker_id``...): each item gets its row's fields in the manifest, the
    Parquet columns (read by ``datasets``) and the cuts (lhotse's supervision text); a row matching no
    item and an item without a row are counted in the run's warnings; run.json records the file."""
    rng = np.random.default_rng(7)
    part = tmp_path / "train_part_0.tar.gz"
    with tarfile.open(part, "w:gz") as tf:
        for i, stem in enumerate(["20180101-0900-PLENARY-1_en", "20180101-0900-PLENARY-2_en", "no-row"]):
            buffer = io.BytesIO()
            sf.write(buffer, (0.2 * rng.standard_normal(24_000 + 4000 * i)).astype(np.float32), 24_000,
                     format="OGG", subtype="VORBIS")
            add_bytes(tf, f"{stem}.ogg", buffer.getvalue())
    tsv = tmp_path / "asr_train.tsv"
    tsv.write_text("id\traw_text\tspeaker_id\tgender\n"
                   "20180101-0900-PLENARY-1_en\tMadam President, thank you.\t1234\tfemale\n"
                   "20180101-0900-PLENARY-2_en\tI agree.\t5678\tmale\n"
                   "20180101-0900-PLENARY-9_en\tnot in this part\t9\tmale\n")
    out = tmp_path / "out"
    result = cli("codes", part, out, "--model", tiny_model_dir, *ONE_WORKER, "--format", "parquet",
                 "--metadata", tsv, "--keep-fields", "raw_text,speaker_id,gender")
    assert result.exit_code == 0, result.output
    assert ("--metadata asr_train.tsv: 1 item(s) have no row (first: 'train_part_0.tar.gz/no-row'; the first "
            "looked up as 'train_part_0.tar.gz/no-row' or 'no-row.ogg' or 'no-row' in column 'id', whose first "
            "unmatched values are '20180101-0900-PLENARY-9_en')") in result.text
    assert "--metadata asr_train.tsv: 1 row(s) match no item (first: '20180101-0900-PLENARY-9_en')" in result.text
    rows = {r["key"]: r for r in read_manifest(out)}
    first = rows["train_part_0.tar.gz/20180101-0900-PLENARY-1_en"]
    assert first["meta"] == {"raw_text": "Madam President, thank you.", "speaker_id": "1234", "gender": "female"}
    assert "meta" not in rows["train_part_0.tar.gz/no-row"]
    table = datasets.load_dataset("parquet", data_files=str(out / "*.parquet"), split="train")
    by_key = {r["key"]: r for r in table}
    assert by_key["train_part_0.tar.gz/20180101-0900-PLENARY-2_en"]["raw_text"] == "I agree."
    assert by_key["train_part_0.tar.gz/no-row"]["raw_text"] is None
    cuts = {c.id: c for c in read_cuts(str(out))}
    assert cuts["train_part_0.tar.gz/20180101-0900-PLENARY-1_en"].supervisions[0].text == "Madam President, thank you."
    assert read_run_info(str(out))["metadata_file"] == str(tsv)
    other = tmp_path / "other.tsv"
    other.write_text(tsv.read_text())
    again = cli("codes", part, out, "--model", tiny_model_dir, *ONE_WORKER, "--format", "parquet",
                "--metadata", other, "--keep-fields", "raw_text,speaker_id,gender")
    assert again.exit_code == 2 and "metadata_file" in again.text, again.text


def test_metadata_by_id_jsonl_and_a_wrong_key_column(tmp_path):
    """JSONL rows join a list's ids; a malformed line is skipped and counted; a --metadata-key no row
    has is one clear error before anything is read."""
    write_noise(tmp_path / "a.wav", 2400)
    write_noise(tmp_path / "b.wav", 2400)
    listing = tmp_path / "list.jsonl"
    listing.write_text('{"path": "a.wav", "id": "utt-a"}\n{"path": "b.wav", "id": "utt-b", "text": "own"}\n')
    meta = tmp_path / "texts.jsonl"
    meta.write_text('{"utt": "utt-a", "text": "from the file", "score": 3}\nnot json\n'
                    '{"utt": "utt-b", "text": "loses to the row\'s own"}\n')
    found = discover(str(listing), options=Options(metadata=str(meta), metadata_key="utt"))
    metas = {i.key: i.meta for i in found.items}
    assert metas == {"utt-a": {"text": "from the file", "score": 3}, "utt-b": {"text": "own"}}
    assert any("1 line(s) skipped (line 2 is not valid JSON" in w for w in found.warnings), found.warnings
    with pytest.raises(ValueError, match="no row has a 'id' column"):
        discover(str(listing), options=Options(metadata=str(meta)))


def test_common_voice_transcripts_join_by_file_name(tmp_path, tiny_model_dir):
    """Common Voice's ``train.tsv`` names each clip in its ``path`` column with the extension
    (``common_voice_en_1.mp3``) (issue 41, item 7: 0 of the clips matched, by stem, and the run went
    on without text): a value naming the file, with its extension or as a relative path, joins,
    whether INPUT is ``clips/`` or the corpus folder; a join that matches nothing is an error before
    OUT is touched, showing both sides; a partial one says how the keys were compared."""
    rng = np.random.default_rng(3)
    clips = tmp_path / "cv" / "clips"
    clips.mkdir(parents=True)
    for n in range(1, 4):
        sf.write(clips / f"common_voice_en_{n}.mp3", (0.2 * rng.standard_normal(24_000)).astype(np.float32), 24_000)
    header = "client_id\tpath\tsentence_id\tsentence\tup_votes\tdown_votes\tage\tgender\taccents\tlocale\n"
    rows = "".join(f"c{n}\tcommon_voice_en_{n}.mp3\ts{n}\tSentence {n}.\t2\t0\t\t\t\ten\n" for n in range(1, 4))
    tsv = tmp_path / "cv" / "train.tsv"
    tsv.write_text(header + rows)
    for source, prefix in ((clips, ""), (tmp_path / "cv", "clips/")):
        found = discover(str(source), options=Options(metadata=str(tsv), metadata_key="path"))
        assert {it.key: it.meta["sentence"] for it in found.items} == {
            f"{prefix}common_voice_en_{n}.mp3": f"Sentence {n}." for n in range(1, 4)}, found.warnings
        assert not found.warnings, found.warnings
    # a value that is a relative path ('clips/x.mp3') names the item 'x.mp3' of INPUT clips/
    paths = tmp_path / "paths.jsonl"
    paths.write_text("".join(json.dumps({"path": f"clips/common_voice_en_{n}.mp3", "text": f"t{n}"}) + "\n"
                             for n in (1, 2)))
    found = discover(str(clips), options=Options(metadata=str(paths), metadata_key="path"))
    assert {it.key: (it.meta or {}).get("text") for it in found.items} == {
        "common_voice_en_1.mp3": "t1", "common_voice_en_2.mp3": "t2", "common_voice_en_3.mp3": None}
    (warning,) = found.warnings
    assert warning == ("--metadata paths.jsonl: 1 item(s) have no row (first: 'common_voice_en_3.mp3'; the "
                       "first looked up as 'common_voice_en_3.mp3' or 'common_voice_en_3' in column 'path', whose first "
                       "unmatched values are none)"), warning
    # the wrong column: an error naming both sides, and OUT never made
    out = tmp_path / "out"
    result = cli("codes", clips, out, "--model", tiny_model_dir, *ONE_WORKER, "--metadata", tsv,
                 "--metadata-key", "client_id")
    assert result.exit_code == 2, result.output
    assert ("no row matches any of the 3 item(s) (first: 'common_voice_en_1.mp3', 'common_voice_en_2.mp3', "
            "'common_voice_en_3.mp3'; the first looked up as 'common_voice_en_1.mp3' or 'common_voice_en_1' in column "
            "'client_id'") in result.text and "first unmatched values are 'c1', 'c2', 'c3'" in result.text
    assert not out.exists()
