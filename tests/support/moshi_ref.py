"""Kyutai's own ``moshi`` package (0.2.13) as a reference: a seeded random moshi Mimi built from
moshi's classes with the config of a transformers ``MimiConfig``, its weights converted to
transformers' layout, and moshi's streaming / non-streaming encode.

Test helper only (``moshi`` is an optional test dependency, installed with ``--no-deps``): the
extraction code never imports it.  The converter follows transformers'
``convert_mimi_checkpoint_to_pytorch.py``; the step that is easy to get wrong is the q/k
projections: moshi's RoPE rotates interleaved pairs (2i, 2i+1) of each head, transformers'
``rotate_half`` rotates (i, i + head_dim/2), so the rows of each head's q and k are reordered
evens-then-odds.  A wrong permutation still runs; only the comparison with moshi catches it.
"""

from __future__ import annotations

import torch
from transformers import MimiConfig, MimiModel

from mimi_extract.codec.model import reset_codebook_cache


def moshi_available() -> bool:
    try:
        import moshi.models.compression  # noqa: F401
    except Exception:
        return False
    return True


def moshi_mimi(config: MimiConfig, seed: int = 0, codebook_std: float = 1.0):
    """moshi's ``MimiModel`` built as ``moshi.models.loaders.get_mimi`` builds it, with the sizes of
    ``config`` and seeded random weights (random, non-degenerate codebooks)."""
    from moshi.models.compression import MimiModel as MoshiMimi
    from moshi.modules import SEANetDecoder, SEANetEncoder, transformer
    from moshi.quantization import SplitResidualVectorQuantizer

    assert config.num_key_value_heads == config.num_attention_heads
    seanet = dict(channels=config.audio_channels, dimension=config.hidden_size, causal=True,
                  n_filters=config.num_filters, n_residual_layers=config.num_residual_layers, activation="ELU",
                  compress=config.compress, dilation_base=config.dilation_growth_rate, disable_norm_outer_blocks=0,
                  kernel_size=config.kernel_size, residual_kernel_size=config.residual_kernel_size,
                  last_kernel_size=config.last_kernel_size, norm="none", pad_mode=config.pad_mode,
                  ratios=list(config.upsampling_ratios), true_skip=True)
    layers = dict(d_model=config.hidden_size, num_heads=config.num_attention_heads,
                  num_layers=config.num_hidden_layers, causal=True, layer_scale=config.layer_scale_initial_scale,
                  context=config.sliding_window, conv_layout=True, max_period=config.rope_parameters["rope_theta"]
                  if getattr(config, "rope_parameters", None) else config.rope_theta,
                  gating="none", norm="layer_norm", positional_embedding="rope",
                  dim_feedforward=config.intermediate_size, input_dimension=config.hidden_size,
                  output_dimensions=[config.hidden_size])
    torch.manual_seed(seed)
    encoder = SEANetEncoder(**seanet)
    model = MoshiMimi(
        encoder, SEANetDecoder(**seanet),
        SplitResidualVectorQuantizer(dimension=config.codebook_dim, n_q=config.num_quantizers,
                                     n_q_semantic=config.num_semantic_quantizers, bins=config.codebook_size,
                                     input_dimension=config.hidden_size, output_dimension=config.hidden_size),
        channels=config.audio_channels, sample_rate=config.sampling_rate, frame_rate=config.frame_rate,
        encoder_frame_rate=config.sampling_rate / encoder.hop_length, causal=True, resample_method="conv",
        encoder_transformer=transformer.ProjectedTransformer(**layers),
        decoder_transformer=transformer.ProjectedTransformer(**layers),
    ).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # visible layer scales, not 0.01 (a stronger test)
            if name.endswith("layer_scale_1.scale") or name.endswith("layer_scale_2.scale"):
                p.uniform_(0.5, 1.0)
        for name, b in model.named_buffers():
            if name.endswith("embedding_sum"):
                b.normal_(std=codebook_std)
            elif name.endswith("cluster_usage"):
                b.fill_(1.0)
            elif name.endswith("_initialized"):
                b.fill_(1.0)
    model.set_num_codebooks(config.num_quantizers)
    return model


_RENAMES = [  # (moshi, transformers) substrings, applied in order (transformers' converter's list)
    ("conv.conv.conv", "conv"), ("conv.conv", "conv"),
    ("quantizer.rvq_first.vq", "quantizer.semantic_residual_vector_quantizer"),
    ("quantizer.rvq_first", "quantizer.semantic_residual_vector_quantizer"),
    ("quantizer.rvq_rest.vq", "quantizer.acoustic_residual_vector_quantizer"),
    ("quantizer.rvq_rest", "quantizer.acoustic_residual_vector_quantizer"),
    ("_codebook", "codebook"), ("_initialized", "initialized"), ("embedding_sum", "embed_sum"),
    ("encoder_transformer.transformer", "encoder_transformer"),
    ("linear1", "mlp.fc1"), ("linear2", "mlp.fc2"), ("self_attn.out_projs.0", "self_attn.o_proj"),
    ("norm1", "input_layernorm"), ("norm2", "post_attention_layernorm"),
    ("layer_scale_1", "self_attn_layer_scale"), ("layer_scale_2", "mlp_layer_scale"),
]


