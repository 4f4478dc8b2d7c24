"""Padding-aware, batched and chunkable Mimi *decoder*: codes back to 24 kHz audio, exactly as
``MimiModel.decode`` gives each item alone.

Unlike the encoder, every decoder op is causal and reads no padding: the convs are causal with
stride 1, the transposed convs (the 2x upsample and SEANet's four) are causal with their
``kernel - stride`` right overhang trimmed, the transformer is causal.  So ``MimiModel.decode`` of a
right-padded batch already gives each item's valid samples (measured: tests/codec/test_decoder.py),
but it cannot decode a long item in bounded memory (its transformer's mask is T x T), and its padding
decodes to sound.  :class:`PaddedMimiDecoder` runs the same transformers sub-modules (weights,
RoPE, attention kernels, transformer layer ``forward``) on a right-padded batch of codes with
per-item frame counts, and chunk by chunk with carried state:

* the codes' padding is replaced by code 0 before ``quantizer.decode`` (any index is valid there);
* after every conv and transformer layer the padded steps are zeroed (``where``: even NaN cannot
  leak), so a conv's or transposed conv's valid outputs see exactly what they see for a lone item;
* the transformer gets the causal sliding-window mask built from the lengths
  (:class:`~mimi_extract.codec.encoder.WindowedTransformer`, the encoder's one rule).

Chunk by chunk with an :class:`~mimi_extract.codec.encoder.EncoderState` (the same carried state as
the encoder's): each stride-1 conv carries its last ``kernel - 1`` (dilated) inputs, each transposed
conv its last ``ceil((kernel - stride) / stride)`` inputs, whose overhang reaches into the chunk's
first outputs; the transformer carries its key/value window and RoPE positions.  A long item decoded
in chunks equals ``MimiModel.decode`` of the whole, to float rounding (tests/codec/test_decoder.py).

Only per-layer batched ops; the one per-row loop is zeroing short rows' tails on the CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .encoder import EncoderState, WindowedTransformer, valid_mask
from .internals import (MimiConv1d, MimiConvTranspose1d, MimiResnetBlock, cache_keyword, decoder_parts,
                        inner_conv, padding_total)


def _zero_tail(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Zero steps >= length of a channel-major [B, C, T] tensor, in place (``masked_fill``
    overwrites NaN too).  On CPU only short rows' tails are written; on a GPU one masked kernel."""
    if bool((lengths >= x.shape[2]).all()):
        return x
    if x.device.type == "cpu":
        for row, length in enumerate(lengths.tolist()):
            if length < x.shape[2]:
                x[row, :, max(length, 0):] = 0
        return x
    return x.masked_fill_(~valid_mask(lengths, x.shape[2])[:, None, :], 0)


@dataclass
class DecoderOutput:
    """``audio`` [B, samples] (24 kHz, padded) and each row's valid ``lengths`` in samples (frames x
    :attr:`PaddedMimiDecoder.hop`: like ``MimiModel.decode``, before trimming to the source's length)."""

    audio: torch.Tensor
    lengths: torch.Tensor


