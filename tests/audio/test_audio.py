"""Resampling and decoding."""

import math

import numpy as np
import pytest
import soundfile as sf
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from mimi_extract.audio.decoders import AudioError
from mimi_extract.audio.reader import AudioReader, load, mix_channels
from mimi_extract.audio.framing import Framing
from mimi_extract.audio.resample import SincResampler, causal_lookahead


def causal_resample(wav: torch.Tensor, orig_sr: int, new_sr: int) -> torch.Tensor:
    """Resample 1-D ``wav`` so output n only uses inputs m with m / orig_sr <= n / new_sr: the
    package's streaming resampler delayed by its look-ahead, in one block, cut to the nominal length
    ceil(T * new_sr / orig_sr) (what ``--resampler causal`` computes for 16 kHz input)."""
    if orig_sr == new_sr:
        return wav
    r = SincResampler(orig_sr, new_sr, causal_lookahead(orig_sr, new_sr))
    head = r.push(wav)
    tail = r.finish().reshape(*wav.shape[:-1], -1)
    y = torch.cat([head, tail], dim=-1)
    return y[..., : math.ceil(r.new * wav.shape[-1] / r.orig)].to(wav.dtype)


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


def _write(tmp_path, name, data, rate):
    path = str(tmp_path / name)
    sf.write(path, data.astype(np.float32), rate, subtype="FLOAT")
    return path


@pytest.mark.parametrize("rate", [24_000, 16_000, 44_100, 8_000])
def test_streamed_reader_equals_whole_and_torchaudio(tmp_path, rate):
    """AudioReader in chunks == whole-file decode == torchaudio's resample (what the reference reads)."""
    import torchaudio.functional as taf

    rng = np.random.default_rng(rate)
    n = rate * 5 + 17
    data = 0.3 * rng.standard_normal((n, 2))
    path = _write(tmp_path, "x.wav", data, rate)
    whole = load(path)
    mono = torch.from_numpy(data.astype(np.float32).mean(1))
    expected = mono if rate == 24_000 else taf.resample(mono, rate, 24_000)  # every rate, 16 kHz included
    assert whole.shape == expected.shape
    assert (whole - expected).abs().max() < 1e-5
    if rate == 16_000:  # --resampler causal: delayed by the filter's look-ahead, nominal length
        causal = taf.resample(torch.nn.functional.pad(mono, (causal_lookahead(rate, 24_000), 0)), rate, 24_000)
        causal = causal[: math.ceil(n * 1.5)]
        got = load(path, causal_16k=True)
        assert got.shape == causal.shape and (got - causal).abs().max() < 1e-5
    for chunk in (1920, 1920 * 9, 7):
        reader, parts, final = AudioReader(path), [], False
        while not final:
            piece, final = reader.next_chunk(chunk)
            assert final or len(piece) == chunk
            parts.append(piece)
        assert torch.cat(parts).shape == whole.shape and (torch.cat(parts) - whole).abs().max() < 1e-6


# issue 31 item 7: the first source length at each rate whose torchaudio 24 kHz length differs from the
# exact ceil(n * 24000 / rate) (every n scanned; docs/inputs.md), and past 2^24 samples: the first with one
# MORE, the first with another frame count (ceil(samples / 1920)), the first where torchaudio's float32 target
# passes what its convolution gives (the cap)
FIRST_FEWER = {11_025: 60_287, 22_050: 120_427, 44_100: 240_854, 32_000: 5_592_407, 16_000: 5_592_407,
               8_000: 5_592_407, 48_000: 16_777_217}
PAST_2_24 = {"more": (8_000, 5_592_409), "frames 48k": (48_000, 16_780_801), "frames 44.1k": (44_100, 30_831_193),
             "capped": (8_000, 22_369_636)}


def _torchaudio_length(n: int, rate: int) -> int:
    import torchaudio.functional as taf

    return taf.resample(torch.zeros(n), rate, 24_000).shape[-1]  # (the length is torch's default dtype's, float32)


