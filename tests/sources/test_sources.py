"""Input sources, probing, keys, planning and parts."""

import hashlib
import json
import os
import random

import numpy as np
import pytest
import soundfile as sf

from mimi_extract.config.settings import Part, parse_part
from mimi_extract.engines.plan import padding_fraction, part_of, plan_batches, plan_units
from mimi_extract.sources import REGISTRY, Item, dataset_name, discover, walk_directory
from support.registered import KIND_TESTS, KINDS, table_problems


def items(lengths):
    return [Item(f"/x/{i}.wav", f"{i}.wav", f"{i}.wav", "mix", 24_000, 0, n, n) for i, n in enumerate(lengths)]


def test_every_registered_input_kind_has_its_test_cases():
    """The registry-driven tests take every registered input kind: each has its builder in the tests'
    table (tests/support/registered.py), or a Skip there saying why a test cannot take it."""
    assert table_problems("input kind", list(REGISTRY), KINDS, KIND_TESTS) == []


def test_plan_batches_budget_cap_and_coverage():
    rng = random.Random(0)
    todo = items([rng.randint(1000, 24_000 * 20) for _ in range(500)])
    batches = plan_batches(todo, max_batch_seconds=60, batch_size=16)
    assert sorted(it.key for b in batches for it in b) == sorted(it.key for it in todo)
    for b in batches:
        assert len(b) <= 16
        assert len(b) == 1 or len(b) * max(it.samples for it in b) <= 60 * 24_000
    unsorted = [todo[i : i + 16] for i in range(0, len(todo), 16)]
    assert padding_fraction(batches) < 0.1 < padding_fraction(unsorted)


def test_plan_units_long_first():
    units = plan_units(items([24_000 * 100, 1000, 24_000 * 300, 2000]), chunk_samples=24_000 * 30,
                       max_batch_seconds=10, batch_size=8)
    assert [(u.stream, [it.key for it in u.items]) for u in units] == [
        (True, ["2.wav"]), (True, ["0.wav"]), (False, ["1.wav", "3.wav"])]


def test_find_and_probe(corpus):
    root, described = corpus
    found = discover(root)
    assert sorted(it.rel for it in found.items + found.bad) == sorted(described)  # notes.txt ignored
    by_rel = {it.rel: it for it in found.items + found.bad}
    assert "empty" in by_rel["empty.wav"].error
    assert "corrupt" in by_rel["corrupt.wav"].error
    assert "zero-length" in by_rel["zero_len.wav"].error
    assert by_rel["rate16k.wav"].samples == 48_000  # header length converted to 24 kHz
    each = discover(root, "each")
    assert {"stereo.wav#ch0", "stereo.wav#ch1"} <= {it.key for it in each.items}


def _wav(path, seconds=0.2, rate=24_000, channels=1):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    sf.write(path, np.zeros((int(seconds * rate), channels), np.float32), rate)


def test_symlink_loop_walked_once(tmp_path):
    _wav(str(tmp_path / "loopdir" / "a.wav"))
    os.symlink(".", tmp_path / "loopdir" / "self")
    os.symlink("loopdir", tmp_path / "again")
    warnings = []
    entries = walk_directory(str(tmp_path), warnings)
    assert [e.rel for e in entries] == ["loopdir/a.wav"]  # today: 41 copies under loopdir/self/self/...
    assert len(warnings) == 2 and all("searched once" in w for w in warnings), warnings


def test_non_utf8_name_gets_an_accurate_error(tmp_path):
    _wav(str(tmp_path / "ok.wav"))
    _wav(str(tmp_path / "tmp.wav"))  # soundfile itself cannot open a non-UTF-8 name: rename after writing
    os.rename(os.path.join(os.fsencode(tmp_path), b"tmp.wav"), os.path.join(os.fsencode(tmp_path), b"caf\xe9.wav"))
    found = discover(str(tmp_path))
    assert [it.key for it in found.items] == ["ok.wav"]
    (err,) = found.bad
    assert "not valid UTF-8" in err.error and "caf\\xe9.wav" in err.rel
    json.dumps({"path": err.rel}, ensure_ascii=False).encode("utf-8")  # the manifest row is valid UTF-8


def test_dataset_names_are_injective():
    keys = ["a.wav#ch0", "a.wav#ch0/b.wav", "a%2Fb", "a/b", ".hidden", "%2Ehidden", "x/../y"]
    names = [dataset_name(k) for k in keys]
    assert len(set(names)) == len(keys) and not any("/" in n for n in names)


