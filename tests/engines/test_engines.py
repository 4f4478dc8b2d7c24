"""The device engine: continuous batching of streams, exact against the single-item reference."""

from dataclasses import replace
import os
import pytest
import threading

import numpy as np
import torch

from support import tolerance, write_noise
from mimi_extract import read, read_manifest
from mimi_extract.audio.reader import load
from mimi_extract.codec.reference import reference_single
from mimi_extract.engines import DeviceRunner
from mimi_extract.engines.plan import plan_units
from support import extract
from mimi_extract.config.settings import Settings
from mimi_extract.sources import discover
from support import check_consistency

FRAME = 1920


def write(root, lengths, rate=24_000, seed=0):
    rng = np.random.default_rng(seed)
    for i, n in enumerate(lengths):
        write_noise(os.path.join(root, f"x{i:02d}.wav"), n, rate, rng, subtype="FLOAT")


def test_continuous_batching_equals_single_item(tmp_path, tiny_model, tiny_model_dir):
    """Streams of very different lengths in 3 rows of 3-frame chunks: rows are refilled as
    streams end, short items join long ones, and every item equals its lone encode."""
    lengths = [FRAME * 31 + 7, 500, FRAME * 4, FRAME * 17 - 3, 1000, FRAME * 9 + 960, FRAME * 2 + 1, FRAME * 12]
    write(str(tmp_path), lengths)
    settings = Settings(model=tiny_model_dir, tap="latent", batch_size=3, max_batch_seconds=60, chunk_seconds=0.24,
                        num_workers=2)
    runner = DeviceRunner(settings, "cpu", taps=("encoder", "latent", "codes"))
    found = discover(str(tmp_path))
    units = iter(plan_units(found.items, runner.chunk, settings.step_seconds, settings.rows))
    chunks: dict[str, list] = {}
    runner.run(lambda block=True: next(units, None), lambda p: chunks.setdefault(p.item.key, []).append(p),
               threading.Event())
    assert runner.stats.joined > 0  # a row was refilled while others went on
    for item in found.items:
        got = chunks[item.key]
        assert got[0].first and got[-1].final and not any(p.final for p in got[:-1])
        ref = reference_single(tiny_model, load(item.path), 8)
        for tap in ("encoder", "latent"):
            joined = torch.cat([p.data[tap] for p in got])
            assert joined.shape == ref[tap].shape and (joined - ref[tap]).abs().max() <= tolerance(ref[tap]), item.key
        assert torch.equal(torch.cat([p.data["codes"] for p in got]), ref["codes"]), item.key


def test_a_step_s_chunks_go_out_in_one_call(tmp_path, tiny_model_dir):
    """``emit_step`` (the in-process engine's queue, issue 40): each step's chunks in one call, more
    than one chunk a call, and in all the chunks ``emit`` gets one at a time, in the same order."""
    write(str(tmp_path), [FRAME * 5 + 7, 500, FRAME * 2, 1000, FRAME * 3 + 1])
    settings = Settings(model=tiny_model_dir, tap="codes", batch_size=3, max_batch_seconds=60, chunk_seconds=0.24,
                        num_workers=1)
    found = discover(str(tmp_path))
    got = {}
    for how in ("emit", "emit_step"):
        runner = DeviceRunner(settings, "cpu", taps=("codes",))
        units = iter(plan_units(found.items, runner.chunk, settings.step_seconds, settings.rows))
        calls: list = []
        step = {"emit_step": calls.append} if how == "emit_step" else {}
        runner.run(lambda block=True: next(units, None), lambda c: calls.append([c]), threading.Event(), **step)
        got[how] = calls
    assert all(len(c) == 1 for c in got["emit"]) and len(got["emit_step"]) < len(got["emit"])
    assert max(len(c) for c in got["emit_step"]) > 1
    one = [c for call in got["emit"] for c in call]
    stepped = [c for call in got["emit_step"] for c in call]
    assert [(c.item.key, c.first, c.final, c.seconds) for c in stepped] == \
        [(c.item.key, c.first, c.final, c.seconds) for c in one]
    assert all(torch.equal(a.data["codes"], b.data["codes"]) for a, b in zip(one, stepped))