def _exact(n: int, rate: int) -> int:
    return -(-n * 24_000 // rate)


@pytest.mark.parametrize("rate", [11_025, 22_050, 44_100, 32_000])
def test_resampled_length_is_torchaudios(rate):
    """The tool's 24 kHz length is torchaudio.functional.resample's (a user's torchaudio + MimiModel
    loop), not the exact ceil(n * 24000 / rate): torchaudio rounds the quotient to float32 first, so
    from 131,072 output samples on some lengths get one sample fewer.  Pinned at the first such length
    of each rate, and the one before it (where the two agree)."""
    n = FIRST_FEWER[rate]
    got = Framing().resampled_length(n, rate)
    assert got == _torchaudio_length(n, rate) == _exact(n, rate) - 1
    assert Framing().resampled_length(n - 1, rate) == _torchaudio_length(n - 1, rate) == _exact(n - 1, rate)
    assert Framing("moshi").input_length(n, rate) == -(-got // 1920) * 1920


@pytest.mark.slow
def test_resampled_length_is_torchaudios_for_long_items():
    """The same for the rates whose first difference comes later (8, 16, 48 kHz: 16 kHz through the causal
    resampler keeps its nominal ceil(1.5 n)), the issue's 8.1 M samples at 44.1 kHz (4,413,951, exact
    4,413,952), and past 2^24 output samples (11.6 min): one sample more, another frame count, and the
    cap at what torchaudio's convolution gives."""
    cases = [(rate, FIRST_FEWER[rate]) for rate in (16_000, 8_000, 48_000)] + [(44_100, 8_110_635)]
    for rate, n in cases:
        assert Framing().resampled_length(n, rate) == _torchaudio_length(n, rate) == _exact(n, rate) - 1, (rate, n)
    assert Framing().resampled_length(8_110_635, 44_100) == 4_413_951
    assert Framing(causal_16k=True).resampled_length(FIRST_FEWER[16_000], 16_000) == _exact(FIRST_FEWER[16_000], 16_000)
    for what, (rate, n) in PAST_2_24.items():
        want = _torchaudio_length(n, rate)
        assert Framing().resampled_length(n, rate) == want != _exact(n, rate), what
        frames = -(-Framing().input_length(n, rate) // 1920)
        assert frames == -(-want // 1920) and Framing("moshi").input_length(n, rate) == frames * 1920, what
        if what.startswith("frames"):
            assert frames == -(-_exact(n, rate) // 1920) - 1, what
    assert Framing().resampled_length(5_592_409, 8_000) == _exact(5_592_409, 8_000) + 1
    # capped: float32(3 n) rounds up to 67,108,912; torchaudio's convolution gives (n + 1) * 3 = 67,108,911
    assert Framing().resampled_length(22_369_636, 8_000) == 67_108_911 == _exact(22_369_636, 8_000) + 3


def test_framings(tmp_path):
    import torchaudio.functional as taf

    rng = np.random.default_rng(1)
    for n in (16_000 * 2 + 1, 16_000 * 2 + 3):  # 1.5 n ends in .5: Python's round goes to even
        data = 0.3 * rng.standard_normal(n)
        path = _write(tmp_path, f"m{n}.wav", data, 16_000)
        got = load(path, framing=Framing("muvap"))
        recipe = taf.resample(torch.nn.functional.pad(torch.from_numpy(data.astype(np.float32)), (16, 0)), 16_000, 24_000)
        recipe = recipe[: round(n * 1.5)]
        recipe = torch.nn.functional.pad(recipe, (0, -len(recipe) % 960))
        assert got.shape == recipe.shape and (got - recipe).abs().max() < 1e-5
    path = _write(tmp_path, "p.wav", 0.3 * rng.standard_normal(24_000 + 5), 24_000)
    plain, moshi = load(path), load(path, framing=Framing("moshi"))
    assert len(moshi) == 1920 * 13 and torch.equal(moshi[: len(plain)], plain) and not moshi[len(plain):].any()
    assert Framing("moshi").input_length(24_005, 24_000) == len(moshi)
    assert Framing("muvap").input_length(32_003, 16_000) == 48_960


def test_segment_read(tmp_path):
    data = np.arange(48_000, dtype=np.float32) / 48_000
    path = _write(tmp_path, "seg.wav", data, 24_000)
    seg = load(path, start=1000, frames=500)
    assert torch.equal(seg, torch.from_numpy(data[1000:1500]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hnp.arrays(np.float32, st.tuples(st.integers(0, 40), st.integers(2, 12)),
                  elements=st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)))
def test_channels_mixed_bit_for_bit_as_numpy_s_mean(data):
    """A mix of several channels is numpy's ``mean(axis=1, dtype=float32)``, the rule of every
    reference here, bit for bit (signed zeros, NaN payloads, infinities, overflow, subnormals),
    whether the fast column-by-column sum or numpy's own mean (8 or more channels) computes it."""
    with np.errstate(all="ignore"):
        want = data.mean(axis=1, dtype=np.float32)
        got = mix_channels(data)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.shares_memory(got, data) is False
