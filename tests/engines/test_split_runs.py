"""Split recordings in real runs (issue 15, part 2): a recording longer than a worker's fair share is
cut into pieces that run on several workers and rows at once, stitched by the runner and committed
whole; the result is the unsplit single-item encode, at every sample rate, tap and framing, and a
kill -9 mid-item resumes exactly."""

import os
import random

import numpy as np
import pytest
import torch

from support import cli, cli_process, tolerance, write_noise
from mimi_extract.audio.reader import load
from mimi_extract.codec.reference import reference_single
from support import check_consistency
from support.kill_trials import kill_9_part_way
from mimi_extract.store.manifest import read_manifest
from mimi_extract import read

RATES = {"long24.wav": (24_000, 40 * 24_000 + 777), "long16.wav": (16_000, 30 * 16_000 + 123),
         "long44.flac": (44_100, 20 * 44_100 + 5)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("split") / "in"
    root.mkdir()
    rng = np.random.default_rng(7)
    for name, (rate, n) in RATES.items():
        write_noise(root / name, n, rate, rng)
    for i in range(3):
        write_noise(root / f"short{i}.wav", 24_000 + 500 * i, 24_000, rng)
    return str(root)


# 1 s chunks, 8 s steps: 8 streams side by side per worker, 16 lanes (the GPU-like shape on CPU)
LANES = ("--chunk-seconds", 1, "--max-batch-seconds", 8)


def run(corpus, out, model_dir, *extra):
    result = cli("codes" if "--tap" not in extra else "features", corpus, out, "--model", model_dir,
                 "--device", "cpu", "--cpu-workers", 2, "--num-workers", 1, *LANES, *extra)
    assert result.exit_code == 0, result.output
    return result.text


@pytest.fixture(scope="module")
def split_codes(corpus, tiny_model_dir, tmp_path_factory):
    """The corpus's codes run split on 2 workers: its OUT and printed text (taken by the split test
    and, as the uninterrupted result, by the kill -9 test)."""
    out = tmp_path_factory.mktemp("split-codes") / "out"
    return out, run(corpus, out, tiny_model_dir, "-q", 8)


@pytest.mark.slow
def test_split_codes_equal_the_single_item_reference(corpus, tiny_model, tiny_model_dir, split_codes, tmp_path):
    """24, 16 (decoded from the start and dropped up to the piece) and 44.1 kHz (resampled the
    same way) recordings split on 2 workers: codes identical to transformers' encode of each file
    alone, and to an unsplit run; short files untouched.  With one full chunk per step (the CPU
    default) there are only 2 lanes and nothing here is longer than half the run: not split."""
    split, text = split_codes
    assert "split 3 long recording(s) into" in text, text
    run(corpus, tmp_path / "whole", tiny_model_dir, "-q", 8, "--no-split")
    check_consistency(str(split))
    default = cli("codes", corpus, tmp_path / "default", "--model", tiny_model_dir, "-q", 8, "--device", "cpu",
                  "--cpu-workers", 2, "--num-workers", 1)
    assert default.exit_code == 0 and "long recording(s) into" not in default.text, default.text
    for name in [*RATES, "short0.wav"]:
        ref = reference_single(tiny_model, load(os.path.join(corpus, name)), 8)["codes"].numpy()
        got = read(split, name)
        assert got.shape == ref.shape and np.array_equal(got, ref), name
        assert np.array_equal(read(tmp_path / "whole", name), got), name


@pytest.mark.slow
def test_split_recordings_resampled_on_the_device(corpus, tiny_model, tiny_model_dir, tmp_path):
    """The same split run with ``--resample-on device`` (the GPU's default, here on the CPU device):
    the 16 and 44.1 kHz recordings' pieces reach the encoder as native-rate rows, each decoded from
    the start and its warm-up dropped before anything is resampled; codes identical to the reference."""
    text = run(corpus, tmp_path / "device", tiny_model_dir, "-q", 8, "--resample-on", "device")
    assert "split 3 long recording(s) into" in text, text
    check_consistency(str(tmp_path / "device"))
    for name in [*RATES, "short0.wav"]:
        ref = reference_single(tiny_model, load(os.path.join(corpus, name)), 8)["codes"].numpy()
        got = read(tmp_path / "device", name)
        assert got.shape == ref.shape and np.array_equal(got, ref), name


@pytest.mark.slow
@pytest.mark.parametrize("framing, tap", [("transformers", "encoder"), ("moshi-stream", "latent")])
def test_split_features_every_tap_and_moshi_stream(corpus, tiny_model, tiny_model_dir, tmp_path, framing, tap):
    """The 25 Hz encoder tap (warm-up dropped in 25 Hz steps) and moshi's streaming mask (its call
    boundaries depend on absolute positions, which pieces keep): within float tolerance of the
    single-item reference, frame by frame."""
    out = tmp_path / "out"
    text = run(corpus, out, tiny_model_dir, "--tap", tap, "--framing", framing)
    assert "long recording(s) into" in text, text
    for name in RATES:
        audio = load(os.path.join(corpus, name), framing=None if framing == "transformers" else _framing(framing))
        ref = reference_single(tiny_model, audio, 8, 1 if framing == "moshi-stream" else None)[tap]
        got = torch.from_numpy(read(out, name))
        assert got.shape == ref.shape, (name, got.shape, ref.shape)
        assert (got - ref).abs().max() <= tolerance(ref), name


def _framing(name):
    from mimi_extract.audio.framing import Framing

    return Framing(name)


@pytest.mark.slow
def test_kill_9_mid_split_item_then_resume(corpus, tiny_model_dir, split_codes, tmp_path):
    """kill -9 while the split recordings' pieces are spread over the workers (a random few ms after
    the first commit, however fast the machine; the run must still be going): OUT is consistent, no
    recording is stored in part, and the resume equals an uninterrupted run exactly."""
    reference, _ = split_codes
    expected = {r["key"]: read(reference, r["key"]) for r in read_manifest(reference)}
    out = str(tmp_path / "out")
    proc = cli_process("codes", corpus, out, "--model", tiny_model_dir, "-q", 8, "--device", "cpu", "--cpu-workers", 2,
                       "--num-workers", 1, "--shard-size", 1, *LANES, start_new_session=True)
    lines = []
    for line in proc.stdout:  # the plan line: encoding starts
        lines.append(line)
        if "long recording(s) into" in line:
            break
    assert proc.poll() is None, "".join(lines)
    kill_9_part_way(proc, out, 1, random.Random(0), group=True, total=len(expected))
    committed = check_consistency(out, killed=True)
    assert len(committed) < len(expected), sorted(committed)
    for key, data in committed.items():
        assert np.array_equal(data, expected[key]), key  # a split recording is whole or absent
    run(corpus, out, tiny_model_dir, "-q", 8)
    final = check_consistency(out)
    assert set(final) == set(expected) and all(np.array_equal(final[k], expected[k]) for k in expected)


@pytest.mark.slow
def test_split_pieces_on_ray_actors(corpus, tiny_model, tiny_model_dir, ray_cluster, tmp_path):
    """Pieces go to Ray actors like any unit (each actor returns its pieces whole; the driver
    stitches): codes identical to the single-item reference."""
    result = cli("codes", corpus, tmp_path / "out", "--model", tiny_model_dir, "-q", 8, "--device", "cpu",
                 "--engine", "ray", "--ray-cpu-actors", 2, "--num-workers", 1, *LANES)
    assert result.exit_code == 0 and "long recording(s) into" in result.text, result.output
    for name in RATES:
        ref = reference_single(tiny_model, load(os.path.join(corpus, name)), 8)["codes"].numpy()
        assert np.array_equal(read(tmp_path / "out", name), ref), name
