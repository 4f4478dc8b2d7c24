"""OUTs made or damaged by hand: a run directory written by the real ShardWriter without encoding
(``make_out``), a byte flipped in a stored array or anywhere in a file, and the check of a run's
arrays against the single-item reference (``check_outputs``)."""

import json
import os

import numpy as np

from mimi_extract import read
from mimi_extract.audio.reader import load
from mimi_extract.codec.reference import reference_single
from mimi_extract.formats import get_format
from mimi_extract.store.files import write_atomic
from mimi_extract.store.manifest import ManifestRow, read_manifest
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
