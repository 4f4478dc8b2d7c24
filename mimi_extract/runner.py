"""The extraction loop: plan, decode, encode on every device, write, report.

With several devices there is one process per device, each taking every n-th length-sorted batch
(so each gets a similar mix of lengths); results travel back to the one writer process, which
owns the shards and the manifest.  With one device everything runs in-process.
"""

from __future__ import annotations

import math
import queue as queue_mod
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader

from . import __version__
from .audio import SAMPLE_RATE
from .discover import BatchDataset, Item, LoadedBatch, collate, find_audio, padding_fraction, plan_batches, probe
from .encoder import PaddedMimiEncoder, config_hash, load_config, load_model
from .writer import ShardWriter, check_run_info, recover

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Settings:
    """Everything a device worker needs (picklable, so spawned processes can rebuild the model)."""

    model: str = "kyutai/mimi"
    tap: str = "latent"  # encoder | latent | codes
    num_quantizers: int = 8
    devices: tuple[str, ...] = ("cpu",)
    dtype: str = "fp32"
    batch_size: int | None = None  # None: 64 on GPU, 1 on CPU (see default_batch_size)
    max_batch_seconds: float = 300.0
    num_workers: int = 2
    channel: str = "mix"
    causal_16k: bool = True
    feature_dtype: str = "float32"


def resolve_devices(spec: str) -> tuple[str, ...]:
    """``auto`` -> every CUDA device (or cpu); else a comma-separated list such as ``cuda:0,cuda:1``."""
    if spec == "auto":
        n = torch.cuda.device_count()
        return tuple(f"cuda:{i}" for i in range(n)) or ("cpu",)
    devices = tuple(d.strip() for d in spec.split(",") if d.strip())
    for d in devices:
        torch.device(d)  # raises on a malformed name
        if d.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {d!r} requested but CUDA is not available")
    return devices or ("cpu",)


def default_batch_size(devices: tuple[str, ...]) -> int:
    """Batching pays on GPUs; on CPU it is slower (measured 2x at 4 items: memory-bound convs)."""
    return 64 if any(d.startswith("cuda") for d in devices) else 1


def build_encoder(settings: Settings, device: str) -> PaddedMimiEncoder:
    if settings.dtype != "fp32" and not device.startswith("cuda"):
        raise ValueError(f"--dtype {settings.dtype} is for GPUs; use fp32 on {device}")
    if device.startswith("cuda") and settings.dtype == "fp32":
        # keep fp32 really fp32: TF32 matmuls/convs would break equality with the reference
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return PaddedMimiEncoder(load_model(settings.model, device, DTYPES[settings.dtype]))


def discover(input_dir: str, channel: str, limit: int | None = None) -> tuple[list[Item], list[Item]]:
    """(encodable items, error items) for every audio file below ``input_dir``."""
    paths = find_audio(input_dir)[:limit]
    with ThreadPoolExecutor(16) as pool:  # header reads are I/O bound (network file systems)
        items = [it for found in pool.map(lambda p: probe(p, input_dir, channel), paths) for it in found]
    return [it for it in items if it.error is None], [it for it in items if it.error is not None]


def _encode(encoder: PaddedMimiEncoder, batch: LoadedBatch, settings: Settings):
    """Encode one batch -> [(item, array)] ; on out-of-memory, halve the batch and retry."""
    device = next(encoder.parameters()).device
    try:
        out = encoder(
            batch.audio.to(device, DTYPES[settings.dtype]),
            batch.lengths,
            taps=(settings.tap,),
            num_quantizers=settings.num_quantizers,
        )
    except torch.cuda.OutOfMemoryError:
        if len(batch.items) == 1:
            return [], [(batch.items[0], "out of memory even alone; lower --max-batch-seconds or use a bigger device")]
        if device.type == "cuda":
            torch.cuda.empty_cache()
        half = len(batch.items) // 2
        results, errors = [], []
        for part in (slice(0, half), slice(half, None)):
            n = int(batch.lengths[part].max())
            sub = LoadedBatch(batch.items[part], batch.audio[part, :n], batch.lengths[part])
            r, e = _encode(encoder, sub, settings)
            results, errors = results + r, errors + e
        return results, errors
    tensor, frames = out.tensors[settings.tap], out.lengths[settings.tap]
    tensor = tensor.float() if settings.tap != "codes" else tensor
    tensor = tensor.cpu().numpy()
    results = []
    for i, item in enumerate(batch.items):  # slicing outputs, not model work
        n = int(frames[i])
        if settings.tap == "codes":
            results.append((item, tensor[i, :, :n].astype(np.int16)))
        else:
            results.append((item, tensor[i, :n].astype(settings.feature_dtype)))
    return results, []


def encode_batches(settings: Settings, batches: list[list[Item]], device: str):
    """Yield ``(results, errors, audio_seconds)`` per batch, decoding ahead in DataLoader workers."""
    encoder = build_encoder(settings, device)
    loader = DataLoader(
        BatchDataset(batches, settings.causal_16k),
        batch_size=None,
        collate_fn=collate,
        num_workers=settings.num_workers,
        prefetch_factor=2 if settings.num_workers else None,
        persistent_workers=False,
    )
    for batch in loader:
        results, errors = _encode(encoder, batch, settings) if batch.items else ([], [])
        yield results, errors + batch.errors, sum(it.duration for it in batch.items + [e[0] for e in batch.errors])


