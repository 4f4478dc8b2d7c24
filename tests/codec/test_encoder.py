"""The padding-aware encoder against transformers' MimiModel, item by item and position by position."""

import math

import pytest
import torch
from transformers.models.mimi import modeling_mimi as mm

from support import ragged, tolerance
from mimi_extract.codec.encoder import ConvRoute, PaddedMimiEncoder, Routes, encode_chunked, frames_of
from mimi_extract.codec.reference import reference_single
from mimi_extract.codec.demo import random_model, tiny_config

FRAME = 1920  # samples per 12.5 Hz frame at 24 kHz
# ragged on purpose: shorter than a frame, off-by-one around frame multiples, every length different,
# and long enough (>6 frames at 25 Hz) to exercise the tiny model's sliding window
LENGTHS = [FRAME * 10 + 7, 100, FRAME * 3, 5000, FRAME * 10 - 1, 1, FRAME * 6 + 1, 37_111]


def assert_matches_single(model, lengths, seed=0, garbage=None, num_quantizers=8, routes=Routes()):
    items, batch = ragged(lengths, seed, garbage)
    encoder = PaddedMimiEncoder(model, routes=routes)
    out = encoder(batch, torch.tensor(lengths), ("encoder", "latent", "codes"), num_quantizers)
    for i, audio in enumerate(items):
        ref = reference_single(model, audio, num_quantizers)
        for tap in ("encoder", "latent"):
            n = int(out.lengths[tap][i])
            assert n == ref[tap].shape[0], f"item {i} {tap}: {n} frames, single-item has {ref[tap].shape[0]}"
            diff = (out.tensors[tap][i, :n] - ref[tap]).abs().max().item()
            assert diff <= tolerance(ref[tap]), f"item {i} {tap}: max abs diff {diff}"
        assert torch.equal(frames_of(out, "codes", i), ref["codes"]), f"item {i}: codes differ"


def test_reference_is_transformers_encode(tiny_model):
    """reference_single is exactly MimiModel.encode for one item (so comparing to it is fair)."""
    audio = ragged([FRAME * 4 + 33])[0][0]
    ref = reference_single(tiny_model, audio, 8)
    with torch.no_grad():
        codes = tiny_model.encode(audio.reshape(1, 1, -1), num_quantizers=8).audio_codes[0]
    assert torch.equal(ref["codes"].T, codes)  # reference_single is time first


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
        ref = reference_single(tiny_model, audio, 8)["codes"].T
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


def test_no_per_item_loop(tiny_model, monkeypatch):
    """The same number of conv, matmul, transformer-layer and quantizer calls for a batch of one
    item and a batch of eight of the same padded length: every step is one batched op (the calls
    depend on the length alone: the first stage runs in tiles of time, not of items; here each
    tile as long as a lone row's, where a real batch shares the cache by shorter tiles)."""
    enc = PaddedMimiEncoder(tiny_model, routes=Routes(front_tile_cells=10**9))

    def counted(batch_size):
        calls = {}
        for owner, name in ((torch.nn.functional, "conv2d"), (torch, "addmm")):
            real = getattr(owner, name)
            monkeypatch.setattr(owner, name, lambda *a, _r=real, _n=name, **k: calls.__setitem__(_n, calls.get(_n, 0) + 1) or _r(*a, **k))
        hooks = [m.register_forward_hook(lambda mod, i, o, n=type(m).__name__: calls.__setitem__(n, calls.get(n, 0) + 1))
                 for m in tiny_model.modules() if isinstance(m, (mm.MimiTransformerLayer, mm.MimiVectorQuantization))]
        try:
            lengths = LENGTHS[:batch_size] if batch_size > 1 else [max(LENGTHS)]
            _, batch = ragged(lengths)
            enc(batch, torch.tensor(lengths), ("codes",), 8)
        finally:
            for h in hooks:
                h.remove()
            monkeypatch.undo()
        return calls

    one, eight = counted(1), counted(8)
    assert one == eight and one["conv2d"] >= len(enc.convs) - 4 and one["MimiTransformerLayer"] == 2, (one, eight)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_num_quantizers(tiny_model, n):
    items, batch = ragged(LENGTHS[:3])
    out = PaddedMimiEncoder(tiny_model)(batch, torch.tensor(LENGTHS[:3]), ("codes",), n)
    assert out.tensors["codes"].shape[1] == n
    for i, audio in enumerate(items):
        assert torch.equal(frames_of(out, "codes", i), reference_single(tiny_model, audio, n)["codes"])


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
            assert torch.equal(streamed.T, frames_of(out, "codes", i)[: streamed.shape[-1]])


