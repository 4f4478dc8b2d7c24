"""Padding-aware, truly batched Mimi encoder built on transformers' ``MimiModel``.

transformers' encoder is exact only for a batch of one: conv biases leak into the padding, strided
convs read that padding at the boundary, the transformer gets no mask and the 2x downsample
replicates the padding instead of the last real frame.  ``PaddedMimiEncoder`` runs the *same*
transformers sub-modules (same weights, same RoPE, same kernels) on a right-padded batch, but:

* before every conv the padded steps hold exactly what the conv would pad a lone item with
  (zeros for ``constant`` convs, the last valid step for ``replicate`` ones, i.e. the downsample);
* after every layer the padded steps are zeroed again, so nothing but zeros is ever carried;
* per-item lengths are tracked through each conv's own ``_get_output_length`` arithmetic;
* the transformer gets a causal sliding-window mask built from the per-item lengths.

Everything is one batched op per layer: there is no loop over batch items.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import torch
from torch import nn
from transformers import MimiConfig
from transformers.models.mimi import modeling_mimi as mm
from transformers.utils import logging as hf_logging

TAPS = ("encoder", "latent", "codes")


def encoder_parts(model: nn.Module) -> tuple[nn.Module, nn.Module, nn.Module | None]:
    """(SEANet encoder, encoder transformer, downsample) across transformers 5.x layouts."""
    enc = model.encoder
    if hasattr(enc, "encoder_seanet"):  # transformers >= 5.2x: MimiModel.encoder is MimiEncoderModel
        return enc.encoder_seanet, enc.encoder_transformer, enc.downsample
    return enc, model.encoder_transformer, model.downsample


def config_hash(config) -> str:
    """Short stable hash of a model config, stored with every output for provenance."""
    fields = {k: v for k, v in config.to_dict().items() if not k.startswith("_") and k != "transformers_version"}
    cfg = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(cfg.encode()).hexdigest()[:16]


def reset_codebook_cache(model: nn.Module) -> None:
    """Codebooks cache ``embed`` lazily; drop it after moving/casting the model or editing weights."""
    for m in model.modules():
        if isinstance(m, mm.MimiEuclideanCodebook):
            m._embed = None


def _from_pretrained(cls, name_or_path: str, **kwargs):
    """``cls.from_pretrained`` with an actionable error instead of a long hub traceback."""
    looks_local = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1  # hub ids: org/name
    if looks_local and not os.path.isdir(os.path.expanduser(name_or_path)):
        raise RuntimeError(f"model directory {name_or_path!r} does not exist")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        return cls.from_pretrained(os.path.expanduser(name_or_path), **kwargs)
    except OSError as e:
        raise RuntimeError(
            f"could not load Mimi from {name_or_path!r}: {e}\n"
            "Pass a local directory saved with `save_pretrained`, or a hub id on a machine with network."
        ) from e


def load_config(name_or_path: str) -> MimiConfig:
    return _from_pretrained(MimiConfig, name_or_path)


def load_model(name_or_path: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """``MimiModel.from_pretrained`` (hub id or local dir) in eval mode on ``device``."""
    return prepare(_from_pretrained(mm.MimiModel, name_or_path, attn_implementation="sdpa"), device, dtype)


def prepare(model: nn.Module, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    model = model.to(device=device, dtype=dtype).eval()
    reset_codebook_cache(model)
    return model


def _valid(lengths: torch.Tensor, size: int) -> torch.Tensor:
    """[B, size] bool: True on each item's valid steps."""
    return torch.arange(size, device=lengths.device)[None, :] < lengths[:, None]


