"""OUTs made or damaged by hand: a run directory written by the real ShardWriter without encoding
(``make_out``), a byte flipped in a stored array or anywhere in a file, and the check of a run's
arrays against the single-item reference (``check_outputs``), a Shar OUT's own invariants, read by
lhotse (``check_shar``)."""

import json
import os

import numpy as np

from mimi_extract import read, read_cuts
from mimi_extract.audio.reader import load
from mimi_extract.codec.reference import reference_single
from mimi_extract.formats import get_format
from mimi_extract.store.files import write_atomic
from mimi_extract.store.manifest import ManifestRow, committed_rows, read_manifest, run_dirs
from mimi_extract.store.writer import ShardWriter
from support import cli, tolerance


INFO = {"model": "tiny", "tap": "codes", "num_quantizers": 8, "framing": "transformers", "channel": "mix",
        "dtype": "fp32", "feature_dtype": "float32", "input": "/corpus", "input_kind": "directory"}


def make_out(run_dir, keys, seed=0, shard_size=3, part="whole"):
    """A run directory written by the real ShardWriter (no encoding): codes [frames, 8] per key."""
    os.makedirs(run_dir, exist_ok=True)
    write_atomic(os.path.join(run_dir, "run.json"), json.dumps({**INFO, "part": part}))
    w = ShardWriter(str(run_dir), get_format("hdf5"), {"tap": "codes", "layout": "[frames, num_quantizers]"}, max_items=shard_size)
    rng = np.random.default_rng(seed)
    arrays = {}
    for i, key in enumerate(keys):
        frames = 3 + i % 5
        data = rng.integers(0, 2048, (frames, 8), dtype=np.int16)
        row = {"path": key, "key": key, "dataset": key.replace("/", "|"), "channel": None, "sample_rate": 24000,
               "duration": frames * 0.08, "source": {"path": f"/corpus/{key}", "frames": frames * 1920, "channels": 1}}
        w.add(key, data, ManifestRow(**row, frames=frames, dims=8))
        arrays[key] = data
    w.add_error(ManifestRow(path="bad.wav", key=f"bad-{part}.wav", dataset="bad.wav", channel=None,
                            sample_rate=None, duration=0.0), "cannot decode")
    w.close()
    return arrays


def flip_hdf5_byte(out, row):
    """Flip one byte inside the stored data of ``row``'s dataset (not its header)."""
    import h5py

    path = os.path.join(out, row["shard"])
    with h5py.File(path, "r") as f:
        ds = f[row["dataset"]]
        offset = ds.id.get_chunk_info(0).byte_offset if ds.chunks else ds.id.get_offset()
        size = ds.id.get_storage_size()
    assert offset is not None and size > 0
    flip_byte(path, offset + size // 2)


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x5A]))


def check_outputs(out, root, model, tap, num_quantizers=8, channel="mix"):
    """Every ok row's stored array equals the single-item transformers encode of that file."""
    rows = [r for r in read_manifest(out) if r["status"] == "ok"]
    for row in rows:
        audio = load(os.path.join(root, row["path"]), row["channel"] if row["channel"] is not None else channel)
        ref = reference_single(model, audio, num_quantizers)
        got = read(out, row["key"])
        if tap == "codes":
            assert got.dtype.name == "int16" and got.shape == tuple(ref["codes"].shape), row["key"]
            assert (got == ref["codes"].numpy()).all(), row["key"]
        else:
            assert got.shape == tuple(ref[tap].shape), row["key"]
            assert abs(got - ref[tap].numpy()).max() <= tolerance(ref[tap]), row["key"]
        assert row["frames"] == (ref["codes"].shape[0] if tap != "encoder" else ref["encoder"].shape[0])
    return rows


def check_decode(out, model, wav, key="sine_440.wav") -> np.ndarray:
    """``mimi-extract decode`` of one stored item equals the model's own decode of its stored codes
    (24 kHz, cut to the item's length); returns the audio."""
    import soundfile as sf
    import torch

    result = cli("decode", out, key, "-o", wav, "--device", "cpu")
    assert result.exit_code == 0, result.output
    audio, rate = sf.read(wav, dtype="float32")
    with torch.no_grad():
        expected = model.decode(torch.from_numpy(read(out, key)).long().T[None]).audio_values[0, 0]
    assert rate == 24_000 and np.allclose(audio, expected[: len(audio)].numpy(), atol=1e-5)
    return audio


def check_shar(out: str, killed: bool = False) -> dict[str, np.ndarray]:
    """Assert a Shar OUT's invariants and return {key: array} of its committed items.

    Per run directory: its ``shar/`` folder holds only ``cuts.N.jsonl.gz`` + ``<field>.N.tar``
    pairs whose rows are committed, each pair exactly what its rows say (the format's own check);
    no temporary anywhere.  ``killed``: as a kill -9 left it: a temporary in the run directory
    (never in ``shar/``) and one cuts file whose tar was never renamed into place may remain.
    Then lhotse reads every committed pair (``from_shar``; also ``from_shar(in_dir=...)`` when
    nothing is left over) and each cut's array equals ``mimi_extract.read``."""
    import lhotse

    shar = get_format("shar")
    arrays = {}
    for d in run_dirs(out):
        rows = [r for r in committed_rows(d) if r.ok]
        keys = [r.key for r in rows]
        assert len(keys) == len(set(keys)), "a key committed twice"
        by_shard: dict[str, list] = {}
        for r in rows:
            by_shard.setdefault(r.shard, []).append(r)
        committed = {n for s in by_shard for n in (s, shar.companions(s)[0])}
        folder = os.path.join(d, "shar")
        files = {f"shar/{n}" for n in os.listdir(folder)} if os.path.isdir(folder) else set()
        stray = files - committed
        assert not any(n.endswith(".tmp") for n in files), f"a temporary inside {folder}: lhotse would read it"
        if killed:
            assert len(stray) <= 1 and all(n.startswith("shar/cuts.") for n in stray), stray
        else:
            assert not stray, f"files in {folder} that no committed row names: {stray}"
            assert not [n for n in os.listdir(d) if n.endswith(".tmp")], os.listdir(d)
        for shard, shard_rows in by_shard.items():
            assert shar.check(os.path.join(d, shard), shard_rows) is None, shard
        if by_shard and not stray:
            ids = [c.id for c in lhotse.CutSet.from_shar(in_dir=folder)]
            assert sorted(ids) == sorted(keys)
    for cut in read_cuts(out):
        field = next(iter(cut.custom))
        arrays[cut.id] = cut.load_custom(field)
        assert np.array_equal(arrays[cut.id], read(out, cut.id)), cut.id
    assert sorted(arrays) == sorted(r["key"] for r in read_manifest(out) if r["status"] == "ok")
    return arrays
