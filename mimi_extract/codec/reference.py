"""The single-item reference: one unpadded item through transformers' own, unmodified forward passes.

What every batched, padded, chunked or split path of ``encoder.py`` is checked against (the tests,
``verify``), kept apart from the encoder so that it shares no code path with what it checks.
"""

from __future__ import annotations

import torch
from torch import nn

from .internals import eager_attention, encoder_parts


def moshi_stream_mask(steps: int, call_steps: int, window: int) -> torch.Tensor:
    """[steps, steps] bool: what a query may attend to in moshi's streaming encode, written out from
    its ring buffer of ``window`` key slots (a call of ``call_steps`` positions writes all its keys,
    then attends to the slots; a slot holds the last position written to it).  Independent of
    ``PaddedMimiEncoder.attention_mask`` on purpose: it is the reference that mask is checked against."""
    t = torch.arange(steps)
    call_end = (t // call_steps + 1) * call_steps - 1  # the last position written before query t attends
    return (t[None, :] <= t[:, None]) & (t[None, :] > call_end[:, None] - window)


@torch.no_grad()
def reference_single(model: nn.Module, audio: torch.Tensor, num_quantizers: int | None = None,
                     frames_per_call: int | None = None) -> dict:
    """One unpadded item through transformers' own, unmodified forward passes (the reference).
    ``frames_per_call``: moshi's streaming attention (``moshi_stream_mask``) given to transformers'
    transformer as its 4D mask, instead of its own sliding window.

    Returns ``encoder``/``latent`` as [frames, dim] and ``codes`` as [frames, N] (time first)."""
    seanet, transformer, downsample = encoder_parts(model)
    x = audio.reshape(1, 1, -1)
    h = seanet(x).transpose(1, 2)
    mask = None
    if frames_per_call is not None:
        call_steps = frames_per_call * (int(downsample.stride) if downsample is not None else 1)  # 25 Hz steps
        allowed = moshi_stream_mask(h.shape[1], call_steps, model.config.sliding_window).to(h.device)
        mask = allowed[None, None] if not eager_attention(model.config) else torch.zeros(
            allowed.shape, dtype=h.dtype, device=h.device).masked_fill(~allowed, torch.finfo(h.dtype).min)[None, None]
    h = transformer(h, attention_mask=mask).last_hidden_state
    latent = downsample(h.transpose(1, 2)) if downsample is not None else h.transpose(1, 2)
    codes = model.quantizer.encode(latent, num_quantizers).transpose(0, 1)
    return {"encoder": h[0], "latent": latent[0].T, "codes": codes[0].T}
