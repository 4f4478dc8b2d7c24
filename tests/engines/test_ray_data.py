"""mimi_extract.ray_data.MimiEncode: the Ray Data entry, on a real local Ray cluster, against the
single-item reference (transformers' own unpadded forward)."""

import io
import json
import os
import tarfile

import numpy as np
import pytest
import soundfile as sf
import torch

pytest.importorskip("ray")

from mimi_extract.audio.reader import load  # noqa: E402
from mimi_extract.codec.reference import reference_single  # noqa: E402
from mimi_extract.engines.ray_data import MimiEncode  # noqa: E402
from support import write_noise  # noqa: E402

# (name, seconds, rate): neighbours differ > 2x in length, so every batch of 4 mixes lengths;
# "long" is over the 2 s chunk (streamed in chunks)
CLIPS = [("a", 0.3, 24_000), ("b", 1.4, 16_000), ("c", 0.5, 44_100), ("d", 1.9, 24_000),
         ("e", 0.25, 16_000), ("long", 4.6, 24_000), ("f", 0.7, 24_000), ("g", 1.6, 16_000)]
KW = {"tap": "codes", "num_quantizers": 8, "device": "cpu", "chunk_seconds": 2, "max_batch_seconds": 30}


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray-data-clips")
    rng = np.random.default_rng(11)
    paths = {}
    for name, seconds, rate in CLIPS:
        paths[name] = str(root / f"{name}.flac")
        write_noise(paths[name], int(seconds * rate), rate=rate, rng=rng)
    return paths


@pytest.fixture(scope="module")
def reference(clips, tiny_model):
    return {name: reference_single(tiny_model, load(path), 8)["codes"].numpy() for name, path in clips.items()}


@pytest.fixture(scope="module")
def ray_data(ray_cluster):
    """The session's cluster (conftest's ``ray_cluster``: 4 logical CPUs, room for the read and write
    tasks beside two 1-CPU actors), with Ray Data's progress bars off."""
    ray_cluster.data.DataContext.get_current().enable_progress_bars = False
    return ray_cluster


def _codes(row) -> np.ndarray:
    return np.array([list(f) for f in row], dtype=np.int16)


def test_in_process_batch_mixed_inputs(clips, reference, tiny_model_dir):
    """One call on a numpy batch: a mixed-length padded step (0.25 s next to 1.9 s), bytes, a path,
    an Audio struct, float samples with a sample rate, and a garbage row that becomes an error row."""
    names = ["a", "d", "e", "long", "g", "bad"]
    data, _ = sf.read(clips["g"], dtype="float32")
    cells = [open(clips["a"], "rb").read(), clips["d"], {"bytes": open(clips["e"], "rb").read(), "path": "e.flac"},
             open(clips["long"], "rb").read(), data, b"garbage" * 50]
    audio = np.empty(len(cells), dtype=object)
    audio[:] = cells
    batch = {"audio": audio, "id": np.array(names), "sample_rate": np.array([0, 0, 0, 0, 16_000, 0])}
    encode = MimiEncode(model=tiny_model_dir, key_column="id", **KW)
    steps = encode._steps([type("R", (), {"audio": torch.zeros(n)})() for n in (6000, 45_600, 5000, 110_400)])
    assert [len(s) for s in steps] == [3, 1]  # the three short rows share one padded step
    out = encode(batch).to_pydict()
    assert "audio" not in out and out["id"] == names
    for i, name in enumerate(names[:-1]):
        assert out["error"][i] is None, out["error"][i]
        got = _codes(out["codes"][i])
        assert out["frames"][i] == len(got) and np.array_equal(got, reference[name]), name
    assert out["codes"][-1] is None and out["frames"][-1] is None
    assert out["error"][-1].startswith("bad: cannot decode")
    import pandas as pd  # batch_format="pandas" hands a DataFrame: same rows, same codes

    frame = encode(pd.DataFrame({"audio": list(audio[:2]), "id": names[:2]})).to_pydict()
    assert frame["codes"] == out["codes"][:2] and frame["error"] == [None, None]


@pytest.mark.slow
def test_parquet_pipeline(clips, reference, tiny_model_dir, ray_data, tmp_path):
    """read_parquet (a `datasets` Audio column) -> map_batches(MimiEncode) -> write_parquet, read back."""
    datasets = pytest.importorskip("datasets")
    ray = ray_data
    names = [n for n, _, _ in CLIPS]
    audio = [{"bytes": open(clips[n], "rb").read(), "path": f"{n}.flac"} for n in names]
    ds = datasets.Dataset.from_dict({"audio": audio, "id": names}).cast_column("audio", datasets.Audio())
    ds.to_parquet(str(tmp_path / "in.parquet"))
    out = str(tmp_path / "out")
    (ray.data.read_parquet(str(tmp_path / "in.parquet"))
     .map_batches(MimiEncode, fn_constructor_kwargs={"model": tiny_model_dir, **KW}, batch_size=4,
                  compute=ray.data.ActorPoolStrategy(size=2), num_cpus=1)
     .write_parquet(out))
    import pyarrow.parquet as pq

    rows = pq.read_table(out).to_pylist()  # a plain Arrow/Parquet reader: no Ray extension types
    assert sorted(r["id"] for r in rows) == sorted(names)
    for r in rows:
        assert r["error"] is None and np.array_equal(_codes(r["codes"]), reference[r["id"]]), r["id"]


@pytest.mark.slow
def test_webdataset_pipeline_with_garbage(clips, reference, tiny_model_dir, ray_data, tmp_path):
    """read_webdataset (flac + json members) -> MimiEncode on the flac column -> keys from the sample
    key; a garbage flac is an error row and the other rows of its batch are fine."""
    ray = ray_data
    shard = tmp_path / "shard-000.tar"
    with tarfile.open(shard, "w") as tar:
        for name in [n for n, _, _ in CLIPS[:4]] + ["bad"] + [n for n, _, _ in CLIPS[4:]]:
            data = open(clips[name], "rb").read() if name != "bad" else b"not audio at all" * 40
            for member, payload in ((f"{name}.flac", data), (f"{name}.json", json.dumps({"n": name}).encode())):
                info = tarfile.TarInfo(member)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    out = str(tmp_path / "out")
    (ray.data.read_webdataset(str(shard))
     .map_batches(MimiEncode, fn_constructor_kwargs={"model": tiny_model_dir, "audio_column": "flac",
                                                     "key_column": "__key__", **KW},
                  batch_size=4, compute=ray.data.ActorPoolStrategy(size=1), num_cpus=1)
     .write_parquet(out))
    import pyarrow.parquet as pq

    rows = {r["__key__"]: r for r in pq.read_table(out).to_pylist()}
    assert sorted(rows) == sorted([n for n, _, _ in CLIPS] + ["bad"])
    assert rows["bad"]["codes"] is None and rows["bad"]["error"].startswith("bad: cannot decode")
    for name, ref in reference.items():
        r = rows[name]
        assert r["error"] is None and r["json"]["n"] == name and r["frames"] == len(ref)
        assert np.array_equal(_codes(r["codes"]), ref), name
    assert os.path.basename(rows["a"]["__url__"]) == "shard-000.tar"
