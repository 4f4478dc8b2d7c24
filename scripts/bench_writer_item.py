"""The writer's CPU per item (issue 40 item 2): ``HDF5Shard.add`` and the whole of a shard's filling
(``store.writer._Filling._fill``: the row's copies, the format's add, the checksum), side by side for
source trees, each in fresh processes, alternating:

    python scripts/bench_writer_item.py --trees /path/to/before,.          # 5 processes per tree
    python scripts/bench_writer_item.py --trees . --items 274 --repeats 3 --json writer.json

Each process fills three shards of ``--items`` codes items (int16 [F, 8], F = 25..250 frames: 2-20 s
at 12.5 Hz, the transposed views an encoder hands over, rows as ``ManifestRow.for_item`` makes
them), thread CPU per item: the **first** shard (a fresh process: every shape new, the heap
growing, as in ``bench_ceilings.py --sections feed``'s one shard), a **second** one of shapes not
seen before (a warm heap), a **third** of the second's shapes (the steady state of a long run,
whose shapes have all been seen).  Medians over the processes, ranges in brackets.  Figures:
docs/performance.md."""

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DRIVER = r"""
import json, sys, time
import numpy as np
from mimi_extract.formats import get_format
from mimi_extract.formats import hdf5
from mimi_extract.sources.keys import dataset_name
from mimi_extract.store.manifest import ManifestRow
from mimi_extract.store.writer import _Filling

items = int(sys.argv[1])
FILE_ATTRS = {"tap": "codes", "model": "kyutai/mimi", "weights": "da6b0984e74bde55afe6b912", "framing": "transformers",
              "config_hash": "290392974bf177a3", "tool_version": "0.4.0", "dtype": "fp32",
              "layout": "[frames, num_quantizers]", "num_quantizers": 8, "frame_rate": 12.5, "sample_rate": 24000}
spent = [0.0]
add = hdf5.HDF5Shard.add
def timed_add(self, *a):
    t = time.thread_time()
    try:
        return add(self, *a)
    finally:
        spent[0] += time.thread_time() - t
hdf5.HDF5Shard.add = timed_add

class Filling(_Filling):
    def commit(self):
        self._take("shard-00000.h5")

rng = np.random.default_rng(0)
frames = rng.integers(12, 125, items) * 2  # even; the first shard's are odd: every shape new to it
shards = [[rng.integers(0, 2048, (8, int(f) + odd), dtype=np.int16).T for f in frames] for odd in (1, 0, 0)]
result = {}
for phase, arrays in zip(("first", "new shapes", "steady"), shards):
    rows = []
    for i, data in enumerate(arrays):
        key = f"spk{i % 7}/utt{i:05d}.flac"
        rows.append((key, data, ManifestRow(key, path=key, dataset=dataset_name(key), sample_rate=16000,
                                            duration=round(len(data) / 12.5, 4),
                                            source={"path": "/corpus/" + key, "frames": len(data) * 1280, "channels": 1}),
                     {"duration": len(data) / 12.5, "source_sample_rate": 16000}))
    writer = Filling(get_format("hdf5"), FILE_ATTRS, 10**9, 1 << 40)
    spent[0] = 0.0
    t = time.thread_time()
    for key, data, row, attrs in rows:
        writer._fill(key, data, row, attrs)
    fill = time.thread_time() - t
    writer.commit()
    result[phase] = {"add_us": spent[0] / items * 1e6, "fill_us": fill / items * 1e6}
import mimi_extract
result["package"] = mimi_extract.__file__
print(json.dumps(result))
"""


def one(tree: str, items: int) -> dict:
    env = {**os.environ, "PYTHONPATH": tree}  # (run from the tree: ``-c`` puts the working directory first)
    done = subprocess.run([sys.executable, "-c", DRIVER, str(items)], env=env, cwd=tree, capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trees", default=ROOT, help="comma-separated source trees (each holds mimi_extract/)")
    p.add_argument("--items", type=int, default=274, help="items per shard (274: bench_ceilings' 3000 s FLAC corpus)")
    p.add_argument("--repeats", type=int, default=5, help="processes per tree")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    runs: dict[str, list[dict]] = {t: [] for t in trees}
    for r in range(args.repeats):
        for tree in (trees if r % 2 == 0 else trees[::-1]):  # alternating: before first, then after first
            runs[tree].append(one(tree, args.items))
    results = {}
    for tree, got in runs.items():
        results[tree] = {}
        assert all(g.pop("package").startswith(tree + os.sep) for g in got), f"{tree}: another tree's package ran"
        for phase in got[0]:
            row = {}
            for what in ("add_us", "fill_us"):
                values = [g[phase][what] for g in got]
                row[what] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
            results[tree][phase] = row
            print(f"{os.path.basename(tree) or tree:>16} {phase:>10}: HDF5Shard.add {row['add_us']['median']:6.1f} us "
                  f"({row['add_us']['min']:.1f}-{row['add_us']['max']:.1f}), whole _fill {row['fill_us']['median']:6.1f} "
                  f"({row['fill_us']['min']:.1f}-{row['fill_us']['max']:.1f}) per item", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"host": host_facts.report(), "items": args.items, "repeats": args.repeats, "results": results}, f,
                      indent=1)


if __name__ == "__main__":
    print(host_facts.header(), flush=True)
    main()
    print(host_facts.footer(), flush=True)
