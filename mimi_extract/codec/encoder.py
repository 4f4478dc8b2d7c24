"""Padding-aware, batched and chunkable Mimi encoder built on transformers' ``MimiModel``.

transformers' encoder is exact only for a batch of one: conv biases leak into the padding, strided
convs read that padding at the boundary, the transformer gets no mask and the 2x downsample
replicates the padding instead of the last real frame.  ``PaddedMimiEncoder`` runs the *same*
transformers sub-modules (same weights, same RoPE, same attention kernels, same transformer layer
``forward``) on a right-padded batch, but:

* before every conv the padded steps hold exactly what the conv would pad a lone item with
  (zeros for ``constant`` convs, the last valid step for ``replicate`` ones, i.e. the downsample);
* after every layer the padded steps are zeroed again, so nothing but zeros is ever carried;
* per-item lengths are tracked through each conv's own output-length arithmetic;
* the transformer gets a causal sliding-window mask built from the per-item lengths.

The same pass also runs *chunk by chunk* with an explicit :class:`EncoderState` (the shape of
moshi's streaming modules): every causal conv carries its last ``kernel - stride`` inputs as left
context, every transformer layer carries a key/value window of the last ``sliding_window - 1``
positions, and each row carries its RoPE position.  A row's last chunk is padded exactly as the
unchunked reference pads the end of the file, so a long file encoded in chunks gives the unchunked
result -- the trailing partial frame included -- in memory bounded by the chunk, not the file.
A single-shot batch is simply one chunk with a fresh state in which every row ends.

Everything is one batched op per layer: there is no loop over batch items.

The rule is written once, as the *exact path* (``PaddedMimiEncoder.forward``, ``_seanet``,
``_layers``, ``exact_conv``, read top to bottom).  Its *accelerations* are methods apart, each
stating the condition under which it computes what the exact path does (``_pointwise_conv``,
``_zero_padded_conv``, ``_block_gemm_conv``, ``_tiled_seanet``), and :class:`Routes` is the one
place they are chosen; ``Routes.exact()`` takes none (tests/codec/test_routes.py holds each to it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np
import torch
from torch import nn

from .internals import (MimiConv1d, MimiResnetBlock, cache_keyword, eager_attention, encoder_parts, inner_conv,
                        output_length, padding_total, require)

TAPS = ("encoder", "latent", "codes")


def valid_mask(lengths: torch.Tensor, size: int) -> torch.Tensor:
    """[B, size] bool: True on each item's valid steps."""
    return torch.arange(size, device=lengths.device)[None, :] < lengths[:, None]


