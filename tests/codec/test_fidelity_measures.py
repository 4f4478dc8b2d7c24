"""SI-SDR and the log-mel distance against independent computations, whole and chunk by chunk."""

import math

import numpy as np
import pytest
import torch
import torchaudio

from mimi_extract.codec.fidelity import FidelityMeter, fidelity, mel_filters


def si_sdr_reference(r: np.ndarray, d: np.ndarray) -> float:
    """Le Roux et al.'s definition, written out directly (float64)."""
    r = r - r.mean()
    d = d - d.mean()
    target = (np.dot(d, r) / np.dot(r, r)) * r
    return 10 * math.log10(np.sum(target ** 2) / np.sum((d - target) ** 2))


def mel_distance_reference(r: torch.Tensor, d: torch.Tensor) -> float:
    """torchaudio's spectrogram and filterbank over the item, zero-padded to whole frames."""
    n = len(r)
    frames = 1 + max(0, math.ceil((n - 1024) / 256))
    size = (frames - 1) * 256 + 1024
    spec = torchaudio.transforms.Spectrogram(n_fft=1024, hop_length=256, center=False, power=1.0,
                                             window_fn=torch.hann_window)
    fb = torchaudio.functional.melscale_fbanks(513, 0.0, 12000.0, 80, 24000, norm=None, mel_scale="htk")

    def logmel(x):
        x = torch.nn.functional.pad(x.double(), (0, size - n))
        return torch.log((spec.double()(x).T @ fb.double()).clamp(min=1e-5))

    return float((logmel(r) - logmel(d)).abs().mean())


def signals(n, seed=0, noise=0.1):
    g = torch.Generator().manual_seed(seed)
    r = 0.3 * torch.randn(n, generator=g) + 0.05  # not zero mean: SI-SDR removes the mean
    d = 0.8 * r + noise * torch.randn(n, generator=g)
    return r, d


def test_mel_filters_are_torchaudios():
    ref = torchaudio.functional.melscale_fbanks(513, 0.0, 12000.0, 80, 24000, norm=None, mel_scale="htk")
    assert torch.allclose(mel_filters().float(), ref, atol=1e-5)  # (torchaudio computes in float32)


@pytest.mark.parametrize("n", [1, 700, 1024, 1025, 24_000 + 77])
def test_whole_item_equals_the_references(n):
    r, d = signals(n, seed=n)
    got = fidelity(r, d)
    if n > 1:
        assert abs(got.si_sdr - si_sdr_reference(r.double().numpy(), d.double().numpy())) < 1e-3
    assert abs(got.mel_distance - mel_distance_reference(r, d)) < 1e-5


@pytest.mark.parametrize("cuts", [[1920], [100, 1024, 2000], [256 * 7 + 3, 9000], list(range(1, 30_000, 3333))])
def test_any_chunking_gives_the_whole_items_result(cuts):
    r, d = signals(30_011, seed=1)
    meter = FidelityMeter()
    for a, b in zip([0, *cuts], [*cuts, len(r)]):
        meter.update(r[a:b], d[a:b])
    got, whole = meter.result(), fidelity(r, d)
    assert abs(got.si_sdr - whole.si_sdr) < 1e-3 and abs(got.mel_distance - whole.mel_distance) < 1e-5


def test_identical_scaled_silent_and_worse():
    r, d = signals(48_000)
    assert fidelity(r, r).mel_distance == 0 and fidelity(r, r).si_sdr > 100
    assert abs(fidelity(r, 3 * d).si_sdr - fidelity(r, d).si_sdr) < 1e-3  # scale-invariant
    assert fidelity(r, d).si_sdr > fidelity(r, signals(48_000, noise=0.5)[1]).si_sdr
    assert fidelity(torch.zeros(5000), d[:5000]).si_sdr is None  # undefined for digital silence
    with pytest.raises(ValueError, match="differ in length"):
        FidelityMeter().update(r[:10], d[:11])