def test_list_inputs_segments_and_bad_rows(tmp_path):
    _wav(str(tmp_path / "audio" / "long.wav"), seconds=3.0, rate=16_000, channels=2)
    _wav(str(tmp_path / "audio" / "b.wav"))
    rows = [
        {"path": "audio/long.wav", "start": 0.5, "end": 1.25},
        {"path": "audio/long.wav", "id": "seg-two", "start": 1.0, "duration": 1.0, "channel": 1},
        {"path": "audio/b.wav"},
        {"path": "audio/missing.wav"},
        {"path": "audio/long.wav", "start": 2.5, "duration": 1.0},  # past the end
        {"path": "audio/long.wav", "start": 1.0, "duration": -1},
        {"path": "audio/b.wav", "id": "seg-two"},  # duplicate id
    ]
    lst = tmp_path / "list.jsonl"
    lst.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    found = discover(str(lst))
    ok = {it.key: it for it in found.items}
    assert set(ok) == {"audio/long.wav@0.5-1.25", "seg-two", "audio/b.wav"}
    seg = ok["audio/long.wav@0.5-1.25"]
    assert (seg.start, seg.frames, seg.samples, seg.segment) == (8000, 12_000, 18_000, (0.5, 1.25))
    assert ok["seg-two"].channel == 1
    errors = sorted(it.error for it in found.bad)
    assert any("file not found" in e for e in errors)
    assert any("past the end" in e for e in errors)
    assert any("not positive" in e for e in errors)
    assert any("duplicate key 'seg-two'" in e for e in errors)
    assert any("is not valid JSON" in e for e in errors)
    txt = tmp_path / "list.txt"
    txt.write_text("audio/b.wav\n# a comment\n\n" + str(tmp_path / "audio" / "long.wav") + "\n")
    assert {it.key for it in discover(str(txt)).items} == {"audio/b.wav", "audio/long.wav"}  # (from the list's folder)
    csv = tmp_path / "list.csv"
    csv.write_text("path,id,start,end\naudio/long.wav,c1,0,0.5\n")
    (c1,) = discover(str(csv)).items
    assert (c1.key, c1.frames) == ("c1", 8000)


def test_parts_are_stable_and_cover():
    keys = [f"spk{i}/utt{j}.wav" for i in range(30) for j in range(20)]
    parts = [part_of(k, 3) for k in keys]
    assert set(parts) == {0, 1, 2} and min(parts.count(p) for p in range(3)) > 150
    more = keys + [f"new/{i}.wav" for i in range(100)]  # adding files moves no existing key
    assert [part_of(k, 3) for k in more[: len(keys)]] == parts
    assert parse_part("1/3") == Part(1, 3) and parse_part(None).whole
    assert parse_part("slurm", {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "3"}) == Part(2, 4)
    for bad in ("3/3", "x", "-1/2"):
        with pytest.raises(ValueError):
            parse_part(bad)
    with pytest.raises(ValueError, match="SLURM_ARRAY_TASK_ID is not set"):
        parse_part("slurm", {})
    with pytest.raises(ValueError, match="without gaps or steps"):  # sbatch --array=0-30:10
        parse_part("slurm", {"SLURM_ARRAY_TASK_ID": "20", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "0"})


def test_part_of_is_a_fixed_function_of_the_key():
    """Pinned values: a per-process hash (Python's hash()), a position in the sorted inputs or any
    other function that is not of the key alone would move keys between parts across runs."""
    keys = ["a.wav", "spk1/utt2.flac", "long.wav@1234.56-1236", "x#ch1", "é/ü.wav"]
    assert [part_of(k, 7) for k in keys] == [3, 6, 1, 1, 5]
    assert [int.from_bytes(hashlib.sha1(k.encode()).digest()[:8], "big") % 1000 for k in keys] == \
        [part_of(k, 1000) for k in keys]


def test_segment_keys_are_exact(tmp_path):
    """Segments 4 ms apart deep into a long recording get distinct keys (six significant digits
    made both 'long.wav@1234.56-1236')."""
    rate = 8000
    sf.write(str(tmp_path / "long.wav"), np.zeros(rate * 1240, np.int16), rate)
    lst = tmp_path / "segs.csv"
    lst.write_text("path,start,end\nlong.wav,1234.56,1236\nlong.wav,1234.564,1236.004\nlong.wav,3,4.5\n")
    found = discover(str(lst))
    assert not found.bad, [it.error for it in found.bad]
    assert [it.key for it in found.items] == ["long.wav@1234.56-1236", "long.wav@1234.564-1236.004", "long.wav@3-4.5"]
    assert [it.start for it in found.items] == [9_876_480, 9_876_512, 24_000]


