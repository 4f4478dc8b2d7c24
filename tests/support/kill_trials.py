"""kill -9 part-way through a CLI run, then resume: the one harness behind the kill tests of every
registered output format and every packaged input kind (their cases: ``support.registered``), so a
new format or input gets the whole scenario -- and every assertion -- by its entry there (a format's
own OUT check, an input's builder)."""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from support import cli_process
from support.waits import read_until, wait_for
from support import check_consistency
from mimi_extract import read_manifest
from support import extract
from mimi_extract.config.settings import Settings
from mimi_extract.formats import formats


@dataclass(frozen=True)
class KillTrial:
    """One killed run: ``workers`` is its ``--cpu-workers`` ("1": one process, killed with its
    process group; more: only the parent is killed, and its workers must not outlive it), and the
    kill lands once ``randint(*rows)`` more ok rows than at its start are committed."""

    workers: str
    rows: tuple[int, int]


def no_processes_left(pgid) -> bool:
    def gone():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        return False

    return wait_for(gone, f"process group {pgid} gone", poll=0.2)


def committed_ok(out) -> int:
    return sum(r["status"] == "ok" for r in read_manifest(out))


def start_kill_trial(many, out, model_dir, workers, fmt="hdf5"):
    """A CLI run in its own process group with 3-item shards (a commit every few ms); returns it
    once start-up is over, with the number of items it found already done."""
    proc = cli_process("codes", many, out, "--model", model_dir, "--shard-size", 3, "--device", "cpu",
                       "--cpu-workers", workers, "--num-workers", "1", "--format", fmt, start_new_session=True)
    try:
        lines = read_until(proc.stdout, "to encode", "the kill trial's start-up")
    except AssertionError:
        proc.kill()
        raise
    text = " ".join("".join(lines).split())
    done = text.split(" already done)")[0].rsplit("(", 1)[-1]
    assert done.isdigit(), text
    return proc, int(done)


def kill_9_part_way(proc, out, target, rng, group, total=120) -> int:
    """Wait until ``target`` ok rows are committed, then a random few ms (so the kill lands
    anywhere: encoding, writing a shard, between its commit steps); assert that the run is still
    going part-way through (alive, 0 < committed < total), then kill -9 it.  Returns the count."""
    def reached():
        assert proc.poll() is None, (f"the run exited ({proc.returncode}) before {target} rows were committed:\n"
                                     + proc.stdout.read()[-3000:])
        return committed_ok(out) >= target

    wait_for(reached, f"{target} committed rows", poll=0.002)
    time.sleep(rng.uniform(0.0, 0.03))
    committed = committed_ok(out)
    assert proc.poll() is None and 0 < committed < total, (
        f"the kill would not land part-way through the run: alive={proc.poll() is None}, {committed}/{total} committed")
    os.killpg(proc.pid, signal.SIGKILL) if group else os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, f"the run had exited ({proc.returncode}) when the kill landed"
    return committed


def checked_arrays(out, killed: bool = False) -> dict[str, np.ndarray]:
    """OUT's committed arrays after ``check_consistency``.  ``killed``: OUT as a kill -9 left it: at
    worst a shard's .tmp file and rows naming a shard that was never renamed into place (both
    invisible to readers); everything else consistent."""
    if killed:
        named = {r["shard"] for r in read_manifest(out) if r.get("shard")}
        for name in (n for n in os.listdir(out) if n.endswith(".tmp")):
            # a shard's file (the shard, or a companion: a Megatron shard's .bin and .json) of a shard no row names
            file = name[:-4].replace("__", "/")
            fmt = next((f for f in formats() if f.is_file(file)), None)
            assert fmt is not None and not any(file == s or file in fmt.companions(s) for s in named), (
                f"a kill left {name} (only an uncommitted shard's .tmp may be left)")
    return check_consistency(out, killed=killed)  # the .tmp left, if any, checked above


def kill_9_then_resume(source: str, out: str, model_dir: str, reference: dict[str, np.ndarray],
                       trials: list[KillTrial], rng: random.Random, fmt: str = "hdf5",
                       check: Callable[..., dict[str, np.ndarray]] = checked_arrays) -> int:
    """kill -9 each of ``trials`` part-way (never before the first commit or after the last), then
    resume in-process; ``reference`` is the uninterrupted run's {key: array} (every input item ok).
    After each kill OUT passes ``check(out, killed=True)`` (the format's own invariants), every
    committed array equals the reference's, and the next run resumes exactly what was committed;
    the final resume equals the uninterrupted run.  Returns the items committed before it."""
    total = len(reference)
    committed = 0
    for trial, t in enumerate(trials):
        proc, done = start_kill_trial(source, out, model_dir, t.workers, fmt)
        assert done == committed, f"trial {trial}: resumed {done} items, {committed} were committed"
        at_kill = kill_9_part_way(proc, out, committed + rng.randint(*t.rows), rng, group=t.workers == "1",
                                  total=total)
        assert no_processes_left(proc.pid), f"trial {trial}: worker processes survived their parent's kill -9"
        kept = check(out, killed=True)
        for key, data in kept.items():
            assert np.array_equal(data, reference[key]), f"{key}: committed array differs from the uninterrupted run"
        assert at_kill <= len(kept) < total and len(kept) > committed and committed_ok(out) == len(kept), (
            f"trial {trial}: {len(kept)} committed after the kill ({at_kill} just before, {committed} at the start)")
        committed = len(kept)
    summary = extract(source, out, Settings(model=model_dir, tap="codes", num_workers=1, format=fmt), shard_size=7)
    assert summary.skipped == committed and summary.ok == total - committed, summary
    arrays = check(out)
    assert sorted(arrays) == sorted(reference)
    for key, data in reference.items():
        assert np.array_equal(arrays[key], data), key
    return committed
