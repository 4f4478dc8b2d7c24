"""verify: relative feature tolerance, tie flips told from real code mismatches by the reference's
decision margin, and the audit of what an OUT directory holds."""

import os

import h5py
import numpy as np
import pytest
import soundfile as sf
import torch

from support import cli
from mimi_extract import read_manifest
from mimi_extract.codec.reference import reference_single
from mimi_extract.codec.model import reset_codebook_cache
from support import extract
from mimi_extract.config.settings import Settings
from mimi_extract.codec.demo import random_model
from support import restamp_checksum
from mimi_extract.audit.verify import classify_codes, rvq_trace, verify_outputs

FRAME = 1920


def group_of(model, codebook):
    """(quantizer, layer index in it) of a global codebook index: Mimi splits its RVQ in two
    independent groups (the semantic codebook 0, then the acoustic ones)."""
    q = model.quantizer
    n_sem = q.num_semantic_quantizers
    if codebook < n_sem:
        return q.semantic_residual_vector_quantizer, codebook
    return q.acoustic_residual_vector_quantizer, codebook - n_sem


@torch.no_grad()
def residual_at(model, latent, frame, codebook, codes):
    """The residual ``codebook`` sees at ``frame`` when the earlier codes of its group are ``codes``."""
    rvq, layer = group_of(model, codebook)
    r = rvq.input_proj(latent.T[None])[0, :, frame]
    for j in range(layer):
        r = r - rvq.layers[j].codebook.embed[int(codes[codebook - layer + j])]
    return r


def near_tie_model(audio, frame=3, relative_gap=1e-6, codebook=0):
    """A tiny model whose ``codebook`` has, at ``frame`` of ``audio``, a second codeword farther
    than the best by only ``relative_gap`` of the distance: a float tie."""
    model = random_model(seed=7)
    ref = reference_single(model, audio, 8)
    rvq, layer = group_of(model, codebook)
    r = residual_at(model, ref["latent"], frame, codebook, ref["codes"][frame])
    book = rvq.layers[layer].codebook
    best = int(ref["codes"][frame, codebook])
    other = (best + 1) % book.codebook_size
    away = r - book.embed[best]
    target = r + away * (1 + relative_gap)  # mirror image of the best codeword, a hair farther
    with torch.no_grad():
        book.embed_sum[other] = target * book.cluster_usage[other].clamp(min=book.epsilon)
    reset_codebook_cache(model)
    return model, best, other


@torch.no_grad()
def flip(model, latent, codes, frame, codebook, code):
    """``codes`` with ``code`` at (frame, codebook) and the later codes of its group as a producer
    that picked it would have chosen them (each the nearest codeword to the residual that follows)."""
    out = codes.clone()
    out[frame, codebook] = code
    rvq, layer = group_of(model, codebook)
    for k in range(codebook + 1, codebook - layer + len(rvq.layers)):
        if k >= codes.shape[1]:
            break
        r = residual_at(model, latent, frame, k, out[frame])
        out[frame, k] = int(torch.cdist(r[None], rvq.layers[k - codebook + layer].codebook.embed)[0].argmin())
    return out


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

    flipped = flip(model, ref["latent"], ref["codes"], 3, 0, other)
    assert torch.equal(flipped[3, 1:], ref["codes"][3, 1:])  # the acoustic group does not see codebook 0
    (m,) = classify_codes(model, flipped, ref["latent"], 8)[0]
    assert m.tie and not m.cascade and (m.frame, m.codebook) == (3, 0) and 0 < m.margin <= m.noise
    # with the batched latent at hand, the measured perturbation decides: a zero perturbation
    # only leaves rounding, which still covers a 1e-6 relative gap
    assert all(m.tie for m in classify_codes(model, flipped, ref["latent"], 8, ref["latent"].clone())[0])

    real = ref["codes"].clone()
    decisive = int(torch.argmax(trace["d2"][:, 0] - trace["d1"][:, 0]))  # the frame with the widest margin
    real[decisive, 0] = (real[decisive, 0] + 1) % 64
    (m,) = classify_codes(model, real, ref["latent"], 8)[0]
    assert not m.tie and m.frame == decisive and m.codebook == 0 and m.margin > m.noise


