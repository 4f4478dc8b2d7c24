"""Throughput, side by side in one run on one corpus (these machines are shared: compare ratios).

    python scripts/bench.py                          # full-size Mimi architecture, random weights, CPU
    python scripts/bench.py --device cuda --files 512 --max-seconds 20
    python scripts/bench.py --model kyutai/mimi      # real weights (network or a local dir)
    python scripts/bench.py --tool-args "--engine ray" --tool-args "--cpu-workers 1" --baseline ../old-checkout

Reports: the machine's measured sgemm GFLOPS (all cores), the encoder's FLOPs per audio second
(counted with torch.utils.flop_counter, not assumed), hence the compute bound in audio seconds per
second; a per-item loop of transformers' ``MimiModel.encode`` (decode each file, encode it: what a
hand-written script does, on the same cores), timed in this process after a warm-up and, like the
tool, as a script in a fresh process (imports and weight loading included); ``mimi-extract codes``
end to end as a user runs it (a fresh process: start-up, decoding, encoding, HDF5 writing), plus the
share of its wall time its encoders sat idle waiting for input or output.  Codes of both paths are
compared.
"""

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mimi_extract.common.threads import passive_openmp  # noqa: E402

passive_openmp()  # torch's threads wait as in the tool's own processes: set before torch loads libgomp

import numpy as np  # noqa: E402
import soundfile as sf  # noqa: E402
import torch  # noqa: E402
from transformers import MimiConfig

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from mimi_extract import read
from mimi_extract.audio.reader import load
from mimi_extract.codec.encoder import PaddedMimiEncoder
from mimi_extract.codec.model import load_model
from mimi_extract.config.settings import cpu_cores
from mimi_extract.codec.demo import random_model, tiny_config

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--model", default="random-default", help="random-default | random-tiny | hub id | local dir")
p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
p.add_argument("--files", type=int, default=40)
p.add_argument("--min-seconds", type=float, default=1.0)
p.add_argument("--max-seconds", type=float, default=8.0)
p.add_argument("--num-quantizers", type=int, default=8)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--tool-args", action="append", default=[],
               help="extra arguments for a further mimi-extract codes row, e.g. '--cpu-workers 1' (repeatable)")
p.add_argument("--baseline", help="another checkout of mimi-extract to run end to end as well (e.g. the last release)")
p.add_argument("--json", help="also write the results here")
p.add_argument("--no-loop-script", dest="loop_script", action="store_false",
               help="leave out the loop as a script (gpu_check.sh's CPU dry run, in scale: bench has just run it)")
p.add_argument("--sgemm-size", type=int, default=2048, help="the matrices the machine's GFLOPS are measured on "
               "(scripts/gpu_check.sh's CPU dry run: small, it only shows the path runs)")
args = p.parse_args()
print(host_facts.header(), flush=True)
cuda = args.device.startswith("cuda")
threads = cpu_cores()
torch.set_num_threads(threads)
work = tempfile.mkdtemp(prefix="mimi-bench-")


def sync():
    if cuda:
        torch.cuda.synchronize()


# -- GPU utilisation, sampled per phase (NVML through torch; device-wide, so the tool's own process counts) --
util: dict[str, list[int]] = {}
phase = [None]
if cuda:
    import threading

    def _sample():
        while True:
            label = phase[0]
            if label is not None:
                try:
                    util.setdefault(label, []).append(int(torch.cuda.utilization()))
                except Exception:  # no NVML (pynvml): no utilisation figures
                    return
            time.sleep(0.05)

    threading.Thread(target=_sample, daemon=True).start()


def mean_util(label: str):
    samples = util.get(label)
    return sum(samples) / len(samples) if samples else None


def pythonpath(*first: str) -> str:
    """``first`` ahead of the caller's PYTHONPATH (carried wheels installed with --target stay visible)."""
    return os.pathsep.join([*first, *filter(None, [os.environ.get("PYTHONPATH")])])


