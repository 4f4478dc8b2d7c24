"""Encoder throughput per precision on fixed step shapes, and code agreement against strict fp32.

    python scripts/bench_precision.py --device cuda --json precision.json     # full-size, random weights
    python scripts/bench_precision.py --device cpu --model random-tiny --shapes 4x2   # a dry run

Modes: ``fp32`` (strict: TF32 off for matmuls and cuDNN convs, what ``--dtype fp32`` runs), ``tf32``
(the same fp32 weights with TF32 allowed), ``bf16`` (weights and audio in bf16, what ``--dtype bf16``
runs) and, with ``--compile``, ``fp32+compile`` (``torch.compile`` of the strict encoder; kept only
if faster and exact).  Each runs the exact :class:`~mimi_extract.codec.encoder.PaddedMimiEncoder` on
right-padded steps of ``ROWSxSECONDS`` (the tool's GPU default is 64 rows, 300 padded seconds), warmed
up, timed with a device sync per step, median over ``--reps``: audio seconds of valid (unpadded)
samples per second of wall time (x real time).

Agreement: per codebook, the share of codes equal to strict fp32's on the same step, and each
differing code classified by ``verify``'s tie rule (``mimi_extract.audit.verify.classify_codes``: a code
within ``2|Δr| + float rounding`` of the nearest codeword along the stored codes is a tie flip; the
perturbation |Δr| is measured from this mode's latent against strict fp32's).  Random weights and
noise: this measures mechanics and rounding drift, not real-speech code statistics.
"""

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import copy
import json
import statistics
import sys
import time

import torch
from transformers import MimiConfig

from mimi_extract.codec.encoder import PaddedMimiEncoder, frames_of
from mimi_extract.codec.model import prepare
from mimi_extract.codec.demo import random_model, tiny_config
from mimi_extract.audit.verify import classify_codes

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--model", default="random-default", help="random-default | random-tiny | local dir")
p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
p.add_argument("--shapes", default="64x4.6,128x10", help="steps as ROWSxSECONDS, comma-separated")
p.add_argument("--modes", default="fp32,tf32,bf16")
p.add_argument("--compile", action="store_true", help="also time torch.compile of the strict fp32 encoder")
p.add_argument("--reps", type=int, default=10)
p.add_argument("--num-quantizers", type=int, default=8)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--json", help="write the results here (rewritten after each mode: a later failure keeps them)")
args = p.parse_args()
print(host_facts.header(), flush=True)
cuda = args.device.startswith("cuda")
SR = 24_000


def sync():
    if cuda:
        torch.cuda.synchronize()


def set_tf32(on: bool):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    torch.backends.cudnn.benchmark = cuda  # as the tool: fixed shapes, autotuning reused


if args.model.startswith("random-"):
    base = random_model(MimiConfig() if args.model == "random-default" else tiny_config(), args.seed)
else:
    from mimi_extract.codec.model import load_model

    base = load_model(args.model, "cpu")
reference_model = prepare(copy.deepcopy(base), args.device, torch.float32)  # classify_codes' fp32 quantizer

g = torch.Generator().manual_seed(args.seed)
shapes = []
for spec in args.shapes.split(","):
    rows, seconds = spec.lower().split("x")
    rows, size = int(rows), int(float(seconds) * SR)
    # ragged rows, most of them long (as a length-sorted corpus fills steps): 60-100 % of the step
    lengths = (size * (0.6 + 0.4 * torch.rand(rows, generator=g))).long().clamp(1, size)
    lengths[0] = size
    audio = 0.1 * torch.randn(rows, size, generator=g)
    for r, n in enumerate(lengths.tolist()):
        audio[r, n:] = 0
    shapes.append({"label": f"{rows}x{float(seconds):g}s", "audio": audio, "lengths": lengths,
                   "audio_seconds": float(lengths.sum()) / SR})

results = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "model": args.model, "num_quantizers": args.num_quantizers, "modes": {}}


def save():
    if args.json:
        json.dump({**results, "host": host_facts.report()}, open(args.json, "w"), indent=2)