def test_mixed_directory_streams_long_files(tmp_path, tiny_model, tiny_model_dir):
    """Short files and a long one (16 kHz, streamed through the resampler) in one run; progress
    moves while the long file is encoded; everything equals the single-item reference."""
    root = tmp_path / "mixed"
    root.mkdir()
    write(str(root), [FRAME * 3, 7000, 20_000])  # (each shorter than a 1 s chunk)
    # 11 s in 1 s chunks: the same 12 chunks as 41 s in the default 4 s ones, at a quarter of the cost
    write_noise(root / "long16k.wav", 16_000 * 11 + 3, 16_000, np.random.default_rng(1), 0.1, subtype="FLOAT")
    calls = []
    summary = extract(str(root), str(tmp_path / "out"),
                      Settings(model=tiny_model_dir, tap="codes", num_workers=1, chunk_seconds=1),
                      on_progress=lambda items, seconds, errors: calls.append((items, seconds)))
    assert summary.streamed == 1 and summary.ok == 4
    assert sum(1 for items, seconds in calls if items == 0 and seconds > 0) >= 10  # 1 s chunks of the long file
    assert abs(sum(s for _, s in calls) - summary.seconds) < 1e-6
    out = str(tmp_path / "out")
    for row in read_manifest(out):
        ref = reference_single(tiny_model, load(os.path.join(root, row["path"])), 8)["codes"].numpy()
        assert np.array_equal(read(out, row["key"]), ref), row["key"]
    check_consistency(out)


@pytest.mark.slow
def test_cpu_workers_are_forked_with_the_runners_model(tmp_path, tiny_model, tiny_model_dir):
    """CPU workers are forked from the process holding the model (no second import of torch, no
    second weight load) and give the single-item reference; without a model (or on GPU) they are
    spawned and load the weights themselves, with the same result.  Two forked workers, one spawned:
    each spawned worker imports torch and transformers anew (seconds of CPU), and one shows the
    spawn, the weights loaded there and the result (the hand-out between workers is the same
    whichever way they start: test_units_go_to_whichever_worker_is_free)."""
    from mimi_extract.engines import ProcessEngine
    from mimi_extract.codec.model import load_model

    write(str(tmp_path), [FRAME * 7 + 5, 3000, FRAME * 3])
    settings = Settings(model=tiny_model_dir, tap="codes", devices=("cpu", "cpu"), num_workers=1, batch_size=2)
    found = discover(str(tmp_path))
    got = {}
    for model, devices in ((load_model(tiny_model_dir), ("cpu", "cpu")), (None, ("cpu",))):
        units = plan_units(found.items, settings.chunk_samples(), settings.step_seconds, settings.rows)
        engine = ProcessEngine(replace(settings, devices=devices))
        chunks = list(engine.run(units, threading.Event(), model))
        got[engine.start_method] = {p.item.key: p.data for p in chunks}
        assert all(p.first and p.final and p.error is None for p in chunks)
    assert set(got) == {"fork", "spawn"}
    for item in found.items:
        ref = reference_single(tiny_model, load(item.path), 8)["codes"]
        assert torch.equal(torch.as_tensor(got["fork"][item.key]), ref), item.key
        assert torch.equal(torch.as_tensor(got["spawn"][item.key]), ref), item.key


@pytest.mark.slow
def test_units_go_to_whichever_worker_is_free(tmp_path, tiny_model_dir):
    """Dynamic hand-out: worker 0 is frozen (SIGSTOP) from its start until 30 of 40 units are
    delivered, so worker 1 must have taken them; a static split would have left half of them
    waiting for worker 0.  The workers are forked with the model, as a CPU run's are (the hand-out
    is the same for spawned ones; spawning is test_cpu_workers_are_forked_with_the_runners_model's)."""
    import signal

    from mimi_extract.codec.model import load_model
    from mimi_extract.engines import ProcessEngine

    root = str(tmp_path / "in")
    os.makedirs(root)
    write(root, [4000 + 97 * i for i in range(40)])
    settings = Settings(model=tiny_model_dir, tap="codes", devices=("cpu", "cpu"), num_workers=1, batch_size=1,
                        max_batch_seconds=0.1)
    units = plan_units(discover(root).items, settings.chunk_samples(), settings.step_seconds, settings.rows)
    assert len(units) == 40
    engine = ProcessEngine(settings)
    engine.start(load_model(tiny_model_dir))
    assert engine.start_method == "fork"
    frozen = engine.procs[0].pid
    os.kill(frozen, signal.SIGSTOP)
    thaw = threading.Timer(60, os.kill, (frozen, signal.SIGCONT))  # a static split would wait for it forever
    thaw.start()
    delivered = 0
    try:
        for chunk in engine.run(units, threading.Event()):
            assert chunk.error is None, chunk.error
            delivered += chunk.final
            if delivered == 30:
                os.kill(frozen, signal.SIGCONT)
    finally:
        thaw.cancel()
        if engine.procs and engine.procs[0].is_alive():
            os.kill(frozen, signal.SIGCONT)
        engine.close()
    assert delivered == 40
    steps = {wid: st.steps for wid, st in engine.worker_stats.items()}
    assert sum(steps.values()) == 40 and steps[1] >= 30, steps


def test_the_engine_choices_are_the_engines_there_are():
    """--engine's choices live torch-free in config/choices.py (the CLI's help must not import the
    engines); they are exactly the engines ``make_engine`` can build, so a new engine cannot be
    offered without existing, or exist without being offered."""
    from mimi_extract import engines
    from mimi_extract.config import choices

    assert choices.ENGINES == tuple(engines.ENGINES)