# -- model and corpus ---------------------------------------------------------------------------
if args.model.startswith("random-"):
    model_dir = os.path.join(work, "model")
    random_model(MimiConfig() if args.model == "random-default" else tiny_config(), args.seed).save_pretrained(model_dir)
else:
    model_dir = args.model
model = load_model(model_dir, args.device)
rng = np.random.default_rng(args.seed)
corpus = os.path.join(work, "corpus")
os.makedirs(corpus)
lengths = rng.uniform(args.min_seconds, args.max_seconds, args.files)
for i, s in enumerate(lengths):
    sf.write(os.path.join(corpus, f"f{i:04d}.wav"), (0.1 * rng.standard_normal(int(s * 24_000))).astype(np.float32), 24_000)
total = float(sum(int(s * 24_000) for s in lengths)) / 24_000

# -- machine and model ----------------------------------------------------------------------------
with torch.no_grad():
    a = torch.randn(args.sgemm_size, args.sgemm_size, device=args.device)
    best = float("inf")
    for _ in range(5):
        sync()
        t = time.perf_counter()
        for _ in range(4):
            a @ a
        sync()
        best = min(best, (time.perf_counter() - t) / 4)
    gflops = 2 * args.sgemm_size**3 / best / 1e9
    from torch.utils.flop_counter import FlopCounterMode

    probe = torch.zeros(1, 24_000 * 4, device=args.device)
    counter = FlopCounterMode(display=False)
    with counter:
        PaddedMimiEncoder(model)(probe, torch.tensor([probe.shape[1]]), ("codes",), args.num_quantizers)
    flops_per_second = counter.get_total_flops() / 4
bound = gflops * 1e9 / flops_per_second

# -- per-item transformers loop ------------------------------------------------------------------
files = sorted(os.listdir(corpus))
with torch.no_grad():
    model.encode(load(os.path.join(corpus, files[0])).to(args.device).reshape(1, 1, -1), num_quantizers=args.num_quantizers)
    sync()
    phase[0] = "loop"
    t = time.perf_counter()
    loop_codes = {}
    for f in files:
        x = load(os.path.join(corpus, f)).to(args.device).reshape(1, 1, -1)
        loop_codes[f] = model.encode(x, num_quantizers=args.num_quantizers).audio_codes[0].T.cpu().numpy()
    sync()
    t_loop = time.perf_counter() - t
    phase[0] = None
del model
if cuda:
    torch.cuda.empty_cache()

# -- the same loop as a script, start-up included (what a user waits for) --------------------------
LOOP_SCRIPT = """
import os, sys, torch
from transformers import MimiModel
from mimi_extract.audio.reader import load
model = MimiModel.from_pretrained(sys.argv[1]).to(sys.argv[3]).eval()
with torch.no_grad():
    for f in sorted(os.listdir(sys.argv[2])):
        x = load(os.path.join(sys.argv[2], f)).to(sys.argv[3]).reshape(1, 1, -1)
        model.encode(x, num_quantizers=int(sys.argv[4])).audio_codes.cpu()
"""
env = {**os.environ, "HF_HUB_OFFLINE": "1"}
t_loop_script = None
if args.loop_script:
    t = time.perf_counter()
    looped = subprocess.run([sys.executable, "-c", LOOP_SCRIPT, model_dir, corpus, args.device, str(args.num_quantizers)],
                            capture_output=True, text=True, env={**env, "PYTHONPATH": pythonpath(HERE)})
    t_loop_script = time.perf_counter() - t
    if looped.returncode:
        sys.exit(f"the loop script failed:\n{looped.stderr}")


# -- the tool, end to end ----------------------------------------------------------------------------
def run_tool(code: str, out: str, extra: str = "", label: str | None = None) -> float:
    cmd = [sys.executable, "-m", "mimi_extract", "codes", corpus, out, "--model", model_dir, "--device", args.device,
           "-q", str(args.num_quantizers), *extra.split()]
    t = time.perf_counter()  # cwd: `python -m` puts it first on sys.path, ahead of PYTHONPATH
    phase[0] = label
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=work, env={**env, "PYTHONPATH": pythonpath(code)})
    phase[0] = None
    if run.returncode:
        sys.exit(f"mimi-extract ({code} {extra}) failed:\n{run.stdout}\n{run.stderr}")
    return time.perf_counter() - t


