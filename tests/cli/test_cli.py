"""End to end: the CLI on a generated corpus, outputs compared with single-item transformers encodes."""

import glob
import json
import os

import h5py
import numpy as np
import pytest
import soundfile as sf
import torch

from support import cli
from support import interrupt_after_items
from mimi_extract import read, read_manifest
from mimi_extract.audio.reader import load
from mimi_extract.codec.reference import reference_single
from support import extract
from mimi_extract.config.settings import Settings
from support.outs import check_outputs

BAD = {"empty.wav": "empty file", "corrupt.wav": "corrupt", "zero_len.wav": "zero-length"}


def common(model_dir):
    # in-process (one CPU worker) and batched: the CPU defaults are one process per core, batch 1
    return ["--model", model_dir, "--device", "cpu", "--cpu-workers", "1", "--num-workers", "1", "--batch-size", "8"]


def all_dataset_keys(out):
    keys = []
    for shard in sorted(glob.glob(os.path.join(out, "shard-*.h5"))):
        with h5py.File(shard, "r") as f:
            f.visititems(lambda name, obj: keys.append(obj.attrs["key"].decode()) if isinstance(obj, h5py.Dataset) else None)
    return keys


def test_features_end_to_end(corpus, tiny_model, tiny_model_dir, tmp_path):
    root, described = corpus
    out = tmp_path / "out"
    result = cli("features", root, out, *common(tiny_model_dir), "--shard-size", 3)
    assert result.exit_code == 0, result.output
    rows = read_manifest(out)
    assert sorted(r["path"] for r in rows) == sorted(described)  # one row per input, nothing else
    for row in rows:
        if row["path"] in BAD:
            assert row["status"] == "error" and BAD[row["path"]] in row["error"] and row["shard"] is None
        else:
            assert row["status"] == "ok" and row["error"] is None
    ok = check_outputs(str(out), root, tiny_model, "latent")
    assert len(ok) == 7
    assert len(glob.glob(str(out / "shard-*.h5"))) == 3  # rolled every 3 utterances
    with h5py.File(out / ok[0]["shard"], "r") as f:
        # strings are fixed-length UTF-8 (no global heap: test_hdf5_damage.py): h5py gives bytes
        assert f.attrs["tap"] == b"latent" and f.attrs["frame_rate"] == 12.5
        assert f.attrs["model"].decode() == tiny_model_dir and len(f.attrs["config_hash"]) == 16
    assert cli("features", root, out, *common(tiny_model_dir), "--strict").exit_code == 1  # errors + --strict


def test_encoder_tap_float16(corpus, tiny_model, tiny_model_dir, tmp_path):
    root, _ = corpus
    out = tmp_path / "out"
    assert cli("features", root, out, *common(tiny_model_dir), "--tap", "encoder", "--feature-dtype", "float16").exit_code == 0
    row = next(r for r in read_manifest(out) if r["path"] == "sine_440.wav")
    got = read(out, row["key"])
    ref = reference_single(tiny_model, load(os.path.join(root, "sine_440.wav")), 8)["encoder"].numpy()
    assert got.dtype.name == "float16" and got.shape == ref.shape == (51, 32)  # 48123 samples -> 51 frames at 25 Hz,, before the downsample
    assert abs(got.astype("float32") - ref).max() <= 2e-3 * max(1, abs(ref).max())


def test_codes_channel_each(corpus, tiny_model, tiny_model_dir, tmp_path):
    root, described = corpus
    out = tmp_path / "codes"
    result = cli("codes", root, out, *common(tiny_model_dir), "--num-quantizers", 4, "--channel", "each")
    assert result.exit_code == 0, result.output
    keys = {r["key"] for r in read_manifest(out)}
    assert {"stereo.wav#ch0", "stereo.wav#ch1"} <= keys and "stereo.wav" not in keys
    rows = check_outputs(str(out), root, tiny_model, "codes", num_quantizers=4)
    assert len(rows) == 8
    assert cli("codes", root, tmp_path / "c2", *common(tiny_model_dir), "-q", 9).exit_code == 2  # model has 8


