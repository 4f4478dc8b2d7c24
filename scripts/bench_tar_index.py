"""The tar header index the tool owns (``sources/tar.py: index_tar``) against the same index built by
iterating the standard ``tarfile`` module (``_index_with_tarfile``, the tool's fallback), on one
uncompressed shard of small members as WebDataset shards hold them (an audio member and a JSON
sidecar per sample).  Process CPU time, best of ``--reps``; both see the page cache warm.

    python scripts/bench_tar_index.py [--members 10000] [--reps 5]
"""

from __future__ import annotations

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import io
import json
import os
import tarfile
import tempfile
import time

from mimi_extract.sources.tar import _index_with_tarfile, index_tar


def build(path: str, members: int) -> None:
    audio = bytes(4800)
    with tarfile.open(path, "w") as tf:
        for i in range(members // 2):
            for name, data in ((f"s{i:06d}.wav", audio), (f"s{i:06d}.json", json.dumps({"text": "x" * 40}).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def best(fn, path: str, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.process_time()
        fn(path)
        times.append(time.process_time() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "shard-000000.tar")
        build(path, args.members)
        ours, theirs = index_tar(path), _index_with_tarfile(path)
        assert [m[:3] for m in ours[0]] == [m[:3] for m in theirs[0]], "the two indexes differ"
        a, b = best(index_tar, path, args.reps), best(_index_with_tarfile, path, args.reps)
        print(f"{args.members} members, {os.path.getsize(path) / 2**20:.1f} MiB: index_tar {a:.3f} CPU s, "
              f"tarfile {b:.3f} CPU s -> {b / a:.2f}x")


if __name__ == "__main__":
    print(host_facts.header(), flush=True)
    main()
    print(host_facts.footer(), flush=True)
