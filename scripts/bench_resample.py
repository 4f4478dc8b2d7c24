"""Resampling on the device (``--resample-on device``): its exactness against the host path, and its speed.

    python scripts/bench_resample.py --device cpu --json /tmp/resample.json      # here: both sections
    python scripts/bench_resample.py --device cuda --json $OUT/resample.json     # scripts/gpu_check.sh

* ``exact``: the same files (16 kHz PCM-16 long enough to be chunked, 44.1 kHz float, 48 kHz stereo
  mixed, 8 kHz) through the engine twice on ``--device``, resampled on the host and on the device,
  with kyutai/mimi's architecture (seeded random weights; ``--model`` for others): the 24 kHz
  input itself (max |difference|), the latents (max relative difference, max |Δ| / max |host|), and
  the codes (agreement over every codebook, each differing code classified by ``verify``'s tie
  rule against the host path's latent: tie flips and their cascades are float noise, "real" ones
  would be a leak);
* ``speed``: :func:`~mimi_extract.audio.device.resample_rows` on the device for the GPU's step
  shapes (64 rows of 4.6 s, 10 rows of 30 s) per input rate, x real time of the device (synchronised),
  and the host's cost of the same work through ``SincResampler`` (one thread, CPU time) for
  comparison; the host-to-device bytes per audio second (int16 native vs float32 at 24 kHz).
"""

from __future__ import annotations

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import json
import os
import sys
import threading
import time

import numpy as np
import soundfile as sf
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mimi_extract.config.choices import SAMPLE_RATE  # noqa: E402
from mimi_extract.audio.reader import AudioReader
from mimi_extract.audio.resample import SincResampler
from mimi_extract.audio.device import NativeGroup, NativeReader, resample_rows  # noqa: E402
from mimi_extract.engines import DeviceRunner  # noqa: E402
from mimi_extract.engines.plan import plan_units  # noqa: E402
from mimi_extract.config.settings import Settings  # noqa: E402
from mimi_extract.sources import discover  # noqa: E402

FILES = [("long16k.wav", 16_000, 45.0, "PCM_16", 1), ("mid44k.wav", 44_100, 12.0, "FLOAT", 1),
         ("stereo48k.flac", 48_000, 15.0, "PCM_16", 2), ("short8k.wav", 8_000, 3.3, "PCM_16", 1)]


def speech(n: int, rate: int, rng, channels: int = 1) -> np.ndarray:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_ceilings import speechlike

    x = np.stack([speechlike(n, rate, rng) for _ in range(channels)], 1)
    return x[:, 0] if channels == 1 else x


def engine_outputs(settings: Settings, device: str, model, items) -> dict:
    runner = DeviceRunner(settings, device, model, taps=("latent", "codes"))
    units = iter(plan_units(items, runner.chunk, settings.step_seconds, settings.rows))
    got: dict[str, dict] = {}

    def collect(piece):
        assert piece.error is None, piece.error
        for tap, v in piece.data.items():
            got.setdefault(piece.item.key, {}).setdefault(tap, []).append(v.cpu())

    runner.run(lambda block=True: next(units, None), collect, threading.Event())
    return {k: {t: torch.cat(v) for t, v in taps.items()} for k, taps in got.items()}


