"""Resampling on the device (issue 34): the host sends native-rate samples (int16 for 16-bit PCM),
the encoder's device resamples them with the host's kernel.  Run here on the CPU device
(``--resample-on device``); ``-k cuda`` runs the same on a GPU (scripts/gpu_check.sh).  Checked
against the host path (AudioReader, which is torchaudio's resample: tests/audio) and end to end
against the single-item reference."""

import itertools
import threading

import numpy as np
import pytest
import soundfile as sf
import torch

from support import cli, tolerance, write_noise
from mimi_extract.audio.decoders import AudioError
from mimi_extract.audio.reader import AudioReader, PieceReader, load
from mimi_extract.audio.framing import Framing
from mimi_extract.audio.device import NativeChunk, NativeGroup, NativeReader, device_resamplable, resample_rows
from mimi_extract.engines import DeviceRunner
from mimi_extract.engines.plan import plan_units, split_items
from mimi_extract.codec.reference import reference_single
from mimi_extract.config.settings import Settings
from mimi_extract.sources import discover

FRAME = 1920
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
NOISE = 4e-7  # |device - host| on samples of magnitude <= ~1.5: a few fp32 ulps (measured: 1.8e-7)


def device_read(reader, chunk: int, device: str = "cpu") -> torch.Tensor:
    """Every chunk of ``reader`` resampled on ``device``, one row at a time, concatenated."""
    parts = []
    while True:
        c, final = reader.next_chunk(chunk)
        assert isinstance(c, NativeChunk)
        out = torch.zeros(1, len(c), device=device)
        parts.append(resample_rows([NativeGroup.of([0], [c])], out)[0].cpu())
        if final:
            return torch.cat(parts)


FILES = [(16_000, 16_000 * 3 + 7, "PCM_16", 1), (48_000, 48_000 * 2 + 5, "PCM_16", 2), (44_100, 44_100 * 2 + 11, "FLOAT", 1),
         (8_000, 8_000 * 4 + 3, "PCM_16", 1), (22_050, 22_050 * 2, "PCM_24", 1), (16_000, 5, "PCM_16", 1)]
FRAMINGS = [Framing(), Framing("transformers", causal_16k=True), Framing("muvap"), Framing("moshi")]


@pytest.mark.parametrize("rate,n,subtype,channels", FILES)
def test_native_chunks_resampled_equal_the_host_reader(tmp_path, rate, n, subtype, channels):
    """Every framing, chunk size and channel choice: the same length as the host's reader, the same
    samples to float noise; a piece of a split recording (its warm-up dropped) too.  16-bit PCM
    with one channel taken travels as int16, anything else as float32."""
    path = tmp_path / "x.wav"
    sf.write(path, (0.3 * np.random.default_rng(rate).standard_normal((n, channels))).astype(np.float32), rate,
             subtype=subtype)
    for framing, chunk, channel in itertools.product(FRAMINGS, [FRAME, 3 * FRAME], ["mix", "first"]):
        ref = AudioReader(str(path), channel, framing).read_all()
        reader = NativeReader(str(path), channel, framing)
        single = subtype == "PCM_16" and (channels == 1 or channel != "mix")
        assert reader.dtype == ("int16" if single else "float32")
        got = device_read(reader, chunk)
        assert got.shape == ref.shape, (framing, chunk, channel)
        assert len(ref) == 0 or (got - ref).abs().max() <= NOISE, (framing, chunk, channel)
        if len(ref) > 3 * FRAME:
            piece = device_read(PieceReader(NativeReader(str(path), channel, framing), 2 * FRAME, None), chunk)
            assert piece.shape == ref[2 * FRAME:].shape and (piece - ref[2 * FRAME:]).abs().max() <= NOISE


@pytest.mark.parametrize("name,rate,seconds,channels", [("a.flac", 16_000, 10.3, 1), ("b.wav", 48_000, 6.1, 2),
                                                        ("c.flac", 44_100, 3.7, 1), ("d.opus", 48_000, 6.1, 1),
                                                        ("e.wav", 48_000, 6.1, 8)])
