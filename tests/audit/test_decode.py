"""``decode --all`` in padded batches and chunks equals MimiModel.decode of each item alone."""

import os

import numpy as np
import soundfile as sf
import torch

from support import cli, extract, tolerance
from mimi_extract import read, read_manifest
from mimi_extract.audit import decode as decode_module
from mimi_extract.config.settings import Settings


def test_decode_all_batched_and_chunked_equals_each_item_alone(corpus, tiny_model, tiny_model_dir, tmp_path,
                                                                monkeypatch):
    root, _ = corpus
    out = str(tmp_path / "out")
    extract(root, out, Settings(model=tiny_model_dir, tap="codes", num_workers=0, num_quantizers=5))
    # small limits, so that the corpus's 1-38-frame items make several batches and chunked streams
    monkeypatch.setattr(decode_module, "decode_limits", lambda device: (20, 8))
    rows = [r for r in read_manifest(out) if r["status"] == "ok"]
    frames = [r["frames"] for r in rows]
    batches = decode_module.decode_batches([r["key"] for r in rows], frames, 20, 8)
    assert any(len(b) > 1 for b in batches) and max(frames) > 8  # both paths taken
    folder = tmp_path / "all"
    result = cli("decode", out, "--all", "-o", folder, "--device", "cpu")
    assert result.exit_code == 0, result.output
    paths = decode_module.mirrored_paths(str(folder), [r["key"] for r in rows])  # (the naming: tests/run/test_outputs.py)
    for row in rows:
        got, rate = sf.read(paths[row["key"]], dtype="float32")
        with torch.no_grad():
            ref = tiny_model.decode(torch.from_numpy(read(out, row["key"])).long().T[None]).audio_values[0, 0]
        assert rate == 24_000 and 0 < len(got) <= len(ref), row["key"]
        assert np.abs(got - ref[: len(got)].numpy()).max() <= tolerance(ref), row["key"]
    assert sum(len(files) for _, _, files in os.walk(folder)) == len(rows)


def test_limits_follow_the_encoders_step_and_chunk():
    assert decode_module.decode_limits("cpu") == (50, 50)  # 4 s and 4 s
    assert decode_module.decode_batches(list("abcd"), [60, 10, 30, 20], 50, 50) == [["b", "d"], ["c"], ["a"]]
