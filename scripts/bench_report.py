"""``mimi-extract report`` at scale: build an OUT of N items with the real shard writer (no encoding:
random int16 codes, 8 codebooks of 2048, 1.6-17.5 s items, 1 % error rows, 97 top-level folders),
then time the report in a fresh process (the CLI, as a user runs it): wall, CPU and peak RSS.

    .venv/bin/python scripts/bench_report.py --items 100000 [--format hdf5|parquet|shar] [--png]
"""

from __future__ import annotations

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def build(out: str, n: int, shard_size: int, fmt: str) -> None:
    from mimi_extract.formats import get_format
    from mimi_extract.store.files import write_atomic
    from mimi_extract.store.manifest import ManifestRow
    from mimi_extract.store.writer import ShardWriter

    os.makedirs(out, exist_ok=True)
    info = {"model": "kyutai/mimi", "weights": "sha256:0123456789abcdef", "tap": "codes", "num_quantizers": 8,
            "framing": "transformers", "channel": "mix", "dtype": "fp32", "feature_dtype": "float32",
            "format": fmt, "input": "/corpus", "input_kind": "directory", "part": "whole"}
    write_atomic(os.path.join(out, "run.json"), json.dumps(info))
    attrs = {"tap": "codes", "layout": "[frames, num_quantizers]", "num_quantizers": 8, "model": "kyutai/mimi"}
    w = ShardWriter(out, get_format(fmt), attrs, max_items=shard_size)
    rng = np.random.default_rng(0)
    for i in range(n):
        key = f"spk{i % 97}/utt{i}.wav"
        row = {"path": key, "key": key, "dataset": key.replace("/", "%2F"), "channel": None, "sample_rate": 24000}
        if i % 100 == 99:
            w.add_error(ManifestRow(**row, duration=0.0), ["cannot decode 'x.wav'", "0 samples", "file is empty"][i % 3])
            continue
        frames = 20 + (i * 7919) % 200
        # Zipf-like code use, as a trained codebook's: a few codes common, many rare
        codes = np.minimum(rng.zipf(1.3, (frames, 8)) - 1, 2047).astype(np.int16)
        w.add(key, codes, ManifestRow(**row, duration=frames * 0.08, frames=frames, dims=8,
                                      source={"path": f"/corpus/{key}", "frames": frames * 1920, "channels": 1}),
              {"duration": frames * 0.08})
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--shard-size", type=int, default=1000)
    ap.add_argument("--format", default="hdf5", choices=["hdf5", "parquet", "shar"])
    ap.add_argument("--png", action="store_true", help="also write the figure")
    ap.add_argument("--keep", help="build (or reuse) the OUT here instead of a temporary folder")
    ap.add_argument("--workers", type=int, help="report --workers (default: its own)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        out = args.keep or os.path.join(tmp, "out")
        if not os.path.exists(os.path.join(out, "manifest.jsonl")):
            t = time.perf_counter()
            build(out, args.items, args.shard_size, args.format)
            print(f"built {args.items} items ({args.format}) in {time.perf_counter() - t:.1f} s")
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
        print(f"OUT: {size / 2**20:.0f} MiB")
        cmd = [sys.executable, "-m", "mimi_extract", "report", out, "--json"]
        if args.workers:
            cmd += ["--workers", str(args.workers)]
        if args.png:
            cmd += ["--png", os.path.join(tmp, "report.png")]
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        stdout = p.stdout.read()
        # wait4: this child's own usage (with its worker processes), not every child this script had
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        if os.waitstatus_to_exitcode(status):
            sys.exit(f"report failed: {' '.join(cmd)}")
        report = json.loads(stdout)
        cpu = usage.ru_utime + usage.ru_stime
        print(f"report: {wall:.1f} s wall, {cpu:.1f} s CPU (report + workers), peak RSS {usage.ru_maxrss / 1024:.0f} MiB "
              "(largest process) "
              f"({report['items']} items, {report['errors']} errors, {len(report['subsets'])} subsets, "
              f"{report['tokens']} tokens, {report['hours']:.1f} h)")
        books = report["codebooks"]["per_codebook"]
        print("perplexity per codebook: " + ", ".join(f"{b['perplexity']:.0f}" for b in books)
              + f"; unused codes: {books[0]['unused']}")


if __name__ == "__main__":
    print(host_facts.header(), flush=True)
    main()
    print(host_facts.footer(), flush=True)