out = os.path.join(work, "out")
t_tool = run_tool(HERE, out, label="tool")
stats = json.load(open(os.path.join(out, "stats.json")))
mismatch = sum(int((read(out, f) != loop_codes[f]).sum()) for f in files)
variants = {}  # label -> (seconds, encoding phase seconds or None)
for i, extra in enumerate(args.tool_args):
    variant_out = os.path.join(work, f"out-{i}")
    t_variant = run_tool(HERE, variant_out, extra)
    variant_stats = json.load(open(os.path.join(variant_out, "stats.json")))
    variants[f"  {extra}"] = (t_variant, variant_stats["elapsed"])
    mismatch += sum(int((read(variant_out, f) != loop_codes[f]).sum()) for f in files)
if args.baseline:
    variants[f"baseline {os.path.basename(os.path.abspath(args.baseline))}"] = (
        run_tool(os.path.abspath(args.baseline), os.path.join(work, "out-baseline")), None)

name = f"{args.model} on {args.device}" + (f" ({threads} cores)" if not cuda else "")
rows = {
    "per-item MimiModel.encode loop": total / t_loop,
    **({"the loop as a script, end to end": total / t_loop_script} if t_loop_script else {}),
    "mimi-extract codes, end to end": total / t_tool,
    "mimi-extract, encoding phase": total / stats["elapsed"],
}
for label, (seconds, phase) in variants.items():
    rows[f"{label}, end to end"] = total / seconds
    if phase:
        rows[f"{label}, encoding phase"] = total / phase
print(f"\n{args.files} files, {total:.0f} s of audio, {args.min_seconds:g}-{args.max_seconds:g} s each, {name}")
print(f"machine: sgemm {gflops:.0f} GFLOPS; model: {flops_per_second / 1e9:.2f} GFLOP per audio second "
      f"-> compute bound {bound:.1f} audio s/s")
width = max(38, 2 + max(map(len, rows)))
print(f"{'path':<{width}}{'audio s/s':>10}{'vs loop':>9}{'of bound':>10}")
for label, speed in rows.items():
    print(f"{label:<{width}}{speed:>10.2f}{speed / rows['per-item MimiModel.encode loop']:>8.2f}x{speed / bound:>10.2f}")
print(f"tool: {stats['workers']} workers, encoder idle {100 * stats['idle_fraction']:.1f}% of its {stats['wall']:.1f} s "
      f"(waiting for input {stats['wait_input']:.1f} s, output {stats['wait_output']:.1f} s, summed over workers), "
      f"padding {100 * stats['padding']:.1f}%; start-up and planning {t_tool - stats['elapsed']:.1f} s"
      + (f" (encoding began {stats['startup']['to_encoding']:.1f} s and the first result came "
         f"{stats['startup']['to_first_result']:.1f} s after the process started)"
         if (stats.get("startup") or {}).get("to_first_result") else "") + "; "
      f"code mismatches vs the loop (every mimi-extract row): {mismatch}")
if cuda and util:
    print(f"GPU utilisation (NVML, mean of 50 ms samples): loop {mean_util('loop') or 0:.0f} %, "
          f"mimi-extract end to end (start-up included) {mean_util('tool') or 0:.0f} %")
if args.json:
    json.dump({"gflops": gflops, "flops_per_second": flops_per_second, "bound": bound, "speeds": rows, "stats": stats,
               "tool_seconds": t_tool, "loop_seconds": t_loop, "loop_script_seconds": t_loop_script,
               "variants": variants, "audio_seconds": total, "mismatch": mismatch,
               "gpu_util": {k: mean_util(k) for k in util}, "device": args.device, "files": args.files,
               "gpu": torch.cuda.get_device_name() if cuda else None, "host": host_facts.report()},
              open(args.json, "w"), indent=2)
print(host_facts.footer(), flush=True)
