"""The padding-aware encoder against transformers' MimiModel, item by item and position by position."""

import math

import pytest
import torch
from transformers import MimiConfig
from transformers.models.mimi import modeling_mimi as mm

from conftest import ragged, tolerance
from mimi_extract.encoder import PaddedMimiEncoder, reference_single
from mimi_extract.testing import random_model, tiny_config

FRAME = 1920  # samples per 12.5 Hz frame at 24 kHz
# ragged on purpose: shorter than a frame, off-by-one around frame multiples, every length different,
# and long enough (>6 frames at 25 Hz) to exercise the tiny model's sliding window
LENGTHS = [FRAME * 10 + 7, 100, FRAME * 3, 5000, FRAME * 10 - 1, 1, FRAME * 6 + 1, 37_111]


def assert_matches_single(model, lengths, seed=0, garbage=None, num_quantizers=8):
    items, batch = ragged(lengths, seed, garbage)
    out = PaddedMimiEncoder(model)(batch, torch.tensor(lengths), ("encoder", "latent", "codes"), num_quantizers)
    for i, audio in enumerate(items):
        ref = reference_single(model, audio, num_quantizers)
        for tap in ("encoder", "latent"):
            n = int(out.lengths[tap][i])
            assert n == ref[tap].shape[0], f"item {i} {tap}: {n} frames, single-item has {ref[tap].shape[0]}"
            diff = (out.tensors[tap][i, :n] - ref[tap]).abs().max().item()
            assert diff <= tolerance(ref[tap]), f"item {i} {tap}: max abs diff {diff}"
        n = int(out.lengths["codes"][i])
        assert torch.equal(out.tensors["codes"][i, :, :n], ref["codes"]), f"item {i}: codes differ"


def test_reference_is_transformers_encode(tiny_model):
    """reference_single is exactly MimiModel.encode for one item (so comparing to it is fair)."""
    audio = ragged([FRAME * 4 + 33])[0][0]
    ref = reference_single(tiny_model, audio, 8)
    with torch.no_grad():
        codes = tiny_model.encode(audio.reshape(1, 1, -1), num_quantizers=8).audio_codes[0]
    assert torch.equal(ref["codes"], codes)


@pytest.mark.parametrize("seed", [0, 1])
def test_batched_equals_single_every_tap(tiny_model, seed):
    assert_matches_single(tiny_model, LENGTHS, seed)


def test_padding_content_is_irrelevant(tiny_model):
    """Whatever the padding holds (even NaN), valid outputs are unchanged."""
    assert_matches_single(tiny_model, LENGTHS[:4], garbage=7.0)
    assert_matches_single(tiny_model, LENGTHS[:4], garbage=float("nan"))


def test_other_model_seed_and_all_different_lengths():
    model = random_model(seed=3)
    assert_matches_single(model, [FRAME * k + 13 * k for k in range(1, 9)], seed=5)


def test_eager_attention_mask(tiny_model):
    """The additive-mask branch used by eager attention gives the same as sdpa's boolean mask."""
    config = tiny_config()
    config._attn_implementation = "eager"
    model = random_model(config, seed=0)
    assert model.config._attn_implementation == "eager"
    assert_matches_single(model, LENGTHS[:5])


def test_naive_transformers_batch_diverges(tiny_model):
    """The problem this tool exists for: MimiModel.encode on a padded batch changes codes."""
    items, batch = ragged(LENGTHS)
    with torch.no_grad():
        naive = tiny_model.encode(batch[:, None], num_quantizers=8).audio_codes
    mismatches = 0
    for i, audio in enumerate(items):
        ref = reference_single(tiny_model, audio, 8)["codes"]
        mismatches += int((naive[i, :, : ref.shape[1]] != ref).sum())
    assert mismatches > 0


