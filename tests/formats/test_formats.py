"""Output formats: the registry (and the tests' table of it, support/registered.py), --format recorded
and enforced; every registered format read back equal to HDF5 and to the single-item reference, a
flipped byte in it found and repaired, a shard of it that cannot be opened a DamagedError; Parquet read
by datasets, pyarrow, lhotse and every mimi-extract reader; damaged Parquet shards quarantined.
(kill -9 and ENOSPC per format: test_integrity.py.)"""

import json
import os
import shutil

import numpy as np
import pytest

import mimi_extract
from support import ONE_WORKER, OnDemand, cli
from mimi_extract import read, read_manifest
from mimi_extract.formats import get_format, names
from mimi_extract.formats.records import StoredRow
from support import extract
from mimi_extract.config.settings import Settings
from mimi_extract.store.files import DamagedError
from mimi_extract.store.read import load_row
from support import check_consistency
from support.outs import check_outputs
from support.outs import check_decode
from support.registered import FORMAT_TESTS, FORMATS, FormatCase, Skip, format_case, format_cases, table_problems


def run(root, out, model_dir, fmt, tap="codes", **kw):
    return extract(root, str(out), Settings(model=model_dir, tap=tap, num_workers=0, format=fmt, **kw), shard_size=3)


@pytest.fixture(scope="module")
def outs(corpus, tiny_model_dir, tmp_path_factory):
    """The corpus as codes in each registered format (3-item shards), each made once a test asks for it."""
    root, _ = corpus

    def make(fmt):
        out = str(tmp_path_factory.mktemp(fmt) / "out")
        assert run(root, out, tiny_model_dir, fmt).ok == 7
        return out

    return OnDemand(make)


def test_every_registered_format_has_its_test_cases():
    """The registry-driven tests take every registered format: each has its fixture in the tests' table
    (tests/support/registered.py), or a Skip there saying why a test cannot take it."""
    assert table_problems("output format", names(), FORMATS, FORMAT_TESTS) == []


def test_the_table_check_names_each_gap():
    """What the check above says of a table that misses a registered name, has one that is not
    registered, lacks a fixture that a test needs, or skips a test that does not exist."""
    skip = {"round_trip": Skip("a reason"), "no_such_test": Skip("a reason"), "kill_9": Skip(" ")}
    table = {"b": FormatCase(skip=skip), "c": FORMATS["hdf5"]}
    problems = table_problems("output format", ["a", "b"], table, FORMAT_TESTS)
    assert sorted(problems) == sorted([
        "output format 'a' is registered but has no entry in tests/support/registered.py",
        "output format 'c' has an entry in tests/support/registered.py but is not registered",
        "output format 'b': a Skip for 'no_such_test', which is no registry-driven test",
        "output format 'b': its Skip for 'kill_9' gives no reason",
        "output format 'b' has no flip_item for 'flipped_byte' (give one, or a Skip saying why not)",
        "output format 'b' has no break_open for 'unopenable' (give one, or a Skip saying why not)"])


def test_registry_names_and_errors():
    assert {"hdf5", "parquet"} <= set(names())
    assert get_format("parquet").shard_name(3) == "shard-00003.parquet"
    with pytest.raises(ValueError, match="unknown output format 'zarr'; choose one of: hdf5, parquet"):
        get_format("zarr")
    # shard names of the formats never collide, and never look like job-array part folders
    for fmt in (get_format(n) for n in names()):
        assert [f.name for f in map(get_format, names()) if f.is_shard(fmt.shard_name(0))] == [fmt.name]
        assert not fmt.is_shard("part-0-of-2") and not fmt.is_shard("../" + fmt.shard_name(0))


