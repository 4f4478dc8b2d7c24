"""An HDF5 shard with any one byte flipped: every read the tool makes of it (``check`` at a resume,
the settings a resume compares, ``verify``'s item attributes, the arrays) either raises or returns
exactly what the intact shard gives. Before 0.3.1 its string attributes were variable-length (in
HDF5's global heap, without a checksum) and 7 flips in a demo shard made HDF5 loop forever: a resume
or ``verify --sample`` on that shard never ended (docs/integrity.md)."""

import json
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from support.waits import HANG_QUICK_S
from mimi_extract.formats.hdf5 import HDF5, HDF5Shard
from mimi_extract.formats.records import StoredRow
from mimi_extract.sources.keys import dataset_name

FILE_ATTRS = {"tap": "codes", "model": "/models/mimi-é", "weights": "da6b0984e74bde55afe6b912", "framing": "transformers",
              "config_hash": "290392974bf177a3", "tool_version": "0.3.1", "dtype": "fp32", "empty": "",
              "layout": "[frames, num_quantizers]", "num_quantizers": np.int64(8), "frame_rate": 12.5,
              "sample_rate": np.int64(24000)}


def build_shard(path, n_items=9):
    """A shard as the writer builds it, and its rows' JSON; 9 datasets, more than HDF5 keeps in the
    root group's header (8: ``link_phase_change``), so its links are in the fractal heap that a real
    shard of 1,000 items uses."""
    rng = np.random.default_rng(0)
    shard, rows = HDF5Shard(FILE_ATTRS), []
    for i in range(n_items):
        key = f"spk{i % 3}/utt-{i}.wav" if i else "spk/naïve ü.wav"
        row = {"key": key, "dataset": dataset_name(key), "frames": 3 + i % 4}
        data = rng.integers(0, 2048, (row["frames"], 8), dtype=np.int16)
        shard.add(key, data, StoredRow.from_dict(row), {"duration": row["frames"] / 12.5, "source_sample_rate": 16000})
        rows.append(row)
    with open(path, "wb") as f:
        f.write(shard.files("shard-00000.h5")["shard-00000.h5"])
    shard.close()
    return rows


def test_string_attributes_are_fixed_length_and_read_back_as_written(tmp_path):
    path = str(tmp_path / "shard-00000.h5")
    rows = [StoredRow.from_dict(r) for r in build_shard(path)]
    fmt = HDF5()
    assert fmt.attrs(path) == {k: (v.item() if isinstance(v, np.generic) else v) for k, v in FILE_ATTRS.items()}
    assert fmt.item_attrs(path, rows[0]) == {"key": "spk/naïve ü.wav", "duration": 0.24, "source_sample_rate": 16000}
    assert fmt.check(path, rows) is None
    with h5py.File(path, "r") as f:  # what a user's own h5py code sees: bytes (UTF-8), no global heap object
        assert f.attrs["tap"] == b"codes" and f.attrs["model"].decode() == "/models/mimi-é"
        assert all(f.attrs.get_id(name).dtype.kind != "O" for name in f.attrs)
    # a shard written before 0.3.1 (variable-length strings) reads the same
    with h5py.File(path, "r+") as f:
        del f.attrs["tap"]
        f.attrs["tap"] = "codes"
        assert f.attrs.get_id("tap").dtype.kind == "O"
    assert fmt.attrs(path)["tap"] == "codes"


FLIP_LOOP = r"""
import json
import sys
from mimi_extract.formats.hdf5 import HDF5
from mimi_extract.formats.records import StoredRow
path, part, parts, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), [StoredRow.from_dict(r) for r in json.loads(sys.argv[4])]
fmt = HDF5()
def reads(p):  # every read the tool makes of a shard, each its own open, those that fail most flips first
    yield fmt.check(p, rows)  # (the object headers: 45 % of the flips)
    yield repr(fmt.attrs(p))  # (the file attributes' fractal heap: 16 %)
    for r in rows:
        yield fmt.load(p, r).tobytes()  # (fletcher32: 7 %)
    for r in rows:
        yield repr(fmt.item_attrs(p, r))
orig = open(path, "rb").read()
ref = list(reads(path))
assert ref[0] is None, ref[0]
flipped, silent = path + ".flipped", []
for off in range(len(orig) * part // parts, len(orig) * (part + 1) // parts):
    sys.stderr.write(f"{off}\n"); sys.stderr.flush()
    data = bytearray(orig); data[off] ^= 0xFF
    open(flipped, "wb").write(data)
    try:  # each read compared as it comes: the first that differs is a lie, the first that raises ends the flip
        for i, (got, want) in enumerate(zip(reads(flipped), ref)):
            if got != want:
                if i:  # (``check``'s problem, i == 0, is an error: a resume quarantines the shard)
                    silent.append(off)
                break
    except Exception:
        pass
print(json.dumps({"size": len(orig), "silent": silent}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("part", [0, 1])  # every byte, in two halves that xdist runs side by side
def test_no_single_flipped_byte_makes_a_read_hang_or_lie(tmp_path, part):
    path = str(tmp_path / "shard-00000.h5")
    rows = build_shard(path)
    # two fractal heaps: the file's attributes' and the root group's links, as in a real shard (8 items: 1)
    assert open(path, "rb").read().count(b"FRHP") == 2
    progress = tmp_path / "progress"
    with open(progress, "w") as err:  # ~15 s each; a read that makes no progress for HANG_QUICK_S is a hang
        child = subprocess.Popen([sys.executable, "-c", FLIP_LOOP, path, str(part), "2", json.dumps(rows)],
                                 stdout=subprocess.PIPE, stderr=err, text=True)
        seen, still = -1, 0
        while child.poll() is None and still < HANG_QUICK_S:
            time.sleep(1)
            size = progress.stat().st_size
            seen, still = size, (still + 1 if size == seen else 0)
        if child.poll() is None:
            child.kill()
            child.wait()
            pytest.fail(f"a read of the shard with byte {progress.read_text().split()[-1]} flipped never ended")
    out = child.stdout.read()
    assert child.returncode == 0, progress.read_text()[-2000:]
    result = json.loads(out)
    assert result["size"] > 8_000  # the whole file, 8.8 KB: this half's bytes, then the other's
    assert result["silent"] == []  # object headers, B-trees, heaps and chunks: each flip is an error or unused