def test_tie_flip_cascade_follows_the_stored_codes():
    """A genuine tie flip in the acoustic group changes the later codes of its frame (each is the
    nearest codeword to the residual the flip leaves): all are ties, the later ones its cascade."""
    audio = 0.3 * torch.randn(FRAME * 12, generator=torch.Generator().manual_seed(2))
    model, best, other = near_tie_model(audio, codebook=1)
    ref = reference_single(model, audio, 8)
    assert int(ref["codes"][3, 1]) == best
    flipped = flip(model, ref["latent"], ref["codes"], 3, 1, other)
    changed = torch.nonzero(flipped[3] != ref["codes"][3]).flatten().tolist()
    assert changed[0] == 1 and len(changed) >= 3, changed  # the flip and a cascade to check
    mismatches, _ = classify_codes(model, flipped, ref["latent"], 8)
    assert [(m.frame, m.codebook) for m in mismatches] == [(3, k) for k in changed]
    assert all(m.tie for m in mismatches)
    assert [m.cascade for m in mismatches] == [False] + [True] * (len(changed) - 1)


def test_arbitrary_code_at_a_near_tie_is_real():
    """The stored code itself must be near the best, not just the reference's decision close: an
    arbitrary code where the reference had a genuine near-tie is real."""
    audio = 0.3 * torch.randn(FRAME * 12, generator=torch.Generator().manual_seed(2))
    model, best, other = near_tie_model(audio, codebook=1)
    ref = reference_single(model, audio, 8)
    far = next(c for c in (5, 6, 7) if c not in (best, other))
    tampered = ref["codes"].clone()
    tampered[3, 1] = far
    mismatches, _ = classify_codes(model, tampered, ref["latent"], 8)
    assert any(not m.tie and (m.frame, m.codebook) == (3, 1) and m.margin > m.noise for m in mismatches)
    out_of_range = ref["codes"].clone()
    out_of_range[7, 6] = 64  # no such codeword
    (m,) = classify_codes(model, out_of_range, ref["latent"], 8)[0]
    assert not m.tie and (m.frame, m.codebook) == (7, 6)


def test_later_code_changed_after_a_tie_flip_is_real():
    """Every codebook of a frame with a flip is checked against the residual the stored codes
    leave: a later code changed after a genuine tie flip is real (not excused as its cascade)."""
    audio = 0.3 * torch.randn(FRAME * 12, generator=torch.Generator().manual_seed(2))
    model, best, other = near_tie_model(audio, codebook=1)
    ref = reference_single(model, audio, 8)
    flipped = flip(model, ref["latent"], ref["codes"], 3, 1, other)
    for later, code in ((4, (int(flipped[3, 4]) + 1) % 64), (5, int(ref["codes"][3, 5]))):
        if code == int(flipped[3, later]):
            continue  # the reference's code happens to be the cascade's: nothing tampered
        tampered = flipped.clone()
        tampered[3, later] = code
        mismatches, _ = classify_codes(model, tampered, ref["latent"], 8)
        real = [m.codebook for m in mismatches if not m.tie]
        assert real and real[0] == later, (later, mismatches)  # (the codes after it may follow the old residual)
        assert all(m.tie for m in mismatches if m.codebook < later)  # the genuine flip and its cascade


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


