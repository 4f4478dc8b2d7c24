"""The resampler to Mimi's 24 kHz: one windowed-sinc polyphase filter (torchaudio's kernel formula:
Hann window, 6 zero crossings, 0.99 roll-off) for every rate, streamed block by block with the
filter's history carried (:class:`SincResampler`), so a long recording read in blocks gives the
samples of the whole file.  The filter can be *delayed* by its look-ahead (:func:`causal_lookahead`,
the causal 16 kHz path: no 24 kHz sample depends on later input)."""

from __future__ import annotations

import math
from functools import lru_cache

from .lazy import torch  # imported at first use: the framing arithmetic asks only for the look-ahead

@lru_cache(maxsize=16)
def sinc_kernel(orig: int, new: int, width_zeros: int = 6, rolloff: float = 0.99) -> tuple[torch.Tensor, int]:
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


def reduced_rates(orig_sr: int, new_sr: int) -> tuple[int, int]:
    """``orig_sr`` and ``new_sr`` divided by their greatest common divisor: the reduced ratio the sinc
    kernel is built for, one rule for this resampler, the framings' arithmetic and the device's."""
    g = math.gcd(orig_sr, new_sr)
    return orig_sr // g, new_sr // g


def causal_lookahead(orig_sr: int, new_sr: int) -> int:
    """Input samples the causal resampler delays by (its filter's look-ahead)."""
    orig, new = reduced_rates(orig_sr, new_sr)
    _, width = sinc_kernel(orig, new)
    return width + orig - 1


class SincResampler:
    """Streaming polyphase resampler over the last axis: ``push`` blocks, then ``finish``; outputs
    concatenate to torchaudio's ``resample`` of the whole input delayed by ``delay`` input samples
    (before any trimming to a target length, which the caller applies)."""

    def __init__(self, orig_sr: int, new_sr: int, delay: int = 0):
        self.orig, self.new = reduced_rates(orig_sr, new_sr)
        self.kernel, self.width = sinc_kernel(self.orig, self.new)
        self.size = self.kernel.shape[-1]
        self.left = self.width + delay  # left padding (width) + delay, as torchaudio pads
        self.buffer: torch.Tensor | None = None  # [rows, samples] not yet consumed

    def _frames(self, final: bool) -> torch.Tensor:
        if final:
            self.buffer = torch.nn.functional.pad(self.buffer, (0, self.width + self.orig))
        length = self.buffer.shape[-1]
        n = (length - self.size) // self.orig + 1 if length >= self.size else 0
        if n <= 0:
            return self.buffer.new_zeros(self.buffer.shape[0], 0)
        x = self.buffer[:, : (n - 1) * self.orig + self.size]
        y = torch.nn.functional.conv1d(x[:, None], self.kernel, stride=self.orig)  # [rows, new, n]
        self.buffer = self.buffer[:, n * self.orig :]
        return y.transpose(1, 2).reshape(x.shape[0], -1)

    def push(self, block: torch.Tensor) -> torch.Tensor:
        shape = block.shape[:-1]
        rows = block.reshape(-1, block.shape[-1]).float()
        if self.buffer is None:
            self.buffer = rows.new_zeros(rows.shape[0], self.left)
        self.buffer = torch.cat([self.buffer, rows], dim=-1)
        out = self._frames(final=False)
        return out.reshape(*shape, out.shape[-1])

    def finish(self) -> torch.Tensor:
        if self.buffer is None:
            self.buffer = torch.zeros(1, self.left)
        out = self._frames(final=True)
        return out[0] if out.shape[0] == 1 else out
