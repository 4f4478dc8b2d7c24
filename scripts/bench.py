"""Throughput: per-item encode vs naive padded batch vs mimi-extract's batched path.

    python scripts/bench.py                      # full-size Mimi architecture, random weights
    python scripts/bench.py --model kyutai/mimi  # real weights (needs network or a local dir)
    python scripts/bench.py --device cuda --files 512 --max-seconds 20

All three encode the same generated corpus (random lengths) to codes; speed is audio seconds per
wall second, model time only (decoding is excluded).  "naive" is transformers' MimiModel.encode on
batches in arrival order, zero-padded; its code mismatches vs per-item show why it is not used.
"""

import argparse
import time

import torch
from tqdm import tqdm
from transformers import MimiConfig

from mimi_extract.discover import Item, padding_fraction, plan_batches
from mimi_extract.encoder import PaddedMimiEncoder, load_model, prepare
from mimi_extract.testing import random_model, tiny_config

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--model", default="random-default", help="random-default | random-tiny | hub id | local dir")
p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
p.add_argument("--files", type=int, default=48)
p.add_argument("--min-seconds", type=float, default=1.0)
p.add_argument("--max-seconds", type=float, default=8.0)
p.add_argument("--batch-size", type=int, default=16)
p.add_argument("--num-quantizers", type=int, default=8)
p.add_argument("--seed", type=int, default=0)
args = p.parse_args()

if args.model.startswith("random-"):
    config = MimiConfig() if args.model == "random-default" else tiny_config()
    model = prepare(random_model(config, args.seed), args.device)
else:
    model = load_model(args.model, args.device)
encoder = PaddedMimiEncoder(model)
q = args.num_quantizers

g = torch.Generator().manual_seed(args.seed)
seconds = args.min_seconds + (args.max_seconds - args.min_seconds) * torch.rand(args.files, generator=g)
wavs = [0.1 * torch.randn(int(s * 24_000), generator=g) for s in seconds]
items = [Item("", str(i), str(i), samples=len(w)) for i, w in enumerate(wavs)]
total = sum(len(w) for w in wavs) / 24_000


def sync():
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


def pad(batch):
    audio = torch.nn.utils.rnn.pad_sequence([wavs[int(it.key)] for it in batch], batch_first=True)
    return audio.to(args.device), torch.tensor([it.samples for it in batch])


def timed(name, fn, batches):
    fn(batches[0])  # warm-up
    sync()
    start = time.perf_counter()
    outs = [fn(b) for b in tqdm(batches, desc=name, leave=False)]
    sync()
    return time.perf_counter() - start, outs


with torch.no_grad():
    single = [[it] for it in items]
    arrival = [items[i : i + args.batch_size] for i in range(0, len(items), args.batch_size)]
    planned = plan_batches(items, max_batch_seconds=args.batch_size * args.max_seconds, batch_size=args.batch_size)
    t_single, ref = timed("per-item", lambda b: model.encode(pad(b)[0][:, None], num_quantizers=q).audio_codes, single)
    t_naive, naive = timed("naive", lambda b: model.encode(pad(b)[0][:, None], num_quantizers=q).audio_codes, arrival)
    t_ours, ours = timed("mimi-extract", lambda b: encoder(*pad(b), ("codes",), q), planned)

    ref_codes = {it.key: r[0] for it, r in zip(items, ref)}
    naive_bad = sum(
        int((c[:, : ref_codes[it.key].shape[1]] != ref_codes[it.key]).sum())
        for b, codes in zip(arrival, naive) for it, c in zip(b, codes)
    )
    ours_bad = sum(
        int((o.tensors["codes"][i, :, : o.lengths["codes"][i]] != ref_codes[it.key]).sum())
        for b, o in zip(planned, ours) for i, it in enumerate(b)
    )

name = f"{args.model} on {args.device}" + (f" ({torch.get_num_threads()} threads)" if args.device == "cpu" else "")
print(f"\n{args.files} files, {total:.0f} s of audio, {args.min_seconds:g}-{args.max_seconds:g} s each, {name}")
print(f"{'path':<22}{'batches':>8}{'padding':>9}{'audio s / s':>13}{'speedup':>9}{'code mismatches':>17}")
for label, t, nb, padf, bad in [
    ("per-item encode", t_single, len(single), 0.0, 0),
    ("naive padded batch", t_naive, len(arrival), padding_fraction(arrival), naive_bad),
    ("mimi-extract batched", t_ours, len(planned), padding_fraction(planned), ours_bad),
]:
    print(f"{label:<22}{nb:>8}{100 * padf:>8.1f}%{total / t:>13.1f}{t_single / t:>8.2f}x{bad:>17}")
