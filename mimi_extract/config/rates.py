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

MEASURED_ON = "the project's 2-core test machine, busy (2026-12-06; scripts/bench_ceilings.py --torch-threads 1)"
TARGET_X = 20_000  # the throughput a GPU is planned for when no --gpu-rate is given (x real time)


@dataclass(frozen=True)
class FeedCost:
    """Host CPU per audio second of feeding a GPU at ``rate`` Hz (``bench_ceilings.py feed``: the decode
    pool, the feeder, the encoder thread's host share, the single writer; null encoder, GPU step
    shapes, HDF5 codes).  ``decode_us`` (the decode pool, resampling on the device: the default on a
    GPU) scales with the sample rate; ``fixed_us`` (the rest) does not; ``host_us`` is the decode pool
    with ``--resample-on host``, so that ``host_us + fixed_us`` is that run's total."""

    rate: int
    decode_us: float
    fixed_us: float
    host_us: float

    def us_per_audio_second(self, rate: int, on_device: bool = True) -> float:
        pool = self.decode_us if on_device else self.host_us
        return pool * rate / self.rate + self.fixed_us


# codec -> its feeding costs, measured at these rates (1,200 s of 2-20 s speech-like utterances per
# format, both resampling modes side by side; docs/performance.md "The host path of a GPU run").
# Vorbis and AAC were not run through the engine: their rows are the decoder's own rate
# (bench_sources.py decoders: libsndfile Vorbis 1,128x, PyAVFile AAC 1,058x per core) plus the
# fixed and resampling costs measured on the other 48 kHz rows -- derived, not measured.
FEED: dict[str, tuple[FeedCost, ...]] = {
    "pcm": (FeedCost(16_000, 42.0, 116.0, 616.0),),
    # dr_flac, a FLAC file read whole (0.4; 2026-12-07, bench_ceilings.py --sections feed --formats flac16k,flac48k
    # --seconds 1200 --resample-on host,device --torch-threads 1); libsndfile's: 264, 133, 694 / 720, 155, 1614
    "flac": (FeedCost(16_000, 182.0, 138.0, 471.0), FeedCost(48_000, 452.0, 160.0, 1129.0)),
    "mp3": (FeedCost(48_000, 778.0, 209.0, 1406.0),),  # FFmpeg's MP3 decoder (0.3; libsndfile's: 774, 251, 1686)
    "opus": (FeedCost(48_000, 3318.0, 231.0, 4229.0),),
    "vorbis": (FeedCost(48_000, 887.0, 200.0, 1787.0),),
    "aac": (FeedCost(48_000, 945.0, 200.0, 1845.0),),
}


def feed_cost(codec: str, rate: int) -> FeedCost:
    """The codec's cost measured at the rate nearest ``rate`` (scaled to it by ``us_per_audio_second``)."""
    return min(FEED[codec], key=lambda c: abs(c.rate - rate))


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
# one feeding process's ceiling, x real time: its audio over its GIL-held CPU (the feeder, the encoder
# thread's host share, the Python around each decoded block), device resampling, FLAC 16 kHz codes
# (bench_ceilings.py procs: 8,200-9,200x alone, 5,400-6,900x with 3-4 on the 2 cores)
PROCESS_X = 7_000
# one writer process stores at most this much, x real time: since 0.4.0 the cap of Ray actors that do not see
# OUT's folder only (the driver writes their items; the local engine's workers and Ray actors that see it write
# their own shards, docs/performance.md issue 40), and of --single-writer
# (the same runs, steady state from its first
# chunk: receiving, stitching and storing 10-s-ish items of codes; the same with 1 to 4 feeding processes)
# Megatron: not in those runs; measured after, side by side with the others (2026-12-06, a quiet machine, 4,800 s,
# 2 processes: hdf5 33,700x, parquet 136,000x, shar 54,600x, megatron 112,600x), so put at 3.3x HDF5's figure
# here and kept below Parquet's (0.83x in that run)
WRITER_X = {"hdf5": 12_000, "parquet": 58_000, "shar": 24_000, "megatron": 40_000}

# output bytes on disk (shards, manifests, cuts) per raw array byte, measured by bench_ceilings.py write
# (10 s items, 1000 per shard: each format's own overheads, zstd for Parquet); codes int16 [frames, 8]
# of uniform random codes (~11 bits each, as Mimi's codebooks are used), latents float32 [frames, 512]
BYTES_PER_ARRAY_BYTE = {
    ("hdf5", "codes"): 1.37, ("parquet", "codes"): 0.88, ("shar", "codes"): 2.30,
    ("hdf5", "features"): 1.03, ("parquet", "features"): 0.93, ("shar", "features"): 1.01,
    # codes only: flat layout, uint16 token ids (under 65,500 ids; int32 ids double the .bin), the same
    # bench (its write section, 2026-12-06: hdf5 1.37, parquet 0.90, shar 2.31 in the same run)
    ("megatron", "codes"): 1.25,
}
FEATURE_DIMS = 512  # kyutai/mimi's encoder and latent features
CODEBOOK_SIZE = 2048  # kyutai/mimi's codes per codebook (plan's token ids; a test holds it to the model's config)