def test_full_size_default_config(full_model):
    """kyutai/mimi's architecture (MimiConfig() defaults, random weights), all 32 codebooks."""
    assert_matches_single(full_model, [24_000 + 17, 700, FRAME * 9], num_quantizers=32)


def test_rejects_bad_lengths(tiny_model):
    with pytest.raises(ValueError):
        PaddedMimiEncoder(tiny_model)(torch.zeros(2, 100), torch.tensor([100, 0]))
    with pytest.raises(ValueError):
        PaddedMimiEncoder(tiny_model)(torch.zeros(1, 100), torch.tensor([101]))


# -- chunked (streaming) encode --------------------------------------------------------------
def assert_chunked_matches(model, lengths, chunk, seed=0, num_quantizers=8, routes=Routes()):
    """Chunked encode (carried state, all rows in one batch) equals the unchunked single-item
    reference: same frame count including the trailing partial frame, same codes, features
    within float rounding."""
    items, _ = ragged(lengths, seed)
    encoder = PaddedMimiEncoder(model, routes=routes)
    outs = encode_chunked(encoder, items, chunk, ("encoder", "latent", "codes"), num_quantizers)
    for i, audio in enumerate(items):
        ref = reference_single(model, audio, num_quantizers)
        for tap in ("encoder", "latent"):
            assert outs[i][tap].shape == ref[tap].shape, f"item {i} {tap}: {outs[i][tap].shape} vs {ref[tap].shape}"
            diff = (outs[i][tap] - ref[tap]).abs().max().item()
            assert diff <= tolerance(ref[tap]), f"item {i} {tap}: max abs diff {diff} (chunk {chunk})"
        assert torch.equal(outs[i]["codes"], ref["codes"]), f"item {i}: codes differ (chunk {chunk})"


@pytest.mark.parametrize("frames_per_chunk", [1, 2, 5, 11])
def test_chunked_equals_unchunked(tiny_model, frames_per_chunk):
    """Far past the tiny model's 6-frame window; lengths end off frame multiples (the trailing
    partial frame), one item is shorter than a chunk, one is a single sample."""
    assert_chunked_matches(tiny_model, [FRAME * 40 + 7, FRAME * 13 - 1, 1, 100, FRAME * 25, FRAME * 3 + 960],
                           FRAME * frames_per_chunk)


def test_chunked_eager_attention():
    config = tiny_config()
    config._attn_implementation = "eager"
    assert_chunked_matches(random_model(config, seed=1), [FRAME * 20 + 333, FRAME * 9], FRAME * 3)


@pytest.mark.slow
def test_chunked_full_size_past_the_window(full_model):
    """kyutai/mimi's architecture: window 250 frames = 10 s.  A 12.4 s file in 7-frame (0.56 s)
    chunks crosses the window edge, where moshi's 250-entry ring buffer drops a key; here the
    window holds 249 past positions plus the query, as transformers' mask does.  Beside it a row
    that ends mid-run (off a frame multiple): the long one goes on past the window in a ragged batch
    (was a second 10.4 s row, which crossed the same edge again at twice this test's cost)."""
    assert_chunked_matches(full_model, [24_000 * 12 + 9_777, FRAME * 9 + 333], FRAME * 7, num_quantizers=32)