def test_resume_after_interruption(corpus, tiny_model, tiny_model_dir, tmp_path):
    root, described = corpus
    out = str(tmp_path / "out")
    settings = Settings(model=tiny_model_dir, tap="codes", num_quantizers=8, batch_size=2, num_workers=0)
    with pytest.raises(KeyboardInterrupt):
        extract(root, out, settings, shard_size=1, on_progress=interrupt_after_items(2))
    partial = [r for r in read_manifest(out) if r["status"] == "ok"]
    assert 0 < len(partial) < 7
    # what a hard kill can leave behind: a half-written shard, rows of a shard that was never
    # renamed into place, and a torn last manifest line
    open(os.path.join(out, "shard-00042.h5.tmp"), "wb").write(b"\x89HDF half written")
    with open(os.path.join(out, "manifest.jsonl"), "a") as f:
        f.write(json.dumps({"path": "sine_440.wav", "key": "sine_440.wav", "shard": "shard-00041.h5",
                            "status": "ok"}) + "\n")
        f.write('{"path": "stereo.wav", "key": "ste')

    result = cli("codes", root, out, *common(tiny_model_dir), "--batch-size", 2)
    assert result.exit_code == 0, result.output
    assert f"({len(partial)} already done)" in result.text
    rows = read_manifest(out)
    assert sorted(r["path"] for r in rows) == sorted(described)  # exactly one row per input
    assert not glob.glob(os.path.join(out, "*.tmp"))
    keys = all_dataset_keys(out)
    assert sorted(keys) == sorted(r["key"] for r in rows if r["status"] == "ok")  # nothing duplicated
    check_outputs(out, root, tiny_model, "codes")
    # a third run has nothing left to do
    again = cli("codes", root, out, *common(tiny_model_dir), "--batch-size", 2)
    assert "(7 already done), 3 unreadable, 0 to encode" in again.text and all_dataset_keys(out) == keys


@pytest.mark.slow
def test_two_device_workers_match(corpus, tiny_model, tiny_model_dir, tmp_path):
    """The multi-device path (one process per device; here two CPU 'devices') merges correctly."""
    root, described = corpus
    out = tmp_path / "multi"
    result = cli("codes", root, out, "--model", tiny_model_dir, "--device", "cpu,cpu", "--num-workers", "1",
                 "--batch-size", 2)
    assert result.exit_code == 0, result.output
    assert sorted(r["path"] for r in read_manifest(out)) == sorted(described)
    assert len(check_outputs(str(out), root, tiny_model, "codes")) == 7


def test_settings_mismatch_refused(corpus, tiny_model_dir, tmp_path):
    root, _ = corpus
    out = tmp_path / "out"
    assert cli("features", root, out, *common(tiny_model_dir), "--limit", 3).exit_code == 0  # 2 bad, 1 ok
    result = cli("codes", root, out, *common(tiny_model_dir))
    assert result.exit_code == 2 and "other settings" in result.text


def test_input_changed_in_place_is_refused(tmp_path, tiny_model_dir):
    """A file replaced in place (same key, another rate and length) is not skipped as done: its
    stored output describes the old audio."""
    root = tmp_path / "in"
    root.mkdir()
    sf.write(str(root / "a.wav"), np.zeros(32_000, np.float32), 16_000)
    sf.write(str(root / "b.wav"), np.zeros(24_000, np.float32), 24_000)
    out = tmp_path / "out"
    assert cli("codes", root, out, *common(tiny_model_dir)).exit_code == 0
    sf.write(str(root / "a.wav"), np.zeros(72_000, np.float32), 24_000)
    result = cli("codes", root, out, *common(tiny_model_dir))
    assert result.exit_code == 2 and "1 input file(s) changed" in result.text, result.output
    assert "a.wav: 16000 Hz, 32000 samples, 1 channel(s) when encoded, now 24000 Hz, 72000 samples" in result.text
    assert [r["sample_rate"] for r in read_manifest(str(out)) if r["key"] == "a.wav"] == [16_000]