def run_mode(name: str, encoder, dtype, shape) -> dict:
    x = shape["audio"].to(args.device, dtype)
    n = shape["lengths"]
    with torch.no_grad():
        for _ in range(2):
            out = encoder(x, n, ("latent", "codes"), args.num_quantizers)
        sync()
        times = []
        for _ in range(args.reps):
            t = time.perf_counter()
            out = encoder(x, n, ("latent", "codes"), args.num_quantizers)
            sync()
            times.append(time.perf_counter() - t)
    return {"median_s": statistics.median(times), "min_s": min(times),
            "x_real_time": shape["audio_seconds"] / statistics.median(times), "out": out}


strict = {}  # shape label -> strict fp32 output (the agreement reference)
modes = args.modes.split(",") + (["fp32+compile"] if args.compile else [])
for mode in modes:
    set_tf32(mode == "tf32")
    dtype = torch.bfloat16 if mode == "bf16" else torch.float16 if mode == "fp16" else torch.float32
    entry = results["modes"].setdefault(mode, {})
    try:
        encoder = PaddedMimiEncoder(prepare(copy.deepcopy(base), args.device, dtype))
        if mode == "fp32+compile":
            encoder = torch.compile(encoder)
        for shape in shapes:
            t0 = time.perf_counter()
            r = run_mode(mode, encoder, dtype, shape)
            out = r.pop("out")
            row = {**r, "audio_seconds": shape["audio_seconds"], "wall_s": time.perf_counter() - t0}
            if mode == "fp32":
                strict[shape["label"]] = out
            elif shape["label"] in strict:
                ref = strict[shape["label"]]
                per_cb_equal = torch.zeros(args.num_quantizers, dtype=torch.long)
                total_frames, ties, real, cascades, max_rel = 0, 0, 0, 0, 0.0
                per_cb_real = [0] * args.num_quantizers
                for i in range(len(shape["lengths"])):
                    got, want = frames_of(out, "codes", i).long().cpu(), frames_of(ref, "codes", i).long().cpu()
                    per_cb_equal += (got == want).sum(0)
                    total_frames += got.shape[0]
                    ref_latent = frames_of(ref, "latent", i).float()
                    got_latent = frames_of(out, "latent", i).float()
                    scale = float(ref_latent.abs().max()) or 1.0
                    max_rel = max(max_rel, float((got_latent - ref_latent).abs().max()) / scale)
                    if bool((got != want).any()):
                        mism, _ = classify_codes(reference_model, got, ref_latent, args.num_quantizers, got_latent)
                        ties += sum(m.tie and not m.cascade for m in mism)
                        cascades += sum(m.cascade for m in mism)
                        for m in mism:
                            if not m.tie:
                                real += 1
                                per_cb_real[m.codebook] += 1
                row.update({"codes": total_frames * args.num_quantizers,
                            "agreement_per_codebook": [round(float(c) / max(total_frames, 1), 6)
                                                       for c in per_cb_equal],
                            "agreement": float(per_cb_equal.sum()) / max(total_frames * args.num_quantizers, 1),
                            "tie_flips": ties, "cascades": cascades, "real": real, "real_per_codebook": per_cb_real,
                            "latent_max_rel_diff": max_rel})
                if mode == "fp32+compile":
                    base_speed = results["modes"]["fp32"][shape["label"]]["x_real_time"]
                    row["kept"] = bool(row["x_real_time"] > base_speed and row["agreement"] == 1.0)
            entry[shape["label"]] = row
            save()
            print(f"{mode:>13} {shape['label']:>10}: {row['x_real_time']:10.1f} x real time"
                  + (f", agreement {100 * row['agreement']:.4f} % (ties {row['tie_flips']}, cascades "
                     f"{row['cascades']}, real {row['real']})" if "agreement" in row else ""), flush=True)
        del encoder
        if cuda:
            torch.cuda.empty_cache()
    except Exception as e:  # one mode failing (compile, out of memory) must not lose the others
        entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
        save()
        print(f"{mode}: FAILED {entry['error']}", file=sys.stderr, flush=True)
set_tf32(False)
save()
print(host_facts.footer(), flush=True)