def test_list_row_channel_and_id_keys(tmp_path):
    """A bad channel's error row is keyed ``a1.wav#ch5`` (not ``#ch5#ch5``); an id that is a JSON
    object or list is an error row, not its Python repr as a key; a whole-number id is its digits."""
    _wav(tmp_path / "a1.wav")
    rows = [{"path": "a1.wav", "channel": 5}, {"path": "a1.wav", "id": {"a": 1}}, {"path": "a1.wav", "id": [1]},
            {"path": "a1.wav", "id": 7}]
    with open(tmp_path / "l.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    found = discover(str(tmp_path / "l.jsonl"))
    assert [it.key for it in found.items] == ["7"]
    errors = {it.key: it.error for it in found.bad}
    assert set(errors) == {"a1.wav#ch5", "line 2", "line 3"}, errors
    assert "no channel 5" in errors["a1.wav#ch5"] and "is not a string or a whole number" in errors["line 2"]


@pytest.mark.parametrize("kind, loc", [
    ("tar", ("MemberLoc", 1536, 48_000, "utt1.flac")),
    ("tgz", ("GroupMemberLoc", 2, 1024, 9216, 1536, 4096, "utt1.wav")),
    ("parquet", ("CellLoc", 3, 7, "audio", "")),
])
def test_a_loc_is_stored_as_its_fields_and_read_back(kind, loc):
    """Where a member's bytes are (its kind's frozen Loc) goes to the manifest as the list of its
    fields, and ``verify --out`` rebuilds the same Loc from it."""
    from mimi_extract.sources import REGISTRY, bytes_name, loc_of

    loc_type = REGISTRY[kind].loc_type
    assert loc_type.__name__ == loc[0]
    made = loc_type(*loc[1:])
    stored = json.loads(json.dumps(made.values()))
    assert stored == list(loc[1:]) and loc_of(kind, stored) == made and loc_of(kind, None) is None
    assert bytes_name(Item("/x/shard", "shard/m", "m", kind=kind, loc=made)) == loc[-1]
    assert bytes_name(Item("/x/a.wav", "a.wav", "a.wav")) == "/x/a.wav"


def test_list_rows_without_an_id_are_keyed_from_the_corpus_root(tmp_path, tiny_model_dir):
    """A NeMo manifest of absolute paths, kept away from its audio: its rows are keyed by their path
    relative to the folder holding every file (not the machine's absolute paths), segments of one
    file included; relative rows stay as written below the list's folder.  An OUT made before (its
    run.json records no --list-keys) resumes with its own keys, storing nothing twice; a new OUT
    refuses another --list-keys."""
    from support import extract
    from mimi_extract.config.settings import Settings
    from mimi_extract.sources import Options
    from mimi_extract.store.files import OutputError
    from mimi_extract.store.identity import read_run_info, write_run_info

    corpus = tmp_path / "mnt" / "corpus"
    for rel in ("spk1/a.wav", "spk2/b.wav"):
        (corpus / rel).parent.mkdir(parents=True, exist_ok=True)
        _wav(corpus / rel, seconds=1.0)
    manifest = tmp_path / "manifests" / "train.json"
    manifest.parent.mkdir()
    rows = [{"audio_filepath": str(corpus / "spk1/a.wav"), "duration": 1.0},
            {"audio_filepath": str(corpus / "spk2/b.wav"), "offset": 0.25, "duration": 0.5},
            {"audio_filepath": str(corpus / "spk2/b.wav"), "offset": 0.5, "duration": 0.25}]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    keys = sorted(i.key for i in discover(str(manifest)).items)
    assert keys == ["spk1/a.wav", "spk2/b.wav@0.25-0.75", "spk2/b.wav@0.5-0.75"]
    written = sorted(i.key for i in discover(str(manifest), options=Options(list_keys="written")).items)
    assert written == [str(corpus / "spk1/a.wav"), f"{corpus / 'spk2/b.wav'}@0.25-0.75", f"{corpus / 'spk2/b.wav'}@0.5-0.75"]
    one = tmp_path / "manifests" / "one.jsonl"  # one row, far away: keyed by its file name
    one.write_text(json.dumps({"path": str(corpus / "spk1/a.wav")}) + "\n")
    assert [i.key for i in discover(str(one)).items] == ["a.wav"]

    settings = Settings(model=tiny_model_dir, tap="codes", num_workers=0)
    old = str(tmp_path / "old")  # as an older version wrote it: keys as written, no --list-keys in run.json
    assert extract(str(manifest), old, settings, options=Options(list_keys="written"), limit=2).ok == 2
    info = read_run_info(old)
    del info["items"]["--list-keys"]
    write_run_info(old, info)
    summary = extract(str(manifest), old, settings)
    assert (summary.skipped, summary.ok) == (2, 1)
    stored = sorted(json.loads(line)["key"] for line in open(os.path.join(old, "manifest.jsonl")))
    assert stored == written and "--list-keys" not in read_run_info(old)["items"]
    new = str(tmp_path / "new")
    assert extract(str(manifest), new, settings).ok == 3
    assert read_run_info(new)["items"]["--list-keys"] == "root"
    with pytest.raises(OutputError, match="--list-keys: 'root' -> 'written'"):
        extract(str(manifest), new, settings, options=Options(list_keys="written"))
