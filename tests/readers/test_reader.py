"""The reader: one key index over every part of OUT, cached ``read``, lazy and merged cuts."""

import gzip

import numpy as np
import pytest

import mimi_extract
from mimi_extract.readers.reader import Reader, cached_reader
from mimi_extract.formats import get_format
from mimi_extract.store.manifest import ManifestRow, read_manifest
from mimi_extract.formats.records import StoredRow
from mimi_extract.store.read import load_row
from mimi_extract.store.writer import ShardWriter
from support.outs import make_out


def test_reader_indexes_every_part_once(tmp_path):
    out = tmp_path / "out"
    arrays = make_out(out / "part-0-of-2", [f"a/{i}.wav" for i in range(7)], seed=0, part="0/2")
    arrays.update(make_out(out / "part-1-of-2", [f"b/{i}.wav" for i in range(5)], seed=1, part="1/2"))
    with mimi_extract.open(out) as reader:
        assert len(reader) == 12 and set(reader.keys()) == set(arrays)
        for key, data in arrays.items():
            assert (reader[key] == data).all()
        # shard order: the keys of each shard together, shards in order, rows in write order
        shards = [reader.row(k)["shard"] for k in reader.keys()]
        assert shards == sorted(shards)
        assert [k for k, _ in reader] == reader.keys()
        assert [r["key"] for r in reader.rows("error")] == ["bad-0/2.wav", "bad-1/2.wav"]
        assert len(reader.rows()) == 14 and "bad-0/2.wav" not in reader
        with pytest.raises(KeyError, match="no ok row"):
            reader["missing.wav"]
    # one loading function: what read_manifest's rows point to
    row = StoredRow.from_dict(next(r for r in read_manifest(out) if r["status"] == "ok"))
    assert (load_row(str(out), row) == arrays[row.key]).all()


def test_read_reuses_its_index_until_the_manifest_changes(tmp_path):
    out = tmp_path / "out"
    arrays = make_out(out, [f"{i}.wav" for i in range(5)])
    assert (mimi_extract.read(out, "3.wav") == arrays["3.wav"]).all()
    first = cached_reader(str(out))
    assert cached_reader(str(out)) is first  # not rebuilt per call (was: every read() parsed every manifest)
    # a resumed run appends rows and a shard: the next read sees them
    w = ShardWriter(str(out), get_format("hdf5"), {"tap": "codes", "layout": "[frames, num_quantizers]"})
    new = np.arange(16, dtype=np.int16).reshape(2, 8)
    w.add("new.wav", new, ManifestRow(path="new.wav", key="new.wav", dataset="new.wav", frames=2, dims=8,
                                      channel=None, sample_rate=24000, duration=0.16))
    w.close()
    assert (mimi_extract.read(out, "new.wav") == new).all()
    assert cached_reader(str(out)) is not first


def test_read_is_fast_on_a_large_out(tmp_path, monkeypatch):
    """2000 items in 20 shards: 200 read() calls parse the manifests once and open each shard they
    touch once (before: a manifest scan per call).  Counted, not timed: a timing bound fails on a
    loaded machine (scripts/bench_reader.py measures the time)."""
    import mimi_extract.readers.reader as reader_module

    out = tmp_path / "out"
    arrays = make_out(out, [f"spk{i % 7}/{i}.wav" for i in range(2000)], shard_size=100)
    keys = list(arrays)[::10]
    scans, opened = [], []
    rows, open_shard = reader_module.committed_rows, reader_module.open_shard
    monkeypatch.setattr(reader_module, "committed_rows", lambda *a, **k: scans.append(a) or rows(*a, **k))
    monkeypatch.setattr(reader_module, "open_shard", lambda *a, **k: opened.append(a) or open_shard(*a, **k))
    for key in keys:
        assert (mimi_extract.read(out, key) == arrays[key]).all()
    assert len(scans) == 1 and len(opened) <= 20, (len(scans), len(opened))


def test_dataset_in_a_dataloader_with_workers(tmp_path):
    import torch

    out = tmp_path / "out"
    arrays = make_out(out, [f"{i}.wav" for i in range(9)], shard_size=4)
    reader = Reader(str(out))
    reader["0.wav"]  # a handle opened in the parent: forked workers must not use it
    loader = torch.utils.data.DataLoader(reader.dataset(), batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    seen = {item["key"]: item["data"] for item in loader}
    assert set(seen) == set(arrays)
    for key, data in seen.items():
        assert torch.equal(data, torch.from_numpy(arrays[key])) and data.shape[0] == reader.row(key)["frames"]


def test_lazy_cuts_and_one_merged_file_over_all_parts(tmp_path):
    from lhotse import CutSet

    out = tmp_path / "out"
    arrays = make_out(out / "part-0-of-2", [f"a/{i}.wav" for i in range(4)], part="0/2")
    arrays.update(make_out(out / "part-1-of-2", [f"b/{i}.wav" for i in range(3)], seed=1, part="1/2"))
    cuts = mimi_extract.read_cuts(out)
    assert cuts.is_lazy and len(cuts) == 7
    for cut in cuts:
        assert (cut.load_custom("mimi_codes") == arrays[cut.id]).all()
    merged = tmp_path / "merged.jsonl.gz"
    from support import cli

    result = cli("cuts", out, "-o", merged)
    assert result.exit_code == 0, result.output
    assert "7 cuts" in result.text and "register_lhotse_readers" not in result.text  # lhotse's own numpy_hdf5
    again = CutSet.from_jsonl_lazy(merged)
    assert sorted(c.id for c in again) == sorted(arrays)
    with gzip.open(merged, "rt") as f:
        assert len(f.readlines()) == 7