def rope_permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of each head from moshi's interleaved RoPE pairs to transformers' halves."""
    out, dim = w.shape
    return w.view(heads, out // heads // 2, 2, dim).transpose(1, 2).reshape(out, dim)


def to_transformers(moshi_model, config: MimiConfig, permute: bool = True) -> MimiModel:
    """transformers' ``MimiModel`` with ``moshi_model``'s encoder-side weights (SEANet encoder,
    encoder transformer, downsample, quantizer); the decoder side stays random (unused).
    ``permute=False`` skips the q/k RoPE reordering (to show that it matters)."""
    hf = MimiModel(config).eval()
    target = hf.state_dict()
    new_style = any(k.startswith("encoder.encoder_seanet.") for k in target)  # transformers >= 5.2x
    converted = {}
    for k, v in moshi_model.state_dict().items():
        if k.startswith(("decoder", "upsample")):
            continue
        name = k
        for old, new in _RENAMES:
            name = name.replace(old, new)
        if name.startswith("encoder.model."):
            name = name.replace("encoder.model.", "encoder.encoder_seanet.layers." if new_style else "encoder.layers.")
        elif name.startswith("encoder_transformer.") and new_style:
            name = "encoder." + name
        elif name.startswith("downsample.") and new_style:
            name = "encoder." + name
        if "self_attn.in_projs.0.weight" in name:
            q, kk, vv = v.chunk(3, dim=0)
            base = name.replace("in_projs.0.weight", "")
            heads = config.num_attention_heads
            converted[base + "q_proj.weight"] = rope_permute(q, heads) if permute else q
            converted[base + "k_proj.weight"] = rope_permute(kk, config.num_key_value_heads) if permute else kk
            converted[base + "v_proj.weight"] = vv
        else:
            converted[name] = v
    encoder_side = {k for k in target if not k.startswith(("decoder", "upsample"))}
    missing, extra = encoder_side - set(converted), set(converted) - set(target)
    if missing or extra:
        raise ValueError(f"conversion: missing {sorted(missing)[:5]}, unexpected {sorted(extra)[:5]}")
    for k in converted:
        if tuple(converted[k].shape) != tuple(target[k].shape):
            raise ValueError(f"{k}: moshi {tuple(converted[k].shape)} vs transformers {tuple(target[k].shape)}")
    hf.load_state_dict(converted, strict=False)
    reset_codebook_cache(hf)
    return hf.eval()


@torch.no_grad()
def moshi_encode(model, audio: torch.Tensor, frames_per_call: int | None = None,
                 taps=("encoder", "latent", "codes"), last_call: str = "padded") -> dict:
    """moshi's encode of a 1-D ``audio``: non-streaming (``frames_per_call=None``: one
    ``encode`` of the whole, which zero-pads to a whole frame) or streaming, ``frames_per_call``
    frames of 1920 samples per ``encode`` call inside ``model.streaming(1)``, the audio
    zero-padded to a whole frame and, when the frames are not a whole number of calls, the last
    call ``last_call="padded"``: zero-padded to a whole call (its extra outputs dropped: what
    ``--framing moshi-stream`` computes) or ``"short"``: fed only the frames left.

    Returns time-first tensors: ``encoder`` [25 Hz steps, D] (the encoder transformer's output),
    ``latent`` [frames, D] and ``codes`` [frames, num_codebooks]."""
    frame = model.frame_size
    n = audio.shape[-1]
    frames = -(-n // frame)
    seen = []
    hook = model.encoder_transformer.register_forward_hook(lambda m, i, o: seen.append(o[0]))
    try:
        if frames_per_call is None:
            x = torch.nn.functional.pad(audio, (0, frames * frame - n)).view(1, 1, -1)
            latent = model._encode_to_unquantized_latent(x)
        else:
            call = frames_per_call * frame
            calls = -(-frames // frames_per_call)
            total = calls * call if last_call == "padded" else frames * frame
            x = torch.nn.functional.pad(audio, (0, total - n)).view(1, 1, -1)
            with model.streaming(1):
                latent = torch.cat([model._encode_to_unquantized_latent(x[..., i * call:(i + 1) * call])
                                    for i in range(calls)], dim=-1)
    finally:
        hook.remove()
    latent = latent[..., :frames]
    encoder = torch.cat(seen, dim=-1)[0, :, : 2 * frames].T if seen else None
    out = {"encoder": encoder, "latent": latent[0].T}
    if "codes" in taps:
        out["codes"] = model.quantizer.encode(latent)[0].T
    return out