def test_native_reads_take_what_a_chunk_needs(tmp_path, name, rate, seconds, channels):
    """NativeReader decodes what a chunk needs in one read (up to ``MAX_READ`` frames, at least a
    ``BLOCK``), not block by block: a 30 s chunk of a 10 s item is one read (three ``BLOCK`` s
    before), and the samples are the host reader's, chunk for chunk, for long and short chunks.
    FFmpeg's decoder (``.opus``) is read a ``BLOCK`` at a time (``largest_read``: its reads join
    decoded frames in Python, and larger ones cost more per sample).  ``MAX_READ`` counts samples
    over all channels: an 8-channel file's reads are at most 2^17 frames (a read decodes every
    channel: 2^20 frames of it were a 32 MB array per decoding thread)."""
    from mimi_extract.audio.decoders import BLOCK, MAX_READ

    path = tmp_path / name
    if name.endswith(".opus"):
        noise = 0.2 * np.random.default_rng(rate).standard_normal(int(rate * seconds))
        sf.write(str(path), noise.astype(np.float32), rate, format="OGG", subtype="OPUS")
    else:
        write_noise(path, int(rate * seconds), rate, np.random.default_rng(rate), channels=channels)
    largest = BLOCK if name.endswith(".opus") else max(BLOCK, MAX_READ // channels)
    for chunk in [375 * FRAME, 25 * FRAME, 2 * FRAME]:
        ref = AudioReader(str(path)).read_all()
        reader, reads = NativeReader(str(path)), []
        real = reader._decode_block
        reader._decode_block = lambda dtype, size=BLOCK: reads.append(size) or real(dtype, size)
        got = device_read(reader, chunk)
        assert got.shape == ref.shape and (got - ref).abs().max() <= NOISE, chunk
        assert all(BLOCK <= size <= largest for size in reads), reads
        if chunk == 375 * FRAME and largest > rate * seconds + BLOCK:  # (the item and the kernel's padding)
            assert len(reads) == 1, reads


@pytest.mark.parametrize("device", DEVICES)
def test_rows_of_several_rates_in_one_step(tmp_path, device):
    """One call resamples rows of different rates and dtypes and lengths into one padded step; rows
    that keep less than the step (the framing's padding, a short final chunk) are zero beyond."""
    readers, refs = [], []
    for i, (rate, n, subtype) in enumerate([(16_000, 9_001, "PCM_16"), (48_000, 30_000, "FLOAT"),
                                            (16_000, 20_000, "FLOAT"), (44_100, 700, "PCM_16"),
                                            (16_000, 30_001, "PCM_16")]):
        path = tmp_path / f"{i}.wav"
        write_noise(path, n, rate, np.random.default_rng(i), subtype=subtype)
        readers.append(NativeReader(str(path), framing=Framing("moshi")))
        refs.append(AudioReader(str(path), framing=Framing("moshi")).read_all())
    chunks = [r.next_chunk(1 << 20)[0] for r in readers]
    groups: dict = {}
    for row, c in enumerate(chunks):
        groups.setdefault(c.group, []).append(row)
    assert len(groups) == 4 and len(groups[2, 3, "int16"]) == 2  # (2:3 int16) x 2, (2:1 float), (2:3 float), (147:80 int16)
    size = max(len(c) for c in chunks) + 960
    out = torch.full((len(chunks), size), float("nan"), device=device).zero_()
    resample_rows([NativeGroup.of(rows, [chunks[r] for r in rows]) for rows in groups.values()], out)
    for row, ref in enumerate(refs):
        assert (out[row, : len(ref)].cpu() - ref).abs().max() <= NOISE
        assert not out[row, len(ref):].any()


def test_which_rates_go_to_the_device(tmp_path):
    odd_rate_file = tmp_path / "odd.wav"
    write_noise(odd_rate_file, 5000, 44_056)
    for rate in (8_000, 11_025, 12_000, 16_000, 22_050, 32_000, 44_100, 48_000, 88_200, 96_000):
        assert device_resamplable(rate, 4 * 24_000 // FRAME * FRAME), rate
    assert not device_resamplable(24_000, 96_000)  # nothing to resample
    assert not device_resamplable(44_056, 96_000)  # 3000 outputs per block: not a whole number per frame
    with pytest.raises(AudioError, match="44056 Hz, is not one the device resamples"):
        NativeReader(str(odd_rate_file))
    assert Settings(devices=("cuda:0",)).device_resample and not Settings().device_resample
    assert Settings(resample_on="device").device_resample and not Settings(devices=("cuda:0",), resample_on="host").device_resample
    with pytest.raises(ValueError, match="--resample-on 'gpu'"):
        Settings(resample_on="gpu").device_resample  # noqa: B018


def runner_pieces(settings, items, model, taps=("encoder", "latent", "codes"), count=None):
    runner = DeviceRunner(settings, "cpu", model, taps=taps)
    if count is not None:
        real = runner._resample

        def counting(step):
            count.append(len(step.groups))
            return real(step)

        runner._resample = counting
    units = iter(plan_units(items, runner.chunk, settings.step_seconds, settings.rows))
    pieces: dict[str, list] = {}
    runner.run(lambda block=True: next(units, None), lambda p: pieces.setdefault(p.item.uid, []).append(p),
               threading.Event())
    return runner, pieces


def test_engine_resampling_on_the_device_equals_the_single_item_reference(tmp_path, tiny_model, tiny_model_dir):
    """The whole engine on the CPU device with ``--resample-on device``: 16, 44.1, 48 and 24 kHz files
    (int16 and float), long ones streamed in 3-frame chunks with rows refilled mid-run, a stereo
    mix; every item equals its lone encode of the host-resampled audio (codes identical, features
    within fp32 tolerance), and rows did go through the device's resampler."""
    rng = np.random.default_rng(3)
    files = [("a16.wav", 16_000, 16_000 * 5 + 11, "PCM_16", 1), ("b44.flac", 44_100, 4_000, "PCM_16", 1),
             ("c48.wav", 48_000, 48_000 * 3 + 1, "FLOAT", 2), ("d24.wav", 24_000, 24_000 * 2 + 3, "PCM_16", 1),
             ("e16.flac", 16_000, 900, "PCM_16", 1), ("f48.flac", 48_000, 48_000 * 4, "PCM_16", 1)]
    for name, rate, n, subtype, channels in files:
        data = (0.2 * rng.standard_normal((n, channels))).astype(np.float32)
        sf.write(tmp_path / name, data, rate, subtype=subtype)
    settings = Settings(model=tiny_model_dir, tap="latent", batch_size=3, max_batch_seconds=60, chunk_seconds=0.24,
                        num_workers=2, resample_on="device")
    found = discover(str(tmp_path))
    groups = []
    runner, pieces = runner_pieces(settings, found.items, tiny_model, count=groups)
    assert runner.stats.joined > 0 and sum(groups) > 0
    for item in found.items:
        got = pieces[item.uid]
        assert got[0].first and got[-1].final
        ref = reference_single(tiny_model, load(item.path), 8)
        for tap in ("encoder", "latent"):
            joined = torch.cat([p.data[tap] for p in got])
            assert joined.shape == ref[tap].shape and (joined - ref[tap]).abs().max() <= tolerance(ref[tap]), item.key
        assert torch.equal(torch.cat([p.data["codes"] for p in got]), ref["codes"]), item.key


def test_split_recording_resampled_on_the_device(tmp_path, tiny_model, tiny_model_dir):
    """A 16 kHz recording cut into pieces (each decoded from the start, its warm-up dropped on the
    host before anything is resampled): the pieces' frames, joined, equal the unsplit reference."""
    write_noise(tmp_path / "long.wav", 16_000 * 21 + 5, 16_000, np.random.default_rng(5))
    settings = Settings(model=tiny_model_dir, tap="codes", batch_size=4, max_batch_seconds=8, chunk_seconds=1,
                        num_workers=1, resample_on="device")
    found = discover(str(tmp_path))
    from mimi_extract.codec.encoder import PaddedMimiEncoder

    encoder = PaddedMimiEncoder(tiny_model)
    items, split = split_items(found.items, 4, encoder.receptive_field, encoder.hop, max_overhead=0.5)
    assert split.pieces >= 2
    _, pieces = runner_pieces(settings, items, tiny_model, taps=("latent", "codes"))
    ref = reference_single(tiny_model, load(str(tmp_path / "long.wav")), 8)
    joined = {t: torch.cat([p.data[t] for it in items for p in pieces[it.uid]]) for t in ("latent", "codes")}
    assert joined["latent"].shape == ref["latent"].shape
    assert (joined["latent"] - ref["latent"]).abs().max() <= tolerance(ref["latent"])
    assert torch.equal(joined["codes"], ref["codes"])


def test_step_rows_picks_host_and_device_rows(tmp_path, tiny_model):
    """A step not yet resampled, cut to some of its rows (a failed stream dropped, an out-of-memory
    split): the rows kept resample to what they would have in the whole step, and to what the host
    resamples, each row its own samples.  Within float noise, not bit for bit: oneDNN's convolution
    of a row alone sums in another order than in a batch of two (measured: 1.2e-7 on these rows,
    torch 2.9.1), where a row holding another row's samples is off by ~1."""
    from mimi_extract.engines.device import _Step

    chunks = []
    for i, rate in enumerate([16_000, 24_000, 48_000, 16_000]):
        path = tmp_path / f"{i}.wav"
        write_noise(path, rate // 2 + 100 * i, rate, np.random.default_rng(i))
        reader = NativeReader(str(path)) if rate != 24_000 else AudioReader(str(path))
        chunks.append(reader.next_chunk(1 << 20)[0])
    size = max(len(c) for c in chunks)
    host = [1]
    audio = torch.zeros(1, size)
    audio[0, : len(chunks[1])] = chunks[1]
    groups: dict = {}
    for r, c in enumerate(chunks):
        if r not in host:
            groups.setdefault(c.group, []).append(r)
    n = len(chunks)
    step = _Step(audio, torch.tensor([len(c) for c in chunks]), torch.ones(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool),
                 torch.arange(n), [None] * n, host_rows=torch.tensor(host),
                 groups=[NativeGroup.of(g, [chunks[r] for r in g]) for g in groups.values()])
    runner = DeviceRunner(Settings(resample_on="device"), "cpu", tiny_model)
    whole = runner._resample(step).audio
    part = runner._resample(step.rows([3, 1, 2])).audio
    for new, old in enumerate([3, 1, 2]):
        length = len(chunks[old])
        host_read = AudioReader(str(tmp_path / f"{old}.wav")).next_chunk(1 << 20)[0]
        assert len(host_read) == length
        assert (part[new, :length] - whole[old, :length]).abs().max() <= NOISE, old
        assert (part[new, :length] - host_read).abs().max() <= NOISE, old
        assert not part[new, length:].any() and not whole[old, length:].any(), old  # the step's padding: zeros


@pytest.mark.parametrize("device", DEVICES)
def test_verify_with_resampling_on_the_device(device, tiny_model_dir, tmp_path):
    """``verify --resample-on device``: the engine with device resampling against transformers'
    single-item encode of the host-resampled audio, classified by verify's tie rule (exit 0: no
    real mismatch)."""
    rng = np.random.default_rng(0)
    for name, seconds, rate, subtype in [("a.wav", 5.3, 16_000, "PCM_16"), ("b.flac", 0.7, 48_000, "PCM_16"),
                                         ("c.wav", 2.05, 44_100, "FLOAT"), ("d.wav", 1.1, 24_000, "PCM_16")]:
        sf.write(tmp_path / name, (0.2 * rng.standard_normal(int(seconds * rate))).astype(np.float32), rate,
                 subtype=subtype)
    result = cli("verify", tmp_path, "--model", tiny_model_dir, "--device", device, "--chunk-seconds", "1",
                 "--batch-size", "2", "--resample-on", "device")
    assert result.exit_code == 0, result.output
    assert "4 files compared" in result.text and "PASS" in result.text


def test_step_buffers_reused_only_once_their_step_is_encoded(tmp_path, tiny_model, tiny_model_dir, monkeypatch):
    """On the CPU device a step's host buffers (native-rate rows of two rates and dtypes, 24 kHz host
    rows) are reused for later steps (``StepBuffers``), and never while a step still reads them: each
    step's frames are emitted only once the feeder has composed three more steps (two queued, one
    composed and waiting), so a buffer given back before its step is encoded would hold a later step's
    samples when that step is encoded; every item's codes still equal its lone reference, buffers were
    reused, and at most ``count`` are kept."""
    from mimi_extract.engines.device import _Feeder

    rng = np.random.default_rng(11)
    for i, (rate, seconds, subtype) in enumerate([(16_000, 4.1, "PCM_16"), (16_000, 3.3, "PCM_16"), (48_000, 2.9, "FLOAT"),
                                                  (24_000, 3.7, "PCM_16"), (16_000, 1.1, "PCM_16")]):
        write_noise(tmp_path / f"{i}.wav", int(rate * seconds), rate, rng, subtype=subtype)
    settings = Settings(model=tiny_model_dir, tap="codes", batch_size=3, max_batch_seconds=60, chunk_seconds=0.24,
                        num_workers=1, resample_on="device")
    items = discover(str(tmp_path)).items
    cond, seen = threading.Condition(), {"offered": 0, "encoded": 0}
    real_offer = _Feeder.offer

    def offer(self, step):  # (the feeder's composed steps, counted as it hands each over)
        with cond:
            seen["offered"] += 1
            cond.notify_all()
        return real_offer(self, step)

    monkeypatch.setattr(_Feeder, "offer", offer)

    def run(total=None):
        runner = DeviceRunner(settings, "cpu", tiny_model, taps=("codes",))
        real_encode = runner._encode

        def encode(step):
            out = real_encode(step)
            seen["encoded"] += 1
            return out

        def emit(piece):
            if total is not None:  # the feeder three steps ahead (or at its end) before anything is emitted
                with cond:
                    assert cond.wait_for(lambda: seen["offered"] >= min(total, seen["encoded"] + 3), timeout=120)
            pieces.setdefault(piece.item.uid, []).append(piece)

        runner._encode = encode
        seen.update(offered=0, encoded=0)
        units, pieces = iter(plan_units(items, runner.chunk, settings.step_seconds, settings.rows)), {}
        runner.run(lambda block=True: next(units, None), emit, threading.Event())
        return runner, pieces, seen["offered"]

    _, _, total = run()
    runner, pieces, _ = run(total)
    assert total >= 8 and runner.buffers.reused > 0 and len(runner.buffers.free) <= runner.buffers.count
    for item in items:
        ref = reference_single(tiny_model, load(item.path), 8)
        assert torch.equal(torch.cat([p.data["codes"] for p in pieces[item.uid]]), ref["codes"]), item.key


def test_step_buffers_reuse_what_is_given_back_and_never_ask_whether_pinned(monkeypatch):
    """A buffer given back serves a later step that fits in it, the largest two are kept, an empty
    one is not, and nothing asks a tensor whether it is pinned (on a host with CUDA that can start
    CUDA in a CPU run)."""
    from mimi_extract.audio.device import StepBuffers

    def asked(self, *a, **kw):
        raise AssertionError("is_pinned asked")

    monkeypatch.setattr(torch.Tensor, "is_pinned", asked)
    pool = StepBuffers()
    first = pool.take(4, 1000, torch.int16)
    pool.give([first, pool.take(0, 1000, torch.float32)])
    assert len(pool.free) == 1
    again = pool.take(3, 1100, torch.int16)
    assert again.untyped_storage().data_ptr() == first.untyped_storage().data_ptr() and pool.reused == 1
    pool.give([again, pool.take(2, 10, torch.float32), pool.take(8, 1000, torch.float32)])
    assert sorted(s.nbytes() for s in pool.free) == sorted([again.untyped_storage().nbytes(), 8 * 1000 * 4 * 5 // 4])
