"""The offline demo: a seeded random tiny Mimi and a small corpus with the awkward cases.

Real weights need the network (``kyutai/mimi``); these make every code path runnable without it
(``scripts/make_demo.py``, the README's offline run, the benchmarks and the tests' fixtures).
Random weights give meaningless features - use them to check mechanics and numerics only.
"""

from __future__ import annotations

import os

import numpy as np
import soundfile as sf
import torch
from transformers import MimiConfig, MimiModel

from .model import reset_codebook_cache


def tiny_config(**overrides) -> MimiConfig:
    """Mimi's real strides (1920-sample frames, 2x downsample) with tiny widths; short sliding window
    so that short test clips exercise it."""
    kw = dict(
        hidden_size=32, num_filters=4, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=64, codebook_size=64, codebook_dim=16, vector_quantization_hidden_dimension=16,
        num_quantizers=8, sliding_window=6, upsample_groups=32,
    )
    kw.update(overrides)
    return MimiConfig(**kw)


def random_model(config: MimiConfig | None = None, seed: int = 0) -> MimiModel:
    """Seeded random MimiModel in eval mode, with random (non-degenerate) codebooks."""
    torch.manual_seed(seed)
    model = MimiModel(config or tiny_config()).eval()
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "embed_sum") and hasattr(m, "cluster_usage"):
                m.embed_sum.normal_()  # transformers initialises codebooks to zeros: every code would be 0
                m.cluster_usage.fill_(1.0)
    reset_codebook_cache(model)
    return model


def write_corpus(root: str, seed: int = 0) -> dict[str, str]:
    """A small corpus with the awkward cases; returns {relative path: what it is}."""
    rng = np.random.default_rng(seed)
    sr = 24_000
    t = lambda n, rate=sr: np.arange(n) / rate  # noqa: E731
    files = {
        "sine_440.wav": (0.5 * np.sin(2 * np.pi * 440 * t(sr * 2 + 123)), sr, "sine, 2 s + 123 samples"),
        "noise_short.flac": (0.1 * rng.standard_normal(1000), sr, "noise shorter than one frame"),
        "sub/exact_frames.wav": (0.3 * rng.standard_normal(1920 * 7), sr, "exactly 7 frames"),
        "sub/deeper/chirp.flac": (0.4 * np.sin(2 * np.pi * (200 + 800 * t(sr * 3)) * t(sr * 3)), sr, "chirp 3 s"),
        "rate16k.wav": (0.3 * np.sin(2 * np.pi * 300 * t(16000 * 2, 16000)), 16000, "16 kHz, torchaudio resample"),
        "rate44k.wav": (0.3 * rng.standard_normal(44100), 44100, "44.1 kHz, torchaudio resample"),
        "stereo.wav": (np.stack([0.3 * np.sin(2 * np.pi * 220 * t(sr)), 0.2 * rng.standard_normal(sr)], 1), sr,
                       "stereo"),
    }
    described = {}
    for rel, (data, rate, what) in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        sf.write(path, data.astype(np.float32), rate, subtype="PCM_16" if rel.endswith("flac") else "FLOAT")
        described[rel] = what
    with open(os.path.join(root, "empty.wav"), "wb"):
        pass
    with open(os.path.join(root, "corrupt.wav"), "wb") as f:
        f.write(b"RIFF\x24\x00\x00\x00WAVEfmt garbage that is not audio" + bytes(rng.integers(0, 255, 64, np.uint8)))
    sf.write(os.path.join(root, "zero_len.wav"), np.zeros((0,), np.float32), sr)
    with open(os.path.join(root, "notes.txt"), "w") as f:
        f.write("not audio, must be ignored\n")
    described.update({"empty.wav": "0 bytes", "corrupt.wav": "corrupt header", "zero_len.wav": "valid, 0 samples"})
    return described
