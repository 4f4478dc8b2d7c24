"""No run may hang: a failing stream, a slow step, the end of the work -- every engine ends, and
every failing item becomes an error row.  Each test bounds its wait (a thread join, a subprocess
timeout) by ``HANG_QUICK_S``, so a regression fails instead of hanging the suite, and a busy machine
(runs 10x slower) does not fail them."""

import json
import os
import subprocess
import threading

import numpy as np
import pytest
import soundfile as sf

from support import cli_process
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


def run_cli(args, timeout=HANG_QUICK_S):
    """The CLI in a subprocess; a hang is a failure (killed after ``timeout`` seconds)."""
    proc = cli_process(*args)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"the run hung (killed after {timeout} s):\n{output[-2000:]}")
    return proc.returncode, output


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


@pytest.mark.slow
@pytest.mark.parametrize("engine", list(ENGINES))
def test_failing_item_is_an_error_row_on_every_engine(tmp_path, tiny_model_dir, engine):
    """Items failing in their first, a middle and their last chunk (NaN samples), beside a clean
    one: every engine ends with one error row each and the clean item ok."""
    if engine == "ray":
        pytest.importorskip("ray")
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    write_nan_corpus(root)
    rc, output = run_cli(["codes", root, out, "-m", tiny_model_dir, "--device", "cpu", "--num-workers", "1",
                          "--chunk-seconds", CHUNK, *ENGINES[engine]])
    assert rc == 0, output
    rows = rows_of(out)
    assert {k: r["status"] for k, r in rows.items()} == {"first.wav": "error", "middle.wav": "error",
                                                         "last.wav": "error", "clean.wav": "ok"}
    assert all(rows[k]["error"] == "contains NaN or infinite samples" for k in NAN_AT)
    if engine == "ray":  # the engine's private cluster: every core of the machine, shared by the 2 actors
        from mimi_extract.config.settings import cpu_cores

        assert f"2 Ray actors on CPU ({max(1, cpu_cores() // 2)} threads each)" in " ".join(output.split()), output


@pytest.mark.slow
@pytest.mark.parametrize("position", ["middle.wav"])
def test_stream_failing_alone_on_worker_processes(tmp_path, tiny_model_dir, position):
    """The issue's repro: one long file failing after its first chunk, alone, on 2 workers."""
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    write_nan_corpus(root, [position], clean=False)
    rc, output = run_cli(["codes", root, out, "-m", tiny_model_dir, "--device", "cpu", "--num-workers", "1",
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
