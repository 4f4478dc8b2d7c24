"""verify: relative feature tolerance, tie flips told from real code mismatches by the reference's
decision margin, and the audit of what an OUT directory holds."""

import os

import h5py
import numpy as np
import soundfile as sf
import torch

from conftest import cli
from mimi_extract import read_manifest
from mimi_extract.encoder import reference_single, reset_codebook_cache
from mimi_extract.runner import extract
from mimi_extract.settings import Settings
from mimi_extract.testing import random_model, restamp_checksum
from mimi_extract.verify import classify_codes, rvq_trace, verify_outputs

FRAME = 1920




def near_tie_model(audio, frame=3, relative_gap=1e-6):
    """A tiny model whose semantic codebook has, at ``frame`` of ``audio``, a second codeword
    farther than the best by only ``relative_gap`` of the distance: a float tie."""
    model = random_model(seed=7)
    ref = reference_single(model, audio, 8)
    trace = rvq_trace(model, ref["latent"], 8)
    rvq = model.quantizer.semantic_residual_vector_quantizer
    r = rvq.input_proj(ref["latent"].T[None])[0, :, frame]  # the residual codebook 0 sees
    codebook = rvq.layers[0].codebook
    best = int(trace["codes"][frame, 0])
    other = (best + 1) % codebook.codebook_size
    away = r - codebook.embed[best]
    target = r + away * (1 + relative_gap)  # mirror image of the best codeword, a hair farther
    with torch.no_grad():
        codebook.embed_sum[other] = target * codebook.cluster_usage[other].clamp(min=codebook.epsilon)
    reset_codebook_cache(model)
    return model, best, other


def test_trace_reproduces_transformers_codes(tiny_model):
    audio = 0.3 * torch.randn(FRAME * 9 + 11, generator=torch.Generator().manual_seed(1))
    ref = reference_single(tiny_model, audio, 8)
    assert torch.equal(rvq_trace(tiny_model, ref["latent"], 8)["codes"], ref["codes"])


def test_tie_flip_versus_real_mismatch():
    audio = 0.3 * torch.randn(FRAME * 12, generator=torch.Generator().manual_seed(2))
    model, best, other = near_tie_model(audio)
    ref = reference_single(model, audio, 8)
    trace = rvq_trace(model, ref["latent"], 8)
    assert int(ref["codes"][3, 0]) == best  # the constructed tie is still decided the reference's way
    margin = float(trace["d2"][3, 0] - trace["d1"][3, 0])
    assert 0 <= margin < 1e-4 * float(trace["d1"][3, 0])

    flipped = ref["codes"].clone()
    flipped[3, 0] = other
    flipped[3, 1:] = (flipped[3, 1:] + 1) % 64  # what follows a flip: later codebooks of that frame differ
    mismatches, _ = classify_codes(model, flipped, ref["latent"], 8)
    assert len(mismatches) == 8 and all(m.tie for m in mismatches)
    assert [m.cascade for m in mismatches] == [False] + [True] * 7
    # with the batched latent at hand, the measured perturbation decides: a zero perturbation
    # only leaves rounding, which still covers a 1e-6 relative gap
    assert all(m.tie for m in classify_codes(model, flipped, ref["latent"], 8, ref["latent"].clone())[0])

    real = ref["codes"].clone()
    decisive = int(torch.argmax(trace["d2"][:, 0] - trace["d1"][:, 0]))  # the frame with the widest margin
    real[decisive, 0] = (real[decisive, 0] + 1) % 64
    (m,) = classify_codes(model, real, ref["latent"], 8)[0]
    assert not m.tie and m.frame == decisive and m.codebook == 0 and m.margin > m.noise