@pytest.mark.parametrize("tap", ["encoder", "latent"])
def test_audit_of_float16_features_allows_their_rounding_and_nothing_more(tmp_path, corpus, tiny_model_dir, tap):
    """Features stored as float16 pass when they are the reference rounded to float16 (they failed:
    rounding moves a value by up to 2.4e-4 of it, 25x the fp32 tolerance), and the frames shown
    are the tap's (the encoder's 25 Hz: it showed the codes' count)."""
    root, _ = corpus
    out = str(tmp_path / "out")
    extract(root, out, Settings(model=tiny_model_dir, tap=tap, feature_dtype="float16", num_workers=0))
    result = cli("verify", "--out", out, "--device", "cpu", "--sample", 4, env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "PASS" in result.text, result.output
    checks, problems = verify_outputs(out, sample=None, device="cpu")
    for check in (c for c in checks if c.error is None and c.note is None):
        row = next(r for r in read_manifest(out) if r["key"] == check.key)
        assert check.frames == row["frames"] and check.passed(1e-5, 1e-6), (check.key, check.diff)


def test_float16_rounding_is_allowed_and_one_spacing_more_is_not():
    from mimi_extract.audit.verify import FileCheck, _compare_features

    ref = torch.randn(200, 64, generator=torch.Generator().manual_seed(0)) * 3
    ref[17, 5] = 2.5  # (the bumped value: one float16 spacing there is 2e-3, over the 1e-5 x max|ref| bound)
    noisy = ref * (1 + 1e-7 * torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)))  # another kernel's fp32 result: some values round the other way
    assert (noisy.half() != ref.half()).sum() > 0  # (6 here)
    check = FileCheck("a", 1.0)
    assert _compare_features(check, "latent", noisy.half(), ref, 1e-5, 1e-6) and check.passed(1e-5, 1e-6)
    bumped = noisy.half().clone()
    bumped[17, 5] = torch.from_numpy(np.nextafter(bumped[17, 5:6].numpy(), np.float16(np.inf)))[0]
    bumped[17, 5] = torch.from_numpy(np.nextafter(bumped[17, 5:6].numpy(), np.float16(np.inf)))[0]  # 2 spacings
    check = FileCheck("a", 1.0)
    _compare_features(check, "latent", bumped, ref, 1e-5, 1e-6)
    assert not check.passed(1e-5, 1e-6) and check.first_diverging["latent"] == 17


def test_verify_says_what_it_needs(tmp_path):
    nothing = cli("verify")
    assert nothing.exit_code == 2 and "--out OUT" in nothing.text and "not both" not in nothing.text
    both = cli("verify", tmp_path, "--out", tmp_path)
    assert both.exit_code == 2 and "not both" in both.text
    sampled = cli("verify", "--out", tmp_path, "--checksums", "--sample", 2)  # (was: --sample silently ignored)
    assert sampled.exit_code == 2 and "give one or the other" in sampled.text


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


def test_audit_warns_when_the_installed_transformers_is_not_outs(tmp_path, corpus, tiny_model_dir):
    """Issue 31 item 7: `verify --out` re-encodes with the installed transformers; when run.json says OUT
    was made with another one (before 5.3.0 Mimi attended to the whole past), it says so in one warning
    line; the audit's verdict is its own.  An OUT made before versions were recorded says nothing."""
    import json

    import transformers

    root, _ = corpus
    out = str(tmp_path / "out")
    extract(root, out, Settings(model=tiny_model_dir, tap="codes", num_workers=0))
    same = cli("verify", "--out", out, "--device", "cpu", "--sample", 2)
    assert same.exit_code == 0 and "PASS" in same.text and "warning" not in same.output, same.output
    path = os.path.join(out, "run.json")
    with open(path) as f:
        info = json.load(f)
    with open(path, "w") as f:
        json.dump({**info, "versions": {**info["versions"], "transformers": "5.3.0"}}, f)
    other = cli("verify", "--out", out, "--device", "cpu", "--sample", 2)
    assert other.exit_code == 0 and "PASS" in other.text, other.output
    warnings = [line for line in other.output.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and f"made with transformers 5.3.0 (run.json), this is transformers " \
        f"{transformers.__version__}" in warnings[0], other.output
    with open(path, "w") as f:
        json.dump({k: v for k, v in info.items() if k != "versions"}, f)
    assert "warning" not in cli("verify", "--out", out, "--device", "cpu", "--sample", 2).output
