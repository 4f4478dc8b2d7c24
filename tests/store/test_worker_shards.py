"""Shards that device workers build and write themselves (``store.writer.WorkerShards``), committed by
the lock holder (``ShardWriter.commit_prepared``): every format, numbered in commit order, refused
when they would store an item twice, their temporaries removed by resume and at a run's end."""

import os
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from support import check_consistency, write_noise
from support.registered import format_cases
from mimi_extract.config.settings import Settings
from mimi_extract.formats import get_format
from mimi_extract.store.manifest import ManifestRow, next_shard_index, read_manifest
from mimi_extract.store.recover import recover
from mimi_extract.store.writer import PROVISIONAL, ShardWriter, WorkerShards



def attrs_for(fmt: str) -> dict:
    settings = Settings(tap="codes", format=fmt)
    return {"tap": "codes", "num_quantizers": 8, "layout": "[frames, num_quantizers]",
            **get_format(fmt).run_settings(settings, SimpleNamespace(codebook_size=2048))}


def items(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"k{i:03d}": rng.integers(0, 2048, (int(rng.integers(1, 20)), 8)).astype(np.int16) for i in range(n)}


def row(key: str, data: np.ndarray) -> ManifestRow:
    return ManifestRow(key=key, path=f"{key}.wav", dataset=key, sample_rate=24_000, duration=data.shape[0] * 0.08,
                       source={"path": f"/corpus/{key}.wav", "frames": data.shape[0] * 1920, "channels": 1})


def tmp_files(run_dir: str) -> list[str]:
    return sorted(n for n in os.listdir(run_dir) if n.endswith(".tmp"))


@pytest.mark.parametrize("fmt", format_cases("worker_shards"))
def test_two_workers_shards_and_the_runners_own_commit_into_one_out(tmp_path, fmt):
    """Two workers' shards (written to their .tmp files side by side) and the runner's own shard
    are committed in an order unlike the one they were written in: OUT holds every item once,
    equal to what was given, its shards numbered 0, 1, 2... in commit order (no worker's
    provisional number reaches a committed name), and nothing temporary is left."""
    out = str(tmp_path)
    attrs = attrs_for(fmt)
    writer = ShardWriter(out, get_format(fmt), attrs, max_items=3)
    spec = writer.spec()
    workers = [WorkerShards(spec, 0), WorkerShards(spec, 1)]
    given = items(17)
    keys = list(given)
    ready = []
    for i, key in enumerate(keys[:14]):
        ready += workers[i % 2].add(key, key, given[key], row(key, given[key]), {"duration": 1.0}, 1.0)
    ready += workers[0].flush() + workers[1].flush()
    assert tmp_files(out) and not [n for n in os.listdir(out) if get_format(fmt).is_shard(n)]  # written, not committed
    assert sum(len(p.rows) for p in ready) == 14 and sorted(u for p in ready for u in p.uids) == sorted(keys[:14])
    for key in keys[14:]:
        writer.add(key, given[key], row(key, given[key]), {"duration": 1.0})
    for prepared in reversed(ready):
        assert writer.commit_prepared(prepared)
    writer.close()
    arrays = check_consistency(out, set(keys))
    assert sorted(arrays) == keys and all(np.array_equal(arrays[k], given[k]) for k in keys)
    fmt_ = get_format(fmt).for_run(attrs)
    shards = sorted({r["shard"] for r in read_manifest(out)})
    assert shards == sorted(fmt_.shard_name(i) for i in range(len(shards))), shards
    assert not tmp_files(out) and next_shard_index(out) == len(shards) < PROVISIONAL


@pytest.mark.parametrize("fmt", ["hdf5", "shar"])
def test_a_shard_holding_an_item_already_stored_is_refused(tmp_path, fmt):
    """A unit handed out again after its worker died: a second worker's shard holding an item
    this run already committed is refused (False), its files removed; OUT holds each item once."""
    out = str(tmp_path)
    writer = ShardWriter(out, get_format(fmt), attrs_for(fmt), max_items=10)
    given = items(4)
    first, second = WorkerShards(writer.spec(), 0), WorkerShards(writer.spec(), 1)
    for key in ("k000", "k001"):
        first.add(key, key, given[key], row(key, given[key]), {}, 1.0)
    for key in ("k001", "k002"):
        second.add(key, key, given[key], row(key, given[key]), {}, 1.0)
    shard_a, shard_b = first.flush()[0], second.flush()[0]
    assert writer.commit_prepared(shard_a) and shard_a.committed
    assert not writer.commit_prepared(shard_b) and not shard_b.committed
    writer.close()
    assert sorted(check_consistency(out)) == ["k000", "k001"]
    assert not tmp_files(out) and len({r["shard"] for r in read_manifest(out)}) == 1


