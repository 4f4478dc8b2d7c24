"""``decode --all``'s decoding: each item alone through ``MimiModel.decode`` (what decode did before
0.4.0) vs the length-sorted padded batches of :class:`~mimi_extract.codec.decoder.PaddedMimiDecoder`
(long items in chunks), side by side on the same codes, interleaved rounds, best of each.

    python scripts/bench_decode.py --items 24 --min-seconds 2 --max-seconds 12 --threads 1 --rounds 3

Full-size Mimi architecture with seeded random weights (speed does not depend on the weights); checks
that the two agree to the suite's tolerance before timing.
"""

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import os
import sys
import time

import torch
from transformers import MimiConfig

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

from mimi_extract.audit.decode import decode_batches, decode_limits  # noqa: E402
from mimi_extract.codec.decoder import PaddedMimiDecoder, decode_chunked  # noqa: E402
from mimi_extract.codec.demo import random_model, tiny_config  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--items", type=int, default=24)
p.add_argument("--min-seconds", type=float, default=2)
p.add_argument("--max-seconds", type=float, default=12)
p.add_argument("--codebooks", type=int, default=8)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--model", choices=["full", "tiny"], default="full")
p.add_argument("--device", default="cpu")
p.add_argument("--batch-frames", type=int, help="padded frames per batch [default: decode's for the device]")
p.add_argument("--chunk-frames", type=int, help="frames per chunk of a long item [default: decode's for the device]")
a = p.parse_args()
print(host_facts.header(), flush=True)
torch.set_num_threads(a.threads)
model = random_model(MimiConfig() if a.model == "full" else tiny_config(), seed=0).to(a.device)
g = torch.Generator().manual_seed(0)
frames = [int(12.5 * (a.min_seconds + (a.max_seconds - a.min_seconds) * i / max(1, a.items - 1)))
          for i in torch.randperm(a.items, generator=g).tolist()]
codes = [torch.randint(0, model.config.codebook_size, (n, a.codebooks), generator=g).to(a.device) for n in frames]
decoder = PaddedMimiDecoder(model)
keys = [str(i) for i in range(a.items)]
limits = (a.batch_frames or decode_limits(a.device)[0], a.chunk_frames or decode_limits(a.device)[1])


def sync():
    if a.device.startswith("cuda"):
        torch.cuda.synchronize()


def alone():
    with torch.no_grad():
        return [model.decode(c.T[None]).audio_values[0, 0] for c in codes]


def batched():
    out = [None] * len(codes)
    for batch in decode_batches(keys, frames, *limits):
        for k, audio in zip(batch, decode_chunked(decoder, [codes[int(k)] for k in batch], limits[1])):
            out[int(k)] = audio
    return out


ref, got = alone(), batched()
worst = max(float((r - x).abs().max() / max(1.0, float(r.abs().max()))) for r, x in zip(ref, got))
assert worst <= 1e-5, worst
times = {"alone (MimiModel.decode)": [], "padded batches": []}
for _ in range(a.rounds):
    for name, fn in (("alone (MimiModel.decode)", alone), ("padded batches", batched)):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times[name].append(time.perf_counter() - t0)
audio_s = sum(frames) / 12.5
print(f"{a.items} items, {audio_s:.0f} s of audio, {a.model} model, {a.device}, {a.threads} thread(s), "
      f"batches of <= {limits[0]} padded frames, chunks of {limits[1]}; "
      f"max relative difference {worst:.2e}")
for name, t in times.items():
    print(f"  {name:26s} best {min(t):7.2f} s  ({audio_s / min(t):6.1f}x real time)  rounds {[round(x, 2) for x in t]}")
base, new = (min(t) for t in times.values())
print(f"  speed-up {base / new:.2f}x")
print(host_facts.footer(), flush=True)
