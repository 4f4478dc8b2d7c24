"""The private parts of transformers' Mimi (``transformers.models.mimi.modeling_mimi``) this package
relies on, reached through this module only.

``PaddedMimiEncoder`` re-runs transformers' own sub-modules layer by layer (so it keeps their
weights, RoPE and attention kernels), which needs more of them than the public ``MimiModel`` API
gives.  These are internals a transformers release may rename or drop without notice; keeping them
here makes the list short to re-check on an upgrade, and :func:`missing` names any that is gone,
so the encoder refuses a model with that name instead of failing with an AttributeError deep in a
forward pass (``tests/codec/test_transformers_internals.py``).

Checked on transformers 5.24.0 (the pin of ``constraints.txt``) and 5.13.0 (pyproject's floor: the
first release whose transformer holds ``rotary_emb``; Mimi's sliding window came in 5.3.0), whose
layout is among those marked *older* below (tests/codec's fast tier passes on it).

=============================  ==========================================================================
internal                       used for
=============================  ==========================================================================
``MimiConv1d``                 the convs to walk, pad and carry (``isinstance``), and of each:
  ``._get_output_length``        per-item output lengths (private method)
  ``.padding_total``             the causal left context (kernel - stride, dilated)
  ``.conv``                      the wrapped ``nn.Conv1d``: its weight, bias, dilation, groups
  ``.stride`` ``.kernel_size``   tensors (buffers), read with ``int()``
  ``.pad_mode`` ``.causal``      ``constant``/``replicate``; only causal convs are supported
  ``.in_channels``               the width of the carried context
``MimiResnetBlock``            ``.block`` (its layers) and ``.shortcut`` (a conv or the identity)
``MimiEuclideanCodebook``      ``._embed``: the codebook cache built lazily, dropped after a move or cast
SEANet ``.layers``             the encoder's layer list, walked in order
encoder layout                 ``model.encoder.encoder_seanet/.encoder_transformer/.downsample``;
                               *older*: ``model.encoder``, ``model.encoder_transformer``, ``model.downsample``
decoder layout                 ``model.decoder.upsample/.decoder_transformer/.decoder_seanet`` and its
                               ``.config``; *older*: ``model.upsample``, ``model.decoder_transformer``,
                               ``model.decoder`` (the decoder, ``decoder.py``)
``MimiConvTranspose1d``        ``.conv`` (an ``nn.ConvTranspose1d``), ``.padding_left``/``.padding_right``
                               (causal: 0 and kernel - stride)
``quantizer.decode``           ``(codes [B, N, T]) -> latent [B, D, T]``
transformer                    ``.layers`` and ``.rotary_emb(hidden, position_ids)``; a layer is called
                               as ``layer(h, attention_mask=, position_ids=, position_embeddings=, <cache>=)``
                               and returns a tensor (*older*: a tuple whose first item is it)
the cache protocol             a layer's cache keyword: ``cache`` (*older*: ``past_key_values``,
                               ``past_key_value``); attention calls
                               ``cache.update(key_states, value_states, layer_idx, ...)`` and attends to
                               the (keys, values) it returns (``encoder._WindowCache`` duck-types it)
``config._attn_implementation``  ``eager`` adds a float mask, the others take a bool one
``quantizer.encode``           ``(latent [B, D, T], num_quantizers) -> codes [N, B, T]``
=============================  ==========================================================================
"""

from __future__ import annotations

import inspect

import torch
from torch import nn
from transformers.models.mimi import modeling_mimi as mm

CHECKED_ON = ("5.13.0", "5.24.0")  # transformers versions this list was checked on

MimiConv1d = mm.MimiConv1d
MimiResnetBlock = mm.MimiResnetBlock
MimiConvTranspose1d = mm.MimiConvTranspose1d
CACHE_KEYWORDS = ("cache", "past_key_values", "past_key_value")  # newest first


def encoder_parts(model: nn.Module) -> tuple[nn.Module, nn.Module, nn.Module | None]:
    """(SEANet encoder, encoder transformer, downsample) across transformers 5.x layouts."""
    enc = model.encoder
    if hasattr(enc, "encoder_seanet"):  # transformers >= 5.21: MimiModel.encoder is MimiEncoderModel
        return enc.encoder_seanet, enc.encoder_transformer, enc.downsample
    return enc, model.encoder_transformer, model.downsample


def decoder_parts(model: nn.Module) -> tuple[nn.Module | None, nn.Module, nn.Module, object]:
    """(upsample, decoder transformer, SEANet decoder, the decoder's config) across transformers 5.x
    layouts: what ``MimiModel.decode`` runs after ``quantizer.decode``."""
    dec = model.decoder
    if hasattr(dec, "decoder_seanet"):  # transformers >= 5.21: MimiModel.decoder is MimiDecoderModel
        return dec.upsample, dec.decoder_transformer, dec.decoder_seanet, dec.config
    return model.upsample, model.decoder_transformer, dec, model.config


