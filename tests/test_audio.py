"""Resampling and decoding."""

import math

import numpy as np
import pytest
import soundfile as sf
import torch

from mimi_extract.audio import AudioError, causal_lookahead, causal_resample, load


def test_causal_resample_ignores_future_input():
    x = torch.randn(16_000)
    y = causal_resample(x, 16_000, 24_000)
    for cut in (0, 999, 5000, 12_345):
        x2 = x.clone()
        x2[cut + 1 :] += torch.randn(len(x) - cut - 1)
        y2 = causal_resample(x2, 16_000, 24_000)
        last_past = cut * 3 // 2  # output n sits at time n/24k: it may use inputs m <= n * 2/3
        assert torch.equal(y[: last_past + 1], y2[: last_past + 1])
        assert not torch.equal(y[last_past + 1 :], y2[last_past + 1 :])  # the future does matter


def test_causal_resample_length_and_delay():
    assert causal_resample(torch.zeros(16_001), 16_000, 24_000).shape[-1] == math.ceil(16_001 * 1.5)
    # a 300 Hz sine comes out as the same sine, late by the filter look-ahead
    sr_in, f = 16_000, 300.0
    x = torch.sin(2 * math.pi * f * torch.arange(sr_in) / sr_in)
    y = causal_resample(x, sr_in, 24_000)
    delay = causal_lookahead(sr_in, 24_000) / sr_in
    t = torch.arange(len(y)) / 24_000
    expected = torch.sin(2 * math.pi * f * (t - delay))
    assert (y[2000:-2000] - expected[2000:-2000]).abs().max() < 1e-2


def test_causal_resample_is_delayed_torchaudio_sinc():
    import torchaudio.functional as taf  # a declared dependency: a broken torch/torchaudio pair must fail here
    x = torch.randn(2, 8000)
    d = causal_lookahead(16_000, 24_000)
    expected = taf.resample(torch.nn.functional.pad(x, (d, 0)), 16_000, 24_000)[:, : 12_000]
    assert torch.allclose(causal_resample(x, 16_000, 24_000), expected, atol=1e-5)


def test_load_channels_and_rates(tmp_path):
    stereo = np.stack([np.full(2400, 0.5), np.full(2400, -0.1)], 1).astype(np.float32)
    sf.write(tmp_path / "s.wav", stereo, 24_000, subtype="FLOAT")
    assert torch.allclose(load(str(tmp_path / "s.wav"), "mix"), torch.full((2400,), 0.2))
    assert torch.allclose(load(str(tmp_path / "s.wav"), "first"), torch.full((2400,), 0.5))
    assert torch.allclose(load(str(tmp_path / "s.wav"), 1), torch.full((2400,), -0.1))
    with pytest.raises(AudioError, match="no channel 2"):
        load(str(tmp_path / "s.wav"), 2)
    sf.write(tmp_path / "m16.wav", np.zeros(1600, np.float32), 16_000)
    assert load(str(tmp_path / "m16.wav")).shape == (2400,)


def test_load_bad_files(tmp_path):
    (tmp_path / "empty.wav").write_bytes(b"")
    (tmp_path / "junk.flac").write_bytes(b"fLaC not really")
    nan = np.zeros(100, np.float32)
    nan[5] = np.nan
    sf.write(tmp_path / "nan.wav", nan, 24_000, subtype="FLOAT")
    for name, message in [("empty.wav", "cannot decode"), ("junk.flac", "cannot decode"), ("nan.wav", "NaN")]:
        with pytest.raises(AudioError, match=message):
            load(str(tmp_path / name))
