"""What ``codes --fidelity`` costs: ``mimi-extract codes`` end to end with and without it, on one
corpus, alternating rounds in fresh processes (best of each; these machines are shared: compare the
ratio).

    python scripts/bench_fidelity.py --files 16 --min-seconds 2 --max-seconds 10 --rounds 2
    python scripts/bench_fidelity.py --device cuda --files 256 --max-seconds 20   # (scripts/gpu_check.sh)
    python scripts/bench_fidelity.py --compute 5      # the compute alone, in this process

Full-size Mimi architecture with seeded random weights (speed does not depend on the weights), white
noise at 24 kHz.  Also prints the fidelity run's median SI-SDR, as a check that it computed them.
"""

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import soundfile as sf
from transformers import MimiConfig

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

from mimi_extract.codec.demo import random_model, tiny_config  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--files", type=int, default=16)
p.add_argument("--min-seconds", type=float, default=2)
p.add_argument("--max-seconds", type=float, default=10)
p.add_argument("--rounds", type=int, default=2)
p.add_argument("--model", choices=["full", "tiny"], default="full")
p.add_argument("--device", default="cpu")
p.add_argument("--tool-args", default="", help="more options for both runs (e.g. --cpu-workers 1)")
p.add_argument("--compute", type=int, default=0, metavar="REPS",
               help="instead: in this process, one step's encode vs its --fidelity work (decode + meters), "
                    "REPS interleaved repetitions, 1 torch thread (robust on a busy machine)")
a = p.parse_args()
print(host_facts.header(), flush=True)

if a.compute:
    import torch

    from mimi_extract.codec.decoder import PaddedMimiDecoder
    from mimi_extract.codec.encoder import PaddedMimiEncoder
    from mimi_extract.codec.fidelity import FidelityMeter

    torch.set_num_threads(1)
    model = random_model(MimiConfig() if a.model == "full" else tiny_config(), seed=0).to(a.device)
    encoder, decoder = PaddedMimiEncoder(model), PaddedMimiDecoder(model)
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([int(24_000 * s) for s in (2.0, 1.2, 0.5, 0.3)])  # a CPU step: 4 s of padded audio
    audio = (0.1 * torch.randn(len(lengths), int(lengths.max()), generator=g)).to(a.device)
    times = {"encode (codes)": [], "--fidelity: decode + meters": []}
    for _ in range(a.compute):
        t0 = time.perf_counter()
        out = encoder(audio, lengths, ("codes",), 8)
        t1 = time.perf_counter()
        decoded = decoder(out.tensors["codes"], out.lengths["codes"]).audio
        for r, n in enumerate(lengths.tolist()):
            meter = FidelityMeter()
            meter.update(audio[r, :n], decoded[r, :n])
            meter.result()
        t2 = time.perf_counter()
        times["encode (codes)"].append(t1 - t0)
        times["--fidelity: decode + meters"].append(t2 - t1)
    print(f"one step of {len(lengths)} rows, {float(lengths.sum()) / 24_000:.1f} s of audio, {a.model} model, "
          f"{a.device}, 1 thread, best of {a.compute}")
    for name, t in times.items():
        print(f"  {name:30s} best {min(t):6.3f} s  rounds {[round(x, 3) for x in t]}")
    enc, fid = (min(t) for t in times.values())
    print(f"  --fidelity adds {fid / enc:.2f}x the encode's time: throughput x{enc / (enc + fid):.2f}")
    sys.exit(0)

work = tempfile.mkdtemp(prefix="bench_fidelity_")
model_dir, corpus = os.path.join(work, "model"), os.path.join(work, "corpus")
random_model(MimiConfig() if a.model == "full" else tiny_config(), seed=0).save_pretrained(model_dir)
os.makedirs(corpus)
rng = np.random.default_rng(0)
seconds = 0.0
for i in range(a.files):
    n = int(24_000 * (a.min_seconds + (a.max_seconds - a.min_seconds) * rng.random()))
    sf.write(os.path.join(corpus, f"f{i:04d}.wav"), (0.1 * rng.standard_normal(n)).astype(np.float32), 24_000)
    seconds += n / 24_000
env = {**os.environ, "PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}
times: dict[str, list[float]] = {"codes": [], "codes --fidelity": []}
for r in range(a.rounds):
    for name in times:
        out = os.path.join(work, f"out-{r}-{len(name)}")
        cmd = [sys.executable, "-m", "mimi_extract", "codes", corpus, out, "--model", model_dir, "--device", a.device,
               *a.tool_args.split(), *(["--fidelity"] if "fidelity" in name else [])]
        t0 = time.perf_counter()
        run = subprocess.run(cmd, capture_output=True, text=True, env=env)
        times[name].append(time.perf_counter() - t0)
        if run.returncode:
            sys.exit(f"{' '.join(cmd)} failed:\n{run.stdout}\n{run.stderr}")
        if "fidelity" in name and r == a.rounds - 1:
            rows = [json.loads(line) for line in open(os.path.join(out, "manifest.jsonl"))]
            median = float(np.median([row["si_sdr"] for row in rows if row.get("status") == "ok"]))
        if r < a.rounds - 1 or "fidelity" not in name:
            shutil.rmtree(out)
print(f"{a.files} files, {seconds:.0f} s of audio, {a.model} model, {a.device} {a.tool_args}; "
      f"fidelity run's median SI-SDR {median:.2f} dB")
for name, t in times.items():
    print(f"  {name:18s} best {min(t):7.2f} s  ({seconds / min(t):6.1f}x real time)  rounds {[round(x, 1) for x in t]}")
base, with_fidelity = (min(t) for t in times.values())
print(f"  --fidelity costs {with_fidelity / base:.2f}x the wall time ({100 * (base / with_fidelity):.0f}% of the throughput)")
shutil.rmtree(work)
print(host_facts.footer(), flush=True)