def test_output_lengths_exact(tiny_model):
    enc = PaddedMimiEncoder(tiny_model)
    lengths = torch.tensor(LENGTHS + [FRAME, FRAME + 1, 2 * FRAME - 1, 960, 961])
    got = enc.output_lengths(lengths)
    assert torch.equal(got["latent"], tiny_model.get_encoded_length(lengths))
    assert got["latent"].tolist() == [math.ceil(n / FRAME) for n in lengths.tolist()]
    assert got["encoder"].tolist() == [math.ceil(n / (FRAME // 2)) for n in lengths.tolist()]
    for n, frames in zip(LENGTHS[:4], got["encoder"][:4]):
        ref = reference_single(tiny_model, torch.randn(n), 8)
        assert ref["encoder"].shape[0] == frames


def test_no_per_item_loop(tiny_model):
    """One forward of every sub-module per batch, whatever the batch size."""
    enc = PaddedMimiEncoder(tiny_model)
    calls = {}
    hooks = [
        m.register_forward_hook(lambda mod, i, o, name=name: calls.__setitem__(name, calls.get(name, 0) + 1))
        for name, m in tiny_model.named_modules()
        if isinstance(m, (mm.MimiConv1d, mm.MimiTransformerLayer, mm.MimiVectorQuantization))
    ]
    try:
        _, batch = ragged(LENGTHS)
        enc(batch, torch.tensor(LENGTHS), ("codes",), 8)
    finally:
        for h in hooks:
            h.remove()
    convs = [k for k in calls if "layers." in k and "transformer" not in k]
    assert convs and len(calls) > 10
    assert set(calls.values()) == {1}, calls


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_num_quantizers(tiny_model, n):
    items, batch = ragged(LENGTHS[:3])
    out = PaddedMimiEncoder(tiny_model)(batch, torch.tensor(LENGTHS[:3]), ("codes",), n)
    assert out.tensors["codes"].shape[1] == n
    for i, audio in enumerate(items):
        ref = reference_single(tiny_model, audio, n)["codes"]
        assert torch.equal(out.tensors["codes"][i, :, : ref.shape[1]], ref)


def test_matches_streaming_encode_on_common_frames(tiny_model):
    """transformers' streaming encode (chunked, with padding cache) gives the same codes for the
    frames it emits; it just drops a trailing partial frame."""
    lengths = [FRAME * 5 + 100, FRAME * 8]
    items, batch = ragged(lengths, seed=2)
    out = PaddedMimiEncoder(tiny_model)(batch, torch.tensor(lengths), ("codes",), 8)
    with torch.no_grad():
        for i, audio in enumerate(items):
            first = tiny_model.encode(audio[: FRAME * 3].reshape(1, 1, -1), num_quantizers=8, use_streaming=True)
            # the kv-cache argument was renamed in transformers 5.2x
            cache = "encoder_cache" if hasattr(first, "encoder_cache") else "encoder_past_key_values"
            rest = tiny_model.encode(audio[FRAME * 3 :].reshape(1, 1, -1), num_quantizers=8, use_streaming=True,
                                     padding_cache=first.padding_cache, **{cache: getattr(first, cache)})
            streamed = torch.cat([first.audio_codes[0], rest.audio_codes[0]], -1)
            assert streamed.shape[-1] == lengths[i] // FRAME
            assert torch.equal(streamed, out.tensors["codes"][i, :, : streamed.shape[-1]])


def test_full_size_default_config():
    """kyutai/mimi's architecture (MimiConfig() defaults, random weights), all 32 codebooks."""
    model = random_model(MimiConfig(), seed=0)
    assert_matches_single(model, [24_000 + 17, 700, FRAME * 9], num_quantizers=32)


def test_rejects_bad_lengths(tiny_model):
    with pytest.raises(ValueError):
        PaddedMimiEncoder(tiny_model)(torch.zeros(2, 100), torch.tensor([100, 0]))
    with pytest.raises(ValueError):
        PaddedMimiEncoder(tiny_model)(torch.zeros(1, 100), torch.tensor([101]))
