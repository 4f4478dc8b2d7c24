"""MP3 through the tool's reader, now (FFmpeg via PyAV) and, with ``--before``, an older checkout
(libsndfile's libmpg123 behind a per-process stderr-capture lock), measured side by side in one run:
audio seconds decoded per CPU second on one thread, and the wall-clock rate of one process's two
decoding threads reading two files at once (what a device worker's feeder does).

    python scripts/bench_mp3.py [--before CHECKOUT] [--seconds 120] [--repeats 3]

Each measurement runs in its own interpreter with that checkout first on the path.
"""

from __future__ import annotations

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, sys, threading, time
try:
    from mimi_extract.audio.decoders import open_decoder
except ImportError:  # a checkout from before the audio package (--before)
    from mimi_extract.audio import open_decoder
paths, repeats = json.loads(sys.argv[1]), int(sys.argv[2])

def read(path):
    f = open_decoder(path)
    n = 0
    while True:
        block = f.read(1 << 16, dtype="float32", always_2d=True)
        if not len(block):
            break
        n += len(block)
    rate = f.samplerate
    f.close()
    return n / rate

out = {}
for path in paths:
    best = None
    for _ in range(repeats):
        c = time.process_time()
        seconds = read(path)
        cpu = time.process_time() - c
        best = cpu if best is None else min(best, cpu)
    out[path] = seconds / best
pair = paths[:2]
best = None
for _ in range(repeats):
    w = time.perf_counter()
    threads = [threading.Thread(target=read, args=(p,)) for p in pair]
    [t.start() for t in threads]
    [t.join() for t in threads]
    wall = time.perf_counter() - w
    best = wall if best is None else min(best, wall)
out["two threads"] = sum(read(p) for p in pair) / best
print(json.dumps(out))
"""


def make(folder: str, seconds: float) -> dict[str, str]:
    import av
    import numpy as np

    shapes = {"44.1 kHz stereo CBR 128k": (44_100, 2, 128_000), "48 kHz mono VBR -V 5": (48_000, 1, None),
              "16 kHz mono CBR 32k": (16_000, 1, 32_000), "24 kHz mono CBR 32k": (24_000, 1, 32_000)}
    paths = {}
    for name, (rate, channels, bit_rate) in shapes.items():
        path = os.path.join(folder, name.replace(" ", "_").replace(".", "") + ".mp3")
        paths[name] = path
        if os.path.exists(path):
            continue
        rng = np.random.default_rng(0)
        t = np.arange(int(seconds * rate)) / rate
        x = 0.2 * np.sin(2 * np.pi * 220 * t)[None] + 0.05 * rng.standard_normal((channels, len(t)))
        layout = "mono" if channels == 1 else "stereo"
        with av.open(path, "w", format="mp3") as out:
            stream = out.add_stream("libmp3lame", rate=rate, layout=layout)
            if bit_rate is None:
                stream.codec_context.qscale = True
                stream.codec_context.global_quality = 5 * 118
            else:
                stream.codec_context.bit_rate = bit_rate
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x, dtype=np.float32), format="fltp", layout=layout)
            frame.sample_rate = rate
            for packet in [*stream.encode(frame), *stream.encode(None)]:
                out.mux(packet)
    return paths


def measure(checkout: str, paths: list[str], repeats: int) -> dict:
    run = subprocess.run([sys.executable, "-c", CHILD, json.dumps(paths), str(repeats)], capture_output=True,
                         text=True, cwd=checkout, env={**os.environ, "PYTHONPATH": checkout, "OMP_NUM_THREADS": "1"})
    if run.returncode:
        raise SystemExit(run.stderr)
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="a checkout of an older commit, measured side by side")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--folder", help="where to write the MP3s (default: a temporary folder)")
    args = parser.parse_args()
    folder = args.folder or tempfile.mkdtemp(prefix="bench-mp3-")
    os.makedirs(folder, exist_ok=True)
    paths = make(folder, args.seconds)
    checkouts = {"now (FFmpeg)": ROOT, **({"before (libsndfile)": os.path.abspath(args.before)} if args.before else {})}
    results = {name: measure(c, list(paths.values()), args.repeats) for name, c in checkouts.items()}
    print("| file | " + " | ".join(f"{c}: x real time per core" for c in checkouts) + (" | now / before |" if args.before
                                                                                          else " |"))
    print("|---|" + "---|" * (len(checkouts) + bool(args.before)))
    for name, path in [*paths.items(), ("two threads, one process (wall)", "two threads")]:
        cells = [f"{r[path]:.0f}" for r in results.values()]
        if args.before:
            cells.append(f"{results['now (FFmpeg)'][path] / results['before (libsndfile)'][path]:.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    print(host_facts.header(), flush=True)
    main()
    print(host_facts.footer(), flush=True)
