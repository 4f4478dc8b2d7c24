"""The tests' checks of an output directory (kept out of the package: they ``assert``)."""

from __future__ import annotations

import os

import numpy as np


def check_consistency(out_dir: str, expected_keys=None, killed: bool = False) -> dict[str, "np.ndarray"]:
    """Assert OUT's invariants and return {key: array} of every ok item, for any output format.

    One ok row per key at most; every committed shard on disk (of any format) has ok rows and holds
    exactly the items they name with their frame counts (its format's ``check``: for HDF5, the
    datasets the rows name and no other), so no key is stored twice; every array loads with its
    row's frame count and checksum; no ``.tmp`` file is left (``killed``: OUT as a kill left it,
    where a ``.tmp`` shard being written may remain: readers ignore it and resume removes it).
    With ``expected_keys``, exactly those keys have ok rows."""
    import glob

    from mimi_extract.store.manifest import format_files, read_manifest, run_dirs
    from mimi_extract.store.read import load_row

    rows = [r for r in read_manifest(out_dir) if r.get("status") == "ok"]
    keys = [r["key"] for r in rows]
    assert len(keys) == len(set(keys)), f"duplicate ok rows: {sorted(k for k in set(keys) if keys.count(k) > 1)[:5]}"
    if expected_keys is not None:
        assert set(keys) == set(expected_keys), (
            f"missing {sorted(set(expected_keys) - set(keys))[:5]}, unexpected {sorted(set(keys) - set(expected_keys))[:5]}")
    by_shard: dict[str, list] = {}
    for r in rows:
        by_shard.setdefault(r["shard"], []).append(r)
    for d in run_dirs(out_dir):
        for name, fmt in sorted(format_files(d)):
            if name.endswith(".tmp") or not fmt.is_shard(name):
                continue
            shard = os.path.relpath(os.path.join(d, name), out_dir)
            assert shard in by_shard, f"{shard}: a committed shard without manifest rows"
            problem = fmt.check(os.path.join(d, name), by_shard[shard])
            assert problem is None, f"{shard}: {problem}"
        assert killed or not glob.glob(os.path.join(d, "*.tmp")), f"leftover tmp files in {d}"
    arrays = {}
    for r in rows:
        data = load_row(out_dir, r)
        assert data.shape[0] == r["frames"], r["key"]
        arrays[r["key"]] = data
    return arrays


def restamp_checksum(out_dir: str, key: str) -> None:
    """Rewrite the manifest checksum of ``key`` (and the shard checksum of its shard's rows) to match
    what its shard now holds: tests that edit a stored array on purpose (to stand for another
    device's output) make it a valid item again, instead of a damaged one that every read refuses."""
    import json

    from mimi_extract.formats.base import array_checksum, bytes_checksum
    from mimi_extract.store.files import write_atomic
    from mimi_extract.store.manifest import format_of_path, read_rows, run_dirs

    for d in run_dirs(out_dir):
        rows = read_rows(d)
        hit = [r for r in rows if r.get("key") == key and r.get("status") == "ok"]
        for r in hit:
            r["checksum"] = array_checksum(format_of_path(r["shard"]).load(os.path.join(d, r["shard"]), r))
        for shard in {r["shard"] for r in hit}:
            with open(os.path.join(d, shard), "rb") as f:
                whole = bytes_checksum(f.read())
            for r in rows:
                if r.get("shard") == shard and r.get("shard_checksum"):
                    r["shard_checksum"] = whole
        if hit:
            write_atomic(os.path.join(d, "manifest.jsonl"), "".join(json.dumps(r) + "\n" for r in rows))


def interrupt_after_items(n: int):
    """An ``on_progress`` callback that raises KeyboardInterrupt once ``n`` items were stored ok
    (an interruption at a known point of a run, whatever the machine's speed)."""
    seen = []

    def on_progress(items, seconds, errors):
        seen.extend([1] * (items - errors))
        if len(seen) >= n:
            raise KeyboardInterrupt

    return on_progress


def extract(source: str, out_dir: str, settings, **asked):
    """One run as the tests ask it: ``run_request`` of ``RunRequest(source, out_dir, settings, **asked)``
    (``options``, ``part``, ``limit``, ``shard_size``...: the request's fields; ``on_plan``,
    ``on_progress``, ``on_signal``, ``stop``, ``on_phase``: the run's callbacks)."""
    from mimi_extract.config.request import RunRequest
    from mimi_extract.run.runner import run_request

    callbacks = {k: asked.pop(k) for k in ("on_plan", "on_progress", "on_signal", "stop", "on_phase") if k in asked}
    return run_request(RunRequest(source, out_dir, settings, **asked), **callbacks)
