"""Split recordings, measured side by side in one run (issue 15, part 2).

1. A mixed corpus (short files plus one recording many times longer) encoded twice on the same
   workers, with and without ``--split``: wall time, encoder idle share (stats.json), and equality
   of the two outputs.
2. Exactness at full size: a long recording cut into pieces with ``encode_piece`` (warm-up = the
   computed receptive field) against transformers' unchunked single-item encode.

Uses a seeded random model of kyutai/mimi's architecture (no weights can be downloaded here).

    .venv/bin/python scripts/bench_split.py --short 20 --short-seconds 10 --long-minutes 20 --exact-minutes 5
"""

from __future__ import annotations

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import soundfile as sf
import torch



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", type=int, default=20)
    ap.add_argument("--short-seconds", type=float, default=10)
    ap.add_argument("--long-minutes", type=float, default=20)
    ap.add_argument("--exact-minutes", type=float, default=5)
    ap.add_argument("--exact-pieces", type=int, default=4)
    ap.add_argument("--cpu-workers", type=int, default=2)
    ap.add_argument("--skip-runs", action="store_true")
    ap.add_argument("--skip-exact", action="store_true")
    args = ap.parse_args()
    from transformers import MimiConfig

    from mimi_extract.codec.encoder import PaddedMimiEncoder, encode_piece, split_bounds
    from mimi_extract.codec.reference import reference_single
    from mimi_extract.codec.demo import random_model

    model = random_model(MimiConfig(), seed=0)
    encoder = PaddedMimiEncoder(model)
    rf = encoder.receptive_field
    print(f"receptive field: {rf} samples = {rf / 24000:.2f} s (kyutai/mimi architecture)")
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_runs:
            model_dir, corpus = os.path.join(tmp, "model"), os.path.join(tmp, "in")
            model.save_pretrained(model_dir)
            os.makedirs(corpus)
            for i in range(args.short):
                sf.write(os.path.join(corpus, f"short{i:03d}.wav"),
                         (0.2 * rng.standard_normal(int(args.short_seconds * 24000))).astype(np.float32), 24000)
            sf.write(os.path.join(corpus, "long.wav"),
                     (0.2 * rng.standard_normal(int(args.long_minutes * 60 * 24000))).astype(np.float32), 24000)
            mimi = os.path.join(os.path.dirname(sys.executable), "mimi-extract")
            results = {}
            for name, flag in (("unsplit", "--no-split"), ("split", "--split")):
                out = os.path.join(tmp, name)
                t = time.perf_counter()
                proc = subprocess.run([mimi, "codes", corpus, out, "-m", model_dir, "-q", "8", "--device", "cpu",
                                       "--cpu-workers", str(args.cpu_workers), flag],
                                      capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
                wall = time.perf_counter() - t
                assert proc.returncode == 0, proc.stdout + proc.stderr
                stats = json.load(open(os.path.join(out, "stats.json")))
                results[name] = (wall, stats)
                plan = [line for line in proc.stdout.splitlines() if "split " in line or "to encode" in line]
                print(f"{name}: wall {wall:.1f} s, encoder idle {100 * stats['idle_fraction']:.1f}%; " + " | ".join(plan))
            import mimi_extract

            a, b = mimi_extract.open(os.path.join(tmp, "unsplit")), mimi_extract.open(os.path.join(tmp, "split"))
            same = sum(np.array_equal(a[k], b[k]) for k in a.keys())
            codes = np.concatenate([(a[k] == b[k]).ravel() for k in a.keys()])
            print(f"outputs: {same}/{len(a)} items identical, {100 * codes.mean():.4f}% of codes equal")
            print(f"speed-up: {results['unsplit'][0] / results['split'][0]:.2f}x wall")

        if args.skip_exact:
            return
        n = int(args.exact_minutes * 60 * 24000) + 777
        audio = torch.from_numpy((0.2 * rng.standard_normal(n)).astype(np.float32))
        t = time.perf_counter()
        ref = reference_single(model, audio, 32)
        t_ref = time.perf_counter() - t
        t = time.perf_counter()
        parts = [encode_piece(encoder, audio[begin:end], begin, first, 24000 * 4, ("encoder", "latent", "codes"), 32)
                 for begin, first, end in split_bounds(n, args.exact_pieces, rf, encoder.hop)]
        t_split = time.perf_counter() - t
        got = {tap: torch.cat([p[tap] for p in parts]) for tap in ("encoder", "latent", "codes")}
        for tap in ("encoder", "latent"):
            err = ((got[tap] - ref[tap]).abs().max() / ref[tap].abs().max()).item()
            print(f"exactness {args.exact_minutes:g} min, {args.exact_pieces} pieces, {tap}: "
                  f"{got[tap].shape[0]} frames, max |diff| / max |ref| = {err:.2e}")
        from mimi_extract.audit.verify import classify_codes

        mismatches, _ = classify_codes(model, got["codes"], ref["latent"], 32, got["latent"])
        ties, cascade = sum(m.tie for m in mismatches), sum(m.cascade and not m.tie for m in mismatches)
        real = len(mismatches) - ties - cascade
        print(f"code mismatches classified as verify does: {ties} tie flips, {cascade} in their cascades, {real} real")
        eq = (got["codes"] == ref["codes"]).float()
        print(f"codes (32 codebooks): {100 * eq.mean():.4f}% equal, first codebook {100 * eq[:, 0].mean():.4f}%, "
              f"frames with any difference {int((eq.min(1).values < 1).sum())} of {eq.shape[0]}")
        print(f"(reference {t_ref:.0f} s, pieces {t_split:.0f} s)")


if __name__ == "__main__":
    print(host_facts.header(), flush=True)
    main()
    print(host_facts.footer(), flush=True)
