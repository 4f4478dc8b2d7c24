"""Long recordings: peak memory vs length, exactness vs the unchunked reference, throughput.

    python scripts/bench_long.py rss --minutes 1 10 30 60 120 --model tiny full
    python scripts/bench_long.py rss --minutes 1 3 6 --model tiny --code /path/to/old/checkout   # another version
    python scripts/bench_long.py exact --minutes 1 3 5          # full-size architecture, random weights
    python scripts/bench_long.py speed --files 6 --seconds 60 [--code /path/to/old/checkout]

rss: one ``mimi-extract codes`` run per length, each in a fresh process (``--cpu-workers 1``:
one process), on one 16 kHz recording (the common rate of long corpora, so the streaming
resampler is in the path); reports that process's peak RSS.
exact: the chunked encoder (``--chunk-seconds`` of the CPU and GPU defaults) against transformers'
unchunked single-item encode of the whole file: frames, code mismatches (with verify's tie-flip
classification), max relative feature difference.
speed: the same files end to end (``mimi-extract codes``), chunked (the default) and in one piece
(``--chunk-seconds`` past the file's length), and with ``--code``, that checkout too, side by side.
"""

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import soundfile as sf
from transformers import MimiConfig

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

from mimi_extract.codec.demo import random_model, tiny_config  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("mode", choices=["rss", "exact", "speed"])
p.add_argument("--minutes", type=float, nargs="+", default=[1, 10, 30, 60, 120])
p.add_argument("--model", nargs="+", default=["tiny", "full"], choices=["tiny", "full"])
p.add_argument("--code", default=HERE, help="checkout whose mimi_extract to run (rss), or to compare with (speed)")
p.add_argument("--files", type=int, default=6)
p.add_argument("--seconds", type=float, default=60)
p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "mimi-bench-long"))
p.add_argument("--json")
args = p.parse_args()
print(host_facts.header(), flush=True)
os.makedirs(args.work, exist_ok=True)
results = []


def model_dir(kind: str) -> str:
    path = os.path.join(args.work, f"model-{kind}")
    if not os.path.exists(path):
        random_model(MimiConfig() if kind == "full" else tiny_config(), seed=0).save_pretrained(path)
    return path


def recording(minutes: float, rate: int = 16_000) -> str:
    """A folder with one long PCM-16 recording of quiet noise (written in blocks)."""
    folder = os.path.join(args.work, f"long-{minutes:g}min")
    path = os.path.join(folder, "long.wav")
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        rng = np.random.default_rng(0)
        with sf.SoundFile(path + ".tmp", "w", rate, 1, "PCM_16", format="WAV") as f:
            left = int(minutes * 60 * rate)
            while left:
                n = min(left, rate * 60)
                f.write((0.05 * rng.standard_normal(n)).astype(np.float32))
                left -= n
        os.replace(path + ".tmp", path)
    return folder


def run_tool(code: str, folder: str, kind: str, *extra: str) -> tuple[float, float, int]:
    """``mimi-extract codes`` of checkout ``code`` in a fresh process: (peak RSS GB, wall s, rc)."""
    out = tempfile.mkdtemp(dir=args.work)
    cmd = [sys.executable, "-m", "mimi_extract", "codes", folder, out, "--model", model_dir(kind), "--device", "cpu",
           *extra]
    wrapper = ("import resource, subprocess, sys, time; t = time.time(); "
               "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode; "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, time.time() - t, rc)")
    res = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True, cwd=args.work,
                         env={**os.environ, "PYTHONPATH": code, "HF_HUB_OFFLINE": "1"})
    # (cwd: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH)
    kb, wall, rc = res.stdout.split()
    return int(kb) / 2**20, float(wall), int(rc)


def has_option(code: str, option: str) -> bool:
    return option in subprocess.run([sys.executable, "-m", "mimi_extract", "codes", "--help"], capture_output=True,
                                    text=True, cwd=args.work, env={**os.environ, "PYTHONPATH": code}).stdout


