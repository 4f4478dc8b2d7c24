"""What a run computes and how (:class:`Settings`: one picklable object shared by the runner,
engines and workers), and which part of a job array it is (:class:`Part`, ``--part``).

Torch-free (plain values; ``engines.device`` turns them into torch devices and dtypes), so the CLI
builds it and a spawned worker unpickles it before the seconds of torch imports."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace

from . import rates
from .choices import RESAMPLE_ON, SAMPLE_RATE


@dataclass
class Settings:
    """Everything a device worker needs (picklable, so spawned processes and Ray actors rebuild the model)."""

    model: str = "kyutai/mimi"
    tap: str = "latent"  # encoder | latent | codes
    num_quantizers: int = 8
    devices: tuple[str, ...] = ("cpu",)  # a worker on each; a GPU named once is fed by feeders_per_gpu (see fed)
    # processes feeding each GPU that ``devices`` names once (--feeders-per-gpu); None: as many as the corpus's
    # codecs want (the command line's default), sized by the run once it has found its items (:meth:`fed`)
    feeders_per_gpu: int | None = 1
    dtype: str = "fp32"
    batch_size: int | None = None  # rows per step; None: 64 on GPU, 8 on CPU
    max_batch_seconds: float | None = None  # padded seconds per step; None: 300 on GPU, 4 on CPU
    chunk_seconds: float | None = None  # longer files are streamed in chunks of it; None: 30 GPU, 4 CPU
    num_workers: int | None = None  # decoding threads per device; None: see decode_threads
    threads: int | None = None  # torch threads per device worker (None: cores / workers)
    channel: str = "mix"
    causal_16k: bool = False  # 16 kHz through the causal (delayed) resampler instead of torchaudio's
    framing: str = "transformers"
    frames_per_call: int = 1  # --framing moshi-stream: frames per moshi streaming call
    resampled_length: str = "torchaudio"  # audio.Framing.length ("exact": an OUT made before 0.3, resumed)
    feature_dtype: str = "float32"
    engine: str = "local"
    single_writer: bool = False  # --single-writer (hidden, measurement): the runner writes every shard, as before 0.4.0
    split: bool = True  # long recordings split across idle workers/rows (plan.split_items)
    resample_on: str = "auto"  # --resample-on: host | device | auto (device on a GPU); see device_resample
    format: str = "hdf5"  # output format: a name of mimi_extract.formats' registry (--format: hdf5, parquet, shar, megatron)
    shar_extend: bool = False  # --shar-extend: one field tar per input Shar shard (format shar)
    token_layout: str = "flat"  # --token-layout (formats that write token ids: megatron): flat | per-codebook
    token_offset: int = 0  # --token-offset: the id of code 0 of codebook 0 (audio ids after a text vocabulary)
    fidelity: bool = False  # --fidelity (codes): decode each item's codes, store SI-SDR and the log-mel distance
    ray_address: str | None = None
    ray_cpu_actors: int | None = None

    def chunk_samples(self, hop: int = 1920) -> int:
        """Chunk length in samples, a whole number of output frames (at least one)."""
        seconds = self.chunk_seconds or (30.0 if self.on_gpu else 4.0)
        return max(hop, int(seconds * SAMPLE_RATE) // hop * hop)

    @property
    def step_seconds(self) -> float:
        """Padded audio seconds per step.  On CPU a step of ~4 s of audio measured fastest (cache-
        sized: single-thread full-size Mimi, 0.5 s: 4.2, 2-4 s: 6.8-7.8, 16 s: 6.1 audio s/s)."""
        return self.max_batch_seconds or (300.0 if self.on_gpu else 4.0)

    @property
    def decode_threads(self) -> int:
        """Decoding threads of each device worker's feeder.  On CPU 2 (the cores encode).  On GPU
        decoding and resampling are the host's main work (16 kHz FLAC: ~2,100 audio seconds per
        CPU second per thread, ``scripts/bench_ceilings.py``): every core but two (the feeder and
        the writer) decodes, shared among the device workers.  Two threads capped a GPU at ~4,000x."""
        if self.num_workers is not None:
            return max(1, self.num_workers)
        if not self.on_gpu:
            return 2
        return max(2, cpu_cores() // max(1, len(self.devices)) - 2)

    @property
    def device_resample(self) -> bool:
        """Whether the encoder process resamples to 24 kHz on its device (``device_resample``) rather
        than the decoding threads on the host: by default on a GPU, where the host's cores decide
        throughput; ``--resample-on device`` forces it on CPU too (how it is tested here)."""
        if self.resample_on not in RESAMPLE_ON:
            raise ValueError(f"--resample-on {self.resample_on!r}: choose from {', '.join(RESAMPLE_ON)}")
        return self.resample_on == "device" or (self.resample_on == "auto" and self.on_gpu)

    def fed(self, mix: rates.CodecMix | None = None) -> Settings:
        """These settings with each GPU that ``devices`` names once fed by ``feeders_per_gpu`` processes
        (None: :func:`feeders_per_gpu` for the GPUs, this machine's cores and the corpus's codec ``mix``):
        the devices the engine starts a worker on.  A GPU named more than once is as given; what this
        returns is fed already (``feeders_per_gpu`` 1), so feeding it again changes nothing."""
        gpus = [d for d in self.devices if d.startswith("cuda")]
        if not gpus or len(set(gpus)) < len(gpus):
            return replace(self, feeders_per_gpu=1)
        k = self.feeders_per_gpu or feeders_per_gpu(len(gpus), mix=mix)
        devices = tuple(d for d in self.devices for _ in range(k if d.startswith("cuda") else 1))
        return replace(self, devices=devices, feeders_per_gpu=1)

    @property
    def on_gpu(self) -> bool:
        return any(d.startswith("cuda") for d in self.devices)

    @property
    def rows(self) -> int:
        return self.batch_size or default_batch_size(self.devices)


@dataclass(frozen=True)
class Part:
    """Part ``index`` of ``count`` (0-based): the items whose key hashes to it."""

    index: int = 0
    count: int = 1

    @property
    def whole(self) -> bool:
        return self.count == 1

    @property
    def dirname(self) -> str:
        width = len(str(self.count - 1))
        return f"part-{self.index:0{width}d}-of-{self.count}"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_part(spec: str | None, environ=os.environ) -> Part:
    """``I/N`` (0-based), or ``slurm`` (from SLURM_ARRAY_TASK_ID/COUNT/MIN), or None (everything)."""
    if spec is None:
        return Part()
    if spec == "slurm":
        try:
            task, count = int(environ["SLURM_ARRAY_TASK_ID"]), int(environ["SLURM_ARRAY_TASK_COUNT"])
        except KeyError as e:
            raise ValueError(f"--part slurm: {e.args[0]} is not set (run inside a Slurm job array, "
                             "sbatch --array=0-N)") from None
        except ValueError:
            raise ValueError("--part slurm: SLURM_ARRAY_TASK_ID/COUNT are not integers") from None
        index = task - int(environ.get("SLURM_ARRAY_TASK_MIN", 0))
        if not 0 <= index < count:
            raise ValueError(f"--part slurm: task {task} is not one of {count} contiguous tasks from "
                             f"SLURM_ARRAY_TASK_MIN; use an array without gaps or steps (sbatch --array=0-{count - 1})")
        spec = f"{index}/{count}"
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", spec)
    if not m:
        raise ValueError(f"--part {spec!r}: expected I/N (0-based, e.g. 0/4) or 'slurm'")
    index, count = int(m.group(1)), int(m.group(2))
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"--part {spec}: need 0 <= I < N")
    return Part(index, count)


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_cpu_workers() -> int:
    """Encoder processes on a CPU-only run: one per core (single-threaded each), measured faster
    than one multi-threaded process (memory-bound convolutions scale poorly across threads)."""
    return max(1, cpu_cores())


@dataclass(frozen=True)
class Feeders:
    """Feeding processes per GPU (:func:`feeding`): ``count`` started, ``wanted`` for ``target`` x real time
    per GPU at ``process_x`` (one process's rate for the corpus's codecs), ``cap`` half the cores per GPU."""

    count: int
    wanted: int
    cap: int
    process_x: float
    target: float

    @property
    def bound_by_cores(self) -> bool:
        """Whether the host's cores (half of them per GPU) allow fewer processes than the target wants."""
        return self.count < self.wanted


