"""The exact path on each available device: the padded, chunked and end-to-end encoders against the
single-item reference computed on the same device, fp32 with TF32 off (what ``build_encoder`` sets).

Parametrised over ``cpu`` and, where one is visible, ``cuda``: CI runs the CPU half; a GPU machine
runs ``pytest tests/engines/test_device.py -k cuda`` (scripts/gpu_check.sh does).  Full-size architecture
cases run on CUDA only (on two CPU cores they take minutes)."""

import threading

import numpy as np
import pytest
import soundfile as sf
import torch
from transformers import MimiConfig

from support import cli, ragged, tolerance
from mimi_extract.codec.encoder import encode_chunked, frames_of
from mimi_extract.codec.reference import reference_single
from mimi_extract.engines import build_encoder
from mimi_extract.config.settings import Settings
from mimi_extract.codec.demo import random_model

FRAME = 1920
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
LENGTHS = [FRAME * 10 + 7, 100, FRAME * 3, 5000, FRAME * 10 - 1, 1, FRAME * 6 + 1, 37_111]


def exact_encoder(model, device):
    encoder = build_encoder(Settings(devices=(device,), dtype="fp32"), device, model)
    if device.startswith("cuda"):  # the reference runs under the same flags: strict fp32
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    return encoder


def check(encoder, items, out, rows=None):
    """Every tap of every row within the fp32 tolerance of the single-item reference, codes equal."""
    model = encoder.model
    for i, audio in enumerate(items):
        ref = reference_single(model, audio.to(model.device), 8)
        row = i if rows is None else rows[i]
        for tap in ("encoder", "latent"):
            got = frames_of(out, tap, row) if rows is None else out[row][tap]
            assert got.shape == ref[tap].shape, f"item {i} {tap}: {tuple(got.shape)} vs {tuple(ref[tap].shape)}"
            diff = (got.to(ref[tap].device) - ref[tap]).abs().max().item()
            assert diff <= tolerance(ref[tap]), f"item {i} {tap}: max abs diff {diff}"
        got = frames_of(out, "codes", row) if rows is None else out[row]["codes"]
        assert torch.equal(got.to(ref["codes"].device), ref["codes"]), f"item {i}: codes differ"


@pytest.mark.parametrize("device", DEVICES)
def test_padded_batch_matches_single(device):
    encoder = exact_encoder(random_model(seed=0), device)
    items, batch = ragged(LENGTHS, seed=1, garbage=float("nan"))
    with torch.no_grad():
        out = encoder(batch.to(device), torch.tensor(LENGTHS), ("encoder", "latent", "codes"), 8)
    check(encoder, items, out)


@pytest.mark.parametrize("device", DEVICES)
def test_chunked_streams_match_single(device):
    encoder = exact_encoder(random_model(seed=2), device)
    items, _ = ragged([FRAME * 9 + 11, FRAME * 4, 777], seed=3)
    out = encode_chunked(encoder, [x.to(device) for x in items], 2 * FRAME, ("encoder", "latent", "codes"), 8)
    check(encoder, items, out, rows=list(range(len(items))))


@pytest.mark.parametrize("device", [d for d in DEVICES if d != "cpu"])
def test_full_size_padded_and_chunked_match_single(device):
    """The real architecture (8 layers, 250-frame window, 32 codebooks) past its 10 s window."""
    encoder = exact_encoder(random_model(MimiConfig(), seed=0), device)
    lengths = [24_000 * 12 + 5, 24_000 * 3 + 1, 1920 * 7]
    items, batch = ragged(lengths, seed=4)
    with torch.no_grad():
        out = encoder(batch.to(device), torch.tensor(lengths), ("encoder", "latent", "codes"), 8)
    check(encoder, items, out)
    chunked = encode_chunked(encoder, [x.to(device) for x in items], 24_000 * 4 // FRAME * FRAME,
                             ("encoder", "latent", "codes"), 8)
    check(encoder, items, chunked, rows=list(range(len(items))))


@pytest.mark.parametrize("device", DEVICES)
def test_verify_engine_on_device(device, tiny_model_dir, tmp_path):
    """``verify INPUT`` on the device: the whole engine (feeder, pinned steps, carried state,
    resampling) against transformers item by item; exit 0 means no real code mismatch."""
    rng = np.random.default_rng(0)
    for name, seconds, rate in [("a.wav", 5.3, 24_000), ("b.flac", 0.7, 16_000), ("c.wav", 2.05, 24_000)]:
        sf.write(tmp_path / name, (0.2 * rng.standard_normal(int(seconds * rate))).astype(np.float32), rate)
    result = cli("verify", tmp_path, "--model", tiny_model_dir, "--device", device, "--chunk-seconds", "1",
                 "--batch-size", "2")
    assert result.exit_code == 0, result.output
    assert "3 files compared" in result.text


def test_gpu_decode_threads_scale_with_cores(monkeypatch):
    """On GPU the host decodes and resamples for the device: every core but two decodes (two
    threads capped a GPU at ~4,000x real time on 16 kHz FLAC: scripts/bench_ceilings.py); on CPU
    the cores encode and two decoding threads suffice; an explicit --num-workers wins."""
    import mimi_extract.config.settings as settings_mod

    monkeypatch.setattr(settings_mod, "cpu_cores", lambda: 16)
    assert Settings(devices=("cuda:0",)).decode_threads == 14
    assert Settings(devices=("cuda:0", "cuda:1")).decode_threads == 6
    assert Settings(devices=("cuda:0",) * 8).decode_threads == 2
    assert Settings(devices=("cpu",) * 16).decode_threads == 2
    assert Settings(devices=("cuda:0",), num_workers=3).decode_threads == 3
    assert Settings(devices=("cuda:0",), num_workers=0).decode_threads == 1


def test_feeder_uses_decode_threads(monkeypatch, tiny_model):
    """The feeder's pool is ``decode_threads`` wide (what the default above is for)."""
    import mimi_extract.engines.device as device_mod
    from mimi_extract.engines import DeviceRunner

    sizes = []
    real = device_mod.ThreadPoolExecutor

    def pool(n, **kw):
        sizes.append(n)
        return real(n, **kw)

    monkeypatch.setattr(device_mod, "ThreadPoolExecutor", pool)
    monkeypatch.setattr(Settings, "decode_threads", property(lambda self: 5))
    runner = DeviceRunner(Settings(), "cpu", tiny_model)
    runner.run(lambda block=True: None, lambda piece: None, threading.Event())
    assert sizes == [5]
