"""``--framing moshi-stream`` against Kyutai's ``moshi`` package itself (0.2.13, seeded random
weights converted to transformers' layout, see ``moshi_ref``).

The model is the tiny test config with a 10-step attention window (moshi's ``context``), so the
window's boundary -- 250 steps = 10 s for the real Mimi -- comes after 0.4 s here and the clips stay
short.  Its layer scales are drawn large (0.5..1) and its codebooks at the latents' scale, so a
wrong mask shows up in the codes, not only in the latents.
"""

import h5py
import numpy as np
import pytest
import soundfile as sf
import torch

pytest.importorskip("moshi.models.compression", reason="pip install --no-deps moshi==0.2.13 einops sentencepiece")

from support import ONE_WORKER, cli, tolerance  # noqa: E402
from support.moshi_ref import moshi_encode, moshi_mimi, to_transformers  # noqa: E402

from mimi_extract.audio.reader import load  # noqa: E402
from mimi_extract.codec.encoder import PaddedMimiEncoder, encode_chunked, frames_of  # noqa: E402
from mimi_extract.codec.reference import moshi_stream_mask, reference_single  # noqa: E402
from mimi_extract.codec.model import prepare  # noqa: E402
from mimi_extract.codec.demo import tiny_config  # noqa: E402
from mimi_extract.audit.verify import classify_codes  # noqa: E402
from mimi_extract.store.identity import read_run_info  # noqa: E402
from mimi_extract.store.manifest import read_manifest

WINDOW = 10  # encoder steps (25 Hz): the boundary is at 0.4 s
FRAME = 1920
TAPS = ("encoder", "latent", "codes")


@pytest.fixture(scope="module")
def pair():
    config = tiny_config(sliding_window=WINDOW)
    moshi = moshi_mimi(config, seed=0, codebook_std=0.1)
    return moshi, prepare(to_transformers(moshi, config)), config


def noise(samples: int, seed: int = 1) -> torch.Tensor:
    return 0.1 * torch.randn(samples, generator=torch.Generator().manual_seed(seed))


def padded(audio: torch.Tensor) -> torch.Tensor:
    """``--framing moshi``'s input: zero-padded to whole frames."""
    return torch.nn.functional.pad(audio, (0, -len(audio) % FRAME))


def first_over(got: torch.Tensor, ref: torch.Tensor) -> int | None:
    """First time step whose features leave float tolerance."""
    over = torch.nonzero((got - ref).abs().amax(-1) > tolerance(ref)).flatten()
    return int(over[0]) if len(over) else None


def assert_same(model, got: dict, ref: dict) -> None:
    """Every tap equals moshi's: features to float tolerance at every step, codes up to float ties."""
    for tap in ("encoder", "latent"):
        assert got[tap].shape == ref[tap].shape, tap
        assert first_over(got[tap], ref[tap]) is None, f"{tap}: max |d| {(got[tap] - ref[tap]).abs().max():.3g}"
    mismatches, _ = classify_codes(model, got["codes"], ref["latent"], 8, got["latent"])
    real = [m for m in mismatches if not m.tie]
    assert not real, real[:3]


def single(encoder: PaddedMimiEncoder, audio: torch.Tensor) -> dict:
    out = encoder(audio[None], torch.tensor([len(audio)]), TAPS, 8)
    return {t: frames_of(out, t, 0) for t in TAPS}