@pytest.mark.parametrize("fmt", format_cases("round_trip"))
def test_a_format_reads_back_equal_to_hdf5_and_the_single_item_reference(outs, corpus, tiny_model, fmt):
    root, _ = corpus
    out = outs[fmt]
    arrays = check_consistency(out)
    hdf5 = check_consistency(outs["hdf5"])
    assert arrays.keys() == hdf5.keys() and len(arrays) == 7
    for key in arrays:
        assert arrays[key].dtype == np.int16 and np.array_equal(arrays[key], hdf5[key]), key
    check_outputs(out, root, tiny_model, "codes")  # each item vs MimiModel on it alone
    assert json.load(open(os.path.join(out, "run.json")))["format"] == fmt
    # its shards, numbered 0, 1, 2 (3 items each), and no other file of OUT is named as one
    shards = sorted({r["shard"] for r in read_manifest(out) if r["status"] == "ok"})
    on_disk = [os.path.relpath(os.path.join(d, n), out) for d, _, files in os.walk(out) for n in files]
    assert sorted(n for n in on_disk if get_format(fmt).is_shard(n)) == shards
    assert [int(get_format(fmt).shard_re.fullmatch(s).group(1)) for s in shards] == [0, 1, 2], shards


def test_datasets_pyarrow_and_polars_read_parquet_as_is(outs):
    import pyarrow.parquet as pq
    from datasets import load_dataset

    out = outs["parquet"]
    keys = {r["key"] for r in read_manifest(out) if r["status"] == "ok"}
    # the dataset card's YAML configs block: load_dataset(OUT) finds the shards by itself
    card = open(os.path.join(out, "README.md")).read()
    assert card.startswith("---\nconfigs:\n") and 'path: "shard-*.parquet"' in card
    ds = load_dataset(out, split="train")
    assert ds.num_rows == 7 and set(ds["key"]) == keys
    assert str(ds.features["codes"].feature.feature.dtype) == "int16"
    for row in ds:
        assert np.array_equal(np.array(row["codes"], dtype=np.int16), read(out, row["key"])), row["key"]
        assert row["frames"] == len(row["codes"]) and row["dims"] == 8
    table = pq.read_table(os.path.join(out, "shard-00000.parquet"))
    for key, codes in zip(table["key"].to_pylist(), table["codes"].to_pylist()):
        assert np.array_equal(np.array(codes, np.int16), read(out, key))
    meta = json.loads(table.schema.metadata[b"mimi_extract"])
    assert meta["tap"] == "codes" and meta["num_quantizers"] == 8 and len(meta["weights"]) == 24
    # zstd, page checksums, and dictionary pages for the codes
    column = pq.ParquetFile(os.path.join(out, "shard-00000.parquet")).metadata.row_group(0).column(1)
    assert column.path_in_schema == "codes.list.element.list.element" and column.compression == "ZSTD"
    assert column.has_dictionary_page
    segment = [r for r in ds if r["key"] == "stereo.wav"][0]
    assert segment["start"] is None and segment["channel"] is None and segment["sample_rate"] == 24_000
    # polars, as is: the glob a user would type
    import polars as pl

    frame = pl.read_parquet(os.path.join(out, "*.parquet"))
    assert frame.height == 7 and set(frame["key"].to_list()) == keys
    for key, codes in zip(frame["key"].to_list(), frame["codes"].to_list()):
        assert np.array_equal(np.array(codes, np.int16), read(out, key)), key


def test_every_reader_works_on_parquet(outs, tiny_model, tiny_model_dir, tmp_path):

    out = outs["parquet"]
    with mimi_extract.open(out) as reader:
        assert len(reader) == 7 and [k for k, _ in reader] == reader.keys()
        for key, data in reader:
            assert np.array_equal(data, read(outs["hdf5"], key))
    cuts = mimi_extract.read_cuts(out)  # lhotse loads the rows through mimi-extract's storage backend
    for cut in cuts:
        stored = read(out, cut.id)
        assert cut.custom["mimi_codes"].array.storage_type == "mimi_extract_parquet"
        assert np.array_equal(cut.load_custom("mimi_codes"), stored), cut.id
        if cut.duration > 0.5:
            part = cut.truncate(offset=0.16, duration=0.32)
            assert np.array_equal(part.load_custom("mimi_codes"), stored[2:6]), cut.id
    info = json.loads(cli("info", out, "--json").output)
    assert info["ok"] == 7 and info["errors"] == 3 and info["settings"]["format"] == "parquet"
    assert sorted(info["shards"]) == ["shard-00000.parquet", "shard-00001.parquet", "shard-00002.parquet"]
    status = cli("status", out)
    assert status.exit_code == 0 and "complete: 7 ok, 3 errors" in status.text, status.output
    check_decode(out, tiny_model, str(tmp_path / "sine.wav"))
    verify = cli("verify", "--out", out, "--sample", 3, "--device", "cpu")
    assert verify.exit_code == 0 and "FAIL" not in verify.text, verify.output


