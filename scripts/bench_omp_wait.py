"""torch's OpenMP threads busy-waiting against a passive wait (issue 40 item 4), side by side in one run.

    python scripts/bench_omp_wait.py --seconds 20 --reps 3 [--decoders 1] [--json /tmp/omp.json]

Each trial is a fresh interpreter (libgomp reads ``OMP_WAIT_POLICY`` once, when torch loads it) that
encodes ``--seconds`` of audio with the full-size Mimi encoder (random weights: the cost is the
shapes') in torch with 1 or 2 intra-op threads, the policy unset (libgomp's default: spin, then
sleep) or ``PASSIVE`` (what the tool now sets); trials alternate so the host's load falls on each
alike.  Reported: process CPU seconds per audio second encoded (all threads but the decoding
ones, whose own CPU time is taken out), wall per audio
second, and the CPU efficiency of 2 threads against 1 (1-thread CPU / 2-thread CPU: 1.0 means the
second thread costs nothing beyond the work it does).  ``--decoders N`` runs N threads decoding a
16 kHz FLAC beside the encoder, as a device worker's decode pool does; their audio seconds decoded
per wall second say what a spinning torch thread takes from them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import host_facts  # scripts/host_facts.py: the host a run's figures belong to

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, os, sys, threading, time
import numpy as np, soundfile as sf, torch
sys.path.insert(0, sys.argv[1])
from mimi_extract.codec.demo import random_model
from transformers import MimiConfig
threads, seconds, decoders, flac = int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.set_num_threads(threads)
model = random_model(MimiConfig(), seed=0)
x = torch.randn(1, 1, int(24000 * seconds)) * 0.1
with torch.no_grad():
    model.encode(x[..., :24000])  # warm-up (allocations, kernel choice)
stop, decoded, decode_cpu = threading.Event(), [0.0], []
def decode():
    t = time.thread_time()
    while not stop.is_set():
        with sf.SoundFile(flac) as f:
            while not stop.is_set():
                got = len(f.read(16000, dtype="int16"))
                if not got:
                    break
                decoded[0] += got / 16000
    decode_cpu.append(time.thread_time() - t)
pool = [threading.Thread(target=decode, daemon=True) for _ in range(decoders)]
for t in pool:
    t.start()
cpu, wall = time.process_time(), time.perf_counter()
with torch.no_grad():
    model.encode(x)
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
stop.set()
for t in pool:
    t.join()
print(json.dumps({"cpu_s": cpu - sum(decode_cpu), "decode_cpu_s": sum(decode_cpu), "wall_s": wall, "decoded_audio_s": decoded[0],
                  "policy": os.environ.get("OMP_WAIT_POLICY", "(unset)")}))
"""


def trial(policy: str | None, threads: int, args, flac: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    run = subprocess.run([sys.executable, "-c", CHILD, ROOT, str(threads), str(args.seconds), str(args.decoders), flac],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().split("\n")[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0, help="audio seconds encoded per trial")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--decoders", type=int, default=0, help="threads decoding FLAC beside the encoder")
    p.add_argument("--workdir", default="/tmp/bench-omp-wait")
    p.add_argument("--json")
    args = p.parse_args()
    import numpy as np
    import soundfile as sf

    os.makedirs(args.workdir, exist_ok=True)
    flac = os.path.join(args.workdir, "speech-16k.flac")
    if not os.path.exists(flac):
        t = np.arange(16000 * 60) / 16000
        sf.write(flac, (0.2 * np.sin(2 * np.pi * 180 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 2 * t) ** 2)
                        + 0.01 * np.random.default_rng(0).standard_normal(len(t))).astype(np.float32), 16000,
                 subtype="PCM_16")
    cases = [(policy, threads) for threads in (1, 2) for policy in (None, "PASSIVE")]
    runs: dict[str, list[dict]] = {}
    for rep in range(args.reps):
        for policy, threads in (cases if rep % 2 == 0 else cases[::-1]):
            key = f"{threads} thread(s), {policy or 'unset (spin)'}"
            r = trial(policy, threads, args, flac)
            runs.setdefault(key, []).append(r)
            print(f"{key}: CPU {r['cpu_s'] / args.seconds * 1e3:.1f} ms / audio s, wall {r['wall_s'] / args.seconds * 1e3:.1f}"
                  f" ms / audio s, decoders {r['decoded_audio_s'] / r['wall_s']:.0f} audio s / s", flush=True)

    def median(key, field):
        values = sorted(r[field] for r in runs[key])
        return values[len(values) // 2]
    table = {}
    for key in runs:
        table[key] = {"cpu_ms_per_audio_s": median(key, "cpu_s") / args.seconds * 1e3,
                      "wall_ms_per_audio_s": median(key, "wall_s") / args.seconds * 1e3,
                      "decoded_x": sorted(r["decoded_audio_s"] / r["wall_s"] for r in runs[key])[len(runs[key]) // 2]}
    print(f"\nmedians of {args.reps}, {args.seconds:g} audio s per trial, {args.decoders} decoding thread(s) beside:")
    print(f"{'case':<30}{'CPU ms/audio s':>16}{'wall ms/audio s':>17}{'2-thread CPU efficiency':>25}{'decoders x':>12}")
    for key, row in table.items():
        policy = key.split(", ", 1)[1]
        one = table.get(f"1 thread(s), {policy}")
        eff = one["cpu_ms_per_audio_s"] / row["cpu_ms_per_audio_s"] if one and key.startswith("2") else None
        row["efficiency_vs_1_thread"] = eff
        print(f"{key:<30}{row['cpu_ms_per_audio_s']:>16.1f}{row['wall_ms_per_audio_s']:>17.1f}"
              f"{'' if eff is None else f'{eff:.2f}x':>25}{row['decoded_x']:>12.0f}")
    if args.json:
        json.dump({"table": table, "runs": runs, "seconds": args.seconds, "decoders": args.decoders,
                   "host": host_facts.report()}, open(args.json, "w"), indent=2)


if __name__ == "__main__":
    print(host_facts.header(), flush=True)
    main()
    print(host_facts.footer(), flush=True)
