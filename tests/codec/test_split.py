"""One recording split into independent pieces (issue 15, part 2: the encoder primitive): each piece
encoded from a warm-up of the model's receptive field before its first frame, positions absolute,
equals the unchunked single-item reference frame by frame; one frame less of warm-up does not."""

import pytest
import torch
from transformers import MimiConfig

from support import tolerance
from mimi_extract.codec.encoder import PaddedMimiEncoder, encode_piece, split_bounds
from mimi_extract.codec.reference import reference_single
from mimi_extract.codec.demo import random_model

FRAME = 1920
TAPS = ("encoder", "latent", "codes")


def stitched(encoder, audio, pieces, warmup, chunk):
    parts = [encode_piece(encoder, audio[begin:end], begin, first, chunk, TAPS, 8)
             for begin, first, end in split_bounds(len(audio), pieces, warmup, encoder.hop)]
    return {t: torch.cat([p[t] for p in parts]) for t in TAPS}


def worst(got, ref):
    """Largest feature error relative to the float tolerance, and the share of equal codes."""
    excess = max((got[t] - ref[t]).abs().max().item() / tolerance(ref[t]) for t in ("encoder", "latent"))
    return excess, (got["codes"] == ref["codes"]).float().mean().item()


def test_receptive_field_from_the_config(tiny_model, full_model):
    """Computed from layers, window and every conv (not a constant): kyutai/mimi's architecture and
    the tiny test model; a wider window widens it by whole 25 Hz steps, one per layer."""
    assert PaddedMimiEncoder(tiny_model).receptive_field == 14_840
    full = PaddedMimiEncoder(full_model)
    assert full.receptive_field == 1_917_560  # 79.9 s at 24 kHz
    wider = PaddedMimiEncoder(random_model(MimiConfig(sliding_window=251), seed=0))
    assert wider.receptive_field - full.receptive_field == 8 * 960  # 8 layers x one more step


def test_split_bounds_cover_every_frame_once():
    hop, total = FRAME, FRAME * 50 + 333
    bounds = split_bounds(total, 4, 10_000, hop)
    assert bounds[0][1] == 0 and bounds[-1][2] == total and len(bounds) == 4
    assert all(a[2] == b[1] for a, b in zip(bounds, bounds[1:]))  # contiguous, frame aligned
    assert all(b[0] % hop == 0 and b[1] % hop == 0 and b[1] - b[0] >= min(b[1], 10_000) for b in bounds)
    assert len(split_bounds(FRAME * 2, 9, 0, hop)) == 2  # never more pieces than frames


@pytest.mark.parametrize("frames_per_call", [None, 1, 2])
def test_pieces_equal_the_unchunked_reference(tiny_model, frames_per_call):
    """A recording ~11x the tiny model's receptive field, ending in a partial frame, cut into 4
    pieces streamed in 3-frame chunks: every tap equals the unchunked single-item encode (transformers,
    or moshi's streaming mask), the trailing partial frame included; codes identical."""
    encoder = PaddedMimiEncoder(tiny_model, frames_per_call)
    audio = 0.3 * torch.randn(FRAME * 85 + 777, generator=torch.Generator().manual_seed(3))
    ref = reference_single(tiny_model, audio, 8, frames_per_call)
    got = stitched(encoder, audio, 4, encoder.receptive_field, FRAME * 3)
    assert all(got[t].shape == ref[t].shape for t in TAPS)
    excess, equal = worst(got, ref)
    assert excess <= 1 and equal == 1.0, (excess, equal)


def test_nothing_outside_the_receptive_field_reaches_a_frame(tiny_model):
    """Safe, exactly: in transformers' own unchunked encode, poking the sample just before a latent
    frame's computed receptive field leaves that frame and every later one bit-identical, while a
    poke inside it (measured edge on this random model: 10,040 samples, the bound counting every
    layer's full window: 14,840) changes the frame."""
    rf = PaddedMimiEncoder(tiny_model).receptive_field
    audio = 0.3 * torch.randn(FRAME * 40, generator=torch.Generator().manual_seed(5))
    frame = 30
    base = reference_single(tiny_model, audio, 8)["latent"]
    for index, changes in ((frame * FRAME - rf - 1, False), (frame * FRAME - 10_040, True)):
        poked = audio.clone()
        poked[index] += 5.0
        got = reference_single(tiny_model, poked, 8)["latent"]
        assert torch.equal(got[frame:], base[frame:]) != changes, (index, changes)
        assert not torch.equal(got, base)  # the poke does reach the earlier frames


def test_short_warmup_leaks(tiny_model):
    """Without enough warm-up the pieces' first frames leave float tolerance by orders of magnitude:
    a leak, not noise (with the computed warm-up: within tolerance, see above).  The measured
    influence of the receptive field's far edge on this random model is below float noise, so
    the edge itself is checked exactly by the poke test, not by this one."""
    encoder = PaddedMimiEncoder(tiny_model)
    audio = 0.3 * torch.randn(FRAME * 60, generator=torch.Generator().manual_seed(4))
    ref = reference_single(tiny_model, audio, 8)
    exact, _ = worst(stitched(encoder, audio, 3, encoder.receptive_field, FRAME * 4), ref)
    short, equal = worst(stitched(encoder, audio, 3, 2 * FRAME, FRAME * 4), ref)
    assert exact <= 1 and short > 1000 and equal < 1, (exact, short, equal)


