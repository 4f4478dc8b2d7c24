"""Peak memory on hostile sizes (docs/inputs.md#bounded-memory): a ``.tar.gz`` whose members expand
to gigabytes (a few MiB compressed), a ``.tar.gz`` sample of 2,000 members repeated under one name,
a Parquet file with one 300 MB cell (alone in its row group, and sharing one: snappy, pyarrow's
default, and zstd, a codec that streams), and a plain WAV shard
for comparison; each probed (``discover``, what planning does) and its largest item read through
(``AudioReader`` chunk by chunk, what an encoder process does), in a fresh interpreter whose peak
RSS (``VmHWM``) is reported.

    python scripts/bench_memory.py [--before CHECKOUT] [--gib 3] [--cell-mb 300] [--folder DIR] [--only plain,dup]

``--before``: a checkout of an older commit, measured the same way, side by side.
"""

from __future__ import annotations

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, sys, time


def hwm_mib():  # this process's peak RSS (VmHWM: reset at exec, unlike ru_maxrss, which keeps the parent's)
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM")) / 1024


try:
    from mimi_extract.audio.reader import AudioReader
except ImportError:  # a checkout from before the audio package (--before)
    from mimi_extract.audio import AudioReader
from mimi_extract.sources import discover, open_audio
path, env = sys.argv[1], json.loads(sys.argv[2])
import os
os.environ.update(env)
t = time.time()
found = discover(path)
probed = hwm_mib()
biggest = max(found.items, key=lambda i: i.frames, default=None)
samples = 0
if biggest is not None:
    reader = AudioReader(open_audio(biggest), biggest.channel, start=biggest.start, frames=biggest.frames)
    while True:
        chunk, final = reader.next_chunk(24_000 * 30)
        samples += len(chunk)
        if final:
            break
peak = hwm_mib()
print(json.dumps({"items": len(found.items), "errors": [b.error for b in found.bad][:3], "probe_mib": probed,
                  "peak_mib": peak, "read_samples": samples, "seconds": time.time() - t}))
