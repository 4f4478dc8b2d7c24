"""Reader at scale: build an OUT of N tiny items with the real shard writer (no encoding), then time
``mimi_extract.open`` (wall and CPU), random ``reader[key]`` / ``read()`` calls, lazy ``read_cuts``,
peak RSS, and the old way (a manifest scan per ``read``) side by side.

    .venv/bin/python scripts/bench_reader.py --items 100000
"""

from __future__ import annotations

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import json
import os
import random
import resource
import tempfile
import time

import numpy as np


def build(out: str, n: int, shard_size: int) -> list[str]:
    from mimi_extract.formats import get_format
    from mimi_extract.store.files import write_atomic
    from mimi_extract.store.manifest import ManifestRow
    from mimi_extract.store.writer import ShardWriter

    os.makedirs(out, exist_ok=True)
    info = {"model": "tiny", "tap": "codes", "num_quantizers": 8, "framing": "transformers", "channel": "mix",
            "dtype": "fp32", "feature_dtype": "float32", "input": "/corpus", "input_kind": "directory", "part": "whole"}
    write_atomic(os.path.join(out, "run.json"), json.dumps(info))
    w = ShardWriter(out, get_format("hdf5"), {"tap": "codes", "layout": "[frames, num_quantizers]"}, max_items=shard_size)
    rng = np.random.default_rng(0)
    keys = []
    for i in range(n):
        key, frames = f"spk{i % 97}/utt{i}.wav", 20 + i % 60
        w.add(key, rng.integers(0, 2048, (frames, 8), dtype=np.int16),
              ManifestRow(key, path=key, dataset=key.replace("/", "%2F"), channel=None, sample_rate=24000,
                          duration=frames * 0.08, frames=frames, dims=8,
                          source={"path": f"/corpus/{key}", "frames": frames * 1920, "channels": 1}))
        keys.append(key)
    w.close()
    return keys


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--shard-size", type=int, default=1000)
    ap.add_argument("--reads", type=int, default=2000)
    ap.add_argument("--old-reads", type=int, default=3)
    args = ap.parse_args()
    import mimi_extract
    from mimi_extract.store.manifest import read_manifest
    from mimi_extract.formats.records import StoredRow
    from mimi_extract.store.read import load_row

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        t = time.perf_counter()
        keys = build(out, args.items, args.shard_size)
        print(f"built {args.items} items in {time.perf_counter() - t:.1f} s")
        picks = random.Random(0).sample(keys, min(args.reads, len(keys)))

        w, c = time.perf_counter(), time.process_time()
        reader = mimi_extract.open(out)
        print(f"open: {time.perf_counter() - w:.2f} s wall, {time.process_time() - c:.2f} s CPU, {len(reader)} keys")
        w, c = time.perf_counter(), time.process_time()
        for k in picks:
            reader[k]
        n = len(picks)
        print(f"reader[key] random: {(time.perf_counter() - w) / n * 1e3:.3f} ms wall, "
              f"{(time.process_time() - c) / n * 1e3:.3f} ms CPU per item")
        mimi_extract.read(out, picks[0])
        w = time.perf_counter()
        for k in picks:
            mimi_extract.read(out, k)
        print(f"read(OUT, key) cached: {(time.perf_counter() - w) / n * 1e3:.3f} ms per call")
        w = time.perf_counter()
        cuts = mimi_extract.read_cuts(out)
        first = next(iter(cuts))
        print(f"read_cuts: first cut after {time.perf_counter() - w:.2f} s ({first.id})")
        w = time.perf_counter()
        for k in picks[: args.old_reads]:  # before: every read() scanned every manifest
            row = next(r for r in read_manifest(out) if r["key"] == k and r["status"] == "ok")
            load_row(out, StoredRow.from_dict(row))
        print(f"old read (manifest scan per call): {(time.perf_counter() - w) / args.old_reads:.2f} s per call")
        print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    print(host_facts.header(), flush=True)
    main()
    print(host_facts.footer(), flush=True)
