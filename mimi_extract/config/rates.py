"""Measured rates, for ``mimi-extract plan`` to turn a corpus into cores and hours.

Every figure here was measured by a script of this repository (dated, with its command, in
docs/performance.md); nothing is a guess.  Where nothing was measured (a GPU's encoding rate, until
``scripts/gpu_check.sh`` runs on one) the value is None and the plan says "unmeasured".  The host
figures are CPU time (``time.process_time``), so they do not depend on the machine's load, but they
are this test machine's cores: a faster server core decodes faster.  Torch-free (``plan`` imports it).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

MEASURED_ON = ("the project's 2-core test machine, busy (feeding costs 2026-12-08, the rest 2026-12-06; "
               "scripts/bench_ceilings.py --torch-threads 1)")
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
    # CPU per item (opening it, its reader's, feeder's and writer's bookkeeping, its HDF5 dataset), already in
    # the figures above at the measured corpora's FEED_ITEM_SECONDS an item, added or taken off for corpora
    # of other lengths: the decode pool's share (decode_item_us) and the rest's (fixed_item_us)
    decode_item_us: float = 0.0
    fixed_item_us: float = 0.0

    def pool_us(self, rate: int, on_device: bool = True, item_seconds: float | None = None) -> float:
        """The decode pool's CPU per audio second at ``rate`` Hz, for items of ``item_seconds`` on average
        (None: the measured corpora's length).  Only the per-sample part scales with the rate: the items'
        own share of the measured figure (``decode_item_us`` an item, FEED_ITEM_SECONDS long) is per item
        whatever their rate (scaled with it, an 8 kHz WAV corpus of 60 s items came out at -4 µs)."""
        pool = self.decode_us if on_device else self.host_us
        per_item = self.decode_item_us / FEED_ITEM_SECONDS
        return (pool - per_item) * rate / self.rate + per_item + self.decode_item_us * _more_items(item_seconds)

    def us_per_audio_second(self, rate: int, on_device: bool = True, item_seconds: float | None = None) -> float:
        """All of the feed's CPU per audio second (see :meth:`pool_us`)."""
        return self.pool_us(rate, on_device, item_seconds) + self.fixed_us + self.fixed_item_us * _more_items(item_seconds)


# the mean utterance of the corpora FEED was measured on (bench_ceilings.py's 2-20 s: 274 items in 3,003 s)
FEED_ITEM_SECONDS = 10.96


def _more_items(item_seconds: float | None) -> float:
    """Items per audio second beyond the measured corpora's (negative for longer items)."""
    return 0.0 if item_seconds is None else 1 / max(item_seconds, 0.01) - 1 / FEED_ITEM_SECONDS


# codec -> its feeding costs, measured at these rates: medians of 3 runs, one corpus at a time, 2026-12-08 00:10-00:18
# UTC on this 2-core machine (load 1-5 from other sessions), at 93272a6: ``scripts/bench_ceilings.py --sections feed
# --formats F --seconds 1200 --resample-on host,device --torch-threads 1`` for F in flac16k, flac48k, wav16k,
# mp3-48k, opus48k, opus16k (1,200 s of 2-20 s speech-like utterances each; docs/performance.md "FEED re-measured").
# decode_us: the decode pool, resampling on the device; fixed_us: the feeder, the encoder thread's host share, the
# writer thread and the rest, less the bench's null encoder (7-10 us); host_us: the decode pool resampling on the host.
# Since 0.4 FLAC read whole goes through dr_flac, MP3 and Ogg Opus through FFmpeg (taking turns in a process).
# Before (2026-12-06/07): pcm 42, 116, 616; flac 182, 138, 471 / 452, 160, 1129; mp3 778, 209, 1406; opus 3318,
# 231, 4229 (libsndfile's libopus).  Opus decodes at 48 kHz whatever rate its header states (audio.decoders), so
# its items are 48 kHz: the row is full-band Opus's; a speech corpus's Opus (16 kHz stated: opus16k) costs 0.85x
# (1417, 134, 1967).
# Vorbis and AAC were not run through the engine: their rows are derived, not measured: the decoder's own rate
# (bench_sources.py decoders: libsndfile Vorbis 1,128x, PyAVFile AAC 1,058x per core) times the decode pool's cost
# over the decoder alone on the measured 48 kHz rows (1.12x: FLAC 448 / 401, MP3 983 / 855, Opus 1669 / 1513), plus
# those rows' median fixed cost (165) and host resampling (host_us - decode_us: 551).
# Per item (decode_item_us, fixed_item_us): the same runs on 3,000 s corpora of 1-4 s utterances (1,208 items)
# against 2-20 s ones (274), 2 runs each, 2026-12-08 00:40-00:58 UTC at 6a7136e (before the writer's per-item
# cut of that stop): the difference in each role's CPU per audio second over the difference in items per audio
# second (0.311), the bench's null encoder left out (Opus: one run each, at 6a7136e + its merges).  FLAC 48 kHz is given FLAC 16 kHz's, Vorbis PCM's (both
# libsndfile's opening) and AAC MP3's (FFmpeg's): derived, not measured.
FEED: dict[str, tuple[FeedCost, ...]] = {
    "pcm": (FeedCost(16_000, 33.0, 62.0, 365.0, 279.0, 482.0),),
    "flac": (FeedCost(16_000, 163.0, 65.0, 460.0, 170.0, 434.0),  # dr_flac, read whole
             FeedCost(48_000, 448.0, 111.0, 994.0, 170.0, 434.0)),
    "mp3": (FeedCost(48_000, 983.0, 189.0, 1534.0, 830.0, 416.0),),  # FFmpeg's MP3 decoder
    "opus": (FeedCost(48_000, 1669.0, 165.0, 2285.0, 977.0, 571.0),),  # FFmpeg's Opus decoder, at 48 kHz
    "vorbis": (FeedCost(48_000, 990.0, 165.0, 1541.0, 279.0, 482.0),),  # derived
    "aac": (FeedCost(48_000, 1056.0, 165.0, 1607.0, 830.0, 416.0),),  # derived
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


# The codec classes FFmpeg decodes (PyAV: ``audio.decoders.PYAV_EXTENSIONS``, held to it by a test).  Their
# decodes take turns within a process (``audio.decoders.FFMPEG_TURNS``: PyAV needs the GIL around each frame,
# so two decoding threads ran no faster than one), so one feeding process decodes them at one core's speed,
# whatever its decoding threads; libsndfile and dr_flac (PCM, FLAC, Vorbis) decode in parallel threads.
FFMPEG_CODECS = frozenset({"mp3", "opus", "aac"})


def process_x(codec: str, rate: int, item_seconds: float | None = None) -> float:
    """x real time one feeding process feeds of ``codec`` at ``rate`` Hz (items of ``item_seconds`` on
    average; None: the measured corpora's): its GIL's ceiling (:data:`PROCESS_X`), and for FFmpeg's codecs
    (:data:`FFMPEG_CODECS`) no more than one core decodes: the inverse of the decode pool's CPU per audio
    second (:data:`FEED`, bench_ceilings.py's feed section, resampling on the device as on a GPU), that
    one core's time with the Python around FFmpeg's frames and each item's opening: MP3 48 kHz 1,017x,
    Opus 599x on 11 s items.  It agrees with what ``scripts/bench_decode_threads.py`` measured as wall
    throughput of a process's two decoding threads taking turns (MP3 909-933x, Opus 578-588x, 2026-12-07)."""
    if codec not in FFMPEG_CODECS:
        return PROCESS_X
    return min(PROCESS_X, 1e6 / feed_cost(codec, rate).pool_us(rate, item_seconds=item_seconds))


@dataclass(frozen=True)
class MixPart:
    """One codec class at one sample rate in a corpus: its audio seconds and its items."""

    codec: str
    rate: int
    seconds: float
    items: int

    @property
    def item_seconds(self) -> float:
        """Its items' mean length (what each item's own costs are spread over)."""
        return self.seconds / max(1, self.items)


@dataclass(frozen=True)
class CodecMix:
    """A corpus's audio seconds and items per codec class and sample rate (``codec_of``; most seconds
    first): what ``plan`` weights the feeding costs by, and what the run's default feeding processes per
    GPU are sized from (``settings.feeders_per_gpu``: an MP3 corpus wants more processes than a FLAC one;
    a corpus of short clips costs more per audio second than one of long recordings)."""

    parts: tuple[MixPart, ...] = ()

    @classmethod
    def of(cls, named: Iterable[tuple[str, int, float]]) -> CodecMix:
        """The mix of (file or member name, sample rate, audio seconds) triples, one per item."""
        seconds: dict[tuple[str, int], float] = {}
        items: Counter[tuple[str, int]] = Counter()
        for name, rate, length in named:
            key = (codec_of(name), int(rate))
            seconds[key] = seconds.get(key, 0.0) + float(length)
            items[key] += 1
        ordered = sorted(seconds.items(), key=lambda kv: -kv[1])
        return cls(tuple(MixPart(c, r, s, items[c, r]) for (c, r), s in ordered))

    @property
    def total(self) -> float:
        return sum(p.seconds for p in self.parts)

    def shares(self) -> list[tuple[MixPart, float]]:
        """Each part with its share of the audio seconds, most first."""
        total = max(self.total, 1e-12)
        return [(p, p.seconds / total) for p in self.parts]

    def process_x(self) -> float:
        """x real time one feeding process feeds of this mix: each part at :func:`process_x`'s rate, its
        share of the process's time in proportion (:data:`PROCESS_X` for an empty mix)."""
        shares = self.shares()
        if not shares or self.total <= 0:  # (no audio: nothing to size from)
            return PROCESS_X
        return 1 / sum(share / process_x(p.codec, p.rate, p.item_seconds) for p, share in shares)


# full-size Mimi, fp32, on one CPU core (docs/performance.md "Throughput": two single-threaded
# workers, ~15-16 audio s/s on 2 cores, end to end)
CPU_X_PER_CORE = 7.5
# a GPU's encoding rate, x real time of the full-size model (None: not measured yet; scripts/gpu_check.sh)
GPU_X: dict[str, float | None] = {"H100": None, "H200": None}
# one feeding process's ceiling, x real time: its audio over its GIL-held CPU (the feeder, the encoder
# thread's host share, the Python around each decoded block), device resampling, FLAC 16 kHz codes
# (bench_ceilings.py procs: 8,200-9,200x alone, 5,400-6,900x with 3-4 on the 2 cores).  Re-checked 2026-12-08
# (``--sections procs --procs 1,2 --formats flac16k --procs-formats hdf5``, each worker writing its own shards,
# 2 runs): 9,063-9,121x alone, 8,114-8,761x with 2; 3-4 on the 2 cores not re-run, so kept.  FFmpeg's codecs
# decode slower than this in one process (process_x: MP3 48 kHz 1,017x, Opus 599x).
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