def test_verify_command(corpus, tiny_model_dir):
    root, _ = corpus
    result = cli("verify", root, "--model", tiny_model_dir, "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert "PASS" in result.text and "codes differing 0/984: 0 tie flips, 0 real" in result.text
    strict = cli("verify", root, "--model", tiny_model_dir, "--device", "cpu", "--rtol", 0, "--atol", 0)
    assert strict.exit_code == 1 and "FAIL" in strict.text  # fp32 rounding differs: the check can fail


def test_bad_input_dir_and_model(tmp_path, tiny_model_dir):
    assert "does not exist" in cli("features", tmp_path / "nope", tmp_path / "o", *common(tiny_model_dir)).text
    (tmp_path / "in").mkdir()
    result = cli("features", tmp_path / "in", tmp_path / "o", "--model", "./no-such-model", "--device", "cpu")
    assert result.exit_code == 2 and "does not exist" in result.text
    result = cli("codes", tmp_path / "in", tmp_path / "o", *common(tiny_model_dir), "--dtype", "bf16")
    assert result.exit_code == 2 and "needs GPUs" in result.text


@pytest.mark.parametrize("command", ["features", "codes", "verify"])
def test_help(command):
    result = cli(command, "--help", env={"COLUMNS": "400"})
    assert result.exit_code == 0 and "Example" in result.text
    if command != "verify":  # bracketed help text is shown, not eaten as markup
        assert "[default: 64 on GPU, 8 on CPU]" in result.text and "mimi-extract[ray]" in result.text, result.output
        # every registered output format and input kind is offered, from its own module's summary
        from mimi_extract.formats import formats
        from mimi_extract.sources.base import REGISTRY

        text = " ".join(result.text.replace("│", " ").split())  # (rich wraps help text in a box)
        assert all(f.summary and f"{f.name} = {' '.join(f.summary.split())}" in text for f in formats()), text
        assert "instead of detecting it: " + ", ".join(
            k + (f" ({c.summary})" if c.summary else "") for k, c in REGISTRY.items()) in text


@pytest.mark.parametrize("error", [
    torch.cuda.OutOfMemoryError("simulated"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: can't allocate memory: "
                 "you tried to allocate 8100000000 bytes. Error code 12 (Cannot allocate memory)"),
])
def test_out_of_memory_splits_batch(corpus, tiny_model, tiny_model_dir, tmp_path, monkeypatch, error):
    """A batch that does not fit (on any device) is halved and retried; nothing is lost and results
    stay exact.  Today only CUDA's error is caught: the CPU allocator's aborts the run."""
    from mimi_extract.codec.encoder import PaddedMimiEncoder

    real_forward = PaddedMimiEncoder.forward
    tried, encoded = [], []

    def small_memory(self, audio, *args, **kwargs):
        tried.append(audio.shape[0])
        if audio.shape[0] > 2:
            raise error
        encoded.append(audio.shape[0])
        return real_forward(self, audio, *args, **kwargs)

    monkeypatch.setattr(PaddedMimiEncoder, "forward", small_memory)
    root, _ = corpus
    out = str(tmp_path / "oom")
    settings = Settings(model=tiny_model_dir, tap="codes", batch_size=8, max_batch_seconds=60, num_workers=0)
    summary = extract(root, out, settings)
    assert tried[0] == 7 and sum(encoded) == 7 and max(encoded) <= 2 and summary.ok == 7
    check_outputs(out, root, tiny_model, "codes")


def test_out_of_memory_alone_is_an_error_row(corpus, tiny_model_dir, tmp_path, monkeypatch):
    """An item that does not fit even alone gets an error row; the run goes on and completes."""
    from mimi_extract.codec.encoder import PaddedMimiEncoder

    real_forward = PaddedMimiEncoder.forward

    def no_memory_for_sine(self, audio, lengths, *args, **kwargs):
        if int(lengths.max()) == 48_123:  # sine_440.wav
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8100000000 bytes")
        return real_forward(self, audio, lengths, *args, **kwargs)

    monkeypatch.setattr(PaddedMimiEncoder, "forward", no_memory_for_sine)
    root, _ = corpus
    out = str(tmp_path / "oom1")
    summary = extract(root, out, Settings(model=tiny_model_dir, tap="codes", num_workers=0))
    assert summary.ok == 6
    (row,) = [r for r in read_manifest(out) if r["path"] == "sine_440.wav"]
    assert row["status"] == "error" and "out of memory even alone" in row["error"]
