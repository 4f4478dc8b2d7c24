"""The framing arithmetic: how a source of ``n`` samples at a rate becomes the encoder's 24 kHz input
-- its resampled length, its zero padding, the resampler's delay -- for each ``--framing``:
``transformers`` (MimiModel.encode of the resampled audio), ``moshi`` (the same, zero-padded to a
whole 1920-sample frame, as Kyutai's ``moshi`` package pads: moshi's *non-streaming* ``encode``),
``moshi-stream`` (the same padding, encoded as moshi's *streaming* mode encodes it when fed
``frames_per_call`` frames per call: its attention window differs from the non-streaming one past
the window's length, 10 s for Mimi; see ``PaddedMimiEncoder``) and ``muvap`` (the MuVAP front end:
16 kHz delayed by 16 samples through torchaudio's resampler, trimmed to round(1.5 n) samples, then
zero-padded to a multiple of 960).  Torch-free: numbers only."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..config.choices import SAMPLE_RATE
from .resample import reduced_rates, causal_lookahead

@dataclass(frozen=True)
class Framing:
    """How a source of ``n`` samples at ``rate`` becomes the encoder's 24 kHz input."""

    name: str = "transformers"
    causal_16k: bool = False  # True: 16 kHz input through the causal (delayed) resampler
    frames_per_call: int = 1  # moshi-stream: 1920-sample frames per moshi streaming call
    # the 24 kHz length of resampled input: "torchaudio" (its float32 rounding: what a user's loop
    # encodes) or "exact" (ceil(n * 24000 / rate): how OUTs made before 0.3 were cut; run.json's
    # ``resampled_length``, so a resume or an audit of such an OUT cuts its items alike)
    length: str = "torchaudio"

    @property
    def stream_frames(self) -> int | None:
        """Frames per moshi streaming call the encoder's attention reproduces (None: not streaming)."""
        return self.frames_per_call if self.name == "moshi-stream" else None

    def delay(self, rate: int) -> int:
        if self.name == "muvap" and rate == 16_000:
            return 16
        if rate == 16_000 and self.causal_16k and self.name != "muvap":
            return causal_lookahead(rate, SAMPLE_RATE)
        return 0

    def resampled_length(self, n: int, rate: int) -> int:
        """24 kHz samples of ``n`` source samples at ``rate``, before :meth:`input_length`'s padding.

        The sinc resampler's is ``torchaudio.functional.resample``'s own length, what a user's
        torchaudio + MimiModel loop encodes: the ceiling of ``new * n / orig`` (the rates reduced by their
        gcd) after torchaudio rounds that quotient to float32 (``torch.as_tensor`` of a Python float: torch's
        default dtype), capped at what its convolution gives, ``(n // orig + 1) * new``.  It is the exact
        ``ceil(n * 24000 / rate)`` while float32 keeps the fraction: from 131,072 samples (5.5 s) on, some
        lengths get one sample fewer; past 2^24 (11.6 min) also one or two more (docs/inputs.md).  The
        causal 16 kHz resampler keeps its nominal ``ceil(1.5 n)``, MuVAP its recipe's ``round(1.5 n)``."""
        if rate == SAMPLE_RATE:
            return n
        if self.name == "muvap" and rate == 16_000:
            return round(n * 1.5)  # Python's round: halves to even, as the MuVAP recipe does
        orig, new = reduced_rates(rate, SAMPLE_RATE)
        if (rate == 16_000 and self.causal_16k) or self.length == "exact":
            return math.ceil(new * n / orig)
        return min(math.ceil(float(np.float32(new * n / orig))), (n // orig + 1) * new)

    @property
    def multiple(self) -> int:
        """The encoder input is zero-padded to a multiple of this many samples."""
        return {"transformers": 1, "moshi": 1920, "moshi-stream": 1920, "muvap": 960}[self.name]

    def input_length(self, n: int, rate: int) -> int:
        """24 kHz samples the encoder gets for ``n`` source samples at ``rate``."""
        m = self.resampled_length(n, rate)
        return -(-m // self.multiple) * self.multiple

    @classmethod
    def of(cls, settings) -> "Framing":
        """The framing a run's :class:`~mimi_extract.config.settings.Settings` ask for."""
        return cls(settings.framing, settings.causal_16k, settings.frames_per_call, settings.resampled_length)