def test_parquet_features_float16_and_segments(tmp_path, tiny_model_dir, corpus):
    """Features as list<list<float16>>; --channel each gives the channel column."""
    from datasets import load_dataset

    root, _ = corpus
    hdf5, parquet = str(tmp_path / "h"), str(tmp_path / "p")
    for fmt, out in (("hdf5", hdf5), ("parquet", parquet)):
        run(root, out, tiny_model_dir, fmt, tap="encoder", feature_dtype="float16", channel="each")
    a, b = check_consistency(hdf5), check_consistency(parquet)
    assert a.keys() == b.keys() and all(b[k].dtype == np.float16 and np.array_equal(a[k], b[k]) for k in a)
    ds = load_dataset(parquet, split="train")
    assert str(ds.features["encoder"].feature.feature.dtype) == "float16"
    row = [r for r in ds if r["key"] == "stereo.wav#ch1"][0]
    assert row["channel"] == 1 and np.array_equal(np.array(row["encoder"], np.float16), b["stereo.wav#ch1"])


def test_resume_with_another_format_is_refused(outs, corpus, tiny_model_dir, tmp_path):
    root, _ = corpus
    out = str(tmp_path / "out")
    shutil.copytree(outs["hdf5"], out)
    result = cli("codes", root, out, "--model", tiny_model_dir, "--format", "parquet", *ONE_WORKER)
    assert result.exit_code == 2 and "format: 'hdf5' -> 'parquet'" in result.text, result.output
    assert "another output format" in result.text
    # run.json deleted: the shards on disk still say what the run wrote
    os.remove(os.path.join(out, "run.json"))
    result = cli("codes", root, out, "--model", tiny_model_dir, "--format", "parquet", *ONE_WORKER)
    assert result.exit_code == 2 and "holds hdf5 shards" in result.text and "--format hdf5" in result.text, result.output
    # an OUT of mimi-extract 0.2 (no "format" in run.json) is an HDF5 run and resumes as one
    info = json.load(open(os.path.join(outs["hdf5"], "run.json")))
    info.pop("format")
    with open(os.path.join(out, "run.json"), "w") as f:
        json.dump(info, f)
    result = cli("codes", root, out, "--model", tiny_model_dir, *ONE_WORKER)
    assert result.exit_code == 0 and "(7 already done)" in result.text, result.output


def test_damaged_parquet_shards_are_quarantined_and_redone(outs, corpus, tiny_model_dir, tmp_path):
    root, _ = corpus
    out = str(tmp_path / "out")
    shutil.copytree(outs["parquet"], out)
    with open(os.path.join(out, "shard-00000.parquet"), "r+b") as f:
        f.truncate(100)
    size = os.path.getsize(os.path.join(out, "shard-00002.parquet"))
    with open(os.path.join(out, "shard-00002.parquet"), "r+b") as f:
        f.write(b"\0" * size)
    result = cli("codes", root, out, "--model", tiny_model_dir, "--format", "parquet", "--shard-size", 3, *ONE_WORKER)
    assert result.exit_code == 0, result.output
    assert result.text.count("moved damaged shard") == 2 and "quarantine/shard-00000.parquet" in result.text
    assert "(3 already done)" in result.text  # 3 + 1 items of the two shards encoded again
    arrays = check_consistency(out)
    reference = check_consistency(outs["hdf5"])
    assert arrays.keys() == reference.keys() and all(np.array_equal(arrays[k], reference[k]) for k in arrays)


