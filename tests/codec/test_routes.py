"""Each acceleration of the encoder against its exact path (``Routes.exact()``), on inputs where it applies.

The exact path is itself held to transformers' single-item encode (test_encoder.py's
test_exact_path_equals_single); here every route, taken alone and then all together, must give the
exact path's output: the same frame counts, the same codes, and features within the tolerance the
tests against transformers use (``support.tolerance``: 1e-5 x max(1, max |exact|), fp32 rounding
being relative and the routes summing in another order).  Each test also checks that its route ran
(and that the exact path took none), so it cannot pass by comparing the exact path with itself."""

from dataclasses import replace

import pytest
import torch

from support import ragged, tolerance
from mimi_extract.codec.encoder import ConvRoute, PaddedMimiEncoder, Routes, encode_chunked

FRAME = 1920  # samples per 12.5 Hz frame at 24 kHz
# ragged, off frame multiples, one shorter than a frame, one a single sample, past the tiny model's window
LENGTHS = [FRAME * 10 + 7, 100, FRAME * 3, 5000, FRAME * 10 - 1, 1, FRAME * 6 + 1, 37_111]
STREAMS = [FRAME * 20 + 7, FRAME * 7 - 1, 1, FRAME * 3 + 960]  # chunked: short last chunks, a row shorter than one
EXACT = Routes.exact()
# each route alone, forced where the tiny model would not take it (its convs are narrow, its inputs short)
ALONE = {
    "_pointwise_conv": replace(EXACT, pointwise=True),
    "_zero_padded_conv": replace(EXACT, zero_padded=True),
    "_block_gemm_conv": replace(EXACT, block_gemm=True, block_gemm_min_width=1),
    "_tiled_seanet": replace(EXACT, tiles=True, front_tile=1000),
}
ROUTES = tuple(ALONE)


@pytest.fixture
def ran(monkeypatch):
    """Calls of each route's method, by name."""
    calls = dict.fromkeys(ROUTES, 0)
    for name in ROUTES:
        original = getattr(PaddedMimiEncoder, name)

        def counted(self, *a, _name=name, _original=original):
            calls[_name] += 1
            return _original(self, *a)
        monkeypatch.setattr(PaddedMimiEncoder, name, counted)
    return calls


def assert_close(got: dict, exact: dict, what: str):
    for tap in ("encoder", "latent", "codes"):
        assert got[tap].shape == exact[tap].shape, f"{what} {tap}: {got[tap].shape} vs {exact[tap].shape}"
    assert torch.equal(got["codes"], exact["codes"]), f"{what}: codes differ"
    for tap in ("encoder", "latent"):
        diff = (got[tap] - exact[tap]).abs().max().item()
        assert diff <= tolerance(exact[tap]), f"{what} {tap}: max abs diff {diff}"


def batched(model, routes: Routes, lengths=LENGTHS) -> list[dict]:
    """Each row's valid frames of every tap (padding full of NaN: it must not matter on any route)."""
    _, batch = ragged(lengths, seed=1, garbage=float("nan"))
    out = PaddedMimiEncoder(model, routes=routes)(batch, torch.tensor(lengths), ("encoder", "latent", "codes"), 8)
    rows = []
    for i in range(len(lengths)):
        n = {t: int(out.lengths[t][i]) for t in out.lengths}
        rows.append({"encoder": out.tensors["encoder"][i, : n["encoder"]],
                     "latent": out.tensors["latent"][i, : n["latent"]], "codes": out.tensors["codes"][i, :, : n["codes"]]})
    return rows


def chunked(model, routes: Routes, chunk: int) -> list[dict]:
    items, _ = ragged(STREAMS, seed=2)
    return encode_chunked(PaddedMimiEncoder(model, routes=routes), items, chunk, ("encoder", "latent", "codes"), 8)