def test_assembler_orders_pieces_and_restarts_a_rehanded_one():
    """Pieces arrive interleaved and out of order; a piece re-handed after its worker died starts
    again from its first chunk (the partial one is dropped); the first error ends the item once."""
    import numpy as np

    from mimi_extract.engines import FrameChunk
    from mimi_extract.engines.assembly import Assembler
    from mimi_extract.sources import Item
    from mimi_extract.sources.items import SplitPiece

    item = Item("/a.wav", "a.wav", "a.wav", sample_rate=24_000, frames=100, samples=100)
    piece = lambda i: Item(**{**item.__dict__, "piece": SplitPiece(i, 3, 0, 0, 40 * (i + 1) if i < 2 else 100)})  # noqa: E731
    arr = lambda *v: np.array(v)  # noqa: E731
    s = Assembler()
    add = lambda it, data, first, final, error: s.add(FrameChunk(it, data, first, final, 1.0, error))  # noqa: E731
    assert add(piece(2), arr(5), True, False, None) is None
    assert add(piece(0), arr(1), True, False, None) is None
    assert add(piece(1), arr(9), True, False, None) is None  # its worker dies after this chunk
    assert add(piece(2), arr(6), False, True, None) is None
    assert add(piece(0), arr(2), False, True, None) is None
    assert add(piece(1), arr(3), True, False, None) is None  # re-handed: starts over
    done = add(piece(1), arr(4), False, True, None)
    whole_item, whole, error = done.item, done.data, done.error
    assert whole.tolist() == [1, 2, 3, 4, 5, 6] and error is None
    assert whole_item.piece is None and whole_item.samples == 100 and not s._held
    assert add(piece(0), arr(1), True, False, "cannot decode").error == "cannot decode"
    assert add(piece(1), arr(1), True, True, "again") is None and not s._held


def test_assembler_hands_a_whole_item_back_as_it_came():
    """An unsplit item in one chunk (first and final: most items) comes back as that chunk, not a
    copy (the writer thread's per-item cost, issue 40), with what the general path gives: "" warnings
    as None; one re-handed whole after its worker died drops what its first attempt held."""
    import numpy as np

    from mimi_extract.engines import FrameChunk
    from mimi_extract.engines.assembly import Assembler
    from mimi_extract.sources import Item

    item = Item("/a.wav", "a.wav", "a.wav", sample_rate=24_000, frames=100, samples=100)
    s = Assembler()
    chunk = FrameChunk(item, np.arange(4), True, True, 1.5, warnings="clipped")
    assert s.add(chunk) is chunk
    quiet = s.add(FrameChunk(item, np.arange(4), True, True, 1.5, warnings=""))
    assert quiet.warnings is None and quiet.data.tolist() == [0, 1, 2, 3] and quiet.seconds == 1.5
    assert s.add(FrameChunk(item, np.arange(2), True, False, 1.0)) is None and s._held  # its worker dies
    again = FrameChunk(item, np.arange(3), True, True, 2.0)
    assert s.add(again) is again and not s._held


def test_split_items_cuts_fair_shares_and_keeps_short_recordings_whole():
    """Pieces of one lane's fair share each (the last takes the rest, never shorter than the
    warm-up bound allows); a recording within its fair share, or with one lane, stays whole."""
    from mimi_extract.engines.plan import split_items
    from mimi_extract.sources import Item

    rate, hop, warm = 24_000, FRAME, 10 * FRAME  # shortest piece: warm / 0.15 = 66.7 frames
    long = Item("/l.wav", "l.wav", "l.wav", sample_rate=rate, frames=FRAME * 400 + 5, samples=FRAME * 400 + 5)
    shorts = [Item(f"/s{i}.wav", f"s{i}.wav", f"s{i}.wav", sample_rate=rate, frames=FRAME * 50, samples=FRAME * 50)
              for i in range(4)]
    out, split = split_items([long, *shorts], 3, warm, hop)  # total 601 frames: fair share ~200
    pieces = [it for it in out if it.piece]
    assert [p.piece.first // FRAME for p in pieces] == [0, 201] and pieces[-1].piece.end == long.samples
    assert split.items == 1 and split.pieces == 2 and all(it.piece is None for it in out if it.key != "l.wav")
    # 2 lanes: a fair share is ~301 frames, the rest (100) is less than a piece may be (67 frames
    # with this warm-up is fine, 134 with twice it): the cut moves back to leave the least piece
    pieces = [it.piece for it in split_items([long, *shorts], 2, 2 * warm, hop)[0] if it.piece]
    assert [p.first // FRAME for p in pieces] == [0, 401 - 134]
    assert split_items([long, *shorts], 1, warm, hop)[1].items == 0  # one lane: nothing to balance
    assert split_items([long], 9, 300 * FRAME, hop)[1].items == 0  # warm-up too long for any piece