def _device_worker(settings: Settings, batches, device: str, out_queue) -> None:
    try:
        torch.set_num_threads(max(1, torch.get_num_threads() // max(1, len(settings.devices))))
        for message in encode_batches(settings, batches, device):
            out_queue.put(("batch", message))
        out_queue.put(("done", device))
    except BaseException:
        out_queue.put(("fail", f"{device}: {traceback.format_exc()}"))


def run_all(settings: Settings, batches: list[list[Item]]):
    """Yield per-batch results from every device (one process each when there are several)."""
    if len(settings.devices) == 1:
        yield from encode_batches(settings, batches, settings.devices[0])
        return
    ctx = torch.multiprocessing.get_context("spawn")
    out_queue = ctx.Queue(maxsize=4 * len(settings.devices))
    procs = [
        ctx.Process(target=_device_worker, args=(settings, batches[rank :: len(settings.devices)], dev, out_queue))
        for rank, dev in enumerate(settings.devices)
    ]
    for p in procs:
        p.start()
    running = len(procs)
    try:
        while running:
            try:
                kind, payload = out_queue.get(timeout=5)
            except queue_mod.Empty:
                if not any(p.is_alive() for p in procs):
                    raise RuntimeError("a device worker died without reporting (killed? out of host memory?)")
                continue
            if kind == "fail":
                raise RuntimeError(f"device worker failed:\n{payload}")
            if kind == "done":
                running -= 1
            else:
                yield payload
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join()


def row_for(item: Item) -> dict:
    return {
        "path": item.rel,
        "key": item.key,
        "channel": item.channel if isinstance(item.channel, int) else None,
        "sample_rate": item.sample_rate or None,
        "duration": round(item.duration, 4),
    }


def frame_rate(settings: Settings, config) -> float:
    """Frames per second of the chosen tap (25 Hz before the downsample, 12.5 Hz after)."""
    return float(config.sampling_rate / math.prod(config.upsampling_ratios)) if settings.tap == "encoder" else float(config.frame_rate)


def file_attrs(settings: Settings, config, chash: str) -> dict:
    attrs = {
        "tap": settings.tap,
        "frame_rate": frame_rate(settings, config),
        "sample_rate": SAMPLE_RATE,
        "model": settings.model,
        "config_hash": chash,
        "tool_version": __version__,
        "dtype": settings.dtype,
        "layout": "[num_quantizers, frames]" if settings.tap == "codes" else "[frames, dim]",
    }
    if settings.tap == "codes":
        attrs["num_quantizers"] = settings.num_quantizers
    return attrs


def run_info(settings: Settings, chash: str) -> dict:
    keep = ("model", "tap", "channel", "causal_16k", "feature_dtype", "dtype")
    info = {k: v for k, v in asdict(settings).items() if k in keep}
    if settings.tap == "codes":
        info["num_quantizers"] = settings.num_quantizers
    return {**info, "config_hash": chash}


def extract(input_dir: str, out_dir: str, settings: Settings, shard_size: int = 1000, shard_mb: float = 1024,
            limit: int | None = None, on_plan=None, on_batch=None) -> dict:
    """Encode every audio file below ``input_dir`` into ``out_dir``; resumes a previous run.

    ``on_plan(summary)`` is called once the work is planned, ``on_batch(n_items, seconds, n_errors)``
    after each batch is written.  Returns counts for the whole run."""
    items, bad = discover(input_dir, settings.channel, limit)
    config = load_config(settings.model)
    if settings.tap == "codes" and not 1 <= settings.num_quantizers <= config.num_quantizers:
        raise ValueError(f"--num-quantizers must be in 1..{config.num_quantizers}")
    chash = config_hash(config)
    check_run_info(out_dir, run_info(settings, chash))
    done = recover(out_dir)

    todo = [it for it in items if it.key not in done]
    bad = [it for it in bad if it.key not in done]
    batch_size = settings.batch_size or default_batch_size(settings.devices)
    batches = plan_batches(todo, settings.max_batch_seconds, batch_size)
    summary = {
        "inputs": len(items) + len(bad), "skipped": len(done), "todo": len(todo), "unreadable": len(bad),
        "batches": len(batches),
        "seconds": sum(it.duration for it in todo), "padding": padding_fraction(batches), "ok": 0, "errors": 0,
    }
    if on_plan:
        on_plan(summary)
    writer = ShardWriter(out_dir, file_attrs(settings, config, chash), shard_size, int(shard_mb * 2**20))
    try:
        for it in bad:
            writer.add_error(row_for(it), it.error)
        summary["errors"] += len(bad)
        rate = frame_rate(settings, config)
        for results, errors, seconds in run_all(settings, batches):
            for item, array in results:
                frames = array.shape[-1] if settings.tap == "codes" else array.shape[0]
                attrs = {"duration": item.duration, "source_sample_rate": item.sample_rate}
                writer.add(item.key, array, {**row_for(item), "frames": frames}, attrs)
            for item, message in errors:
                writer.add_error(row_for(item), message)
            summary["ok"] += len(results)
            summary["errors"] += len(errors)
            if on_batch:
                on_batch(len(results) + len(errors), seconds, len(errors))
    finally:
        writer.close()  # also on Ctrl-C: what was encoded is committed, the rest resumes later
    summary["frame_rate"] = rate
    return summary