def _zero_padding(x: torch.Tensor, lengths: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """Zero steps >= length of a [B, C, T] tensor (``masked_fill`` also overwrites NaN/inf).

    A batch without padding is returned as is: a lone item pays nothing for the masking."""
    if bool((lengths >= x.shape[-1]).all()):
        return x
    invalid = ~_valid(lengths, x.shape[-1])[:, None, :]
    return x.masked_fill_(invalid, 0) if inplace else x.masked_fill(invalid, 0)


def _replicate_padding(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Fill steps >= length with each item's last valid step (what ``replicate`` pads a lone item with)."""
    last = (lengths - 1).clamp(min=0)[:, None, None].expand(-1, x.shape[1], 1)
    return torch.where(_valid(lengths, x.shape[-1])[:, None, :], x, x.gather(-1, last))


@dataclass
class EncoderOutput:
    """Per tap: padded batch tensor and exact per-item frame counts.

    ``encoder``/``latent`` are ``[B, frames, dim]``; ``codes`` is ``[B, num_quantizers, frames]``.
    """

    tensors: dict[str, torch.Tensor]
    lengths: dict[str, torch.Tensor]


class PaddedMimiEncoder(nn.Module):
    """Batched Mimi encoding whose valid outputs equal encoding each item alone."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.seanet, self.transformer, self.downsample = encoder_parts(model)
        self.quantizer = model.quantizer
        for m in self.modules():
            if isinstance(m, mm.MimiConv1d) and m.pad_mode not in ("constant", "replicate"):
                raise NotImplementedError(f"pad_mode {m.pad_mode!r} is not supported (constant/replicate only)")

    @property
    def config(self):
        return self.model.config

    # -- lengths ---------------------------------------------------------------------------
    def output_lengths(self, lengths: torch.Tensor) -> dict[str, torch.Tensor]:
        """Frames per item for each tap, from each conv's own length arithmetic."""
        n = torch.as_tensor(lengths, dtype=torch.long)
        for m in self.seanet.modules():
            if isinstance(m, mm.MimiConv1d):
                n = m._get_output_length(n).cpu()
        latent = self.downsample._get_output_length(n).cpu() if self.downsample is not None else n
        return {"encoder": n, "latent": latent, "codes": latent}

    # -- layers ----------------------------------------------------------------------------
    def _conv(self, conv: nn.Module, x: torch.Tensor, lengths: torch.Tensor):
        if conv.pad_mode == "replicate":
            x = _replicate_padding(x, lengths)  # invariant elsewhere: padding already holds zeros
        out_lengths = conv._get_output_length(lengths).to(lengths.device)
        return _zero_padding(conv(x), out_lengths, inplace=True), out_lengths

    def _seanet(self, x: torch.Tensor, lengths: torch.Tensor):
        for layer in self.seanet.layers:
            if isinstance(layer, mm.MimiConv1d):
                x, lengths = self._conv(layer, x, lengths)
            elif isinstance(layer, mm.MimiResnetBlock):
                h = x
                for sub in layer.block:
                    if isinstance(sub, mm.MimiConv1d):
                        h, _ = self._conv(sub, h, lengths)
                    else:
                        h = _zero_padding(sub(h), lengths, inplace=True)
                residual = self._conv(layer.shortcut, x, lengths)[0] if isinstance(layer.shortcut, mm.MimiConv1d) else x
                x = _zero_padding(residual + h, lengths, inplace=True)
            else:
                x = _zero_padding(layer(x), lengths, inplace=True)
        return x, lengths

    def attention_mask(self, lengths: torch.Tensor, size: int, dtype: torch.dtype) -> torch.Tensor:
        """[B, 1, T, T] causal sliding-window mask from lengths (key j visible to query i iff
        i - window < j <= i and j is valid).  Padded queries may see themselves, so no row is
        fully masked (no NaN); their outputs are zeroed anyway."""
        pos = torch.arange(size, device=lengths.device)
        allowed = pos[None, :] <= pos[:, None]
        window = getattr(self.config, "sliding_window", None)
        if window is not None:
            allowed &= pos[None, :] > pos[:, None] - window
        key_ok = _valid(lengths, size)[:, None, :] | torch.eye(size, dtype=torch.bool, device=lengths.device)
        allowed = allowed[None] & key_ok  # [B, T, T]
        if self.config._attn_implementation == "eager":  # eager *adds* the mask
            return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
                ~allowed, torch.finfo(dtype).min
            )[:, None]
        return allowed[:, None]

    def _transformer(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        h = x.transpose(1, 2)  # [B, T, D]
        size = h.shape[1]
        mask = self.attention_mask(lengths, size, h.dtype)
        position_ids = torch.arange(size, device=h.device)[None]
        pos_emb = self.transformer.rotary_emb(h, position_ids)
        valid = _valid(lengths, size)[:, :, None]
        for layer in self.transformer.layers:
            out = layer(h, attention_mask=mask, position_ids=position_ids, position_embeddings=pos_emb)
            h = torch.where(valid, out[0] if isinstance(out, tuple) else out, h.new_zeros(()))
        return h.transpose(1, 2)

    # -- public ----------------------------------------------------------------------------
    @torch.no_grad()
    def forward(
        self,
        audio: torch.Tensor,
        lengths: torch.Tensor,
        taps: tuple[str, ...] = ("latent",),
        num_quantizers: int | None = None,
    ) -> EncoderOutput:
        """Encode a right-padded batch ``audio`` [B, T] or [B, 1, T] with per-item sample ``lengths``."""
        unknown = set(taps) - set(TAPS)
        if unknown:
            raise ValueError(f"unknown taps {sorted(unknown)}; choose from {TAPS}")
        if audio.dim() == 2:
            audio = audio[:, None]
        lengths = torch.as_tensor(lengths, dtype=torch.long, device=audio.device)
        if (lengths < 1).any() or (lengths > audio.shape[-1]).any():
            raise ValueError("every length must be in [1, padded length]")
        x = _zero_padding(audio, lengths)

        x, n25 = self._seanet(x, lengths)
        x = self._transformer(x, n25)
        tensors, out_lengths = {}, {"encoder": n25.cpu()}
        if "encoder" in taps:
            tensors["encoder"] = x.transpose(1, 2)
        if "latent" in taps or "codes" in taps:
            n12 = n25
            if self.downsample is not None:
                x, n12 = self._conv(self.downsample, x, n25)
            out_lengths["latent"] = out_lengths["codes"] = n12.cpu()
            if "latent" in taps:
                tensors["latent"] = x.transpose(1, 2)
            if "codes" in taps:
                tensors["codes"] = self.quantizer.encode(x, num_quantizers).transpose(0, 1)
        return EncoderOutput(tensors, {t: out_lengths[t] for t in taps})


@torch.no_grad()
def reference_single(model: nn.Module, audio: torch.Tensor, num_quantizers: int | None = None) -> dict:
    """One unpadded item through transformers' own, unmodified forward passes (the reference).

    Returns ``encoder``/``latent`` as [frames, dim] and ``codes`` as [N, frames]."""
    seanet, transformer, downsample = encoder_parts(model)
    x = audio.reshape(1, 1, -1)
    h = transformer(seanet(x).transpose(1, 2)).last_hidden_state
    latent = downsample(h.transpose(1, 2)) if downsample is not None else h.transpose(1, 2)
    codes = model.quantizer.encode(latent, num_quantizers).transpose(0, 1)
    return {"encoder": h[0], "latent": latent[0].T, "codes": codes[0]}