def output_length(conv: nn.Module, lengths: torch.Tensor) -> torch.Tensor:
    """``conv``'s output length for each input length (MimiConv1d's own arithmetic)."""
    return conv._get_output_length(lengths)


def padding_total(conv: nn.Module) -> int:
    """Input steps of left context a causal ``conv`` pads with (dilated kernel - stride)."""
    return int(conv.padding_total)


def inner_conv(conv: nn.Module) -> nn.Conv1d:
    """The ``nn.Conv1d`` a MimiConv1d wraps (its weight, bias, dilation and groups)."""
    return conv.conv


def cache_keyword(layer: nn.Module) -> str | None:
    """The keyword a transformer layer takes its key/value cache by (renamed across releases)."""
    params = inspect.signature(layer.forward).parameters
    return next((a for a in CACHE_KEYWORDS if a in params), None)


def eager_attention(config) -> bool:
    """Whether attention runs transformers' eager kernel, which *adds* its mask (float, -inf where
    masked) where sdpa and flash take a bool mask."""
    return config._attn_implementation == "eager"


def drop_codebook_cache(model: nn.Module) -> None:
    """Forget each codebook's lazily built ``_embed`` (stale after a move, a cast or a weight edit)."""
    for m in model.modules():
        if isinstance(m, mm.MimiEuclideanCodebook):
            m._embed = None


def missing(model: nn.Module | None = None) -> list[str]:
    """The internals above that this transformers (and ``model``, when given) lacks: [] when all are
    there.  Each is named as the table above names it."""
    gone = [f"modeling_mimi.{name}" for name in ("MimiConv1d", "MimiResnetBlock", "MimiEuclideanCodebook")
            if not hasattr(mm, name)]
    try:
        from transformers.cache_utils import Cache

        params = list(inspect.signature(Cache.update).parameters)[1:4]
        if params != ["key_states", "value_states", "layer_idx"]:
            gone.append(f"Cache.update(key_states, value_states, layer_idx, ...) (now {params})")
    except (ImportError, AttributeError):
        gone.append("transformers.cache_utils.Cache.update")
    if model is None or gone:
        return gone
    try:
        seanet, transformer, downsample = encoder_parts(model)
    except AttributeError as e:
        return gone + [f"encoder layout ({e})"]
    convs = [m for m in seanet.modules() if isinstance(m, mm.MimiConv1d)] + ([downsample] if downsample else [])
    if not convs:
        gone.append("MimiConv1d in the SEANet encoder")
    for conv in convs[:1] + convs[-1:]:
        for name in ("_get_output_length", "padding_total", "stride", "kernel_size", "pad_mode", "causal",
                     "in_channels"):
            if not hasattr(conv, name):
                gone.append(f"MimiConv1d.{name}")
        if not isinstance(getattr(conv, "conv", None), nn.Conv1d):
            gone.append("MimiConv1d.conv (an nn.Conv1d)")
    blocks = [m for m in seanet.modules() if isinstance(m, mm.MimiResnetBlock)]
    if blocks and not (hasattr(blocks[0], "block") and hasattr(blocks[0], "shortcut")):
        gone.append("MimiResnetBlock.block / .shortcut")
    if not hasattr(seanet, "layers"):
        gone.append("SEANet .layers")
    if not (hasattr(transformer, "layers") and hasattr(transformer, "rotary_emb")):
        gone.append("transformer .layers / .rotary_emb")
    elif len(transformer.layers) and cache_keyword(transformer.layers[0]) is None:
        gone.append(f"the transformer layer's cache keyword (one of {', '.join(CACHE_KEYWORDS)})")
    codebooks = [m for m in model.modules() if isinstance(m, mm.MimiEuclideanCodebook)]
    if codebooks and not hasattr(codebooks[0], "_embed"):
        gone.append("MimiEuclideanCodebook._embed")
    if not hasattr(model.config, "_attn_implementation"):
        gone.append("config._attn_implementation")
    if not callable(getattr(getattr(model, "quantizer", None), "encode", None)):
        gone.append("quantizer.encode")
    return sorted(set(gone), key=gone.index)


def require(model: nn.Module) -> None:
    """Raise a RuntimeError naming every internal :func:`missing` finds (and the versions checked)."""
    gone = missing(model)
    if gone:
        import transformers

        raise RuntimeError(
            f"transformers {transformers.__version__} lacks what mimi-extract's encoder relies on: "
            f"{'; '.join(gone)} (checked on transformers {', '.join(CHECKED_ON)}; see mimi_extract/codec/internals.py)")