def test_parquet_parts_card_and_union(corpus, tiny_model_dir, tmp_path):
    """Parts of a job array: one card for OUT, its glob over every part's shards."""
    from datasets import load_dataset

    from mimi_extract.config.settings import Part

    root, _ = corpus
    out = str(tmp_path / "parts")
    for i in range(2):
        extract(root, out, Settings(model=tiny_model_dir, tap="codes", num_workers=0, format="parquet"), part=Part(i, 2))
    card = open(os.path.join(out, "README.md")).read()
    assert 'path: "part-*-of-*/shard-*.parquet"' in card
    ds = load_dataset(out, split="train")
    assert sorted(ds["key"]) == sorted(check_consistency(out)) and ds.num_rows == 7
    assert sorted(c.id for c in mimi_extract.read_cuts(out)) == sorted(ds["key"])


@pytest.mark.parametrize("fmt", format_cases("flipped_byte"))
def test_a_flipped_byte_is_found_read_refuses_and_resume_repairs(outs, corpus, tiny_model_dir, tmp_path, fmt):
    root, _ = corpus
    out = str(tmp_path / "out")
    shutil.copytree(outs[fmt], out)
    clean = cli("verify", "--out", out, "--checksums")
    assert clean.exit_code == 0 and "7 stored items read, 7 against their checksums; 0 damaged; PASS" in clean.text, clean.output
    rows = [r for r in read_manifest(out) if r["status"] == "ok"]
    assert all(r["checksum"].startswith("crc32:") for r in rows)
    victim = next(r for r in rows if r["key"] == "sub/deeper/chirp.flac")
    damaged = format_case(fmt).flip_item(out, victim)
    assert victim["key"] in damaged
    with pytest.raises(DamagedError) as e:
        read(out, victim["key"])
    assert out in str(e.value) and repr(victim["key"]) in str(e.value) and victim["shard"] in str(e.value)
    with pytest.raises(DamagedError):
        mimi_extract.open(out)[victim["key"]]
    result = cli("verify", "--out", out, "--checksums")
    assert result.exit_code == 1 and f"{len(damaged)} damaged; FAIL" in result.text, result.output
    in_shard = f" in {victim['shard']}"
    listed = [line.split(in_shard)[0] for line in result.output.splitlines() if in_shard in line]
    assert sorted(listed) == sorted(damaged)
    # a plain resume does not read every array (structure only); --reencode-damaged does
    result = cli("codes", root, out, "--model", tiny_model_dir, "--format", fmt, "--shard-size", 3,
                 "--reencode-damaged", *ONE_WORKER)
    assert result.exit_code == 0 and "fail their checksums" in result.text and "moved damaged shard" in result.text, result.output
    assert cli("verify", "--out", out, "--checksums").exit_code == 0
    arrays, reference = check_consistency(out), check_consistency(outs["hdf5"])
    assert arrays.keys() == reference.keys() and all(np.array_equal(arrays[k], reference[k]) for k in arrays)


def test_an_array_edited_in_place_fails_the_manifest_checksum(outs, tmp_path):
    """HDF5 recomputes fletcher32 when h5py writes: only the manifest's crc32 catches an edit."""
    import h5py

    out = str(tmp_path / "out")
    shutil.copytree(outs["hdf5"], out)
    row = next(r for r in read_manifest(out) if r["status"] == "ok")
    with h5py.File(os.path.join(out, row["shard"]), "r+") as f:
        f[row["dataset"]][0, 0] = f[row["dataset"]][0, 0] + 1
    with pytest.raises(DamagedError, match="fails its checksum"):
        read(out, row["key"])
    result = cli("verify", "--out", out, "--checksums")
    assert result.exit_code == 1 and "checksum mismatch (crc32)" in result.text and "1 damaged" in result.text