"""


def wav_bytes(seconds: float, rate: int = 48_000, channels: int = 2, noise: bool = True) -> bytes:
    """A 16-bit WAV of near-silence (``noise``: a 1-LSB dither), or of digital silence (gzip packs it ~1000:1)."""
    import soundfile as sf

    n = int(seconds * rate)
    rng = np.random.default_rng(0)
    data = (rng.integers(-1, 2, (n, channels)) if noise else np.zeros((n, channels))).astype(np.int16)
    buffer = io.BytesIO()
    sf.write(buffer, data, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def make_bomb(path: str, gib: float) -> None:
    """``gib`` GiB of silent WAV members (3 members) in one .tar.gz of a few MiB."""
    each = gib * (1 << 30) / 3 / (48_000 * 4)
    with tarfile.open(path, "w:gz", compresslevel=6) as tf:
        for i in range(3):
            data = wav_bytes(each, noise=False)
            info = tarfile.TarInfo(f"long{i}.wav")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
            meta = json.dumps({"text": f"member {i}"}).encode()
            info = tarfile.TarInfo(f"long{i}.json")
            info.size = len(meta)
            tf.addfile(info, io.BytesIO(meta))


def make_parquet(path: str, cell_mb: float, row_group_size: int = 1, compression: str = "snappy") -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    big = wav_bytes(cell_mb * (1 << 20) / (48_000 * 4))
    small = wav_bytes(1.0)
    table = pa.table({"audio": [{"bytes": small, "path": "a.wav"}, {"bytes": big, "path": "big.wav"},
                                {"bytes": small, "path": "c.wav"}], "text": ["a", "big", "c"]})
    pq.write_table(table, path, row_group_size=row_group_size, compression=compression)


def make_dup(path: str, count: int = 2000) -> None:
    """A sample of ``count`` consecutive 1 MiB ``dup.wav`` members (silence: a few MiB in all),
    between two 1 s samples: only its first ``dup.wav`` is its audio (the largest item, read through)."""
    with tarfile.open(path, "w:gz", compresslevel=6) as tf:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        add("a.wav", wav_bytes(1.0))
        one = wav_bytes((1 << 20) / (48_000 * 4), noise=False)
        for _ in range(count):
            add("dup.wav", one)
        add("z.wav", wav_bytes(1.0))


def make_plain(path: str) -> None:
    with tarfile.open(path, "w") as tf:
        for i in range(20):
            data = wav_bytes(10.0)
            info = tarfile.TarInfo(f"u{i}.wav")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def measure(checkout: str, path: str, env: dict) -> dict:
    run = subprocess.run([sys.executable, "-c", CHILD, path, json.dumps(env)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": checkout, "OMP_NUM_THREADS": "1"}, cwd=checkout)
    if run.returncode:
        return {"failed": run.stderr.strip().splitlines()[-1] if run.stderr.strip() else run.returncode}
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="a checkout of an older commit, measured side by side")
    parser.add_argument("--gib", type=float, default=3.0, help="decompressed size of the .tar.gz bomb's members")
    parser.add_argument("--cell-mb", type=float, default=300.0, help="size of the large Parquet cell")
    parser.add_argument("--folder", help="where to write the inputs (default: a temporary folder)")
    parser.add_argument("--only", help="comma-separated inputs to measure: plain, bomb, dup, cells, cells-shared, "
                                       "cells-shared-zstd (default: all)")
    args = parser.parse_args()
    folder = args.folder or tempfile.mkdtemp(prefix="bench-memory-")
    os.makedirs(folder, exist_ok=True)
    paths = {"plain": os.path.join(folder, "plain.tar"), "bomb": os.path.join(folder, "bomb.tar.gz"),
             "dup": os.path.join(folder, "dup.tar.gz"), "cells": os.path.join(folder, "cells.parquet"),
             "cells-shared": os.path.join(folder, "cells-shared.parquet"),
             "cells-shared-zstd": os.path.join(folder, "cells-shared-zstd.parquet")}
    makers = {"plain": make_plain, "bomb": lambda p: make_bomb(p, args.gib), "dup": make_dup,
              "cells": lambda p: make_parquet(p, args.cell_mb),
              "cells-shared": lambda p: make_parquet(p, args.cell_mb, row_group_size=3),
              "cells-shared-zstd": lambda p: make_parquet(p, args.cell_mb, row_group_size=3, compression="zstd")}
    only = args.only.split(",") if args.only else list(paths)
    paths = {k: v for k, v in paths.items() if k in only}
    for what, path in paths.items():
        if not os.path.exists(path):
            makers[what](path)
        print(f"{what}: {os.path.getsize(path) / (1 << 20):.1f} MiB on disk", file=sys.stderr)
    raised = {"MIMI_EXTRACT_MAX_CELL_MB": str(args.cell_mb * 2)}
    inputs = {"plain": ("plain .tar (20 x 10 s WAV)", {}),
              "bomb": (f".tar.gz bomb ({args.gib:g} GiB of WAV)", {}),
              "dup": (".tar.gz, a sample of 2,000 x 1 MiB members named dup.wav", {}),
              "cells": (f"Parquet, one {args.cell_mb:g} MB cell (default limit: refused)", {}),
              "cells-raised": (f"Parquet, one {args.cell_mb:g} MB cell (limit raised: read)", raised),
              "cells-shared": (f"Parquet, one {args.cell_mb:g} MB cell sharing its row group (refused)", {}),
              "cells-shared-zstd": (f"Parquet (zstd), one {args.cell_mb:g} MB cell sharing its row group (refused)",
                                    {})}
    inputs = {name: (paths[what.removesuffix("-raised")], env) for what, (name, env) in inputs.items()
              if what.removesuffix("-raised") in paths}
    checkouts = {"now": ROOT, **({"before": os.path.abspath(args.before)} if args.before else {})}
    print("| input | " + " | ".join(f"{c}: peak RSS probing / reading (MiB)" for c in checkouts) + " |")
    print("|---|" + "---|" * len(checkouts))
    for name, (path, env) in inputs.items():
        cells = []
        for checkout in checkouts.values():
            r = measure(checkout, path, env)
            cells.append(f"failed: {r['failed']}" if "failed" in r else
                         f"{r['probe_mib']:.0f} / {r['peak_mib']:.0f} ({r['items']} items, {r['read_samples']} samples read)")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    print(host_facts.header(), flush=True)
    main()
    print(host_facts.footer(), flush=True)
