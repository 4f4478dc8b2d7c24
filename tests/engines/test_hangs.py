"""No run may hang: a failing stream, a slow step, the end of the work -- every engine ends, and
every failing item becomes an error row.  Each test bounds its wait (a thread join) by
``HANG_QUICK_S``, so a regression fails instead of hanging the suite, and a busy machine
(runs 10x slower) does not fail them."""

import json
import os
import threading

import numpy as np
import pytest
import soundfile as sf

from support.waits import HANG_QUICK_S
from mimi_extract.engines import LATER, DeviceRunner
from mimi_extract.engines.plan import plan_units
from mimi_extract.config.settings import Settings
from mimi_extract.sources import discover

RATE = 24_000
CHUNK = 1.0  # seconds: 9 s files are 9 chunks (the reader decodes 2.7 s blocks: a NaN shows when its block is read)
SECONDS = 9
NAN_AT = {"first.wav": 0.5, "middle.wav": 4.5, "last.wav": 8.5}  # seconds: seen in chunk 1, 3 and 9


def write_nan_corpus(root, names=tuple(NAN_AT), clean: bool = True) -> None:
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in names:
        x = (0.2 * rng.standard_normal(SECONDS * RATE)).astype(np.float32)
        x[int(NAN_AT[name] * RATE)] = np.nan
        sf.write(os.path.join(root, name), x, RATE, subtype="FLOAT")
    if clean:
        sf.write(os.path.join(root, "clean.wav"), (0.2 * rng.standard_normal(SECONDS * RATE)).astype(np.float32),
                 RATE, subtype="FLOAT")


def rows_of(out):
    with open(os.path.join(out, "manifest.jsonl")) as f:
        return {r["key"]: r for r in map(json.loads, f)}


@pytest.mark.parametrize("position", list(NAN_AT))
def test_feeder_delivers_a_stream_error_before_waiting_for_work(tmp_path, tiny_model_dir, position):
    """The multi-process engine's hand-out: a worker asking for work blocks until its items are
    done (the parent hands out "no more" only then).  A stream that fails while nothing else runs
    must deliver its error before the feeder waits, or both sides wait for each other."""
    write_nan_corpus(str(tmp_path), [position], clean=False)
    settings = Settings(model=tiny_model_dir, tap="codes", chunk_seconds=CHUNK, num_workers=1)
    runner = DeviceRunner(settings, "cpu")
    units = iter(plan_units(discover(str(tmp_path)).items, runner.chunk, settings.step_seconds, settings.rows))
    finals, all_final = [], threading.Event()

    def next_unit(block=True):
        unit = next(units, None)
        if unit is not None:
            return unit
        if not block:
            return LATER
        all_final.wait()  # like ProcessEngine: "no more" only once every handed-out item is done
        return None

    def emit(piece):
        if piece.final:
            finals.append(piece)
            all_final.set()

    thread = threading.Thread(target=runner.run, args=(next_unit, emit, threading.Event()), daemon=True)
    thread.start()
    thread.join(timeout=HANG_QUICK_S)
    hung = thread.is_alive()
    all_final.set()  # release it, whatever happened
    assert not hung, "the feeder waited for work while holding the only item's error"
    assert [p.error for p in finals] == ["contains NaN or infinite samples"]


ENGINES = {"in-process": ["--cpu-workers", "1"], "processes": ["--cpu-workers", "2"],
           "ray": ["--cpu-workers", "1", "--engine", "ray", "--ray-cpu-actors", "2"]}


def run_in_process(args):
    """The CLI in-process, in a thread of its own; a hang is a failure (the thread still running
    after ``HANG_QUICK_S``).  Its worker processes are daemons: a hung run's go with the session."""
    from support import cli

    done = []
    thread = threading.Thread(target=lambda: done.append(cli(*args)), daemon=True)
    thread.start()
    thread.join(timeout=HANG_QUICK_S)
    assert done, f"the run hung (still running after {HANG_QUICK_S:.0f} s)"
    return done[0].exit_code, done[0].output


@pytest.mark.slow
@pytest.mark.parametrize("engine", list(ENGINES))
def test_failing_item_is_an_error_row_on_every_engine(tmp_path, tiny_model_dir, engine, request):
    """Items failing in their first, a middle and their last chunk (NaN samples), beside a clean
    one: every engine ends with one error row each and the clean item ok.  The CLI runs in-process
    (what can hang is the engines' hand-out, the same in a subprocess), Ray's on the session's
    cluster (the engine's private cluster: test_ray.py's test_ray_driver_killed_takes_its_private_cluster)."""
    if engine == "ray":
        request.getfixturevalue("ray_cluster")
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    write_nan_corpus(root)
    rc, output = run_in_process(["codes", root, out, "-m", tiny_model_dir, "--device", "cpu", "--num-workers", "1",
                                 "--chunk-seconds", CHUNK, *ENGINES[engine]])
    assert rc == 0, output
    rows = rows_of(out)
    assert {k: r["status"] for k, r in rows.items()} == {"first.wav": "error", "middle.wav": "error",
                                                         "last.wav": "error", "clean.wav": "ok"}
    assert all(rows[k]["error"] == "contains NaN or infinite samples" for k in NAN_AT)
    if engine == "ray":
        assert "2 Ray actors on CPU" in " ".join(output.split()), output


@pytest.mark.slow
@pytest.mark.parametrize("position", ["middle.wav"])
def test_stream_failing_alone_on_worker_processes(tmp_path, tiny_model_dir, position):
    """The issue's repro: one long file failing after its first chunk, alone, on 2 workers."""
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    write_nan_corpus(root, [position], clean=False)
    rc, output = run_in_process(["codes", root, out, "-m", tiny_model_dir, "--device", "cpu", "--num-workers", "1",
                                 "--chunk-seconds", CHUNK, "--cpu-workers", "2"])
    assert rc == 4, output  # every input failed (the only one): exit 4, as documented
    assert rows_of(out)[position]["status"] == "error"


@pytest.mark.slow
def test_run_ends_after_a_step_slower_than_any_timeout(tmp_path, tiny_model_dir, monkeypatch):
    """A step taking longer than the feeder once waited to hand over its end-of-work marker (10 s):
    the marker was dropped with the queue full, and the encoder loop then waited for it forever.
    Three one-row steps, the first one 11 s long: the run ends with all three items."""
    import time

    root = tmp_path / "in"
    root.mkdir()
    rng = np.random.default_rng(1)
    for i in range(3):
        sf.write(root / f"{i}.wav", (0.2 * rng.standard_normal(RATE // 2)).astype(np.float32), RATE)
    settings = Settings(model=tiny_model_dir, tap="codes", batch_size=1, num_workers=1)
    runner = DeviceRunner(settings, "cpu")
    encode, slow = runner._encode, [11.0]

    def slow_first(step):
        time.sleep(slow.pop() if slow else 0)
        return encode(step)

    monkeypatch.setattr(runner, "_encode", slow_first)
    units = iter(plan_units(discover(str(root)).items, runner.chunk, settings.step_seconds, settings.rows))
    finals = []
    thread = threading.Thread(target=runner.run, daemon=True,
                              args=(lambda block=True: next(units, None), lambda p: finals.append(p), threading.Event()))
    thread.start()
    thread.join(timeout=HANG_QUICK_S)
    assert not thread.is_alive(), "the run never ended after a step slower than 10 s"
    assert sorted(p.item.key for p in finals if p.final and p.error is None) == ["0.wav", "1.wav", "2.wav"]
