"""The Ray driver's CPU with the actors writing their own shards (0.4.0) against the driver writing
every item (``--single-writer``: as before 0.4.0), side by side in one run, alternating.

    python scripts/bench_ray_writers.py --items 400 --seconds 8 --reps 2

A seeded random tiny Mimi on CPU actors (2) of a local cluster started once; for each run, the
driver process's CPU seconds (``time.process_time``: this process only, the actors are others)
spent in ``run_request`` and what it wrote itself. The tap is ``latent`` (fp32 latents, 25.6 KB per
audio second: what a writer moves most of); ``--tap codes`` for codes."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import soundfile as sf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import host_facts  # noqa: E402


def corpus(root: str, items: int, seconds: float) -> float:
    rng = np.random.default_rng(0)
    for i in range(items):
        n = int(16_000 * seconds * (0.5 + rng.random()))
        sf.write(os.path.join(root, f"u{i:05d}.wav"), (0.1 * rng.standard_normal(n)).astype(np.float32), 16_000)
    return sum(sf.info(os.path.join(root, f)).duration for f in os.listdir(root))


def one(source: str, out: str, model: str, tap: str, single_writer: bool) -> dict:
    from mimi_extract.config.request import RunRequest
    from mimi_extract.config.settings import Settings
    from mimi_extract.run.runner import run_request
    from mimi_extract.store.writer import ShardWriter

    shutil.rmtree(out, ignore_errors=True)
    added = [0]
    add = ShardWriter.add

    def counting(self, *a, **k):
        added[0] += 1
        return add(self, *a, **k)

    ShardWriter.add = counting
    try:
        settings = Settings(model=model, tap=tap, num_workers=1, engine="ray", ray_cpu_actors=2,
                            single_writer=single_writer)
        t_cpu, t_wall = time.process_time(), time.perf_counter()
        summary = run_request(RunRequest(source, out, settings, shard_size=100))
        cpu, wall = time.process_time() - t_cpu, time.perf_counter() - t_wall
    finally:
        ShardWriter.add = add
    return {"ok": summary.ok, "cpu": cpu, "wall": wall, "driver_stored": added[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=400)
    p.add_argument("--seconds", type=float, default=8.0, help="mean item length (0.5x to 1.5x)")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--tap", default="latent")
    args = p.parse_args()
    import logging

    import ray

    from mimi_extract.codec.demo import random_model

    work = tempfile.mkdtemp(prefix="bench-ray-writers-")
    try:
        src, model = os.path.join(work, "corpus"), os.path.join(work, "model")
        os.makedirs(src)
        audio = corpus(src, args.items, args.seconds)
        random_model().save_pretrained(model)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        one(src, os.path.join(work, "warm"), model, args.tap, False)  # imports, actors' first start
        print(f"{args.items} items, {audio:.0f} audio s, tap {args.tap}, 2 CPU actors; driver CPU per run:")
        for rep in range(args.reps):
            for single in (True, False):
                r = one(src, os.path.join(work, "out"), model, args.tap, single)
                what = "driver writes every item (--single-writer)" if single else "actors write their shards"
                print(f"  rep {rep}  {what:44s} driver {r['cpu']:6.2f} CPU s = {1e6 * r['cpu'] / audio:6.0f} us "
                      f"per audio s; stored by the driver {r['driver_stored']}/{r['ok']}; wall {r['wall']:.1f} s",
                      flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    print(host_facts.header(), flush=True)
    main()
    print(host_facts.footer(), flush=True)
