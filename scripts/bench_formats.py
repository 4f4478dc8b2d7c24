"""Output formats side by side: write throughput, bytes on disk, and the reading side.

    python scripts/bench_formats.py --items 20000 --workdir /tmp/bench-formats

For each format (every one registered: hdf5, parquet, shar, megatron) on the same synthetic corpus
of codes (int16 [frames, 8], frames uniform in 25..250: 2-20 s items at 12.5 Hz):

* **write**: the real ShardWriter (the format's in-memory shard + the shared commit protocol with
  its fsyncs), items/s and MiB/s of arrays, relative to HDF5, per wall second and per CPU second
  of the writing process (what a writer costs the host's cores, with the disk's waits left out);
  Megatron with its default token layout (flat, offset 0; ``--megatron-layout`` for the other);
* **bytes on disk** of the shards;
* **end to end** (``--e2e-items``): ``extract`` with a tiny random Mimi on short wav files, wall
  seconds relative to HDF5 (encoding dominates; the writer's share is what differs);
* **read**, each in a fresh subprocess (items/s of the loop, imports and set-up excluded; peak
  RSS of that process, VmHWM): ``mimi_extract.open``
  iteration; a lhotse DataLoader over ``read_cuts`` (SimpleCutSampler, batches of 64 cuts,
  ``load_custom`` per cut); for Parquet also a ``datasets`` streaming iteration
  (``load_dataset("parquet", streaming=True)``, rows as numpy).

Prints one table (markdown) and writes it to WORKDIR/bench_formats.json.
"""

from __future__ import annotations

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

INFO = {"model": "synthetic", "tap": "codes", "num_quantizers": 8, "framing": "transformers", "channel": "mix",
        "dtype": "fp32", "feature_dtype": "float32", "input": "/synthetic", "input_kind": "directory",
        "weights": "0" * 24, "config_hash": "0" * 16, "part": "whole"}