def _zero_padding(x: torch.Tensor, lengths: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """Zero steps >= length of a time-major [B, T, C] tensor (``masked_fill`` also overwrites NaN/inf).

    A batch without padding is returned as is: a lone item pays nothing for the masking.  On CPU
    (and for one row) only each short row's tail is written, a few slices instead of a masked pass
    over the whole batch (that pass was 10 % of a CPU step with ragged rows, measured); on a GPU
    one masked kernel beats a launch per row."""
    if bool((lengths >= x.shape[1]).all()):
        return x
    if x.device.type == "cpu" or x.shape[0] == 1:
        x = x if inplace else x.clone()
        for row, length in enumerate(lengths.tolist()):
            if length < x.shape[1]:
                x[row, max(length, 0):] = 0
        return x
    invalid = ~valid_mask(lengths, x.shape[1])[:, :, None]
    return x.masked_fill_(invalid, 0) if inplace else x.masked_fill(invalid, 0)


def _elu(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """ELU of a fresh activation: in place when it is contiguous, else out of place, which reads the
    strided view once and writes a contiguous result (instead of a copy, then the ELU)."""
    return torch.nn.functional.elu_(x, alpha) if x.is_contiguous() else torch.nn.functional.elu(x, alpha)


def _replicate_padding(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Fill steps >= length with each item's last valid step (what ``replicate`` pads a lone item with)."""
    if bool((lengths >= x.shape[1]).all()):
        return x
    last = (lengths - 1).clamp(min=0)[:, None, None].expand(-1, 1, x.shape[2])
    return torch.where(valid_mask(lengths, x.shape[1])[:, :, None], x, x.gather(1, last))


def _carry_context(state: "EncoderState", index: int, x: torch.Tensor, pad: int) -> None:
    """Keep conv ``index``'s last ``pad`` inputs (this chunk's, preceded by the carried ones when
    the chunk is shorter) as its left context for the next chunk."""
    size = x.shape[1]
    state.conv[index] = torch.cat([state.conv[index], x], dim=1)[:, -pad:].clone() if size < pad \
        else x[:, size - pad :].clone()


@dataclass
class EncoderOutput:
    """Per tap: padded batch tensor and exact per-item frame counts (of this chunk, when chunked).

    ``encoder``/``latent`` are ``[B, frames, dim]``; ``codes`` is ``[B, num_quantizers, frames]``.
    """

    tensors: dict[str, torch.Tensor]
    lengths: dict[str, torch.Tensor]


@dataclass
class EncoderState:
    """What a chunked encode carries from one chunk to the next, one row per stream.

    ``conv[i]`` is conv ``i``'s left context (its last ``kernel - stride`` inputs, [B, P, C_in]);
    ``keys[l]``/``values[l]`` are transformer layer ``l``'s window of past positions
    ([B, H_kv, M, head_dim], M <= sliding_window - 1), of which the last ``cached[b]`` are valid for
    row b; ``position[b]`` is the number of 25 Hz frames row b has encoded (its RoPE offset) and
    ``samples[b]`` the number of input samples (0: the row's stream starts with the next chunk)."""

    conv: list[torch.Tensor]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    cached: torch.Tensor
    position: torch.Tensor
    samples: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.samples.shape[0]

    def reset(self, rows: torch.Tensor) -> None:
        """Start new streams in the rows where ``rows`` (bool [B]) is True (moshi's ``reset_mask``)."""
        rows = rows.to(self.samples.device)
        for t in self.conv:
            t.masked_fill_(rows[:, None, None], 0)
        for t in (self.cached, self.position, self.samples):
            t.masked_fill_(rows, 0)

    def select(self, index: torch.Tensor) -> "EncoderState":
        """The rows ``index`` as a state of their own (a copy)."""
        pick = lambda t: t.index_select(0, index.to(t.device))  # noqa: E731
        return EncoderState([pick(t) for t in self.conv], [pick(t) for t in self.keys],
                            [pick(t) for t in self.values], pick(self.cached), pick(self.position),
                            pick(self.samples))

    def assign(self, index: torch.Tensor, other: "EncoderState") -> None:
        """Write ``other`` (rows ``index`` of this state, after a step) back into this state."""
        index = index.to(self.samples.device)
        for mine, theirs in zip(self.conv, other.conv):
            mine.index_copy_(0, index, theirs)
        m = other.keys[0].shape[2] if other.keys else 0
        for name in ("keys", "values"):
            mine, theirs = getattr(self, name), getattr(other, name)
            for layer, t in enumerate(theirs):
                if mine[layer].shape[2] < m:  # the window grew: widen every row (new slots invalid)
                    mine[layer] = torch.nn.functional.pad(mine[layer], (0, 0, m - mine[layer].shape[2], 0))
                if m:
                    mine[layer][:, :, -m:].index_copy_(0, index, t)
        for name in ("cached", "position", "samples"):
            getattr(self, name).index_copy_(0, index, getattr(other, name))


class _WindowCache:
    """Key/value window for transformers' attention layers (duck-types ``Cache.update``).

    Returns the cached window followed by this chunk's keys/values, and keeps the last
    ``keep`` positions for the next chunk.  Which of them a query may see is the attention mask's
    job (see ``PaddedMimiEncoder.attention_mask``)."""

    def __init__(self, state: EncoderState, keep: int | None):
        self.state, self.keep = state, keep

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys = torch.cat([self.state.keys[layer_idx], key_states], dim=2)
        values = torch.cat([self.state.values[layer_idx], value_states], dim=2)
        start = 0 if self.keep is None else max(0, keys.shape[2] - self.keep)
        self.state.keys[layer_idx] = keys[:, :, start:].clone()
        self.state.values[layer_idx] = values[:, :, start:].clone()
        return keys, values


class WindowedTransformer:
    """transformers' own transformer layers run on a right-padded batch with per-item lengths: the
    causal sliding-window mask built from them, and (chunk by chunk) the carried key/value window
    and RoPE positions of an :class:`EncoderState`.  Shared by the encoder's transformer and the
    decoder's (:class:`~mimi_extract.codec.decoder.PaddedMimiDecoder`), one rule for both.  Needs
    ``self.transformer``, ``self.config``, ``self.call_steps`` and ``self._cache_arg``."""

    @property
    def window(self) -> int | None:
        return getattr(self.config, "sliding_window", None)

    def attention_mask(self, lengths: torch.Tensor, size: int, dtype: torch.dtype, cached: torch.Tensor | None = None,
                       past: int = 0, position: torch.Tensor | None = None) -> torch.Tensor:
        """[B, 1, size, past + size] causal sliding-window mask over ``past`` cached positions and
        this chunk's ``size`` positions: key j is visible to query i iff i - window < j <= i (in
        stream positions), j is valid (one of the row's ``cached`` last past positions, or a chunk
        position < length).  Padded queries may see themselves, so no row is fully masked (no NaN);
        their outputs are zeroed anyway.  With moshi's streaming calls (``call_steps`` = c) the
        window's start is that of the query's call instead: j >= c * floor(t / c) + c - window in
        absolute positions (t = ``position`` + i: the row's chunk starts at ``position``)."""
        device = lengths.device
        query = torch.arange(size, device=device)
        key = torch.arange(past + size, device=device) - past  # positions relative to the chunk start
        allowed = (key[None, :] <= query[:, None])[None]  # [1 or B, T, past+T]
        if self.call_steps is not None:
            c = self.call_steps
            start = torch.zeros_like(lengths) if position is None else position.to(device)
            t = start[:, None] + query[None, :]  # absolute query positions [B, T]
            first = torch.div(t, c, rounding_mode="floor") * c + c - self.window - start[:, None]  # relative
            allowed = allowed & (key[None, None, :] >= first[:, :, None])
        elif self.window is not None:
            allowed = allowed & (key[None, :] > query[:, None] - self.window)[None]
        key_ok = key[None, :] < lengths[:, None]
        if cached is not None:
            key_ok &= key[None, :] >= -cached[:, None]
        allowed = allowed & (key_ok[:, None, :] | (key[None, :] == query[:, None])[None])  # [B, T, past+T]
        if eager_attention(self.config):  # eager *adds* the mask
            return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(
                ~allowed, torch.finfo(dtype).min
            )[:, None]
        return allowed[:, None]

    def _fresh_state(self, conv: list[torch.Tensor], batch_size: int, device, dtype) -> EncoderState:
        """A state with the convs' contexts ``conv`` and empty key/value windows at position 0."""
        cfg = self.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        empty = lambda: torch.zeros(batch_size, cfg.num_key_value_heads, 0, head_dim, device=device, dtype=dtype)  # noqa: E731
        n_layers = len(self.transformer.layers)
        zeros = lambda: torch.zeros(batch_size, dtype=torch.long, device=device)  # noqa: E731
        return EncoderState(conv, [empty() for _ in range(n_layers)], [empty() for _ in range(n_layers)],
                            zeros(), zeros(), zeros())

    def _transformer(self, h: torch.Tensor, lengths: torch.Tensor, state: EncoderState | None) -> torch.Tensor:
        """transformers' own layers on [B, T, D], with the length mask and the carried window."""
        size = h.shape[1]
        position_ids = torch.arange(size, device=h.device)[None]
        kwargs = {}
        if state is None:
            mask = self.attention_mask(lengths, size, h.dtype)
        else:
            past = state.keys[0].shape[2] if state.keys else 0
            mask = self.attention_mask(lengths, size, h.dtype, state.cached, past, state.position)
            position_ids = position_ids + state.position[:, None]
            keep = self.window - 1 if self.window is not None else None
            kwargs[self._cache_arg] = _WindowCache(state, keep)
        pos_emb = self.transformer.rotary_emb(h, position_ids)
        valid = valid_mask(lengths, size)[:, :, None]
        for layer in self.transformer.layers:
            out = layer(h, attention_mask=mask, position_ids=position_ids, position_embeddings=pos_emb, **kwargs)
            h = torch.where(valid, out[0] if isinstance(out, tuple) else out, h.new_zeros(()))
        if state is not None:
            state.cached = torch.clamp(state.cached + lengths, max=state.keys[0].shape[2] if state.keys else 0)
            state.position = state.position + lengths
        return h


class ConvRoute(Enum):
    """How one conv is computed: by the exact path's :meth:`PaddedMimiEncoder.exact_conv`, or by one of its
    accelerations (each value names the encoder's method that computes it)."""

    EXACT = "exact_conv"
    POINTWISE = "_pointwise_conv"
    ZERO_PADDED = "_zero_padded_conv"
    BLOCK_GEMM = "_block_gemm_conv"


@dataclass(frozen=True)
class Routes:
    """Which accelerations of the exact path an encoder takes, and the one place each is chosen
    (:meth:`conv` for a conv, :meth:`tile` for SEANet's first stage).

    Each acceleration computes what the exact path computes, under a condition its docstring states
    and :meth:`conv`/:meth:`tile` check (tests/codec/test_routes.py holds each, alone and together, to
    the exact path).  The default takes every one where it applies (the tool's speed); :meth:`exact` takes
    none, so every step is the readable rule itself."""

    pointwise: bool = True  # 1x1 convs as one matrix product (PaddedMimiEncoder._pointwise_conv)
    zero_padded: bool = True  # convs padding zeros themselves, the head recomputed (_zero_padded_conv)
    block_gemm: bool = True  # Mimi's wide strided convs as two GEMMs over blocks, CPU (_block_gemm_conv)
    tiles: bool = True  # SEANet's first stage in tiles, CPU (_tiled_seanet)
    block_gemm_min_width: int = 512  # stride x C_in from which the block GEMM wins (see _block_gemm_conv)
    front_tile: int = 24_000  # at most this many input samples per row in a tile of SEANet's first stage (CPU)
    front_tile_cells: int = 96_000  # rows x samples per tile: a batch of 8 rows gets 11,520-sample tiles

    @classmethod
    def exact(cls) -> "Routes":
        """No acceleration: the reference exact path (slower, and the same to float rounding)."""
        return cls(pointwise=False, zero_padded=False, block_gemm=False, tiles=False)

    def conv(self, conv: nn.Module, x: torch.Tensor) -> ConvRoute:
        """The route of ``conv`` on the time-major input ``x`` [B, T, C_in]: the first acceleration
        (in this order) that is on and whose exactness condition holds, else the exact conv."""
        pad, stride, inner = padding_total(conv), int(conv.stride), inner_conv(conv)
        if conv.pad_mode != "constant" or -x.shape[1] % stride > pad:
            return ConvRoute.EXACT  # every acceleration pads zeros, at most pad at the end (Mimi: the downsample)
        if (self.block_gemm and x.device.type == "cpu" and stride > 1 and int(conv.kernel_size) == 2 * stride
                and pad == stride and inner.dilation[0] == 1 and inner.groups == 1
                and stride * conv.in_channels >= self.block_gemm_min_width):
            return ConvRoute.BLOCK_GEMM
        if self.pointwise and pad == 0 and stride == 1 and inner.groups == 1:
            return ConvRoute.POINTWISE
        return ConvRoute.ZERO_PADDED if self.zero_padded else ConvRoute.EXACT

    def tile(self, x: torch.Tensor) -> int | None:
        """The tile (input samples per row) SEANet's first stage runs in on the input ``x`` [B, T, 1],
        or None: in one piece.  Tiles only on CPU, for the cache (see ``_tiled_seanet``), and shorter
        for more rows (``front_tile_cells`` / rows, a multiple of 960 samples)."""
        size = min(self.front_tile, max(960, self.front_tile_cells // x.shape[0] // 960 * 960))
        return size if self.tiles and x.device.type == "cpu" and x.shape[1] > size else None


class PaddedMimiEncoder(WindowedTransformer, nn.Module):
    """Batched (and optionally chunked) Mimi encoding whose valid outputs equal encoding each item alone.

    ``frames_per_call``: None (default) is transformers' and moshi's non-streaming attention (a
    sliding window of ``sliding_window`` steps); N reproduces moshi's *streaming* encode fed N
    frames (of :attr:`hop` samples) per call.  moshi keeps a ring buffer of ``sliding_window``
    key slots and writes a call's keys before attending, so a query sees back only to the window
    ending at its call's last step: key s is visible to query t iff s <= t and
    s >= c * floor(t / c) + c - window, with c = encoder steps per call and t, s absolute stream
    positions.  Only the mask differs (moshi's convs and RoPE positions are the same in both
    modes), so the batched, padded and chunked paths all give moshi's streaming output.  An item
    that is not a whole number of calls ends in moshi's last call *zero-padded* to N frames (the
    rule above, for every call): not moshi fed the frames left as a shorter call, whose window
    ends at the audio's end and so differs in that call's frames (README, tests/codec/test_moshi_stream).

    ``routes``: the accelerations taken (:class:`Routes`: all by default; ``Routes.exact()`` is the
    reference exact path, which the tests hold each acceleration to)."""

    def __init__(self, model: nn.Module, frames_per_call: int | None = None, routes: Routes = Routes()):
        super().__init__()
        require(model)  # every transformers internal used below is there (see internals.py)
        self.model = model
        self.routes = routes
        self.seanet, self.transformer, self.downsample = encoder_parts(model)
        self.quantizer = model.quantizer
        self.convs = [m for m in self.seanet.modules() if isinstance(m, MimiConv1d)]
        if self.downsample is not None:
            self.convs.append(self.downsample)
        self._conv_index = {id(m): i for i, m in enumerate(self.convs)}
        # the first SEANet stage: its layers up to the first strided conv (tiled on CPU, see _tiled_seanet)
        self._front = next((i + 1 for i, m in enumerate(self.seanet.layers)
                            if isinstance(m, MimiConv1d) and int(m.stride) > 1), len(self.seanet.layers))
        self._weights: dict[tuple[int, str], tuple] = {}  # (conv, layout) -> (weight version, tensor)
        for m in self.convs:
            if m.pad_mode not in ("constant", "replicate"):
                raise NotImplementedError(f"pad_mode {m.pad_mode!r} is not supported (constant/replicate only)")
            if not m.causal:
                raise NotImplementedError("only causal Mimi convolutions are supported")
        self._cache_arg = cache_keyword(self.transformer.layers[0])
        self.frames_per_call = frames_per_call
        self.call_steps = None  # encoder (25 Hz) steps per moshi streaming call
        if frames_per_call is not None:
            steps = frames_per_call * (int(self.downsample.stride) if self.downsample is not None else 1)
            if frames_per_call < 1 or self.window is None or steps > self.window:
                raise ValueError(f"moshi streaming with {frames_per_call} frame(s) per call needs 1 <= frames and "
                                 f"{steps} steps per call <= the attention window ({self.window}): moshi's ring "
                                 "buffer would overwrite keys within one call")
            self.call_steps = steps

    @property
    def config(self):
        return self.model.config

    @property
    def hop(self) -> int:
        """Input samples per output frame of the last tap (1920 at 24 kHz: one 12.5 Hz frame).
        Chunks that do not end a stream must be a multiple of this."""
        return math.prod(int(c.stride) for c in self.convs)

    @property
    def step(self) -> int:
        """Input samples per encoder-transformer step (960 at 24 kHz: one 25 Hz step)."""
        return self.hop // (int(self.downsample.stride) if self.downsample is not None else 1)

    @property
    def receptive_field(self) -> int:
        """Input samples before a latent frame's first sample that the frame can depend on.

        Computed from the model, not a constant: a causal conv's output j reads its input from
        ``j * stride - padding_total`` on (``padding_total`` = dilated kernel - stride), and every
        transformer layer looks back ``window - 1`` steps (moshi's streaming mask never further).
        Following the earliest input index from a latent frame back through the downsample, the
        layers and every SEANet conv (all affine in the frame index) gives the look-back.  A piece of
        a recording encoded from this many samples (rounded up to whole frames) before its first
        frame, with absolute positions, gives the unchunked result for its frames: see
        :func:`encode_piece`.  kyutai/mimi: 1,917,560 samples (79.9 s); the tiny test model 14,840."""
        if self.window is None:
            raise ValueError("the transformer attends to every past step: the receptive field is unbounded")
        frame = 1 << 20  # any frame far from the start (every map below is affine in it)
        first = frame
        seanet = self.convs[:-1] if self.downsample is not None else self.convs
        if self.downsample is not None:
            first = first * int(self.downsample.stride) - padding_total(self.downsample)
        first -= len(self.transformer.layers) * (self.window - 1)
        for conv in reversed(seanet):
            first = first * int(conv.stride) - padding_total(conv)
        return frame * self.hop - first

    # -- lengths ---------------------------------------------------------------------------
    def output_lengths(self, lengths: torch.Tensor) -> dict[str, torch.Tensor]:
        """Frames per item for each tap, from each conv's own length arithmetic: the model's own
        answer, which the torch-free length rules (``audit.dry_run.frames``, the engines' frame
        counts) and the benchmarks' null encoder (``scripts/bench_ceilings.py``) are held to."""
        n = torch.as_tensor(lengths, dtype=torch.long)
        for m in self.seanet.modules():
            if isinstance(m, MimiConv1d):
                n = output_length(m, n).cpu()
        latent = output_length(self.downsample, n).cpu() if self.downsample is not None else n
        return {"encoder": n, "latent": latent, "codes": latent}

    # -- state -----------------------------------------------------------------------------
    def init_state(self, batch_size: int, device=None, dtype=None) -> EncoderState:
        """A fresh state for ``batch_size`` streams (each starts with its next chunk)."""
        p = next(self.parameters())
        device, dtype = device or p.device, dtype or p.dtype
        conv = [torch.zeros(batch_size, padding_total(c), c.in_channels, device=device, dtype=dtype)
                for c in self.convs]
        return self._fresh_state(conv, batch_size, device, dtype)

    # -- the exact path: the rule, read top to bottom (forward, _seanet, _layers, exact_conv) ----------------
    @torch.no_grad()
    def forward(
        self,
        audio: torch.Tensor,
        lengths: torch.Tensor,
        taps: tuple[str, ...] = ("latent",),
        num_quantizers: int | None = None,
        state: EncoderState | None = None,
        final: torch.Tensor | None = None,
    ) -> EncoderOutput:
        """Encode a right-padded batch ``audio`` [B, T] or [B, 1, T] with per-item sample ``lengths``.

        Without ``state`` every row is a whole item.  With ``state`` this is the next chunk of each
        row's stream, and ``final`` (bool [B]) marks the rows whose stream ends with it; a row that
        goes on must fill the chunk (length T), and T must be a multiple of :attr:`hop`.

        The steps are transformers' own, each given per-item lengths: SEANet (every conv's input
        padded as for the item alone, every layer's padded outputs zeroed), the transformer under the
        per-item causal sliding-window mask, the downsample (a conv like the others, replicate-padded),
        then the quantizer (frame by frame: nothing to pad)."""
        unknown = set(taps) - set(TAPS)
        if unknown:
            raise ValueError(f"unknown taps {sorted(unknown)}; choose from {TAPS}")
        if audio.dim() == 3:
            audio = audio[:, 0]
        audio = audio[:, :, None]  # time-major [B, T, 1]
        lengths = torch.as_tensor(lengths, dtype=torch.long, device=audio.device)
        if (lengths < 1).any() or (lengths > audio.shape[1]).any():
            raise ValueError("every length must be in [1, padded length]")
        if state is not None:
            final = torch.as_tensor(final, dtype=torch.bool, device=audio.device)
            going_on = ~final
            if going_on.any() and (audio.shape[1] % self.hop or (lengths[going_on] != audio.shape[1]).any()):
                raise ValueError(f"a chunk that does not end its stream must fill the batch and be a multiple "
                                 f"of {self.hop} samples")
            if state.batch_size != audio.shape[0]:
                raise ValueError(f"state has {state.batch_size} rows, the chunk {audio.shape[0]}")
        x = _zero_padding(audio, lengths)  # whatever the padding held (NaN included)

        x, n25 = self._seanet(x, lengths, state)
        x = self._transformer(x, n25, state)  # WindowedTransformer: the length mask, the carried window
        tensors, out_lengths = {}, {"encoder": n25.cpu()}
        if "encoder" in taps:
            tensors["encoder"] = x
        if "latent" in taps or "codes" in taps:
            n12 = n25
            if self.downsample is not None:
                x, n12 = self._conv(self.downsample, x, n25, state)
            out_lengths["latent"] = out_lengths["codes"] = n12.cpu()
            if "latent" in taps:
                tensors["latent"] = x
            if "codes" in taps:
                tensors["codes"] = self.quantizer.encode(x.transpose(1, 2), num_quantizers).transpose(0, 1)
        if state is not None:
            state.samples += lengths
        return EncoderOutput(tensors, {t: out_lengths[t] for t in taps})

    def _seanet(self, x: torch.Tensor, lengths: torch.Tensor, state: EncoderState | None):
        """SEANet on [B, T, 1]: its layers in order (on CPU its first stage in tiles, where
        :meth:`Routes.tile` says so: :meth:`_tiled_seanet`)."""
        tile = self.routes.tile(x)
        if tile is not None:
            return self._tiled_seanet(x, lengths, state, tile)
        x, lengths = self._layers(list(self.seanet.layers), x, lengths, state)
        return x.contiguous(), lengths

    def _layers(self, layers, x: torch.Tensor, lengths: torch.Tensor, state: EncoderState | None):
        """SEANet ``layers`` on [B, T, C], zeroing each layer's padded outputs (every conv then finds
        zeros there, what a lone item is padded with).  The ELUs run in place where that cannot touch
        a residual (the same values, one pass less)."""
        for layer in layers:
            if isinstance(layer, MimiConv1d):
                x, lengths = self._conv(layer, x, lengths, state)
            elif isinstance(layer, MimiResnetBlock):
                h = x
                for sub in layer.block:
                    if isinstance(sub, MimiConv1d):
                        h, _ = self._conv(sub, h, lengths, state)
                    elif isinstance(sub, nn.ELU) and h is not x:  # never in place on the residual
                        h = _zero_padding(_elu(h, sub.alpha), lengths, inplace=True)
                    else:
                        h = _zero_padding(sub(h), lengths, inplace=True)
                shortcut = layer.shortcut
                residual = self._conv(shortcut, x, lengths, state)[0] if isinstance(shortcut, MimiConv1d) else x
                x = _zero_padding(h.add_(residual), lengths, inplace=True)
            elif isinstance(layer, nn.ELU):  # x is the previous block's fresh output: in place is safe
                x = _zero_padding(_elu(x, layer.alpha), lengths, inplace=True)
            else:
                x = _zero_padding(layer(x.transpose(1, 2)).transpose(1, 2), lengths, inplace=True)
        return x, lengths

    def _conv(self, conv: nn.Module, x: torch.Tensor, lengths: torch.Tensor, state: EncoderState | None):
        """``conv`` on the route :meth:`Routes.conv` picks: :meth:`exact_conv`, or an acceleration of it."""
        return getattr(self, self.routes.conv(conv, x).value)(conv, x, lengths, state)

    def exact_conv(self, conv: nn.Module, x: torch.Tensor, lengths: torch.Tensor, state: EncoderState | None):
        """One causal conv on a padded time-major batch [B, T, C_in], as the rule states it: each row's
        input laid out as transformers' MimiConv1d pads that item alone, then transformers' weights.

        * before the row: ``padding_total`` steps of left context: zeros (``constant``), the row's
          first step (``replicate``), or, chunk by chunk, the stream's last inputs carried from its
          previous chunk (this chunk's are kept here for the next one);
        * the row's padded steps: zeros already, or for ``replicate`` its last valid step;
        * after the batch: the extra steps that complete the last stride window, zeros or the
          last step again.

        Outputs past each row's output length are zeroed.  Mimi's route for its replicate-padded
        downsample (small, at 25 Hz) and any conv whose end padding would exceed kernel - stride."""
        pad, stride = padding_total(conv), int(conv.stride)
        replicate = conv.pad_mode == "replicate"
        if replicate:
            x = _replicate_padding(x, lengths)
        if state is None:
            context = x[:, :1].expand(-1, pad, -1) if replicate else x.new_zeros(x.shape[0], pad, x.shape[2])
        else:
            index = self._conv_index[id(conv)]
            context = state.conv[index]
            if replicate:  # a stream's first chunk: replicate its first step
                first = (state.samples == 0)[:, None, None]
                context = torch.where(first, x[:, :1].expand_as(context), context)
        size = x.shape[1]
        xin = torch.cat([context, x], dim=1)
        if state is not None:
            state.conv[index] = xin[:, size : size + pad].clone()
        extra = -size % stride
        if extra:
            tail = xin[:, -1:].expand(-1, extra, -1) if replicate else xin.new_zeros(xin.shape[0], extra, xin.shape[2])
            xin = torch.cat([xin, tail], dim=1)
        out = torch.nn.functional.conv2d(xin[:, None].permute(0, 3, 1, 2), self._weight(conv), inner_conv(conv).bias,
                                         stride=(1, stride), dilation=(1, inner_conv(conv).dilation[0]),
                                         groups=inner_conv(conv).groups).permute(0, 2, 3, 1)[:, 0]
        out_lengths = output_length(conv, lengths).to(lengths.device)
        return _zero_padding(out.contiguous(), out_lengths, inplace=True), out_lengths

    # -- accelerations: each computes what the exact path does, under the condition its docstring states ------
    def _pointwise_conv(self, conv: nn.Module, x: torch.Tensor, lengths: torch.Tensor, state: EncoderState | None):
        """``ConvRoute.POINTWISE``: a 1x1 conv (kernel 1, stride 1, one group) as one matrix product
        over every step.  Exact because an output step reads its own input step alone: no context to
        pad or carry, no end padding, and the padded steps' outputs are zeroed after."""
        weight, bias = self._weight(conv), inner_conv(conv).bias
        flat = x.reshape(-1, x.shape[2])
        w2 = weight[:, :, 0, 0]
        out = (torch.addmm(bias, flat, w2.T) if bias is not None else flat @ w2.T).view(x.shape[0], x.shape[1], -1)
        out_lengths = output_length(conv, lengths).to(lengths.device)
        return _zero_padding(out, out_lengths, inplace=True), out_lengths

    def _zero_padded_conv(self, conv: nn.Module, x: torch.Tensor, lengths: torch.Tensor, state: EncoderState | None):
        """``ConvRoute.ZERO_PADDED``: the conv pads zeros itself (``padding_total`` on both sides)
        rather than copying the input into a padded buffer, and chunk by chunk recomputes only the
        few leading outputs that see the carried context.  Runs channels-last (time-major data is
        NHWC to oneDNN and cuDNN: measured 1.4x faster than channel-major convs on CPU, and no
        transposes anywhere).

        Exact for a ``constant`` conv whose end padding (``-T % stride``) is at most ``padding_total``:
        the left zeros are a lone item's context, every row's padded steps hold zeros already, the
        right zeros cover MimiConv1d's extra padding (outputs past ceil(T / stride) are dropped), and
        with a state the outputs whose window reaches into the left context (the first
        ceil(padding_total / stride)) are recomputed over the carried inputs instead."""
        pad, stride = padding_total(conv), int(conv.stride)
        dilation = inner_conv(conv).dilation[0]
        size = x.shape[1]
        n = -(-size // stride)  # outputs: ceil(T / S), MimiConv1d's extra padding completing the last window
        weight, bias = self._weight(conv), inner_conv(conv).bias

        def run(inp, padding):
            y = torch.nn.functional.conv2d(inp[:, None].permute(0, 3, 1, 2), weight, bias, stride=(1, stride),
                                           padding=(0, padding), dilation=(1, dilation), groups=inner_conv(conv).groups)
            return y.permute(0, 2, 3, 1)[:, 0]  # channels-last memory: [B, n, C_out] contiguous

        # zeros on both sides; the right side needs at most `pad` (its extra is < stride <= pad)
        out = run(x, pad)[:, :n]
        if state is not None:
            index = self._conv_index[id(conv)]
            head = -(-pad // stride)  # outputs whose window reaches into the left context
            need = head * stride + int(conv.kernel_size) - pad  # samples of x their windows cover
            lead = [state.conv[index], x[:, :need]]
            if size < need:  # a stream's short last chunk: the reference's zeros after its end
                lead.append(x.new_zeros(x.shape[0], need - size, x.shape[2]))
            lead = torch.cat(lead, dim=1)
            out = out.clone() if out.shape[1] != n else out
            head = min(head, n)
            out[:, :head] = run(lead, 0)[:, :head]
            _carry_context(state, index, x, pad)
        out_lengths = output_length(conv, lengths).to(lengths.device)
        # `out` may be a view that drops the conv's extra right outputs (not contiguous): its consumer,
        # an out-of-place ELU (see _layers) or the next conv, lays it out afresh anyway, so copying it
        # here would be a second pass over it (8 % of a CPU step, measured)
        return _zero_padding(out, out_lengths, inplace=True), out_lengths

    def _block_gemm_conv(self, conv: nn.Module, x: torch.Tensor, lengths: torch.Tensor, state: EncoderState | None):
        """``ConvRoute.BLOCK_GEMM`` (CPU): a strided conv as ``out[t] = block[t - 1] @ Wa + block[t] @ Wb
        + bias`` over blocks of ``stride`` input steps, ``block[-1]`` being the left context (zeros,
        or the carried state) and the last block completed with zeros.

        Exact for a ``constant`` conv with kernel = 2 x stride, ``padding_total`` = stride, no
        dilation, one group (Mimi's downsampling convs): each output then reads exactly two
        consecutive blocks, the first of them the lone item's zero context for output 0, and
        MimiConv1d's extra padding (< stride) is the zeros completing the last block.  Faster where
        the blocks are wide (:attr:`Routes.block_gemm_min_width`).  Single-threaded, full-size
        Mimi, 4 s of audio, as block GEMMs vs oneDNN's strided conv: k10 s5 128->256 64 vs 76 ms,
        k12 s6 256->512 27 vs 40 ms, k16 s8 512->1024 23 vs 48 ms; k8 s4 64->128 60 vs 48 ms (a
        [.., 256] x [256, 128] GEMM is too thin), hence the width threshold.  Not measured on GPU:
        cuDNN keeps its conv there (the route is CPU only)."""
        x = x.contiguous()
        s = int(conv.stride)
        batch, size, channels = x.shape
        n = -(-size // s)
        previous, current = self._block_weights(conv)
        blocks = x if size == n * s else torch.nn.functional.pad(x, (0, 0, 0, n * s - size))
        blocks = blocks.reshape(batch * n, s * channels)
        bias = inner_conv(conv).bias
        out = (torch.addmm(bias, blocks, current) if bias is not None else blocks @ current).view(batch, n, -1)
        from_previous = (blocks @ previous).view(batch, n, -1)
        out[:, 1:] += from_previous[:, :-1]
        if state is not None:
            index = self._conv_index[id(conv)]
            out[:, 0] += state.conv[index].reshape(batch, s * channels) @ previous
            _carry_context(state, index, x, s)
        out_lengths = output_length(conv, lengths).to(lengths.device)
        return _zero_padding(out, out_lengths, inplace=True), out_lengths

    def _tiled_seanet(self, x: torch.Tensor, lengths: torch.Tensor, state: EncoderState | None, size: int):
        """SEANet with its first stage (the 24 kHz layers up to the first strided conv, 64 channels:
        24.6 MB per 4 s row) run tile by tile, ``size`` samples per row, each tile's activations
        staying in cache, then the rest on the whole input (:meth:`Routes.tile`: on CPU).

        Exact because a tile is a chunk of the conv streams: the tiles run the chunked rule with
        each conv's left context carried (in a fresh state when the call has none), as a long file
        is encoded in chunks; a row that ends in a tile is padded there as at its end.
        Single-threaded, full-size, 4 s of audio: that stage 113-125 ms whole, 82-95 ms in 1 s tiles
        (0.16 s tiles: 129 ms).  A batch shares the tile's cache, so its tiles are shorter: a step of
        8 ragged rows of <= 4 s, 2.81-2.85 s in 1 s tiles, 2.53-2.72 s in 0.25-0.5 s tiles (measured
        side by side, bit-identical codes)."""
        layers = list(self.seanet.layers)
        front = self._front
        tile_state = state if state is not None else self.init_state(x.shape[0], x.device, x.dtype)
        pieces = []
        for start in range(0, x.shape[1], size):
            tile = x[:, start : start + size]
            tile_lengths = (lengths - start).clamp(0, tile.shape[1])
            pieces.append(self._layers(layers[:front], tile, tile_lengths, tile_state)[0])
        front_lengths = lengths
        for conv in layers[:front]:
            if isinstance(conv, MimiConv1d):
                front_lengths = output_length(conv, front_lengths).to(lengths.device)
        x, lengths = self._layers(layers[front:], torch.cat(pieces, dim=1), front_lengths, state)
        return x.contiguous(), lengths

    # -- weights ---------------------------------------------------------------------------
    def _cached(self, conv: nn.Module, kind: str, make):
        """``make(weight)`` for ``conv``, cached per device, dtype and weight version."""
        w = inner_conv(conv).weight
        key = (w.device, w.dtype, w._version)
        slot = (id(conv), kind)
        if self._weights.get(slot, (None,))[0] != key:
            self._weights[slot] = (key, make(w))
        return self._weights[slot][1]

    def _weight(self, conv: nn.Module) -> torch.Tensor:
        """``conv``'s weight as a [C_out, C_in, 1, K] channels-last 2-D kernel (time-major data is NHWC)."""
        return self._cached(conv, "nhwc", lambda w: w[:, :, None, :].contiguous(memory_format=torch.channels_last))

    def _block_weights(self, conv: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """A kernel of 2 x stride taps split in two [stride * C_in, C_out] matrices: the taps over
        the previous block of ``stride`` input steps, and those over the current block."""
        def make(w):
            s = int(conv.stride)
            half = lambda taps: taps.permute(2, 1, 0).reshape(s * w.shape[1], w.shape[0]).contiguous()  # noqa: E731
            return half(w[:, :, :s]), half(w[:, :, s:])
        return self._cached(conv, "blocks", make)


def frames_of(output: EncoderOutput, tap: str, row: int) -> torch.Tensor:
    """Row ``row``'s valid frames of ``tap``, time first: [frames, dim] or [frames, num_quantizers]."""
    n = int(output.lengths[tap][row])
    t = output.tensors[tap][row]
    return t[:, :n].T if tap == "codes" else t[:n]


def stored_array(frames: torch.Tensor, tap: str, feature_dtype: str = "float32") -> np.ndarray:
    """A tap's frames (time first) as OUT stores them, on the host: codes as int16, features as
    ``feature_dtype`` (from float32, whatever the compute dtype)."""
    if tap == "codes":
        return frames.to("cpu").numpy().astype(np.int16)
    return frames.float().to("cpu").numpy().astype(feature_dtype)


@torch.no_grad()
def encode_chunked(encoder: PaddedMimiEncoder, items: list[torch.Tensor], chunk: int,
                   taps: tuple[str, ...] = ("latent",), num_quantizers: int | None = None,
                   starts: list[int] | None = None) -> list[dict]:
    """Encode whole 1-D items as streams of ``chunk``-sample chunks, all rows in one batch.

    The simplest driver of the chunked path (tests, ``verify``, :func:`encode_piece`, the Ray Data entry); the extraction
    engine refills rows as streams end (continuous batching).  The chunks are fed in the encoder's
    own dtype, on its device.  ``starts``: where each item begins in
    its recording (samples, a multiple of :attr:`~PaddedMimiEncoder.hop`), so RoPE positions and
    moshi's streaming calls stay absolute.  Returns per item {tap: time-first tensor}."""
    if chunk % encoder.hop:
        raise ValueError(f"chunk must be a multiple of {encoder.hop} samples")
    weight = next(encoder.parameters())
    state = encoder.init_state(len(items))
    if starts is not None:
        if any(s % encoder.hop for s in starts):
            raise ValueError(f"an item's start must be a multiple of {encoder.hop} samples")
        state.position += torch.tensor([s // encoder.step for s in starts], device=state.position.device)
    pieces = [{t: [] for t in taps} for _ in items]
    start = 0
    while any(start < len(a) for a in items):
        rows = [i for i, a in enumerate(items) if start < len(a)]
        idx = torch.tensor(rows)
        lengths = torch.tensor([min(chunk, len(items[i]) - start) for i in rows])
        audio = torch.zeros(len(rows), int(lengths.max()), device=weight.device, dtype=weight.dtype)
        for r, i in enumerate(rows):
            audio[r, : lengths[r]] = items[i][start : start + int(lengths[r])]
        final = torch.tensor([start + chunk >= len(items[i]) for i in rows])
        sub = state if len(rows) == state.batch_size else state.select(idx)
        out = encoder(audio, lengths, taps, num_quantizers, state=sub, final=final)
        if sub is not state:
            state.assign(idx, sub)
        for r, i in enumerate(rows):
            for t in taps:
                pieces[i][t].append(frames_of(out, t, r))
        start += chunk
    return [{t: torch.cat(p[t]) for t in taps} for p in pieces]


def split_bounds(total: int, pieces: int, warmup: int, hop: int,
                 cuts: list[int] | None = None) -> list[tuple[int, int, int]]:
    """Cut a recording of ``total`` samples into ``pieces`` equal pieces at frame boundaries (or at
    the frame indices ``cuts``, increasing, inside the recording).

    Returns ``(begin, first, end)`` per piece, in samples: the piece owns ``[first, end)`` (its
    frames ``first / hop`` to ``ceil(end / hop)``; the last piece ends at ``total``, trailing partial
    frame included) and is encoded from ``begin = max(0, first - warmup)`` rounded down to a frame,
    so its frames see all the context the unchunked encode gives them (``warmup`` >= the encoder's
    :attr:`~PaddedMimiEncoder.receptive_field`)."""
    frames = -(-total // hop)
    if cuts is None:
        pieces = max(1, min(pieces, frames))
        bounds = [frames * i // pieces for i in range(pieces + 1)]
    else:
        if any(not 0 < c < frames for c in cuts) or sorted(set(cuts)) != list(cuts):
            raise ValueError(f"cuts must be increasing frame indices inside the recording's {frames} frames")
        bounds = [0, *cuts, frames]
    out = []
    for a, b in zip(bounds, bounds[1:]):
        first = a * hop
        begin = max(0, first - -(-warmup // hop) * hop)
        out.append((begin, first, min(total, b * hop)))
    return out


@torch.no_grad()
def encode_piece(encoder: PaddedMimiEncoder, audio: torch.Tensor, begin: int, first: int, chunk: int,
                 taps: tuple[str, ...] = ("latent",), num_quantizers: int | None = None) -> dict:
    """One piece of a recording, encoded on its own: ``audio`` is the recording's samples from
    ``begin`` to the piece's end (see :func:`split_bounds`); returns each tap's frames from sample
    ``first`` on.  The warm-up ``[begin, first)`` is encoded and dropped; positions are absolute, so
    rounding (RoPE) and moshi's streaming calls are those of the unchunked encode.  Pieces are
    independent: they can run on any worker, in any order, and their frames concatenated in order
    equal the unchunked single-item encode to float noise (tested).  The split engines plan pieces
    themselves; this is the plain form of that rule, the reference ``scripts/bench_split.py`` and
    tests/codec/test_split.py check them against."""
    if begin % encoder.hop or first % encoder.hop or first < begin:
        raise ValueError(f"begin <= first, both multiples of {encoder.hop} samples")
    out = encode_chunked(encoder, [audio], chunk, taps, num_quantizers, starts=[begin])[0]
    skip = {"encoder": (first - begin) // encoder.step}
    skip["latent"] = skip["codes"] = (first - begin) // encoder.hop
    return {t: v[skip[t]:] for t, v in out.items()}