def feeding(gpus: int, cores: int | None = None, mix: rates.CodecMix | None = None,
            target: float | None = None) -> Feeders:
    """Feeding processes per GPU (``--feeders-per-gpu``'s default; ``plan`` suggests the same): enough
    for every GPU at ``target`` (default ``rates.TARGET_X``) and no more than half the cores per GPU
    (each needs its Python thread and a decoding thread).  One process feeds the ``mix`` at
    ``mix.process_x()`` at most (``rates.process_x``): ``rates.PROCESS_X`` where its decoding threads run
    in parallel (libsndfile and dr_flac release the GIL for a whole read) and its one GIL, shared by the
    feeder, the encoder thread and the Python around each decoded block, is the cap; FFmpeg's decodes
    (MP3, Opus, AAC) take turns in a process (``audio.decoders.FFMPEG_TURNS``), so their share decodes
    at one core's FFmpeg speed per process (~1,000x for MP3 at 48 kHz on this repository's host) and
    such a corpus gets more processes.  No writer caps the machine (each process writes its own
    shards, since 0.4.0).  Measured: scripts/bench_ceilings.py feed and procs (docs/performance.md)."""
    cores = cores or cpu_cores()
    per_process = mix.process_x() if mix is not None else rates.PROCESS_X
    target = target or rates.TARGET_X
    wanted = max(1, math.ceil(target / per_process - 1e-9))  # (a mix's rate is a sum of fractions: 3.0000000001)
    cap = max(1, cores // max(1, gpus) // 2)
    return Feeders(min(wanted, cap), wanted, cap, per_process, target)


def feeders_per_gpu(gpus: int, cores: int | None = None, mix: rates.CodecMix | None = None) -> int:
    """Feeding processes per GPU by default (``--feeders-per-gpu``; ``--device cuda:0,cuda:0,...``
    says it by hand): :func:`feeding`'s count for ``rates.TARGET_X`` per GPU.  Without a ``mix``, as
    for FLAC or WAV (``rates.PROCESS_X`` per process)."""
    return feeding(gpus, cores, mix).count


def default_batch_size(devices: tuple[str, ...]) -> int:
    """Rows per step: 64 on GPUs; 8 on CPU, where the step's seconds budget (4 s) is what binds,
    so short clips are packed up to ~4 s of audio and long ones are not batched at all."""
    return 64 if any(d.startswith("cuda") for d in devices) else 8


def threads_per_worker(settings: Settings) -> int:
    if settings.threads:
        return settings.threads
    cpu_workers = sum(d == "cpu" for d in settings.devices)
    return max(1, cpu_cores() // cpu_workers) if cpu_workers else 2