class PaddedMimiDecoder(WindowedTransformer, nn.Module):
    """Batched (and optionally chunked) ``MimiModel.decode`` whose valid outputs equal decoding each
    item alone; see the module docstring."""

    call_steps = None  # MimiModel.decode's plain sliding window (no moshi streaming calls)

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.quantizer = model.quantizer
        self.upsample, self.transformer, self.seanet, self._config = decoder_parts(model)
        self.convs = ([self.upsample] if self.upsample is not None else []) + [
            m for m in self.seanet.modules() if isinstance(m, (MimiConv1d, MimiConvTranspose1d))]
        self._conv_index = {id(m): i for i, m in enumerate(self.convs)}
        for m in self.convs:
            if isinstance(m, MimiConv1d):
                if not m.causal or m.pad_mode != "constant" or int(m.stride) != 1:
                    raise NotImplementedError("decoder convs must be causal, zero-padded and of stride 1")
            elif not m.causal or m.padding_left != 0:
                raise NotImplementedError("decoder transposed convs must be causal with trim_right_ratio 1")
        self._cache_arg = cache_keyword(self.transformer.layers[0])

    @property
    def config(self):
        return self._config

    @property
    def hop(self) -> int:
        """Output samples per code frame (1920 at 24 kHz)."""
        return math.prod(int(inner_conv(m).stride[0]) for m in self.convs if isinstance(m, MimiConvTranspose1d))

    @staticmethod
    def _context(conv: nn.Module) -> int:
        """Input steps a chunk's first outputs need from the chunk before."""
        if isinstance(conv, MimiConv1d):
            return padding_total(conv)
        c = inner_conv(conv)
        return -(-(c.kernel_size[0] - c.stride[0]) // c.stride[0])

    def init_state(self, batch_size: int, device=None, dtype=None) -> EncoderState:
        """A fresh state for ``batch_size`` streams of codes (each starts with its next chunk)."""
        p = next(self.model.parameters())
        device, dtype = device or p.device, dtype or p.dtype
        conv = [torch.zeros(batch_size, inner_conv(c).in_channels, self._context(c), device=device, dtype=dtype)
                for c in self.convs]
        return self._fresh_state(conv, batch_size, device, dtype)

    # -- layers ----------------------------------------------------------------------------
    def _with_context(self, conv: nn.Module, x: torch.Tensor, state: EncoderState | None) -> tuple[torch.Tensor, int]:
        """``x`` [B, C, T] preceded by the conv's carried left context (zeros when not chunked, which
        a stride-1 causal conv pads with and a transposed conv needs none of); carries the new one."""
        pad = self._context(conv)
        if state is None:
            return (nn.functional.pad(x, (pad, 0)) if isinstance(conv, MimiConv1d) and pad else x), 0
        index = self._conv_index[id(conv)]
        xin = torch.cat([state.conv[index], x], dim=2)
        state.conv[index] = xin[:, :, xin.shape[2] - pad:].clone()
        return xin, pad

    def _conv(self, conv: nn.Module, x: torch.Tensor, lengths: torch.Tensor, state: EncoderState | None):
        xin, _ = self._with_context(conv, x, state)
        return _zero_tail(inner_conv(conv)(xin), lengths), lengths

    def _transposed(self, conv: nn.Module, x: torch.Tensor, lengths: torch.Tensor, state: EncoderState | None):
        """The transposed conv's outputs for this chunk's inputs: the context's outputs dropped, the
        right overhang (kernel - stride) left for the next chunk's context to recompute."""
        xin, ctx = self._with_context(conv, x, state)
        stride = int(inner_conv(conv).stride[0])
        y = inner_conv(conv)(xin)[:, :, ctx * stride: (ctx + x.shape[2]) * stride]
        lengths = lengths * stride
        return _zero_tail(y.contiguous(), lengths), lengths

    def _seanet(self, x: torch.Tensor, lengths: torch.Tensor, state: EncoderState | None):
        for layer in self.seanet.layers:
            if isinstance(layer, MimiConv1d):
                x, lengths = self._conv(layer, x, lengths, state)
            elif isinstance(layer, MimiConvTranspose1d):
                x, lengths = self._transposed(layer, x, lengths, state)
            elif isinstance(layer, MimiResnetBlock):
                h = x
                for sub in layer.block:
                    h = self._conv(sub, h, lengths, state)[0] if isinstance(sub, MimiConv1d) else sub(h)
                shortcut = layer.shortcut
                residual = self._conv(shortcut, x, lengths, state)[0] if isinstance(shortcut, MimiConv1d) else x
                x = h + residual
            else:  # ELU (0 stays 0: the padding stays zero)
                x = layer(x)
        return x, lengths

    # -- public ----------------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, codes: torch.Tensor, lengths: torch.Tensor, state: EncoderState | None = None,
                final: torch.Tensor | None = None) -> DecoderOutput:
        """Decode a right-padded batch of ``codes`` [B, N, T] with per-item frame counts ``lengths``.

        Without ``state`` every row is a whole item.  With ``state`` this is the next chunk of each
        row's stream; a row that goes on (not ``final``) must fill the chunk (length T)."""
        lengths = torch.as_tensor(lengths, dtype=torch.long, device=codes.device)
        if (lengths < 1).any() or (lengths > codes.shape[2]).any():
            raise ValueError("every length must be in [1, padded frames]")
        if state is not None:
            final = torch.as_tensor(final, dtype=torch.bool, device=codes.device)
            if ((~final) & (lengths != codes.shape[2])).any():
                raise ValueError("a chunk that does not end its stream must fill the batch")
            if state.batch_size != codes.shape[0]:
                raise ValueError(f"state has {state.batch_size} rows, the chunk {codes.shape[0]}")
        valid = valid_mask(lengths, codes.shape[2])
        codes = codes.long().masked_fill(~valid[:, None, :], 0)
        x = _zero_tail(self.quantizer.decode(codes), lengths)  # [B, D, T]
        n = lengths
        if self.upsample is not None:
            x, n = self._transposed(self.upsample, x, n, state)
        h = self._transformer(x.transpose(1, 2), n, state)
        x, n = self._seanet(h.transpose(1, 2).contiguous(), n, state)
        if state is not None:
            state.samples += n
        return DecoderOutput(x[:, 0], n.cpu())


@torch.no_grad()
def decode_chunked(decoder: PaddedMimiDecoder, items: list[torch.Tensor], chunk: int) -> list[torch.Tensor]:
    """Decode whole items' codes ([frames, N] each, time first as OUT stores them) as streams of
    ``chunk``-frame chunks, all rows in one batch; returns each item's audio (frames x hop samples).
    Items of at most ``chunk`` frames are one single-shot padded batch."""
    device = next(decoder.model.parameters()).device
    if all(len(c) <= chunk for c in items):
        lengths = torch.tensor([len(c) for c in items])
        batch = torch.zeros(len(items), items[0].shape[1], int(lengths.max()), dtype=torch.long, device=device)
        for r, c in enumerate(items):
            batch[r, :, : len(c)] = c.T.to(device)
        out = decoder(batch, lengths)
        return [out.audio[r, : int(out.lengths[r])] for r in range(len(items))]
    state = decoder.init_state(len(items))
    pieces: list[list[torch.Tensor]] = [[] for _ in items]
    start = 0
    while any(start < len(c) for c in items):
        rows = [i for i, c in enumerate(items) if start < len(c)]
        idx = torch.tensor(rows)
        lengths = torch.tensor([min(chunk, len(items[i]) - start) for i in rows])
        batch = torch.zeros(len(rows), items[rows[0]].shape[1], int(lengths.max()), dtype=torch.long, device=device)
        for r, i in enumerate(rows):
            batch[r, :, : lengths[r]] = items[i][start: start + int(lengths[r])].T.to(device)
        final = torch.tensor([start + chunk >= len(items[i]) for i in rows])
        sub = state if len(rows) == state.batch_size else state.select(idx)
        out = decoder(batch, lengths, state=sub, final=final)
        if sub is not state:
            state.assign(idx, sub)
        for r, i in enumerate(rows):
            pieces[i].append(out.audio[r, : int(out.lengths[r])])
        start += chunk
    return [torch.cat(p) for p in pieces]
