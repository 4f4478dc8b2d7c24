"""The run's own process: its CPU per item (issue 40 item 2), side by side for two source trees.

A CLI run of N 1-s WAVs (16 kHz, mono), tiny seeded model, ``--device cpu --cpu-workers 2``, for N in
``--items`` (100 and 500): the marginal CPU of the run's own process (its threads, not its worker
processes: ``resource.getrusage(RUSAGE_SELF)`` when the CLI returns) per item is (CPU(500) -
CPU(100)) / 400, so start-up (imports, the model's load and hash, forking) cancels out.  Each tree
(``--trees``; ``--base REV`` adds REV of this repository, exported with ``git archive``) runs the
same command in a fresh interpreter, interleaved, ``--repeats`` times (the median is reported):
ratios between trees measured in one run, on one machine's load.  ``--profile`` adds a cProfile of
the last tree's largest run (the runner's process only), top functions by own time.

    python scripts/bench_runner.py --base 7af266a                # before (7af266a) vs this tree
    python scripts/bench_runner.py --trees . --profile --repeats 1
"""

from __future__ import annotations

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import numpy as np
import soundfile as sf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# what the fresh interpreter runs: the CLI in this process, then its own CPU (children excluded)
DRIVER = r"""
import json, resource, runpy, sys
out, profile = sys.argv[1], sys.argv[2]
sys.argv = ["mimi-extract"] + sys.argv[3:]

def cpu():
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime

from mimi_extract.engines.processes import ProcessEngine  # the encoding phase: this process's CPU inside run()
phase, original = {}, ProcessEngine.run

def timed(self, *a, **kw):
    phase["start"] = cpu()
    try:
        yield from original(self, *a, **kw)
    finally:
        phase["end"] = cpu()

ProcessEngine.run = timed
prof = None
if profile != "-":
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
try:
    runpy.run_module("mimi_extract", run_name="__main__")
except SystemExit as e:
    code = e.code
else:
    code = 0
if prof is not None:
    prof.disable()
    import pstats
    with open(profile, "w") as f:
        pstats.Stats(prof, stream=f).sort_stats("tottime").print_stats(25)
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
json.dump({"code": code, "self_cpu_s": me.ru_utime + me.ru_stime, "encoding_cpu_s": phase["end"] - phase["start"],
           "children_cpu_s": kids.ru_utime + kids.ru_stime}, open(out, "w"))
"""


def corpus(root: str, n: int) -> str:
    folder = os.path.join(root, f"wav-{n}")
    if not os.path.isdir(folder):
        os.makedirs(folder)
        rng = np.random.default_rng(0)
        for i in range(n):
            sf.write(os.path.join(folder, f"u{i:05d}.wav"), (0.1 * rng.standard_normal(16_000)).astype(np.float32),
                     16_000, subtype="PCM_16")
    return folder


def export(rev: str, where: str) -> str:
    """REV of this repository as a plain tree (``git archive``): the package as it was."""
    tree = os.path.join(where, f"tree-{rev}")
    if not os.path.isdir(tree):
        os.makedirs(tree)
        archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "mimi_extract"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
    return tree


def one_run(tree: str, source: str, out: str, model: str, workdir: str, profile: str = "-") -> dict:
    shutil.rmtree(out, ignore_errors=True)
    result = os.path.join(workdir, "result.json")
    env = {**os.environ, "PYTHONPATH": tree}
    args = ["codes", source, out, "--model", model, "--device", "cpu", "--cpu-workers", "2", "--num-workers", "1"]
    done = subprocess.run([sys.executable, "-c", DRIVER, result, profile, *args], env=env, capture_output=True,
                          text=True)
    r = json.load(open(result))
    assert r["code"] == 0 and done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="/tmp/mimi-bench-runner")
    p.add_argument("--trees", default=ROOT, help="comma-separated source trees (each holds mimi_extract/)")
    p.add_argument("--base", help="also this revision of the repository (before), exported with git archive")
    p.add_argument("--items", default="100,500")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--json")
    args = p.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    from mimi_extract.codec.demo import random_model

    model = os.path.join(args.workdir, "tiny-model")
    if not os.path.exists(model):
        random_model(seed=0).save_pretrained(model)
    trees = ([export(args.base, args.workdir)] if args.base else []) + [os.path.abspath(t) for t in args.trees.split(",")]
    counts = [int(n) for n in args.items.split(",")]
    runs: dict[str, dict[int, list[dict]]] = {t: {n: [] for n in counts} for t in trees}
    out = tempfile.mkdtemp(dir=args.workdir)
    for rep in range(args.repeats):
        for n in counts:
            for tree in trees:
                r = one_run(tree, corpus(args.workdir, n), os.path.join(out, "out"), model, args.workdir)
                runs[tree][n].append(r)
                print(f"repeat {rep} {n:5d} items {os.path.basename(tree):>24}: run's own process "
                      f"{r['self_cpu_s']:.2f} CPU s ({r['encoding_cpu_s']:.2f} encoding), its workers "
                      f"{r['children_cpu_s']:.2f}", flush=True)
    results = {}
    lo, hi = min(counts), max(counts)
    for tree in trees:
        own = {n: statistics.median(r["self_cpu_s"] for r in runs[tree][n]) for n in counts}
        enc = {n: statistics.median(r["encoding_cpu_s"] for r in runs[tree][n]) for n in counts}
        per_item, enc_item = (own[hi] - own[lo]) / (hi - lo), (enc[hi] - enc[lo]) / (hi - lo)
        results[tree] = {"self_cpu_s": own, "encoding_cpu_s": enc, "marginal_ms_per_item": 1e3 * per_item,
                         "encoding_marginal_ms_per_item": 1e3 * enc_item, "encoding_ms_per_item": 1e3 * enc[hi] / hi}
        print(f"{tree}: the run's own process {1e3 * per_item:.3f} ms CPU per 1-s item (marginal, {lo} -> {hi} items; "
              f"medians of {args.repeats}); its encoding phase alone {1e3 * enc_item:.3f} ms marginal, "
              f"{1e3 * enc[hi] / hi:.3f} ms per item at {hi}", flush=True)
    if len(trees) > 1:
        for key in ("marginal_ms_per_item", "encoding_marginal_ms_per_item", "encoding_ms_per_item"):
            first = results[trees[0]][key]
            for tree in trees[1:]:
                print(f"{key}: {os.path.basename(tree)} / {os.path.basename(trees[0])}: "
                      f"{results[tree][key] / first:.2f}x")
    if args.profile:
        profile = os.path.join(args.workdir, "profile.txt")
        one_run(trees[-1], corpus(args.workdir, hi), os.path.join(out, "out"), model, args.workdir, profile)
        print(open(profile).read())
    shutil.rmtree(out, ignore_errors=True)
    if args.json:
        json.dump({"results": results, "host": host_facts.report()}, open(args.json, "w"), indent=2)


if __name__ == "__main__":
    print(host_facts.header(), flush=True)
    main()
    print(host_facts.footer(), flush=True)
