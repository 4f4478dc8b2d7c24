"""``mimi-extract plan INPUT``: what a run over INPUT would take, without a model.

It reads only what a run's indexing reads (``sources.discover``: the listing and each item's audio
header) and turns the items into sizes (hours, a duration histogram, frames and tokens, output bytes
per format and tap) and, through the measured rates of :mod:`~mimi_extract.config.rates`, into costs: the
host cores a GPU needs for this corpus's codecs, the time per device kind, and how many ``--part`` s
make tasks of a given size.  Torch-free: no model, no encoder, seconds on 100k items (docs).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..config import rates
from ..config.choices import SAMPLE_RATE
from ..config.taps import frame_rate
from ..audio.framing import Framing
from ..config.input_options import Options
from .report import duration_histogram
from ..config.settings import Feeders, cpu_cores, feeding
from ..formats.megatron import Tokens
from ..sources import discover

TAPS = ("codes", "latent", "encoder")
FORMATS = ("hdf5", "parquet", "shar", "megatron")  # (megatron: codes only)


@dataclass
class PlanAsk:
    """What ``plan`` is asked besides INPUT (the command line's options)."""

    num_quantizers: int = 8
    feature_dtype: str = "float32"
    part_hours: float = 1000.0  # audio hours per part of a job array
    cores: int | None = None  # host cores (None: this machine's)
    gpus: int = 1
    gpu_rate: float | None = None  # x real time per GPU (None: the measured one, unmeasured so far)
    output_format: str = "hdf5"  # the format whose single writer caps Ray actors that do not see OUT (the driver's)
    limit: int | None = None
    token_layout: str = "flat"  # --format megatron's ids (--token-layout, --token-offset): their width
    token_offset: int = 0

    @property
    def tokens(self) -> Tokens:
        return Tokens(self.token_layout, self.token_offset, rates.CODEBOOK_SIZE, self.num_quantizers)


def frames(samples: np.ndarray, tap: str) -> np.ndarray:
    """Frames of ``tap`` for encoder inputs of ``samples`` (24 kHz, framing padding included): Mimi's
    causal convs give ceil(samples / stride product) (tested against the encoder's own arithmetic)."""
    per = round(SAMPLE_RATE / frame_rate(tap))  # 1920 samples a 12.5 Hz frame, 960 a 25 Hz one
    return -(-samples // per)


def _bytes(frame_count: int, tap: str, ask: PlanAsk) -> dict[str, int]:
    """Output bytes of ``frame_count`` frames of ``tap`` per format: the arrays' bytes times the
    format's measured overhead (``rates.BYTES_PER_ARRAY_BYTE``).  Megatron's was measured with
    uint16 ids (2 bytes a code, as the int16 arrays); ids wider than that (``ask.tokens.dtype``:
    int32 past 65,500 ids) add their extra bytes per token to the ``.bin``."""
    if tap == "codes":
        raw, kind = frame_count * ask.num_quantizers * 2, "codes"
    else:
        raw, kind = frame_count * rates.FEATURE_DIMS * (2 if ask.feature_dtype == "float16" else 4), "features"
    found = {"arrays": int(raw), **{f: int(raw * rates.BYTES_PER_ARRAY_BYTE[f, kind]) for f in FORMATS
                                    if (f, kind) in rates.BYTES_PER_ARRAY_BYTE}}
    if "megatron" in found:
        found["megatron"] += frame_count * ask.num_quantizers * (np.dtype(ask.tokens.dtype).itemsize - 2)
    return found


def _estimates(ask: PlanAsk, cores: int, us: float, feeders: Feeders) -> dict:
    """The time per device kind: the CPU's (its cores), each GPU kind's (its rate, or ``ask.gpu_rate``),
    bound per GPU by what the host's cores feed (``us`` CPU per audio second) and by the feeding
    processes (``feeders``: each at its rate for the corpus's codecs); GPUs x that, no single writer's
    cap (every device worker writes its own shards), but Ray's driver's where its actors do not see OUT."""
    gpu_rate = ask.gpu_rate or next((v for v in rates.GPU_X.values() if v), None)
    estimates = {"cpu": {"x_real_time": cores * rates.CPU_X_PER_CORE, "cores": cores, "measured": True}}
    for name, x in ({"gpu": gpu_rate} if ask.gpu_rate else rates.GPU_X).items():
        if not x:
            estimates[name] = {"x_real_time": None, "measured": False}
            continue
        bounds = {"GPU": x, "host cores": (cores / max(1, ask.gpus)) * 1e6 / us if us else math.inf,
                  "feeding processes": feeders.count * feeders.process_x}
        bound = min(bounds, key=bounds.get)  # (GPU first: it wins a tie)
        machine = ask.gpus * bounds[bound]
        # Ray actors that see OUT's folder write their own shards too; on machines that do not, the driver stores
        # their items: its one writer's cap
        ray = min(machine, rates.WRITER_X.get(ask.output_format) or math.inf)
        estimates[name] = {"x_real_time": machine, "gpus": ask.gpus, "cores": cores, "bound": bound,
                           "measured": not ask.gpu_rate, "ray_x_real_time": ray}
    return estimates


def plan_report(source: str, options: Options | None = None, channel: str = "mix", framing: Framing = Framing(),
                ask: PlanAsk | None = None) -> dict:
    ask = ask or PlanAsk()
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    found = discover(source, channel, framing, ask.limit, options=options)
    indexing = {"wall_s": round(time.perf_counter() - t_wall, 3), "cpu_s": round(time.process_time() - t_cpu, 3)}
    items = found.items
    seconds = np.array([it.duration for it in items], dtype=np.float64)
    samples = np.array([it.samples for it in items], dtype=np.int64)
    hours = float(seconds.sum()) / 3600
    counts = {tap: int(frames(samples, tap).sum()) for tap in TAPS}
    codec_mix = found.codec_mix
    total = max(codec_mix.total, 1e-12)
    # each part's costs for its items' mean length: a corpus of 2 s clips pays each item's opening, bookkeeping
    # and dataset over fewer audio seconds than the measured corpora's 11 s utterances
    mix = [{"codec": p.codec, "sample_rate": p.rate, "hours": share * total / 3600, "share": share,
            "items": p.items, "mean_item_s": p.item_seconds,
            "host_us_per_audio_s": rates.feed_cost(p.codec, p.rate).us_per_audio_second(p.rate, True, p.item_seconds),
            "host_us_per_audio_s_host_resampling": rates.feed_cost(p.codec, p.rate).us_per_audio_second(
                p.rate, False, p.item_seconds),
            "one_process_x": rates.process_x(p.codec, p.rate, p.item_seconds)}
           for p, share in codec_mix.shares()]
    us = sum(m["share"] * m["host_us_per_audio_s"] for m in mix)
    us_host = sum(m["share"] * m["host_us_per_audio_s_host_resampling"] for m in mix)
    target = ask.gpu_rate or rates.TARGET_X
    cores = ask.cores or cpu_cores()
    # the feeding processes per GPU for this corpus's codecs: the run's default (for rates.TARGET_X per GPU) and
    # the suggestion for this plan's target (--gpu-rate), one rule (settings.feeding)
    feeders = feeding(ask.gpus, cores, codec_mix, target)
    default = feeding(ask.gpus, cores, codec_mix)
    estimates = _estimates(ask, cores, us, feeders)
    for e in estimates.values():
        e["hours"] = total / e["x_real_time"] / 3600 if e.get("x_real_time") else None
    parts = max(1, math.ceil(hours / ask.part_hours)) if ask.part_hours > 0 else 1
    reasons = Counter(it.error for it in found.bad)
    return {
        "input": found.root, "kind": found.kind, "items": len(items), "unreadable": len(found.bad),
        "errors_by_reason": dict(reasons.most_common(10)), "warnings": found.warnings,
        "hours": hours, "durations": duration_histogram(seconds),
        "frames": {"12.5 Hz (latent, codes)": counts["codes"], "25 Hz (encoder)": counts["encoder"]},
        "tokens": counts["codes"] * ask.num_quantizers, "num_quantizers": ask.num_quantizers,
        "token_ids": {"layout": ask.token_layout, "offset": ask.token_offset, "dtype": ask.tokens.dtype},
        "bytes": {tap: _bytes(counts[tap], tap, ask) for tap in TAPS},
        "codecs": mix,
        "host": {"us_per_audio_s": us, "us_per_audio_s_host_resampling": us_host, "target_x": target,
                 "cores_per_gpu": target * us / 1e6, "cores_per_gpu_host_resampling": target * us_host / 1e6,
                 "measured_on": rates.MEASURED_ON},
        "feeders": {"per_gpu": feeders.count, "wanted": feeders.wanted, "half_cores_per_gpu": feeders.cap,
                    "bound_by_cores": feeders.bound_by_cores, "one_process_x": feeders.process_x,
                    "target_x": target, "default_per_gpu": default.count},
        "estimates": estimates,
        "parts": {"part_hours": ask.part_hours, "count": parts,
                  "hours_per_part": hours / parts},
        "indexing": indexing,
    }