if args.mode == "rss":
    print(f"{'model':<6}{'minutes':>8}{'peak RSS GB':>13}{'wall s':>9}{'rc':>4}  code={args.code}")
    one = ["--cpu-workers", "1"] if has_option(args.code, "cpu-workers") else []
    for kind in args.model:
        for minutes in args.minutes:
            rss, wall, rc = run_tool(args.code, recording(minutes), kind, *one)
            print(f"{kind:<6}{minutes:>8g}{rss:>13.2f}{wall:>9.0f}{rc:>4}", flush=True)
            results.append({"model": kind, "minutes": minutes, "rss_gb": rss, "wall": wall, "rc": rc})

elif args.mode == "exact":
    from mimi_extract.audio.reader import load
    from mimi_extract.codec.encoder import PaddedMimiEncoder, encode_chunked
    from mimi_extract.codec.reference import reference_single
    from mimi_extract.audit.verify import classify_codes

    model = random_model(MimiConfig(), seed=0)
    encoder = PaddedMimiEncoder(model)
    print(f"{'minutes':>8}{'chunk s':>8}{'frames':>8}{'ref':>7}{'codes ≠ (tie/real)':>20}{'in frames':>10}{'rel max|Δ| latent':>19}{'encoder':>10}")
    for minutes in args.minutes:
        audio = load(os.path.join(recording(minutes), "long.wav"))
        ref = reference_single(model, audio, 32)
        for chunk_s in (4.0, 30.0):
            chunk = int(chunk_s * 24_000) // 1920 * 1920
            got = encode_chunked(encoder, [audio], chunk, ("encoder", "latent", "codes"), 32)[0]
            mism, _ = classify_codes(model, got["codes"], ref["latent"], 32, got["latent"])
            rel = {t: float((got[t] - ref[t]).abs().max() / ref[t].abs().max()) for t in ("latent", "encoder")}
            ties = sum(m.tie for m in mism)
            flipped = sorted({m.frame for m in mism})  # a flip at codebook k changes the later ones too
            print(f"{minutes:>8g}{chunk_s:>8g}{got['codes'].shape[0]:>8}{ref['codes'].shape[0]:>7}"
                  f"{f'{len(mism)} ({ties}/{len(mism) - ties})':>20}{len(flipped):>10}{rel['latent']:>19.1e}"
                  f"{rel['encoder']:>10.1e}", flush=True)
            results.append({"minutes": minutes, "chunk": chunk_s, "frames": got["codes"].shape[0],
                            "ref_frames": ref["codes"].shape[0], "mismatches": len(mism), "ties": ties,
                            "frames_with_mismatch": flipped, "first_codebooks": sorted({m.codebook for m in mism
                                                                                         if not m.cascade}), **rel})

else:  # speed: end to end, as a user runs it, side by side
    folder = os.path.join(args.work, f"speed-{args.files}x{args.seconds:g}")
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(1)
    for i in range(args.files):
        path = os.path.join(folder, f"f{i}.wav")
        if not os.path.exists(path):
            sf.write(path, (0.05 * rng.standard_normal(int(args.seconds * 24_000))).astype(np.float32), 24_000)
    total = args.files * args.seconds
    paths = [("chunked (default)", HERE, ()), ("one piece (--chunk-seconds > file)", HERE,
                                               ("--chunk-seconds", f"{args.seconds + 1:g}"))]
    if args.code != HERE:
        paths.append((f"baseline {os.path.basename(os.path.abspath(args.code))}", args.code, ()))
    print(f"{args.files} files x {args.seconds:g} s, CPU, mimi-extract codes end to end (start-up included)")
    for kind in args.model:
        for label, code, extra in paths:
            rss, wall, rc = run_tool(code, folder, kind, *extra)
            print(f"{kind:<5} {label:<36} {total / wall:6.2f} audio s/s  peak RSS {rss:5.2f} GB  rc {rc}", flush=True)
            results.append({"model": kind, "path": label, "speed": total / wall, "rss_gb": rss, "rc": rc})

if args.json:
    json.dump({"results": results, "host": host_facts.report()}, open(args.json, "w"), indent=2)
print(host_facts.footer(), flush=True)
