"""Measured rates, for ``mimi-extract plan`` to turn a corpus into cores and hours.

Every figure here was measured by a script of this repository (dated, with its command, in
docs/performance.md); nothing is a guess.  Where nothing was measured (a GPU's encoding rate, until
``scripts/gpu_check.sh`` runs on one) the value is None and the plan says "unmeasured".  The host
figures are CPU time (``time.process_time``), so they do not depend on the machine's load, but they
are this test machine's cores: a faster server core decodes faster.  Torch-free (``plan`` imports it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MEASURED_ON = "2 shared cores (the project's test machine), 2026-12-06, scripts/bench_ceilings.py --torch-threads 1"
TARGET_X = 20_000  # the throughput a GPU is planned for when no --gpu-rate is given (x real time)


@dataclass(frozen=True)
class FeedCost:
    """Host CPU per audio second of feeding a GPU (``bench_ceilings.py feed``: the decode pool, the
    feeder, the encoder thread's host share, the single writer; null encoder), at ``rate`` Hz.
    ``decode_us`` scales with the sample rate (it is decoding, per sample); ``fixed_us`` does not."""

    rate: int
    decode_us: float  # the decode pool, device resampling (the default on a GPU)
    fixed_us: float  # feeder + encoder thread + writer + the rest
    host_resample_us: float  # the decode pool with resampling on the host (--resample-on host), for comparison

    def us_per_audio_second(self, rate: int, on_device: bool = True) -> float:
        pool = self.decode_us if on_device else self.host_resample_us
        return pool * rate / self.rate + self.fixed_us


# codec -> its measured feeding cost (bench_ceilings.py feed, 1,200 s of 2-20 s utterances per format)
FEED: dict[str, FeedCost] = {
    "pcm": FeedCost(16_000, 80.0, 120.0, 450.0),
    "flac": FeedCost(16_000, 280.0, 170.0, 830.0),
    "mp3": FeedCost(48_000, 600.0, 170.0, 1400.0),
    "vorbis": FeedCost(48_000, 850.0, 170.0, 1650.0),
    "opus": FeedCost(48_000, 1500.0, 170.0, 2300.0),
    "aac": FeedCost(48_000, 800.0, 170.0, 1600.0),
}
CODEC_OF_EXTENSION = {
    ".wav": "pcm", ".aiff": "pcm", ".aif": "pcm", ".aifc": "pcm", ".caf": "pcm", ".w64": "pcm", ".rf64": "pcm",
    ".au": "pcm", ".snd": "pcm", ".flac": "flac", ".mp3": "mp3", ".mp2": "mp3", ".mp1": "mp3", ".mpga": "mp3",
    ".mpeg": "mp3", ".ogg": "vorbis", ".oga": "vorbis", ".opus": "opus", ".webm": "opus", ".mka": "opus",
    ".m4a": "aac", ".mp4": "aac", ".aac": "aac", ".alac": "aac", ".wma": "aac", ".asf": "aac", ".ac3": "aac",
    ".amr": "aac", ".3gp": "aac", ".mkv": "aac",
}


def codec_of(name: str) -> str:
    """The codec class of a file or member name, by extension (as the decoders are chosen); an
    unknown extension is costed as AAC (PyAV's typical rate)."""
    return CODEC_OF_EXTENSION.get(os.path.splitext(name.lower())[1], "aac")


# full-size Mimi, fp32, on one CPU core (docs/performance.md "Throughput": two single-threaded
# workers, ~15-16 audio s/s on 2 cores, end to end)
CPU_X_PER_CORE = 7.5
# a GPU's encoding rate, x real time of the full-size model (None: not measured yet; scripts/gpu_check.sh)
GPU_X: dict[str, float | None] = {"H100": None, "H200": None}
# one feeding process's ceiling, x real time: the GIL-held share of its work (feeder, encoder thread,
# the Python around each decoded block; bench_ceilings.py procs), device resampling
PROCESS_X = 7_000
# one writer process stores at most this much (x real time; bench_ceilings.py procs, FLAC 16 kHz codes)
WRITER_X = {"hdf5": 19_500, "parquet": 118_000, "shar": None}

# output bytes on disk per raw array byte, measured by bench_ceilings.py write (10 s items, 1000 per
# shard: the formats' own overheads, zstd for Parquet); codes int16 [frames, 8], latents float32 [frames, 512]
BYTES_PER_ARRAY_BYTE = {
    ("hdf5", "codes"): 1.18, ("parquet", "codes"): 0.70, ("shar", "codes"): 1.88,
    ("hdf5", "features"): 1.01, ("parquet", "features"): 0.93, ("shar", "features"): 1.02,
}
FEATURE_DIMS = 512  # kyutai/mimi's encoder and latent features
