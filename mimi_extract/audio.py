"""Decoding, channel handling and resampling to Mimi's 24 kHz.

16 kHz input (the common ASR rate) goes through a *causal* windowed-sinc resampler: the input is
delayed by the filter's look-ahead so that no 24 kHz sample depends on a 16 kHz sample later in
time, which keeps Mimi's causal encoder causal end to end.  Other rates use torchaudio.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import soundfile as sf
import torch

SAMPLE_RATE = 24_000
CHANNEL_MODES = ("mix", "first", "each")


class AudioError(Exception):
    """A file that cannot be used; the message is what the manifest reports."""


@lru_cache(maxsize=16)
def _sinc_kernel(orig: int, new: int, width_zeros: int = 6, rolloff: float = 0.99) -> tuple[torch.Tensor, int]:
    """Hann-windowed sinc polyphase kernel [new, 1, 2*width + orig] (torchaudio's formula).

    ``orig``/``new`` are already divided by their gcd; returns (kernel, width in input samples)."""
    base = min(orig, new) * rolloff
    width = math.ceil(width_zeros * orig / base)
    idx = torch.arange(-width, width + orig, dtype=torch.float64)[None, :] / orig
    t = (idx - torch.arange(new, dtype=torch.float64)[:, None] / new) * base
    t = t.clamp(-width_zeros, width_zeros)
    window = torch.cos(t * math.pi / width_zeros / 2) ** 2
    t = t * math.pi
    kernel = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t) * window * (base / orig)
    return kernel[:, None].float(), width


def causal_lookahead(orig_sr: int, new_sr: int) -> int:
    """Input samples the causal resampler delays by (its filter's look-ahead)."""
    g = math.gcd(orig_sr, new_sr)
    orig = orig_sr // g
    _, width = _sinc_kernel(orig, new_sr // g)
    return width + orig - 1


def causal_resample(wav: torch.Tensor, orig_sr: int, new_sr: int) -> torch.Tensor:
    """Resample [..., T] so output n only uses inputs m with m / orig_sr <= n / new_sr.

    Equals a symmetric sinc resampler applied to the input delayed by ``causal_lookahead`` samples;
    the output keeps the nominal length ceil(T * new_sr / orig_sr)."""
    g = math.gcd(orig_sr, new_sr)
    orig, new = orig_sr // g, new_sr // g
    if orig == new:
        return wav
    kernel, width = _sinc_kernel(orig, new)
    delay = width + orig - 1
    shape = wav.shape
    x = wav.reshape(-1, 1, shape[-1]).float()
    # symmetric version pads (width, width + orig); the delay moves all look-ahead to the left
    x = torch.nn.functional.pad(x, (width + delay, width + orig - delay))
    y = torch.nn.functional.conv1d(x, kernel.to(x.device), stride=orig)  # [B, new, frames]
    y = y.transpose(1, 2).reshape(x.shape[0], -1)
    target = math.ceil(new * shape[-1] / orig)
    return y[:, :target].reshape(*shape[:-1], target).to(wav.dtype)


def resample(wav: torch.Tensor, orig_sr: int, causal_16k: bool = True) -> torch.Tensor:
    """To 24 kHz: causal path for 16 kHz (unless disabled), torchaudio for other rates."""
    if orig_sr == SAMPLE_RATE:
        return wav
    if orig_sr == 16_000 and causal_16k:
        return causal_resample(wav, orig_sr, SAMPLE_RATE)
    try:
        import torchaudio.functional as taf
    except Exception as e:  # a torchaudio wheel built for another torch fails at import
        raise AudioError(f"resampling {orig_sr} Hz needs torchaudio, which failed to import: {e}") from e
    return taf.resample(wav, orig_sr, SAMPLE_RATE)


def load(path: str, channel: int | str = "mix", causal_16k: bool = True) -> torch.Tensor:
    """Decode ``path`` to a mono float32 24 kHz tensor [T].

    ``channel``: "mix" (mean of channels), "first", or a channel index (for ``--channel each``)."""
    try:
        data, sr = sf.read(path, dtype="float32", always_2d=True)
    except Exception as e:
        raise AudioError(f"cannot decode: {e}") from e
    if data.shape[0] == 0:
        raise AudioError("no audio samples (zero-length)")
    if not np.isfinite(data).all():
        raise AudioError("contains NaN or infinite samples")
    if channel == "mix":
        mono = data.mean(axis=1)
    elif channel == "first":
        mono = data[:, 0]
    else:
        if int(channel) >= data.shape[1]:
            raise AudioError(f"has {data.shape[1]} channel(s), no channel {channel}")
        mono = data[:, int(channel)]
    return resample(torch.from_numpy(np.ascontiguousarray(mono)), sr, causal_16k)