def boundary(frames_per_call: int) -> int:
    """First 25 Hz step where moshi's streaming window starts later than its non-streaming one
    (for the real Mimi, 1 frame per call: step 250 = 10.00 s)."""
    c = 2 * frames_per_call
    return next(t for t in range(10 * WINDOW) if (t // c + 1) * c - WINDOW > max(0, t - WINDOW + 1))


def test_converted_weights_match_moshi_non_streaming(pair):
    """The converter is right: moshi's non-streaming encode == transformers' MimiModel (and the
    padded encoder with --framing moshi's padding) on the converted weights.  Without the q/k RoPE
    permutation the transformer's output is visibly wrong."""
    moshi, model, config = pair
    audio = noise(FRAME * 20 + 500)
    ref = moshi_encode(moshi, audio)
    assert ref["codes"].shape == (21, 8)
    assert_same(model, reference_single(model, padded(audio), 8), ref)
    assert_same(model, single(PaddedMimiEncoder(model), padded(audio)), ref)
    unpermuted = prepare(to_transformers(moshi, config, permute=False))
    wrong = reference_single(unpermuted, padded(audio), 8)["encoder"]
    assert (wrong - ref["encoder"]).abs().max() > 100 * tolerance(ref["encoder"])


def test_mask_rule_is_moshis_ring_buffer():
    """The rule, against moshi's own RingKVCache driven as its attention drives it (writes a call's
    keys, then masks by the positions it reports), for 2, 4 and 8 steps per call, windows 10 and 250."""
    from moshi.modules.transformer import RingKVCache

    for window in (10, 250):
        for c in (2, 4, 8):
            steps = c * (3 * window // c + 3)  # whole calls, three windows and more
            cache = RingKVCache(1, 1, 1, window, device=torch.device("cpu"), dtype=torch.float32)
            seen = torch.zeros(steps, steps, dtype=torch.bool)
            for start in range(0, steps, c):
                k = torch.zeros(1, 1, c, 1)
                pos_k = cache.complete(k, k, torch.ones(1, dtype=torch.bool)).positions[0]  # [window]
                pos_q = torch.arange(start, start + c)[:, None]
                visible = (pos_k >= 0) & (pos_q - pos_k >= 0) & (pos_q - pos_k < window)  # moshi's attn_bias
                for i in range(c):
                    seen[start + i, pos_k[visible[i]]] = True
            assert torch.equal(moshi_stream_mask(steps, c, window), seen), (window, c)
            plain = torch.tril(torch.ones(steps, steps, dtype=torch.bool)).triu(-(window - 1))
            assert not torch.equal(plain, seen)  # a uniform window is not moshi's streaming


@pytest.mark.parametrize("frames_per_call", [1, 2, 4])
def test_moshi_stream_equals_moshi_streaming(pair, frames_per_call):
    """moshi-stream == moshi's streaming encode, N frames per call, on both sides of the window
    boundary, every tap; --framing moshi (non-streaming) equals it exactly up to the boundary and
    leaves float tolerance at the boundary step itself."""
    moshi, model, _ = pair
    audio = noise(FRAME * 15 + 500)
    ref = moshi_encode(moshi, audio, frames_per_call)
    assert ref["encoder"].shape[0] == 32 > 2 * boundary(frames_per_call)
    assert_same(model, single(PaddedMimiEncoder(model, frames_per_call), padded(audio)), ref)
    assert_same(model, reference_single(model, padded(audio), 8, frames_per_call), ref)  # verify's reference
    before = single(PaddedMimiEncoder(model), padded(audio))
    assert first_over(before["encoder"], ref["encoder"]) == boundary(frames_per_call)
    assert not torch.equal(before["codes"], ref["codes"])


def test_moshi_stream_padded_batch(pair):
    """Three files of different lengths in one padded batch, 2 frames per call, each equals moshi
    streaming the file alone."""
    moshi, model, _ = pair
    items = [padded(noise(n, seed)) for seed, n in enumerate((FRAME * 15 + 500, FRAME * 7 + 3, FRAME * 12))]
    batch = torch.nn.utils.rnn.pad_sequence(items, batch_first=True)
    batch[1, len(items[1]):] = 0.7  # garbage in the padding
    out = PaddedMimiEncoder(model, 2)(batch, torch.tensor([len(a) for a in items]), TAPS, 8)
    for row, audio in enumerate(items):
        assert_same(model, {t: frames_of(out, t, row) for t in TAPS}, moshi_encode(moshi, audio, 2))


@pytest.mark.parametrize("frames_per_call", [2, 4])
def test_moshi_stream_chunked(pair, frames_per_call):
    """A long file encoded in chunks (3 frames: not a whole number of calls) with the carried key
    window, next to a shorter one that ends mid-run: the mask's rule runs on absolute positions."""
    moshi, model, _ = pair
    items = [padded(noise(FRAME * 20 + 700, 3)), padded(noise(FRAME * 8, 4))]
    got = encode_chunked(PaddedMimiEncoder(model, frames_per_call), items, 3 * FRAME, TAPS, 8)
    for audio, g in zip(items, got):
        assert_same(model, g, moshi_encode(moshi, audio, frames_per_call))


def test_too_many_frames_per_call(pair):
    _, model, _ = pair
    PaddedMimiEncoder(model, 5)  # 10 steps: the whole window
    with pytest.raises(ValueError, match="ring buffer"):
        PaddedMimiEncoder(model, 6)


def test_cli_moshi_stream(pair, tmp_path):
    """codes --framing moshi-stream --frames-per-call 2 (one long file chunked by the engine, one
    short) stores moshi's streaming codes and records the framing; --framing moshi stores its
    non-streaming codes, which differ; verify --out re-checks the moshi-stream OUT."""
    moshi, model, _ = pair
    model_dir = tmp_path / "mimi"
    model.save_pretrained(model_dir)
    root = tmp_path / "in"
    root.mkdir()
    lengths = {"long.wav": FRAME * 15 + 500, "short.wav": FRAME * 4 + 11}
    for i, (name, n) in enumerate(lengths.items()):
        sf.write(root / name, noise(n, 10 + i).numpy(), 24_000, subtype="FLOAT")
    args = ["--model", model_dir, *ONE_WORKER, "-q", 8, "--chunk-seconds", 0.4]
    streamed, plain = tmp_path / "stream", tmp_path / "plain"
    result = cli("codes", root, streamed, *args, "--framing", "moshi-stream", "--frames-per-call", 2)
    assert result.exit_code == 0, result.output
    assert cli("codes", root, plain, *args, "--framing", "moshi").exit_code == 0
    info = read_run_info(str(streamed))
    assert info["framing"] == "moshi-stream" and info["frames_per_call"] == 2
    assert "frames_per_call" not in read_run_info(str(plain))
    differs = 0
    for row in read_manifest(str(streamed)):
        audio = load(str(root / row["path"]))
        ref = moshi_encode(moshi, audio, 2)
        with h5py.File(streamed / row["shard"], "r") as f:
            assert f.attrs["framing"] == b"moshi-stream" and f.attrs["frames_per_call"] == 2
            got = torch.from_numpy(np.asarray(f[row["dataset"]][()]))
        mismatches, _ = classify_codes(model, got, ref["latent"], 8)
        assert not [m for m in mismatches if not m.tie], row["path"]
        plain_row = next(r for r in read_manifest(str(plain)) if r["key"] == row["key"])
        with h5py.File(plain / plain_row["shard"], "r") as f:
            differs += int((torch.from_numpy(np.asarray(f[plain_row["dataset"]][()])) != ref["codes"]).sum())
    assert differs > 0  # the non-streaming framing is not moshi's streaming codes
    assert cli("verify", "--out", streamed, "--device", "cpu", "--chunk-seconds", 0.4).exit_code == 0
    again = cli("codes", root, streamed, *args, "--framing", "moshi-stream", "--frames-per-call", 1)
    assert again.exit_code != 0 and "frames_per_call" in again.text  # a resume may not mix call sizes
    wrong = cli("codes", root, tmp_path / "x", *args, "--frames-per-call", 2)
    assert wrong.exit_code == 2 and "moshi-stream" in wrong.text


@pytest.mark.parametrize("frames_per_call", [2, 3, 4])
def test_leftover_frames_are_moshis_last_call_zero_padded(pair, frames_per_call):
    """Frames not a whole number of calls: what moshi-stream computes is moshi streaming with its
    last call zero-padded to N frames (the padding's outputs dropped), not moshi fed the leftover
    frames as a short last call.  The two differ only in the last call's frames: the padded call's
    keys push older keys out of moshi's ring buffer (window - N*2 steps before the padded call's
    end, not the audio's end).  Both sides are checked: equal to the padded one everywhere
    (whole item, chunked, verify's reference); equal to the short one before the last call."""
    moshi, model, _ = pair
    for frames in (9, 14):
        audio = noise(FRAME * (frames - 1) + 500, seed=frames)
        ref = moshi_encode(moshi, audio, frames_per_call)
        short = moshi_encode(moshi, audio, frames_per_call, last_call="short")
        got = single(PaddedMimiEncoder(model, frames_per_call), padded(audio))
        assert_same(model, got, ref)
        assert_same(model, reference_single(model, padded(audio), 8, frames_per_call), ref)
        chunked = encode_chunked(PaddedMimiEncoder(model, frames_per_call), [padded(audio)], 3 * FRAME, TAPS, 8)[0]
        assert_same(model, chunked, ref)
        last = frames - frames % frames_per_call if frames % frames_per_call else frames  # first frame of a short call
        if last == frames:  # a whole number of calls: both are the same
            assert_same(model, got, short)
            continue
        for tap, per in (("latent", 1), ("encoder", 2)):
            assert first_over(got[tap][: last * per], short[tap][: last * per]) is None, tap
        assert first_over(got["latent"], short["latent"]) is not None and first_over(got["latent"], short["latent"]) >= last
