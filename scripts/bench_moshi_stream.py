"""--framing moshi-stream against Kyutai's moshi 0.2.13 itself, full-size architecture (issue 15, part 1).

A seeded random moshi Mimi (kyutai/mimi's sizes) is converted to transformers' layout
(tests/support/moshi_ref.py: the q/k RoPE permutation included).  One noise file is encoded by moshi's
streaming encode, N frames (1920 samples) per call, and compared per codebook with
(a) moshi's non-streaming ``encode`` (what ``--framing moshi`` reproduces) and
(b) the tool's ``moshi-stream`` framing (one batched pass with moshi's ring-buffer mask).

    .venv/bin/python scripts/bench_moshi_stream.py --seconds 15 --frames-per-call 1 2 4
"""

from __future__ import annotations

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--frames-per-call", type=int, nargs="+", default=[1, 2, 4])
    args = ap.parse_args()
    from moshi_ref import moshi_encode, moshi_mimi, to_transformers
    from transformers import MimiConfig

    from mimi_extract.codec.encoder import PaddedMimiEncoder, frames_of
    from mimi_extract.codec.model import prepare

    torch.manual_seed(0)
    config = MimiConfig()
    moshi = moshi_mimi(config, seed=0)
    model = prepare(to_transformers(moshi, config))
    n = int(args.seconds * 24000)
    audio = 0.1 * torch.randn(n, generator=torch.Generator().manual_seed(1))
    audio = torch.nn.functional.pad(audio, (0, -n % 1920))  # moshi's whole frames
    plain = moshi_encode(moshi, audio, None, ("latent", "codes"))
    tol = lambda ref: 1e-5 * max(1.0, float(ref.abs().max()))  # noqa: E731
    for fpc in args.frames_per_call:
        stream = moshi_encode(moshi, audio, fpc, ("latent", "codes"))
        enc = PaddedMimiEncoder(model, fpc)
        out = enc(audio[None], torch.tensor([len(audio)]), ("latent", "codes"), 32)
        ours = {t: frames_of(out, t, 0) for t in ("latent", "codes")}
        for name, got in (("moshi non-streaming (--framing moshi)", plain), ("moshi-stream", ours)):
            eq = (got["codes"] == stream["codes"]).float()
            per = " ".join(f"{100 * v:.1f}" for v in eq.mean(0).tolist())
            over = torch.nonzero((got["latent"] - stream["latent"]).abs().amax(-1) > tol(stream["latent"])).flatten()
            first = f"latent leaves float tolerance at frame {int(over[0])} ({int(over[0]) * 0.08:.2f} s)" if len(over) \
                else "latent within float tolerance everywhere"
            print(f"{fpc} frame(s)/call, {name}: {100 * eq.mean():.2f}% of codes equal to moshi streaming "
                  f"({eq.shape[0]} frames x 32 codebooks); {first}")
            print(f"    per codebook: {per}")


if __name__ == "__main__":
    print(host_facts.header(), flush=True)
    main()
    print(host_facts.footer(), flush=True)