def synthetic(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for i in range(n):
        frames = int(rng.integers(25, 251))
        yield f"spk{i % 97:02d}/utt{i:06d}.wav", rng.integers(0, 2048, (frames, 8), dtype=np.int16)


def write(fmt_name: str, out: str, n: int, layout: str = "flat") -> dict:
    from types import SimpleNamespace

    from mimi_extract.formats import get_format
    from mimi_extract.config.settings import Settings
    from mimi_extract.store.files import write_atomic
    from mimi_extract.store.manifest import ManifestRow
    from mimi_extract.store.writer import ShardWriter
    from mimi_extract.store.cuts import write_cuts
    from mimi_extract.sources import dataset_name

    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    write_atomic(os.path.join(out, "run.json"), json.dumps({**INFO, "format": fmt_name}))
    attrs = {"tap": "codes", "frame_rate": 12.5, "sample_rate": 24000, "num_quantizers": 8,
             "layout": "[frames, num_quantizers]"}
    # the format's own settings (Megatron: token layout, offset, codebook size, dtype), as a run records them
    attrs.update(get_format(fmt_name).run_settings(Settings(tap="codes", format=fmt_name, token_layout=layout),
                                                   SimpleNamespace(codebook_size=2048)))
    items = list(synthetic(n))
    nbytes = sum(a.nbytes for _, a in items)
    if not out.endswith("-warmup"):  # one small untimed shard first: every import and first call done
        write(fmt_name, out + "-warmup", 50, layout)
    started, cpu_started = time.perf_counter(), time.process_time()
    w = ShardWriter(out, get_format(fmt_name), attrs, max_items=1000)
    for key, data in items:
        frames = data.shape[0]
        row = {"path": key, "key": key, "dataset": dataset_name(key), "channel": None, "sample_rate": 24000,
               "duration": frames * 0.08, "frames": frames, "dims": 8,
               "source": {"path": f"/synthetic/{key}", "frames": frames * 1920, "channels": 1}}
        w.add(key, data, ManifestRow(**row), {"duration": frames * 0.08})
    w.close()
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    if out.endswith("-warmup"):
        shutil.rmtree(out)
        return {}
    write_cuts(out)
    from mimi_extract.store.manifest import format_files

    shards = [name for name, _ in format_files(out)]  # every format's files (Shar: shar/cuts.* + shar/<field>.*)
    return {"items": n, "write_s": seconds, "items_per_s": n / seconds, "array_mib_per_s": nbytes / 2**20 / seconds,
            "cpu_s": cpu, "items_per_cpu_s": n / cpu, "array_mib_per_cpu_s": nbytes / 2**20 / cpu,
            "array_mib": nbytes / 2**20, "disk_mib": sum(os.path.getsize(os.path.join(out, f)) for f in shards) / 2**20,
            "shards": len(shards)}


# each reader: (imports and set-up, untimed; the timed loop, counting items in n)
READERS = {
    "mimi_extract.open": ("""
import mimi_extract
from mimi_extract.formats import get_format
if FORMAT != "megatron":  # (Megatron's shards are read with numpy alone: megatron-core is the writer's library)
    get_format(FORMAT).require()  # the format's library imported before the clock starts (only its own)
reader = mimi_extract.open(OUT)
""", """
for key, data in reader:
    n += 1
"""),
    "lhotse DataLoader": ("""
import torch, lhotse
from lhotse.dataset import SimpleCutSampler
import mimi_extract
class Codes(torch.utils.data.Dataset):
    def __getitem__(self, batch):
        return [torch.from_numpy(c.load_custom("mimi_codes")) for c in batch]
""", """
cuts = mimi_extract.read_cuts(OUT)
loader = torch.utils.data.DataLoader(Codes(), sampler=SimpleCutSampler(cuts, max_cuts=64), batch_size=None, num_workers=0)
for batch in loader:
    n += len(batch)
"""),
    "datasets streaming": ("""
import numpy as np
from datasets import load_dataset
""", """
ds = load_dataset("parquet", data_files=OUT + "/shard-*.parquet", split="train", streaming=True).with_format("numpy")
for row in ds:
    codes = row["codes"]
    n += 1
"""),
    "datasets streaming, batches of 64": ("""
from datasets import load_dataset
""", """
ds = load_dataset("parquet", data_files=OUT + "/shard-*.parquet", split="train", streaming=True).with_format("numpy")
for batch in ds.iter(batch_size=64):
    n += len(batch["key"])
"""),
    "datasets (Arrow cache, built untimed)": ("""
from datasets import load_dataset
ds = load_dataset("parquet", data_files=OUT + "/shard-*.parquet", split="train").with_format("numpy")
""", """
for row in ds:
    codes = row["codes"]
    n += 1
"""),
}


def _peak_rss_mib() -> str:
    return "open('/proc/self/status').read().split('VmHWM:')[1].split()[0]"  # kB; reset by exec, unlike ru_maxrss


def read(reader: str, out: str, cache: str, fmt_name: str) -> dict:
    setup, loop = READERS[reader]
    code = (f"import sys, time\nOUT = sys.argv[1]\nFORMAT = {fmt_name!r}\n" + setup + "\nn = 0\nt0 = time.perf_counter()\n" + loop
            + f"\nprint(n, time.perf_counter() - t0, {_peak_rss_mib()})\n")
    env = {**os.environ, "PYTHONPATH": ROOT, "HF_DATASETS_CACHE": cache, "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code, out], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1]}
    n, seconds, rss_kb = proc.stdout.split()[-3:]
    return {"items": int(n), "read_s": float(seconds), "items_per_s": int(n) / float(seconds),
            "peak_rss_mib": int(rss_kb) / 1024}


def end_to_end(fmt_name: str, corpus: str, out: str, model: str) -> float:
    from mimi_extract.config.request import RunRequest
    from mimi_extract.run.runner import run_request
    from mimi_extract.config.settings import Settings

    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    summary = run_request(RunRequest(corpus, out, Settings(model=model, tap="codes", num_workers=1, devices=("cpu",), format=fmt_name)))
    assert summary.errors == 0, summary
    return time.perf_counter() - started


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--items", type=int, default=20_000)
    p.add_argument("--e2e-items", type=int, default=300, help="short wav files for the end-to-end run (0: skip)")
    p.add_argument("--workdir", default="/tmp/bench-formats")
    p.add_argument("--formats", default=None, help="comma-separated (default: every registered format; hdf5 always)")
    p.add_argument("--megatron-layout", default="flat", choices=["flat", "per-codebook"])
    args = p.parse_args()
    from mimi_extract.formats import names

    chosen = ["hdf5"] + [n for n in (args.formats.split(",") if args.formats else names()) if n != "hdf5"]
    os.makedirs(args.workdir, exist_ok=True)
    results = {}
    for name in chosen:
        out = os.path.join(args.workdir, f"out-{name}")
        results[name] = {"write": write(name, out, args.items, args.megatron_layout), "read": {}}
        for reader in READERS:
            if reader.startswith("datasets") and name != "parquet":
                continue
            results[name]["read"][reader] = read(reader, out, os.path.join(args.workdir, "hf-cache"), name)
        print(name, json.dumps(results[name]), flush=True)
    if args.e2e_items:
        import soundfile as sf

        from mimi_extract.codec.demo import random_model

        corpus, model = os.path.join(args.workdir, "corpus"), os.path.join(args.workdir, "model")
        if not os.path.exists(model):
            random_model().save_pretrained(model)
        if not os.path.exists(corpus):
            os.makedirs(corpus)
            rng = np.random.default_rng(0)
            for i in range(args.e2e_items):
                sf.write(os.path.join(corpus, f"f{i:05d}.wav"), (0.1 * rng.standard_normal(int(24000 * rng.uniform(0.3, 1.0)))).astype(np.float32), 24000)
        for name in chosen:
            results[name]["e2e_s"] = end_to_end(name, corpus, os.path.join(args.workdir, f"e2e-{name}"), model)
    base = results["hdf5"]
    lines = ["| format | write items/s (x HDF5) | array MiB/s | items / CPU s (x HDF5) | array MiB / CPU s | disk MiB (x HDF5) "
             "| end to end s (x HDF5) | reader | read items/s | peak RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        w = r["write"]
        e2e = f"{r['e2e_s']:.1f} ({r['e2e_s'] / base['e2e_s']:.2f})" if "e2e_s" in r else "-"
        first = True
        for reader, rr in r["read"].items():
            head = (f"| {name} | {w['items_per_s']:.0f} ({w['items_per_s'] / base['write']['items_per_s']:.2f}) | "
                    f"{w['array_mib_per_s']:.1f} | {w['items_per_cpu_s']:.0f} "
                    f"({w['items_per_cpu_s'] / base['write']['items_per_cpu_s']:.2f}) | {w['array_mib_per_cpu_s']:.1f} | "
                    f"{w['disk_mib']:.1f} ({w['disk_mib'] / base['write']['disk_mib']:.2f}) | {e2e} "
                    if first else "| | | | | | | ")
            body = (f"| {reader} | {rr['items_per_s']:.0f} | {rr['peak_rss_mib']:.0f} |" if "error" not in rr
                    else f"| {reader} | error: {rr['error']} | |")
            lines.append(head + body)
            first = False
    table = "\n".join(lines)
    print(f"\n{args.items} items of int16 codes [25..250 frames, 8]; {base['write']['array_mib']:.1f} MiB of arrays\n")
    print(table)
    with open(os.path.join(args.workdir, "bench_formats.json"), "w") as f:
        json.dump({"results": results, "table": table, "host": host_facts.report()}, f, indent=2)


if __name__ == "__main__":
    print(host_facts.header(), flush=True)
    main()
    print(host_facts.footer(), flush=True)