def test_chunk_rules_and_reset(tiny_model):
    enc = PaddedMimiEncoder(tiny_model)
    state = enc.init_state(2)
    with pytest.raises(ValueError, match="multiple"):
        enc(torch.zeros(2, FRAME + 5), torch.tensor([FRAME + 5, FRAME + 5]), state=state, final=torch.tensor([False, True]))
    # a row reset mid-run starts a new stream: same result as a fresh state
    items, _ = ragged([FRAME * 4, FRAME * 4], seed=4)
    audio = torch.stack(items)
    first = enc(audio[:, : FRAME * 2], torch.tensor([FRAME * 2] * 2), ("codes",), 8, state, torch.tensor([False, False]))
    state.reset(torch.tensor([False, True]))
    second = enc(torch.stack([audio[0, FRAME * 2 :], audio[1, : FRAME * 2]]), torch.tensor([FRAME * 2] * 2),
                 ("codes",), 8, state, torch.tensor([True, True]))
    ref0 = reference_single(tiny_model, items[0], 8)["codes"]
    ref1 = reference_single(tiny_model, items[1][: FRAME * 2], 8)["codes"]
    assert torch.equal(torch.cat([frames_of(first, "codes", 0), frames_of(second, "codes", 0)]), ref0)
    assert torch.equal(frames_of(second, "codes", 1), ref1)


def test_exact_path_equals_single(tiny_model):
    """The exact path alone (``Routes.exact()``: no acceleration), batched and chunked, is transformers'
    single-item encode: the reference each acceleration is held to (tests/codec/test_routes.py)."""
    assert_matches_single(tiny_model, LENGTHS, routes=Routes.exact())
    assert_chunked_matches(tiny_model, [FRAME * 20 + 7, FRAME * 7 - 1, 1, FRAME * 3 + 960], FRAME * 3,
                           routes=Routes.exact())


def test_block_gemm_downsampling_convs(tiny_model, monkeypatch):
    """The strided convs as block GEMMs (on for full-size Mimi's wide convs; forced here for every
    strided conv of the tiny model): batched and chunked still equal the single-item reference."""
    routes = Routes(block_gemm_min_width=1)
    enc = PaddedMimiEncoder(tiny_model, routes=routes)
    used = [c for c in enc.convs if routes.conv(c, torch.zeros(1, 1, 1)) is ConvRoute.BLOCK_GEMM]
    assert len(used) == 4, "the four SEANet downsampling convs take the block GEMM"
    calls = []
    original = PaddedMimiEncoder._block_gemm_conv
    monkeypatch.setattr(PaddedMimiEncoder, "_block_gemm_conv", lambda self, *a: calls.append(1) or original(self, *a))
    assert_matches_single(tiny_model, LENGTHS, routes=routes)
    assert_chunked_matches(tiny_model, [FRAME * 20 + 7, FRAME * 7 - 1, 1, FRAME * 3 + 960], FRAME * 3, routes=routes)
    assert calls, "the block GEMM path ran"


def test_first_stage_in_tiles(tiny_model, monkeypatch):
    """On CPU the first SEANet stage runs in tiles through the streaming path (1 s tiles by default:
    the full-size tests cross it); small tiles that cut frames and items anywhere still give the
    single-item reference, batched and chunked."""
    routes = Routes(front_tile=1000)
    calls = []
    original = PaddedMimiEncoder._layers
    monkeypatch.setattr(PaddedMimiEncoder, "_layers", lambda self, layers, *a: calls.append(len(layers)) or original(self, layers, *a))
    assert_matches_single(tiny_model, LENGTHS, routes=routes)
    front = PaddedMimiEncoder(tiny_model)._front
    assert front == 4 and calls.count(front) > len(calls) // 2, "the first stage ran tile by tile"
    assert_chunked_matches(tiny_model, [FRAME * 20 + 7, FRAME * 7 - 1, 1, FRAME * 3 + 960], FRAME * 3, routes=routes)