def test_audit_of_out_classifies_and_fails_on_real(tmp_path):
    audio = 0.3 * torch.randn(FRAME * 12, generator=torch.Generator().manual_seed(2))
    model, best, other = near_tie_model(audio)
    model_dir = str(tmp_path / "model")
    model.save_pretrained(model_dir)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    sf.write(str(corpus / "tie.wav"), audio.numpy(), 24_000, subtype="FLOAT")
    sf.write(str(corpus / "other.wav"), 0.2 * np.random.default_rng(0).standard_normal(FRAME * 5).astype(np.float32),
             24_000, subtype="FLOAT")
    out = str(tmp_path / "out")
    extract(str(corpus), out, Settings(model=model_dir, tap="codes", num_workers=0))
    clean = cli("verify", "--out", out, "--device", "cpu")
    assert clean.exit_code == 0 and "PASS" in clean.text and "2 files compared" in clean.text, clean.output

    row = next(r for r in read_manifest(out) if r["key"] == "tie.wav")
    with h5py.File(os.path.join(out, row["shard"]), "r+") as f:
        f[row["dataset"]][3, 0] = other  # as another device's float noise could have decided the tie
    restamp_checksum(out, "tie.wav")  # a valid item with other codes, not a damaged one
    tie = cli("verify", "--out", out, "--device", "cpu")
    assert tie.exit_code == 0, tie.output
    assert "tie.wav: frame 3, codebook 0: tie flip" in tie.text and "1 tie flips, 0 real" in tie.text

    with h5py.File(os.path.join(out, row["shard"]), "r+") as f:
        codes = f[row["dataset"]]
        codes[8, 2] = (codes[8, 2] + 5) % 64  # a decision nowhere near a tie
    restamp_checksum(out, "tie.wav")
    real = cli("verify", "--out", out, "--device", "cpu")
    assert real.exit_code == 1 and "tie.wav: frame 8, codebook 2: REAL MISMATCH" in real.text, real.output
    checks, problems = verify_outputs(out, sample=None, device="cpu")
    first = {c.key: c.first_diverging.get("codes") for c in checks}
    assert not problems and first == {"tie.wav": 8, "other.wav": None}, first  # the tie at frame 3 is not "bad"


def test_audit_checks_attributes(tmp_path, corpus, tiny_model_dir):
    root, _ = corpus
    out = str(tmp_path / "out")
    extract(root, out, Settings(model=tiny_model_dir, tap="latent", num_workers=0))
    assert cli("verify", "--out", out, "--device", "cpu", "--sample", 3).exit_code == 0
    shard = next(r for r in read_manifest(out) if r["status"] == "ok")["shard"]
    with h5py.File(os.path.join(out, shard), "r+") as f:
        f.attrs["framing"] = "moshi"
    result = cli("verify", "--out", out, "--device", "cpu")
    assert result.exit_code == 1 and "framing='moshi'" in result.text, result.output


def test_verify_relative_tolerance_is_per_file(tiny_model_dir, corpus):
    """Loud files must not fail an absolute bound: the tolerance scales with max|ref| per file."""
    root, _ = corpus
    result = cli("verify", root, "--model", tiny_model_dir, "--device", "cpu", "--rtol", 1e-5, "--atol", 0)
    assert result.exit_code == 0 and "PASS" in result.text, result.output
    assert cli("verify", root, "--model", tiny_model_dir, "--device", "cpu", "--rtol", 1e-9, "--atol", 0).exit_code == 1


def test_verify_long_items_chunked_and_a_markup_path(tmp_path, tiny_model_dir):
    """Long items: `verify INPUT` checks the engine's chunked encode against the unchunked
    reference, `verify --out` re-encodes long stored items in chunks (no T x T mask); an OUT named
    like rich markup is printed as it is (it used to crash after all the work)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = np.random.default_rng(4)
    for name, n in (("long.wav", FRAME * 30 + 77), ("short.wav", 5000)):
        sf.write(str(corpus / name), (0.2 * rng.standard_normal(n)).astype(np.float32), 24_000, subtype="FLOAT")
    wide = {"COLUMNS": "300"}  # one table row per file
    engine = cli("verify", corpus, "--model", tiny_model_dir, "--device", "cpu", "--chunk-seconds", 0.24, env=wide)
    assert engine.exit_code == 0 and "long.wav (chunked)" in engine.text and "PASS" in engine.text, engine.output
    out = str(tmp_path / "o[/x]ut[bold]")
    extract(str(corpus), out, Settings(model=tiny_model_dir, tap="codes", num_workers=0, chunk_seconds=0.4))
    audit = cli("verify", "--out", out, "--device", "cpu", "--chunk-seconds", 0.24, env=wide)
    assert audit.exit_code == 0 and "PASS" in audit.text and "2 files compared" in audit.text, audit.output
    assert "o[/x]ut[bold]" in audit.text and "long.wav (chunked)" in audit.text
    assert "short.wav (chunked)" not in audit.text
