"""How well an item's stored codes give back the audio the encoder saw: SI-SDR and a log-mel distance.

Both compare the decoded codes (``MimiModel.decode`` of the first ``q`` codebooks, computed by
:class:`~mimi_extract.codec.decoder.PaddedMimiDecoder`) with the 24 kHz input of the encoder, over
the input's samples (the decoder's output beyond them, the last frame's padding, is dropped).  They
are accumulated chunk by chunk (:class:`FidelityMeter`), so a streamed hour-long item needs neither
its whole input nor its whole decode in memory; fed in any chunking, the result is that of the whole
item (to float rounding, tested).

* **SI-SDR** (dB; Le Roux et al. 2019, "SDR -- half-baked or well done?"): both signals made zero
  mean, ``a = <d, r> / <r, r>``, ``10 log10(|a r|^2 / |d - a r|^2)``; ``r`` the input, ``d`` the
  decode.  Higher is better.  None for an input of no energy (digital silence: undefined).
* **Log-mel distance**: the mean, over frames and mel bands, of ``|ln max(M_r, 1e-5) - ln max(M_d,
  1e-5)|``, where ``M`` is the 80-band mel filterbank (HTK scale, 0-12 kHz, no normalisation:
  what ``torchaudio.functional.melscale_fbanks`` gives) applied to the STFT magnitude (1024-point periodic Hann
  window, hop 256, not centred; the frames cover the item, the last one zero-padded at the end).
  Lower is better; 0 is identical.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

N_FFT = 1024
HOP = 256
N_MELS = 80
FLOOR = 1e-5
SAMPLE_RATE = 24_000


@dataclass(frozen=True)
class Fidelity:
    """One item's fidelity: ``si_sdr`` in dB (None for a silent input) and ``mel_distance``."""

    si_sdr: float | None
    mel_distance: float


def mel_filters(n_freqs: int = N_FFT // 2 + 1, n_mels: int = N_MELS, rate: int = SAMPLE_RATE) -> torch.Tensor:
    """[n_freqs, n_mels] triangular HTK-mel filters from 0 Hz to ``rate / 2``, unnormalised (float64;
    what ``torchaudio.functional.melscale_fbanks(..., norm=None, mel_scale="htk")`` gives, tested:
    torchaudio is not a dependency of the package)."""
    freqs = torch.linspace(0, rate / 2, n_freqs, dtype=torch.float64)
    top = 2595.0 * math.log10(1.0 + (rate / 2) / 700.0)
    points = 700.0 * (10 ** (torch.linspace(0, top, n_mels + 2, dtype=torch.float64) / 2595.0) - 1.0)
    width = points[1:] - points[:-1]
    slopes = points[None, :] - freqs[:, None]
    down = -slopes[:, :-2] / width[:-1]
    up = slopes[:, 2:] / width[1:]
    return torch.clamp(torch.minimum(down, up), min=0.0)


_FILTERS: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}


def _mel(frames: torch.Tensor) -> torch.Tensor:
    """[K, N_FFT] frames -> [K, N_MELS] mel magnitudes (float64)."""
    if "cpu" not in _FILTERS:
        _FILTERS["cpu"] = (mel_filters(), torch.hann_window(N_FFT, periodic=True, dtype=torch.float64))
    fb, window = _FILTERS["cpu"]
    return torch.fft.rfft(frames * window).abs() @ fb


class FidelityMeter:
    """One item's running sums: ``update`` with each chunk of input and decode (same length), then
    ``result``.  SI-SDR needs only five sums; the STFT frames that straddle two chunks wait in a
    tail of fewer than ``N_FFT`` samples."""

    def __init__(self):
        self.n = 0
        self.sums = torch.zeros(5, dtype=torch.float64)  # sum r, sum d, sum r^2, sum d^2, sum r d
        self.mel_sum = 0.0
        self.mel_frames = 0
        self.tail: torch.Tensor | None = None  # [2, <N_FFT + HOP] samples not yet framed (input, decode)

    def update(self, reference: torch.Tensor, decoded: torch.Tensor) -> None:
        if reference.shape != decoded.shape:
            raise ValueError(f"input {tuple(reference.shape)} and decode {tuple(decoded.shape)} differ in length")
        pair = torch.stack([reference.detach().to("cpu", torch.float64), decoded.detach().to("cpu", torch.float64)])
        r, d = pair
        self.sums += torch.stack([r.sum(), d.sum(), (r * r).sum(), (d * d).sum(), (r * d).sum()])
        self.n += r.shape[0]
        self.tail = pair if self.tail is None else torch.cat([self.tail, pair], dim=1)
        self._frames(final=False)

    def _frames(self, final: bool) -> None:
        """Distance over the complete frames of the tail (with ``final``, the last ones zero-padded)."""
        size = self.tail.shape[1]
        if final:
            # frames cover the item: starts 0, HOP... while a frame starts before the item's last N_FFT samples
            count = self._total_frames() - self.mel_frames
            need = (count - 1) * HOP + N_FFT if count > 0 else 0
            if need > size:
                self.tail = torch.nn.functional.pad(self.tail, (0, need - size))
        else:
            count = 0 if size < N_FFT else (size - N_FFT) // HOP + 1
        if count <= 0:
            return
        frames = self.tail.unfold(1, N_FFT, HOP)[:, :count]  # [2, count, N_FFT]
        mel = torch.log(_mel(frames.reshape(-1, N_FFT)).clamp(min=FLOOR)).reshape(2, count, N_MELS)
        self.mel_sum += float((mel[0] - mel[1]).abs().sum())
        self.mel_frames += count
        self.tail = self.tail[:, count * HOP:]

    def _total_frames(self) -> int:
        return 1 + max(0, -(-(self.n - N_FFT) // HOP))

    def result(self) -> Fidelity:
        """The item's fidelity (call once, after its last chunk)."""
        if self.n == 0:
            raise ValueError("no samples")
        self._frames(final=True)
        sr, sd, srr, sdd, srd = self.sums.tolist()
        n = self.n
        rr = srr - sr * sr / n  # zero-mean energies and product
        dd = sdd - sd * sd / n
        rd = srd - sr * sd / n
        si_sdr = None
        if rr > 1e-20 * n:  # (digital silence: no SI-SDR)
            target = rd * rd / rr
            noise = max(dd - target, 0.0)
            si_sdr = 10 * math.log10(max(target, 1e-300) / max(noise, 1e-300 + 1e-15 * dd))
        return Fidelity(None if si_sdr is None else round(si_sdr, 4),
                        round(self.mel_sum / (self.mel_frames * N_MELS), 6))


def fidelity(reference: torch.Tensor, decoded: torch.Tensor) -> Fidelity:
    """One whole item's :class:`Fidelity` (``decoded`` may be longer: its first samples are compared)."""
    meter = FidelityMeter()
    meter.update(reference, decoded[: reference.shape[0]])
    return meter.result()