def assert_route_matches_exact(model, routes: Routes, ran: dict, taken: set[str]):
    """``routes`` gives the exact path's output, batched and chunked (3-frame and 1-frame chunks);
    the routes ``taken`` ran, and the exact path ran none."""
    cases = [("batched", lambda r: batched(model, r))]
    cases += [(f"chunks of {k} frames", lambda r, k=k: chunked(model, r, FRAME * k)) for k in (3, 1)]
    for what, encode in cases:
        ran.update(dict.fromkeys(ROUTES, 0))
        exact = encode(EXACT)
        assert not any(ran.values()), f"the exact path took a route: {ran}"
        got = encode(routes)
        assert {r for r, n in ran.items() if n} == taken, f"{what}: routes taken {ran}, expected {taken}"
        for i, (g, e) in enumerate(zip(got, exact, strict=True)):
            assert_close(g, e, f"{what}, row {i}")


@pytest.mark.parametrize("route", ROUTES)
def test_each_route_alone_equals_the_exact_path(tiny_model, ran, route):
    assert_route_matches_exact(tiny_model, ALONE[route], ran, {route})


def test_every_route_together_equals_the_exact_path(tiny_model, ran):
    """All four at once (the default's combination, each forced on the tiny model): the tiles then run
    their convs on the other routes."""
    assert_route_matches_exact(tiny_model, Routes(block_gemm_min_width=1, front_tile=1000), ran, set(ROUTES))


def test_full_size_default_routes_equal_the_exact_path(full_model, ran):
    """kyutai/mimi's architecture with the default routes, nothing forced: its wide strided convs take
    the block GEMM and 2 rows of > 1 s take the tiles, as in the tool."""
    lengths = [24_000 + 6_011, FRAME * 9 + 17]
    ran.update(dict.fromkeys(ROUTES, 0))
    exact = batched(full_model, EXACT, lengths)
    assert not any(ran.values())
    got = batched(full_model, Routes(), lengths)
    assert all(ran.values()), f"every route ran: {ran}"
    for i, (g, e) in enumerate(zip(got, exact, strict=True)):
        assert_close(g, e, f"row {i}")


def test_route_selection(tiny_model, full_model):
    """Where each route applies (Routes.conv and Routes.tile, the one place routes are chosen)."""
    cpu, elsewhere = torch.zeros(1, 1, 1), torch.zeros(1, 1, 1, device="meta")
    tiny, full = PaddedMimiEncoder(tiny_model), PaddedMimiEncoder(full_model)

    def routes(enc, x, chosen=Routes()):
        return [chosen.conv(c, x) for c in enc.convs]

    kernels = [int(c.kernel_size) for c in tiny.convs]
    assert routes(tiny, cpu)[-1] is ConvRoute.EXACT, "the replicate-padded downsample: the exact conv"
    assert all((r is ConvRoute.POINTWISE) == (k == 1) for r, k in zip(routes(tiny, cpu)[:-1], kernels)), \
        "1x1 convs as a matrix product, the others padding zeros themselves"
    assert set(routes(tiny, cpu)[:-1]) == {ConvRoute.POINTWISE, ConvRoute.ZERO_PADDED}, \
        "no block GEMM on the tiny model's narrow convs"
    # full-size: the 3 of 4 downsampling convs at least 512 wide (stride x C_in), on CPU only
    assert routes(full, cpu).count(ConvRoute.BLOCK_GEMM) == 3
    assert ConvRoute.BLOCK_GEMM not in routes(full, elsewhere)
    assert set(routes(full, cpu, EXACT)) == {ConvRoute.EXACT}
    # tiles: CPU inputs longer than a tile, shorter tiles for more rows, a multiple of 960 samples
    assert Routes().tile(torch.zeros(1, 24_000, 1)) is None
    assert Routes().tile(torch.zeros(1, 24_001, 1)) == 24_000
    assert Routes().tile(torch.zeros(8, 24_001, 1)) == 11_520
    assert Routes().tile(torch.zeros(1, 24_001, 1, device="meta")) is None
    assert EXACT.tile(torch.zeros(1, 24_001, 1)) is None