def test_a_parquet_footer_naming_other_columns_is_a_damaged_shard_not_a_crash(outs, tmp_path):
    """A byte flipped in a Parquet footer can rename a column ('key' -> 'kez'): the file still parses,
    and the format's check used to raise KeyError (a traceback in verify --checksums and in every
    resume); it is a damaged shard, its items listed."""
    from mimi_extract.store.read import scan_checksums

    out = str(tmp_path / "out")
    shutil.copytree(outs["parquet"], out)
    rows = [r for r in read_manifest(out) if r["status"] == "ok"]
    shard = rows[0]["shard"]
    path = os.path.join(out, shard)
    with open(path, "rb") as f:
        data = f.read()
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    with open(path, "wb") as f:
        f.write(data[:footer] + data[footer:].replace(b"\x03key", b"\x03kez"))  # (thrift: length, then the name)
    problem = get_format("parquet").check(path, [StoredRow.from_dict(r) for r in rows if r["shard"] == shard])
    assert problem is not None and "kez" not in problem and "key" in problem
    damaged = scan_checksums(out)["damaged"]
    assert {d["key"] for d in damaged} == {r["key"] for r in rows if r["shard"] == shard}


def test_lhotse_sampler_and_dataloader_workers_over_parquet_cuts(outs):
    """lhotse's own DynamicBucketingSampler and a DataLoader with a (forked) worker process load
    the Parquet rows through mimi-extract's storage backend, each cut exactly read()."""
    import torch
    from lhotse.dataset import DynamicBucketingSampler

    out = outs["parquet"]
    cuts = mimi_extract.read_cuts(out)
    assert len(cuts) == 7

    class Codes(torch.utils.data.Dataset):
        def __getitem__(self, batch):
            return [(c.id, c.load_custom("mimi_codes")) for c in batch]

    sampler = DynamicBucketingSampler(cuts, max_duration=4.0, num_buckets=2, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(Codes(), sampler=sampler, batch_size=None, num_workers=1)
    seen = {key: data for batch in loader for key, data in batch}
    assert sorted(seen) == sorted(c.id for c in cuts)
    for key, data in seen.items():
        assert np.array_equal(data, read(out, key)), key


@pytest.mark.parametrize("fmt", format_cases("unopenable"))
def test_a_damaged_footer_or_superblock_is_a_damaged_error_naming_out_shard_and_key(outs, tmp_path, fmt):
    """A flipped Parquet footer magic / HDF5 superblock signature / Megatron index magic makes the library
    fail to open the shard at all (ArrowInvalid, OSError, ValueError): every reader says DamagedError with
    OUT, shard and key."""
    out = str(tmp_path / "out")
    shutil.copytree(outs[fmt], out)
    victim = next(r for r in read_manifest(out) if r["status"] == "ok")
    path = os.path.join(out, victim["shard"])
    format_case(fmt).break_open(path)
    for reader in (lambda k: read(out, k), lambda k: mimi_extract.open(out)[k],
                   lambda k: load_row(out, StoredRow.from_dict(victim))):  # what report and verify read through
        with pytest.raises(DamagedError) as e:
            reader(victim["key"])
        assert out in str(e.value) and repr(victim["key"]) in str(e.value) and victim["shard"] in str(e.value)
    result = cli("verify", "--out", out, "--checksums")
    in_shard = sum(r["shard"] == victim["shard"] for r in read_manifest(out) if r["status"] == "ok")
    assert result.exit_code == 1 and f"7 stored items read, 7 against their checksums; {in_shard} damaged; FAIL" in result.text, result.output


def test_verify_out_without_run_json_after_a_refused_resume_says_so(outs, corpus, tiny_model_dir, tmp_path):
    root, _ = corpus
    out = str(tmp_path / "out")
    shutil.copytree(outs["hdf5"], out)
    os.remove(os.path.join(out, "run.json"))
    refused = cli("codes", root, out, "--model", tiny_model_dir, "-q", "4", *ONE_WORKER)
    assert refused.exit_code == 2 and "num_quantizers: 8 -> 4" in refused.text, refused.output
    result = cli("verify", "--out", out, "--sample", "1000")
    assert result.exit_code == 2, result.output
    assert "run.json is missing" in result.text and "Traceback" not in result.output, result.output
    assert cli("verify", "--out", out, "--checksums").exit_code == 0
