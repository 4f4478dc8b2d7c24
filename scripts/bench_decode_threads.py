"""Decoding threads in one process, per decoder (issue 40 item 2): a corpus's files opened with the
decoder the tool picks and read to their ends in ``BLOCK`` reads, by a ``ThreadPoolExecutor`` of N
threads, each setting in a fresh process, alternating:

    python scripts/bench_decode_threads.py --corpus /tmp/ceilings/corpus/opus48k-300s-0 --threads 1,2
    python scripts/bench_decode_threads.py --corpus DIR --threads 1,2 --repeats 3 --no-turns --json t.json

Reported: process CPU per audio second and throughput (audio seconds per wall second).  With
``--no-turns`` FFmpeg's decodes do not take turns (``decoders.FFMPEG_TURNS`` replaced by a lock
nobody shares): what two PyAV decodes at once cost, against what the tool does.  Corpora:
``scripts/bench_ceilings.py --sections feed`` makes them (``WORKDIR/corpus/NAME-SECONDS-0``).
Figures: docs/performance.md ("FFmpeg decodes take turns in a process")."""

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import json
import os
import statistics
import subprocess
import sys

DRIVER = r"""
import contextlib, json, os, sys, time
from concurrent.futures import ThreadPoolExecutor
from mimi_extract.audio import decoders

corpus, threads, turns = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "turns"
if not turns:
    decoders.FFMPEG_TURNS = contextlib.nullcontext()
paths = sorted(os.path.join(d, f) for d, _, files in os.walk(corpus) for f in files if not f.startswith("."))

def decode(path):
    f = decoders.open_decoder(path, span=(0, None))
    n = 0
    while True:
        got = len(decoders.read_frames(f, decoders.BLOCK))
        n += got
        if got < decoders.BLOCK:
            break
    f.close()
    return n / f.samplerate

t, cpu = time.perf_counter(), time.process_time()
with ThreadPoolExecutor(threads) as pool:
    audio = sum(pool.map(decode, paths))
cpu, wall = time.process_time() - cpu, time.perf_counter() - t
print(json.dumps({"us_per_audio_s": cpu / audio * 1e6, "x_real_time": audio / wall, "audio_s": audio}))
"""


def one(corpus: str, threads: int, turns: bool) -> dict:
    run = subprocess.run([sys.executable, "-c", DRIVER, corpus, str(threads), "turns" if turns else "free"],
                         capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().split("\n")[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", required=True, help="a folder of audio files")
    p.add_argument("--threads", default="1,2", help="thread counts to compare")
    p.add_argument("--repeats", type=int, default=2, help="processes per setting")
    p.add_argument("--no-turns", action="store_true", help="also run without FFmpeg's turns")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    settings = [(int(n), True) for n in args.threads.split(",")]
    if args.no_turns:
        settings += [(n, False) for n, _ in settings if n > 1]
    runs: dict[tuple[int, bool], list[dict]] = {s: [] for s in settings}
    for r in range(args.repeats):
        for s in (settings if r % 2 == 0 else settings[::-1]):
            runs[s].append(one(args.corpus, *s))
    results = []
    for (threads, turns), got in runs.items():
        cpu = [g["us_per_audio_s"] for g in got]
        speed = [g["x_real_time"] for g in got]
        results.append({"threads": threads, "turns": turns, "us_per_audio_s": cpu, "x_real_time": speed})
        print(f"{os.path.basename(args.corpus.rstrip('/'))}: {threads} thread(s){'' if turns else ', no turns'}: "
              f"{statistics.median(cpu):6.0f} us CPU per audio s ({min(cpu):.0f}-{max(cpu):.0f}), "
              f"{statistics.median(speed):6.0f} x real time ({min(speed):.0f}-{max(speed):.0f})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"host": host_facts.report(), "corpus": args.corpus, "results": results}, f, indent=1)


if __name__ == "__main__":
    print(host_facts.header(), flush=True)
    main()
    print(host_facts.footer(), flush=True)