def exact(args) -> dict:
    from transformers import MimiConfig, MimiModel

    from mimi_extract.codec.demo import random_model, tiny_config
    from mimi_extract.audit.verify import classify_codes

    folder = os.path.join(args.workdir, "exact" if args.exact_scale == 1 else f"exact-x{args.exact_scale:g}")
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, rate, seconds, subtype, channels in FILES:
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            sf.write(path, speech(int(rate * seconds * args.exact_scale), rate, rng, channels), rate, subtype=subtype)
    model = (random_model(MimiConfig() if args.model == "random-default" else tiny_config(), seed=0)
             if args.model.startswith("random-") else MimiModel.from_pretrained(args.model)).to(args.device).eval()
    found = discover(folder)
    result = {"device": args.device, "q": args.q, "files": {}}
    # the 24 kHz input itself, every file, chunk by chunk as a run reads it
    for it in found.items:
        ref = AudioReader(it.path).read_all()
        reader, parts = NativeReader(it.path), []
        while True:
            c, final = reader.next_chunk(24_000 * 4 // 1920 * 1920)
            out = torch.zeros(1, len(c), device=args.device)
            parts.append(resample_rows([NativeGroup.of([0], [c])], out)[0].cpu())
            if final:
                break
        got = torch.cat(parts)
        result["files"][it.key] = {"rate": it.sample_rate, "seconds": round(it.duration, 2),
                                   "input_max_abs_diff": float((got - ref).abs().max())}
    common = dict(model="unused", tap="codes", num_quantizers=args.q, devices=(args.device,), batch_size=args.rows,
                  max_batch_seconds=args.step_seconds, chunk_seconds=args.chunk_seconds, num_workers=2)
    host = engine_outputs(Settings(**common, resample_on="host"), args.device, model, found.items)
    dev = engine_outputs(Settings(**common, resample_on="device"), args.device, model, found.items)
    totals = {"codes": 0, "equal": 0, "tie_flips": 0, "cascades": 0, "real": 0, "max_rel_latent": 0.0}
    for it in found.items:
        h, d = host[it.key], dev[it.key]
        rel = float((d["latent"] - h["latent"]).abs().max() / h["latent"].abs().max())
        mismatches, _ = classify_codes(model, d["codes"].to(args.device), h["latent"].to(args.device), args.q,
                                       d["latent"].to(args.device))
        r = result["files"][it.key]
        r.update(frames=int(h["codes"].shape[0]), latent_max_rel_diff=rel,
                 codes_equal=int((d["codes"] == h["codes"]).sum()), codes=int(h["codes"].numel()),
                 tie_flips=sum(m.tie and not m.cascade for m in mismatches), cascades=sum(m.cascade for m in mismatches),
                 real=sum(not m.tie for m in mismatches))
        for k in ("codes", "tie_flips", "cascades", "real"):
            totals[k] += r[k]
        totals["equal"] += r["codes_equal"]
        totals["max_rel_latent"] = max(totals["max_rel_latent"], rel)
        print(f"exact {it.key:>15} ({it.sample_rate} Hz, {it.duration:.1f} s): input max|Δ| {r['input_max_abs_diff']:.1e}, "
              f"latent max rel Δ {rel:.1e}, codes equal {r['codes_equal']}/{r['codes']}, tie flips {r['tie_flips']} "
              f"(+{r['cascades']} cascade), real {r['real']}", flush=True)
    totals["agreement"] = totals["equal"] / max(1, totals["codes"])
    result["totals"] = totals
    print(f"exact total: codes agree {100 * totals['agreement']:.4f} %, tie flips {totals['tie_flips']} "
          f"(+{totals['cascades']} cascade), real {totals['real']}, latent max rel Δ {totals['max_rel_latent']:.1e}")
    return result


def speed(args) -> dict:
    device = torch.device(args.device)
    result = {"device": args.device, "shapes": {}}
    rng = np.random.default_rng(1)
    for rate, dtype in ((16_000, "int16"), (48_000, "int16"), (44_100, "float32")):
        for rows, seconds in args.speed_shapes:
            n = int(rate * seconds)
            samples = [(rng.standard_normal(n) * 3000).astype(np.int16) if dtype == "int16"
                       else (0.1 * rng.standard_normal(n)).astype(np.float32) for _ in range(rows)]
            # one row read as a run reads it (its shape and arithmetic), then every row given its own signal:
            # only the compute is timed here (tests/audio/test_device_resample.py checks the arithmetic)
            path = os.path.join(args.workdir, f"speed-{rate}-{dtype}.wav")
            sf.write(path, samples[0], rate, subtype="PCM_16" if dtype == "int16" else "FLOAT")
            chunk, _ = NativeReader(path).next_chunk(1 << 30)
            group = NativeGroup.of(list(range(rows)), [chunk] * rows, pin=device.type == "cuda")
            for r, x in enumerate(samples):
                group.samples[r, : len(x)] = torch.from_numpy(x)
            out = torch.zeros(rows, len(chunk), device=device)
            times = []
            for _ in range(args.reps + 1):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t = time.perf_counter()
                resample_rows([group], out)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            device_s = min(times[1:])  # (the first: kernel selection, allocations)
            torch.set_num_threads(1)
            for _ in range(2):  # (the second pass is timed: the first builds the kernel and oneDNN's primitives)
                t = time.process_time()
                for x in samples[:4]:  # (4 rows, or fewer in a dry run's small step)
                    r2 = SincResampler(rate, SAMPLE_RATE)
                    xf = torch.from_numpy(x.astype(np.float32) / (32768 if dtype == "int16" else 1))
                    for i in range(0, len(xf), 1 << 16):
                        r2.push(xf[i: i + (1 << 16)])
                    r2.finish()
                host_us = (time.process_time() - t) / (len(samples[:4]) * seconds) * 1e6
            label = f"{rate // 1000}k {dtype} {rows}x{seconds:g}s"
            result["shapes"][label] = {"x_real_time_device": rows * seconds / device_s, "device_ms_per_step": 1e3 * device_s,
                                       "host_us_per_audio_s": host_us,
                                       "h2d_bytes_per_audio_s": rate * (2 if dtype == "int16" else 4),
                                       "h2d_bytes_per_audio_s_host_path": SAMPLE_RATE * 4}
            r = result["shapes"][label]
            print(f"speed {label:>22}: device {r['x_real_time_device']:10.0f}x real time ({r['device_ms_per_step']:.2f} ms "
                  f"per step), host path {r['host_us_per_audio_s']:.0f} us CPU per audio s; H2D {r['h2d_bytes_per_audio_s']} "
                  f"B per audio s (host path {SAMPLE_RATE * 4})", flush=True)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default="random-default", help="random-default (kyutai/mimi's architecture, seeded "
                   "random weights), random-tiny (the tests' tiny one) or a model directory")
    p.add_argument("--sections", default="exact,speed")
    p.add_argument("--q", type=int, default=32, help="codebooks compared")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--step-seconds", type=float, default=16.0)
    p.add_argument("--chunk-seconds", type=float, default=4.0)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--exact-scale", type=float, default=1.0, help="exact's files at this share of their "
                   "length (scripts/gpu_check.sh's CPU dry run: 0.25, the long one still chunked)")
    p.add_argument("--speed-shapes", default="64x4.6,10x30", type=lambda v: [
        (int(r), float(s)) for r, s in (spec.lower().split("x") for spec in v.split(","))],
        help="speed's steps as ROWSxSECONDS (the GPU's; scripts/gpu_check.sh's CPU dry run: small ones)")
    p.add_argument("--workdir", default="/tmp/mimi-bench-resample")
    p.add_argument("--json")
    args = p.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    if args.device.startswith("cuda"):  # strict fp32: what the reference path runs
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    results = {"torch": torch.__version__, "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda")
               else "cpu"}
    for name, fn in (("exact", exact), ("speed", speed)):
        if name in args.sections.split(","):
            results[name] = fn(args)
            if args.json:
                json.dump({**results, "host": host_facts.report()}, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    print(host_facts.header(), flush=True)
    main()
    print(host_facts.footer(), flush=True)
