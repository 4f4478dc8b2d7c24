"""Packaged corpora, a pytest plugin (tests/conftest.py registers it): a few loose files (``FILES``)
and the same audio as tar/WebDataset shards, a Hugging Face dataset and a lhotse Shar, with their
writers and the equality check of two runs' arrays.  Module-scoped: each test module builds its own."""

import io
import json
import os
import tarfile

import numpy as np
import pytest
import soundfile as sf

from mimi_extract.config.settings import Settings
from support import check_consistency, extract


# name -> (seconds, rate, channels); flac and wav, three rates, one stereo file
FILES = {"a.flac": (0.7, 16_000, 1), "b.wav": (1.3, 24_000, 1), "c.flac": (0.45, 44_100, 1),
         "d.wav": (0.9, 24_000, 2), "e.flac": (1.1, 16_000, 1), "f.wav": (0.3, 24_000, 1)}


def settings(model_dir, **kw):
    return Settings(model=model_dir, tap="codes", num_workers=1, **kw)


@pytest.fixture(scope="module")
def loose(tmp_path_factory):
    root = tmp_path_factory.mktemp("loose")
    rng = np.random.default_rng(3)
    for name, (seconds, rate, channels) in FILES.items():
        shape = int(seconds * rate) if channels == 1 else (int(seconds * rate), channels)
        sf.write(str(root / name), (0.2 * rng.standard_normal(shape)).astype(np.float32), rate,
                 subtype="PCM_16")
    return str(root)


@pytest.fixture(scope="module")
def loose_run(loose, tiny_model_dir, tmp_path_factory):
    """The loose files encoded: what every packaged form of the same audio must give, key for key."""
    out = str(tmp_path_factory.mktemp("loose-out") / "out")
    assert extract(loose, out, settings(tiny_model_dir)).ok == len(FILES)
    return check_consistency(out)


def add_bytes(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def write_tar(path, loose, names, sidecar=True, extra=()):
    """A WebDataset shard: ``<stem>.<ext>`` + ``<stem>.json`` (the id: the loose file's name)."""
    with tarfile.open(path, "w") as tf:
        for name in names:
            stem = name.split(".")[0]
            with open(os.path.join(loose, name), "rb") as f:
                add_bytes(tf, f"{stem}.{name.split('.')[1]}", f.read())
            if sidecar:
                add_bytes(tf, f"{stem}.json", json.dumps({"id": name, "text": "hi"}).encode())
        for name, data in extra:
            add_bytes(tf, name, data)
    return str(path)


def assert_equal_arrays(got, want, mapping=lambda k: k):
    assert len(got) == len(want)
    for key, data in got.items():
        assert np.array_equal(data, want[mapping(key)]), key


# -- tar ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shards(loose, tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    names = sorted(FILES)
    write_tar(root / "en-000000.tar", loose, names[:3])
    write_tar(root / "en-000001.tar", loose, names[3:])
    return str(root)


# -- Parquet / HF datasets ------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_dataset(loose, tmp_path_factory):
    """The loose files as a datasets Audio column (bytes embedded, as on the Hub): Parquet with
    two-row row groups, and a save_to_disk folder."""
    datasets = pytest.importorskip("datasets")
    root = tmp_path_factory.mktemp("hf")
    names = sorted(FILES)
    audio = [{"bytes": open(os.path.join(loose, n), "rb").read(), "path": n} for n in names]
    ds = datasets.Dataset.from_dict({"audio": audio, "id": names}).cast_column("audio", datasets.Audio())
    (root / "data").mkdir()
    ds.to_parquet(str(root / "data" / "train-00000-of-00001.parquet"), batch_size=2)
    ds.save_to_disk(str(root / "saved"))
    assert datasets.load_dataset("parquet", data_files=str(root / "data" / "*.parquet"), split="train")["id"] == names
    return str(root)


# -- lhotse Shar ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shar(loose, tmp_path_factory):
    """The loose files as a lhotse Shar written by lhotse itself (flac members, 4 cuts a shard)."""
    lhotse = pytest.importorskip("lhotse")
    root = tmp_path_factory.mktemp("shar")
    recs = [lhotse.Recording.from_file(os.path.join(loose, n), recording_id=n.split(".")[0]) for n in sorted(FILES)]
    cuts = lhotse.CutSet.from_manifests(recordings=lhotse.RecordingSet.from_recordings(recs))
    cuts = lhotse.CutSet.from_cuts(c.with_id(c.recording_id) for c in cuts)
    cuts.to_shar(str(root), fields={"recording": "flac"}, shard_size=4)
    return str(root)
