"""The padding-aware decoder against transformers' MimiModel.decode of each item alone."""

import pytest
import torch

from support import tolerance
from mimi_extract.codec.decoder import PaddedMimiDecoder, decode_chunked
from mimi_extract.codec.demo import random_model, tiny_config

FRAME = 1920
# frames per item: one frame, around the tiny model's 6-step (3-frame) window, and well past it
FRAMES = [11, 1, 3, 4, 7, 2, 25, 6]


def random_codes(frames, seed=0, codebooks=8, size=64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, size, (n, codebooks), generator=g) for n in frames]


def single(model, codes: torch.Tensor) -> torch.Tensor:
    """MimiModel.decode of one item's codes [frames, N], unmodified: the reference."""
    with torch.no_grad():
        return model.decode(codes.T[None]).audio_values[0, 0]


def padded(items, garbage: int | None = None):
    batch = torch.zeros(len(items), items[0].shape[1], max(len(c) for c in items), dtype=torch.long)
    for r, c in enumerate(items):
        batch[r, :, : len(c)] = c.T
        if garbage is not None:
            batch[r, :, len(c):] = garbage
    return batch


def assert_matches(ref: torch.Tensor, got: torch.Tensor, what: str):
    assert got.shape == ref.shape, f"{what}: {tuple(got.shape)} samples, MimiModel.decode gives {tuple(ref.shape)}"
    diff = (got - ref).abs().max().item()
    assert diff <= tolerance(ref), f"{what}: max abs diff {diff}"


@pytest.mark.parametrize("codebooks", [8, 3])
def test_padded_batch_equals_each_item_decoded_alone(tiny_model, codebooks):
    items = random_codes(FRAMES, codebooks=codebooks)
    out = PaddedMimiDecoder(tiny_model)(padded(items, garbage=63), torch.tensor(FRAMES))
    for i, c in enumerate(items):
        assert int(out.lengths[i]) == len(c) * FRAME
        assert_matches(single(tiny_model, c), out.audio[i, : int(out.lengths[i])], f"item {i}")


def test_padding_is_zero_and_content_irrelevant(tiny_model):
    items = random_codes(FRAMES[:4], seed=1)
    dec = PaddedMimiDecoder(tiny_model)
    a = dec(padded(items, garbage=0), torch.tensor(FRAMES[:4]))
    b = dec(padded(items, garbage=5), torch.tensor(FRAMES[:4]))
    assert torch.equal(a.audio, b.audio)
    for i, n in enumerate(a.lengths.tolist()):
        assert not a.audio[i, n:].any()


def test_right_padding_never_reaches_a_valid_sample(tiny_model):
    """Measured, and why the padded decoder is simple: every decoder op is causal (stride-1 convs,
    transposed convs trimmed on the right, a causal transformer), so MimiModel.decode of a
    right-padded batch already gives each item's valid samples; unlike the encoder (replicate
    downsample, strided convs' end padding).  The decoder's work is chunking long items with state."""
    items = random_codes([25, 4], seed=2)
    with torch.no_grad():
        naive = tiny_model.decode(padded(items)).audio_values[:, 0]
    ref = single(tiny_model, items[1])
    assert_matches(ref, naive[1, : len(ref)], "naive batch")
    assert naive[1, len(ref):].abs().max() > 0  # its padding decodes to sound, which the padded decoder zeroes


@pytest.mark.parametrize("chunk", [1, 2, 5, 8])
def test_chunked_long_items_equal_the_whole_decode(tiny_model, chunk):
    """Streams of chunks with carried state (conv contexts, the transposed convs' overhang, the
    key/value window, RoPE positions) give MimiModel.decode of each whole item."""
    frames = [25, 3, 17, 1, 9]
    items = random_codes(frames, seed=3)
    got = decode_chunked(PaddedMimiDecoder(tiny_model), items, chunk)
    for i, c in enumerate(items):
        assert_matches(single(tiny_model, c), got[i], f"item {i} in chunks of {chunk}")


def test_eager_attention_and_another_seed():
    config = tiny_config()
    config._attn_implementation = "eager"
    model = random_model(config, seed=4)
    items = random_codes([9, 2, 5], seed=4)
    got = decode_chunked(PaddedMimiDecoder(model), items, 100)
    for i, c in enumerate(items):
        assert_matches(single(model, c), got[i], f"item {i}")


@pytest.mark.slow
def test_full_size_architecture_past_its_window(full_model):
    """The real architecture (seeded random weights): 10 s window, 8 layers, 512-wide SEANet."""
    items = random_codes([140, 30], seed=5, size=2048)
    dec = PaddedMimiDecoder(full_model)
    whole = decode_chunked(dec, items, 1000)
    chunked = decode_chunked(dec, items, 50)
    for i, c in enumerate(items):
        ref = single(full_model, c)
        assert_matches(ref, whole[i], f"item {i}")
        assert_matches(ref, chunked[i], f"item {i} chunked")