@pytest.mark.parametrize("fmt", format_cases("worker_tmp_files"))
def test_resume_removes_what_a_killed_worker_wrote(tmp_path, fmt):
    """A worker killed after writing its shard's .tmp files, before the runner committed it: resume
    removes them (every format's provisional names are temporaries), keeps what was committed,
    and numbers the next shard after the committed ones only."""
    out = str(tmp_path)
    attrs = attrs_for(fmt)
    writer = ShardWriter(out, get_format(fmt), attrs, max_items=2)
    given = items(5)
    workers = [WorkerShards(writer.spec(), w) for w in range(3)]
    committed = workers[0].add("k000", "k000", given["k000"], row("k000", given["k000"]), {}, 1.0)
    committed += workers[0].add("k001", "k001", given["k001"], row("k001", given["k001"]), {}, 1.0)
    assert len(committed) == 1 and writer.commit_prepared(committed[0])
    for w, key in ((1, "k002"), (2, "k003"), (2, "k004")):
        workers[w].add(key, key, given[key], row(key, given[key]), {}, 1.0)
    workers[1].flush(), workers[2].flush()  # written, never sent: their workers were killed
    assert len(tmp_files(out)) >= 2
    done, _ = recover(out, fmt=get_format(fmt))
    assert sorted(done) == ["k000", "k001"] and not tmp_files(out)
    assert next_shard_index(out) == 1
    assert sorted(check_consistency(out)) == ["k000", "k001"]


def test_process_workers_write_their_own_shards(tmp_path, tiny_model, tiny_model_dir):
    """Two CPU worker processes given the run's ShardSpec build and write the shards themselves:
    the engine hands the caller shards to commit, never an item's frames; committed, OUT equals
    the single-item reference, item by item."""
    import torch

    from mimi_extract.audio.reader import load
    from mimi_extract.codec.model import load_model
    from mimi_extract.codec.reference import reference_single
    from mimi_extract.engines import ProcessEngine
    from mimi_extract.engines.base import Progress
    from mimi_extract.engines.plan import plan_units
    from mimi_extract.sources import discover
    from mimi_extract.store.writer import PreparedShard

    root = tmp_path / "in"
    root.mkdir()
    rng = np.random.default_rng(0)
    for i in range(9):
        write_noise(root / f"x{i}.wav", 3000 + 1920 * i, 24_000, rng, subtype="FLOAT")
    out = str(tmp_path / "out")
    os.makedirs(out)
    settings = Settings(model=tiny_model_dir, tap="codes", devices=("cpu", "cpu"), num_workers=1, batch_size=2)
    found = discover(str(root))
    units = plan_units(found.items, settings.chunk_samples(), settings.step_seconds, settings.rows)
    writer = ShardWriter(out, get_format("hdf5"), attrs_for("hdf5"), max_items=2)
    engine = ProcessEngine(settings)
    got = []
    for prepared in engine.run(units, threading.Event(), load_model(tiny_model_dir), writer.spec()):
        got.append(type(prepared).__name__)
        if isinstance(prepared, Progress):  # (seconds of an item not whole yet)
            continue
        assert isinstance(prepared, PreparedShard), got  # (committed as it arrives, as the runner does)
        assert writer.commit_prepared(prepared)
    writer.close()
    assert got
    arrays = check_consistency(out, {it.key for it in found.items})
    for item in found.items:
        ref = reference_single(tiny_model, load(item.path), 8)["codes"]
        assert torch.equal(torch.as_tensor(arrays[item.key]), ref), item.key


def test_workers_write_full_shards_not_one_per_unit(tmp_path, tiny_model_dir):
    """A worker writes its open shard only when the run has nothing left to hand it (or at its
    end), not each time it waits for its next unit: 30 short files in ~8 units on two workers make
    at most one shard per worker (each shard up to --shard-size), equal to a one-process run."""
    from support import extract

    root = tmp_path / "in"
    root.mkdir()
    rng = np.random.default_rng(1)
    for i in range(30):
        write_noise(root / f"x{i:02d}.wav", int(24_000 * (0.3 + rng.random())), 24_000, rng)
    out, one = str(tmp_path / "out"), str(tmp_path / "one")
    summary = extract(str(root), out, Settings(model=tiny_model_dir, tap="codes", devices=("cpu", "cpu"),
                                               num_workers=1))
    assert summary.ok == 30 and summary.units >= 4, summary
    shards = {r["shard"] for r in read_manifest(out)}
    assert 1 <= len(shards) <= 2, sorted(shards)
    extract(str(root), one, Settings(model=tiny_model_dir, tap="codes", num_workers=1))
    arrays, alone = check_consistency(out), check_consistency(one)
    assert sorted(arrays) == sorted(alone) and all(np.array_equal(arrays[k], alone[k]) for k in alone)
