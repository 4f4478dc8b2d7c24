"""The CPU-side ceilings a fast GPU meets: feeding, writing and the Ray driver, in CPU time.

    python scripts/bench_ceilings.py --workdir /tmp/ceilings              # every section
    python scripts/bench_ceilings.py --sections feed --formats flac16k --seconds 600
    python scripts/bench_ceilings.py --sections feed --resample-on host,device --torch-threads 1   # issue 34's table
    python scripts/bench_ceilings.py --sections procs --formats flac16k --procs-formats hdf5,parquet,shar --torch-threads 1

At 20,000x real time the host must decode and resample ~20,000 audio seconds per second and store
what comes back.  Everything here is measured in **process CPU time** (``time.process_time``: all
threads of this process), not wall time, so the per-core figures do not depend on how loaded the
machine is; "cores for 20,000x" is 20,000 x CPU seconds per audio second, which assumes the work
spreads over cores (the serial parts below say where it cannot).

Sections:

* ``feed``: the whole feeding pipeline of one GPU worker (``extract`` in this process: discovery,
  planning, the feeder thread, its decode pool reading, decoding, resampling to 24 kHz and mixing,
  packing steps) with the GPU's step shapes (64 rows, 300 padded s, 30 s chunks) and a **null
  encoder** (zeros of the full-size model's output shapes, at once) and the real writer (HDF5
  codes).  The null encoder's own CPU (the real encoder's length rule and the zeros, ~1.7 ms a
  step) stays in the encoder thread's and the feed's figures and is reported apart
  (``null_encoder_us_per_audio_s``): it is the benchmark's, not the tool's.  Reported per role: the
  decode pool (parallel), the feeder thread (one per GPU), the caller's thread (the single writer, and the frame-chunk loop), all else (torch's intra-op threads,
  start-up).  Pinning is not measured (no CUDA here): it is one copy of each step into a cached
  pinned block.
  ``--resample-on host,device`` runs each corpus both ways: with ``device`` the resampling
  convolution (the GPU's work in a real run, done by the CPU here) is timed apart and left out of
  the host's figures; ``--torch-threads 1`` keeps every convolution in the thread that calls it, so
  that nothing is charged to torch's own threads.
* ``procs``: the same with K = ``--procs`` feeding processes (``ProcessEngine``, as
  ``--feeders-per-gpu K`` runs one GPU from K processes, each with its own GIL): CPU time of this
  process, the single writer, which receives, stitches and stores every frame chunk (from its first one
  on: the workers' start is paid once per run), and each worker's CPU by role, whose GIL-held part
  (all but the decoder library's calls and the device's work) bounds what one process feeds.
* ``write``: the ShardWriter per format (hdf5, parquet, shar) for codes (int16 [F, 8]) and fp32
  latents ([F, 512]), 10 s items: items/s and MB/s of arrays per CPU second, fsyncs included (and
  wall for reference).
* ``ray``: the Ray driver as the single writer: a local cluster, one actor returning ready-made
  frame chunks of codes per unit (the sizes the planner makes), the driver's ``ray.wait``/``ray.get`` and
  writing, CPU time of the driver process.
"""

from __future__ import annotations

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import json
import os
import resource
import shutil
import sys
import threading
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mimi_extract.common.threads import passive_openmp  # noqa: E402

passive_openmp()  # torch's threads wait as in the tool's own processes: set before torch loads libgomp

import numpy as np  # noqa: E402
import soundfile as sf  # noqa: E402
import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mimi_extract.codec.encoder import EncoderOutput  # noqa: E402
import mimi_extract.engines.device as device_mod  # noqa: E402
from mimi_extract.engines.device import DeviceRunner  # noqa: E402
from mimi_extract.engines.inprocess import InProcessEngine  # noqa: E402
from mimi_extract.config.settings import Settings  # noqa: E402
from mimi_extract.codec.demo import random_model  # noqa: E402

TARGET = 20_000
# name: (extension, sample rate, soundfile format/subtype)
FORMATS = {  # name: (extension, rate, soundfile's format, channels)
    "wav16k": (".wav", 16_000, dict(format="WAV", subtype="PCM_16"), 1),
    "flac16k": (".flac", 16_000, dict(format="FLAC", subtype="PCM_16"), 1),
    "mp3-48k": (".mp3", 48_000, dict(format="MP3", subtype="MPEG_LAYER_III"), 1),
    "flac48k": (".flac", 48_000, dict(format="FLAC", subtype="PCM_16"), 1),
    "opus48k": (".opus", 48_000, dict(format="OGG", subtype="OPUS"), 1),
    "opus16k": (".opus", 16_000, dict(format="OGG", subtype="OPUS"), 1),  # speech corpora's Opus: 16 kHz stated
    "flac44k-stereo": (".flac", 44_100, dict(format="FLAC", subtype="PCM_16"), 2),  # mixed to mono by the run
}


def speechlike(n: int, rate: int, rng) -> np.ndarray:
    """Noise shaped by a slow random envelope plus a few harmonics: compresses like speech does
    (FLAC on white noise would be slower to decode than on any real corpus)."""
    t = np.arange(n) / rate
    f0 = 110 + 60 * np.sin(2 * np.pi * 0.3 * t + rng.uniform(0, 6))
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 6))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 2.5 * t + rng.uniform(0, 6)) ** 2
    return (0.15 * envelope * voiced + 0.01 * rng.standard_normal(n)).astype(np.float32)


UTTERANCES = (2.0, 20.0)  # seconds: the corpora's utterances by default, as speech corpora ship


def make_corpus(root: str, name: str, seconds: float, seed: int = 0,
                lengths: tuple[float, float] = UTTERANCES) -> tuple[str, float]:
    ext, rate, kw, channels = FORMATS[name]
    shape = "" if lengths == UTTERANCES else f"-{lengths[0]:g}to{lengths[1]:g}s"
    folder = os.path.join(root, f"{name}-{seconds:g}s-{seed}{shape}")
    done = os.path.join(folder, ".done")
    rng = np.random.default_rng(seed)
    if not os.path.exists(done):
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        total, i = 0.0, 0
        while total < seconds:
            s = float(rng.uniform(*lengths))
            os.makedirs(os.path.join(folder, f"spk{i % 7}"), exist_ok=True)
            signal = np.stack([speechlike(int(s * rate), rate, rng) for _ in range(channels)], 1)
            sf.write(os.path.join(folder, f"spk{i % 7}", f"utt{i:05d}{ext}"), signal, rate, **kw)
            total, i = total + s, i + 1
        open(done, "w").write(str(total))
    return folder, float(open(done).read())


# -- the null encoder ----------------------------------------------------------------------------
class NullEncoder:
    """Zeros of the full-size model's output shapes (8 codebooks / 512-dim latents at 12.5 Hz),
    returned at once: everything around the encoder is what is measured.  Frame counts come from
    the real encoder's length arithmetic, so the writer stores what a real run would."""

    def __init__(self, real, dims: int = 512):
        self.real, self.dims = real, dims
        self.hop, self.step, self.model = real.hop, real.step, real.model

    def init_state(self, rows, device=None, dtype=None):
        return self.real.init_state(rows, device, dtype)

    def __call__(self, audio, lengths, taps, num_quantizers=None, state=None, final=None):
        n = self.real.output_lengths(torch.as_tensor(lengths))
        rows, tensors = audio.shape[0], {}
        for tap in taps:
            frames = int(n[tap].max())
            tensors[tap] = torch.zeros(rows, num_quantizers, frames, dtype=torch.long) if tap == "codes" else \
                torch.zeros(rows, frames, self.dims)
        return EncoderOutput(tensors, {t: n[t] for t in taps})


CPU: dict[str, float] = {}
DEVICE_WORK = "device resample (GPU work in a real run)"  # measured on the CPU here, not the host's share
NULL_ENCODER = "null encoder (the benchmark's own)"  # within the encoder thread's figure, reported apart
_lock = threading.Lock()


def _add(role: str, seconds: float) -> None:
    with _lock:
        CPU[role] = CPU.get(role, 0.0) + seconds


_depth = threading.local()


def _timed(role: str, fn):
    """``fn`` adding its thread CPU time to ``role`` (outermost call only: _start calls _read)."""
    def wrapper(*a, **kw):
        if getattr(_depth, "on", False):
            return fn(*a, **kw)
        _depth.on = True
        t = time.thread_time()
        try:
            return fn(*a, **kw)
        finally:
            _add(role, time.thread_time() - t)
            _depth.on = False
    return wrapper


def install_null() -> None:
    """The null encoder in place of the model (measurement only; spawned workers get it through a
    sitecustomize.py that calls this, see ``feed_processes``)."""
    real_build = device_mod.build_encoder
    if getattr(real_build, "null", False):
        return
    device_mod.build_encoder = lambda settings, device, model=None: NullEncoder(real_build(settings, "cpu", model))
    device_mod.build_encoder.null = True


def _timed_inside(role: str, fn):
    """``fn`` adding its thread CPU time to ``role`` even inside another timed call (the caller's
    role is then charged without it: see ``feed``)."""
    def wrapper(*a, **kw):
        t = time.thread_time()
        try:
            return fn(*a, **kw)
        finally:
            _add(role, time.thread_time() - t)
    return wrapper


def install_probes() -> None:
    """The null encoder, and thread CPU time per role (measurement only; once per process)."""
    install_null()
    if getattr(DeviceRunner, "probed", False):
        return
    DeviceRunner.probed = True
    DeviceRunner._resample = _timed_inside(DEVICE_WORK, DeviceRunner._resample)
    NullEncoder.__call__ = _timed_inside(NULL_ENCODER, NullEncoder.__call__)
    DeviceRunner._read = _timed("decode pool", DeviceRunner._read)
    DeviceRunner._start = _timed("decode pool", DeviceRunner._start)
    DeviceRunner._feed = _timed("feeder thread", DeviceRunner._feed)
    DeviceRunner.run = _timed("encoder thread", DeviceRunner.run)
    original = InProcessEngine.run

    def run(self, *a, **kw):  # the caller's thread between frame chunks: the writer
        t_proc, t_main = time.process_time(), time.thread_time()
        try:
            yield from original(self, *a, **kw)
        finally:
            _add("writer thread (caller)", time.thread_time() - t_main)
            _add("process, encoding phase", time.process_time() - t_proc)

    InProcessEngine.run = run


def decoder_alone(folder: str, where: str, passes: int = 3) -> float:
    """CPU seconds per audio second of the decoder library alone on ``folder`` (one thread, best of
    ``passes``): each file opened with the decoder the tool picks and read to its end in reads of
    the size the run makes (the host's reader: ``BLOCK`` frames; the device path: what a chunk
    needs in one call, the decoder's ``largest_read`` at most, since 0.4), as the samples the run
    transports (int16 where the device path takes it: 16-bit mono through libsndfile or dr_flac),
    nothing else -- the floor the feed's cost is compared with.  Each file is opened as the run
    reads it, whole (a FLAC file by dr_flac since 0.4)."""
    from mimi_extract.audio.decoders import BLOCK, DrFlacFile, largest_read, open_decoder, read_frames

    paths = sorted(os.path.join(d, f) for d, _, files in os.walk(folder) for f in files if not f.startswith("."))
    best, audio = float("inf"), 0.0
    for _ in range(passes):
        t, audio = time.process_time(), 0.0
        for path in paths:
            f = open_decoder(path, span=(0, None))
            size = largest_read(f) if where == "device" else BLOCK
            int16 = where == "device" and isinstance(f, (sf.SoundFile, DrFlacFile)) and f.subtype == "PCM_16" \
                and f.channels == 1
            n = 0
            while True:
                got = len(read_frames(f, size, "int16" if int16 else "float32"))
                n += got
                if got < size:
                    break
            audio += n / f.samplerate
            f.close()
        best = min(best, time.process_time() - t)
    return best / audio


def feed(args, model_dir: str) -> dict:
    from mimi_extract.config.request import RunRequest
    from mimi_extract.run.runner import run_request

    results = {}
    for name, where in [(n, w) for n in args.formats.split(",") for w in args.resample_on.split(",")]:
        folder, seconds = make_corpus(os.path.join(args.workdir, "corpus"), name, args.seconds,
                                      lengths=args.utterance_seconds)
        out = os.path.join(args.workdir, "out-feed")
        shutil.rmtree(out, ignore_errors=True)
        settings = Settings(model=model_dir, tap=args.tap, devices=("cpu",), batch_size=64, max_batch_seconds=300,
                            chunk_seconds=30, num_workers=args.decode_threads, resample_on=where,
                            threads=args.torch_threads)
        CPU.clear()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t_proc, t_wall = time.process_time(), time.perf_counter()
        summary = run_request(RunRequest(folder, out, settings))
        total_cpu, wall = time.process_time() - t_proc, time.perf_counter() - t_wall
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults  # fresh pages touched (the run's)
        assert summary.ok == summary.todo, f"{name}: {summary.ok} of {summary.todo} items written"
        device_work = CPU.get(DEVICE_WORK, 0.0)
        phase = CPU.get("process, encoding phase", total_cpu) - device_work  # the host's share
        roles = {r: CPU.get(r, 0.0) for r in ("decode pool", "feeder thread", "encoder thread", "writer thread (caller)")}
        roles["encoder thread"] -= device_work
        roles["other (torch threads, GC)"] = max(0.0, phase - sum(roles.values()))
        per_audio = {r: v / seconds for r, v in roles.items()}
        key = name if args.resample_on == "host" else f"{name} {where}"
        results[key] = {
            "resample_on": where, "device_work_cpu_s": device_work,
            "audio_seconds": seconds, "items": summary.ok, "wall_s": wall, "cpu_s_total": total_cpu,
            "minor_page_faults_per_audio_s": faults / seconds,
            # the null encoder's own arithmetic (the real encoder's length rule, zeros): in the encoder
            # thread's figure and the feed's, not the tool's work
            "null_encoder_us_per_audio_s": CPU.get(NULL_ENCODER, 0.0) / seconds * 1e6,
            "cpu_s_encoding_phase": phase, "startup_and_planning_cpu_s": total_cpu - phase - device_work,
            "per_core_x": seconds / phase, "cores_for_target": TARGET * phase / seconds,
            "cpu_per_audio_s": per_audio,
            "serial_ceilings_x": {"feeder thread": 1 / max(per_audio["feeder thread"], 1e-12),
                                  "writer thread (caller)": 1 / max(per_audio["writer thread (caller)"], 1e-12)},
        }
        floor = decoder_alone(folder, where)  # side by side: right after the run, on the same files
        host = phase / seconds
        results[key].update({"decoder_alone_cpu_per_audio_s": floor, "feed_over_decoder": host / floor,
                             "beyond_decoding_us_per_audio_s": (host - floor) * 1e6})
        r = results[key]
        print(f"feed {name:>8} {where:>6}: decoder alone {floor * 1e6:6.0f} us / audio s ({1 / floor:6.0f} x per core); "
              f"feed {host * 1e6:6.0f} us = {host / floor:4.2f}x the decoder, {(host - floor) * 1e6:5.0f} us beyond it; "
              f"{faults / seconds:.0f} minor page faults / audio s; the null encoder's own "
              f"{r['null_encoder_us_per_audio_s']:.0f} us of it", flush=True)
        print(f"feed {name:>8} {where:>6}: {seconds:6.0f} audio s, {phase:6.2f} CPU s -> {r['per_core_x']:7.0f} x per core, "
              f"{r['cores_for_target']:5.1f} cores for {TARGET}x; feeder thread alone caps at "
              f"{r['serial_ceilings_x']['feeder thread']:.0f} x, writer thread at "
              f"{r['serial_ceilings_x']['writer thread (caller)']:.0f} x", flush=True)
        shutil.rmtree(out, ignore_errors=True)
    return results


SHARDS = "shard writer thread"  # a worker's own shards: built, written to .tmp, fsynced (an upper bound on its GIL)
DECODER = "decoder library (GIL released)"  # time inside the decoder's read call, within the decode pool


def feed_processes(args, model_dir: str) -> dict:
    """K feeding processes (ProcessEngine, as ``--feeders-per-gpu K`` runs them on one GPU) and the
    runner in this process, for K in ``--procs``: this process's CPU per audio second is the runner's
    ceiling (since issue 40 each worker builds and writes its own shards and the runner commits
    their rows: the ceiling of the one process left on the data path; before, the single writer's:
    frame chunks unpickled from the workers' queue, stitched, written); each worker's
    thread CPU per role says what holds its GIL (everything but the decoder library's own calls and
    the device's work: an upper bound, numpy and torch release the GIL in places), so its ceiling
    (its audio / its GIL-held CPU).  The machine's: min(K x a process's, the writer's)."""
    from mimi_extract.audio import reader as audio_mod
    from mimi_extract.engines.processes import ProcessEngine
    from mimi_extract.config.request import RunRequest
    from mimi_extract.run.runner import run_request

    hook = os.path.join(args.workdir, "null-hook")
    os.makedirs(hook, exist_ok=True)
    with open(os.path.join(hook, "sitecustomize.py"), "w") as f:
        f.write(f"import sys\nsys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
                "import bench_ceilings\nbench_ceilings.install_null()\n")
    os.environ["PYTHONPATH"] = os.pathsep.join([hook, ROOT, os.environ.get("PYTHONPATH", "")])
    install_probes()  # the roles, timed in the (forked) workers as well
    from mimi_extract.engines import processes as processes_mod

    if hasattr(processes_mod, "_OwnShards"):  # (since issue 40: each worker builds and writes its shards)
        processes_mod._OwnShards._work = _timed(SHARDS, processes_mod._OwnShards._work)
    audio_mod.read_frames = _timed_inside(DECODER, audio_mod.read_frames)
    dumps = os.path.join(args.workdir, "procs-cpu")
    timed_run = DeviceRunner.run

    began: dict = {}

    def dump() -> None:
        with open(os.path.join(dumps, f"{os.getpid()}.json"), "w") as f:
            json.dump({"roles": dict(CPU), "process_cpu_s": time.process_time() - began["cpu"],
                       "audio_seconds": began["audio"]}, f)

    def worker_run(self, *a, **kw):  # in each worker: its CPU by role, dumped when its run ends
        CPU.clear()
        began["cpu"] = time.process_time()
        try:
            return timed_run(self, *a, **kw)
        finally:
            began["audio"] = self.stats.real / 24_000
            dump()

    DeviceRunner.run = worker_run
    if hasattr(processes_mod, "_OwnShards"):  # its last shard is written after the run: dumped again then
        shards_close = processes_mod._OwnShards.close

        def close_and_dump(self):
            try:
                return shards_close(self)
            finally:
                dump()

        processes_mod._OwnShards.close = close_and_dump
    spent = {}
    original = ProcessEngine.run

    def run(self, *a, **kw):  # the runner: from the start, and from its first result on (any tree: PYTHONPATH)
        t, spent["engine_wall"] = time.process_time(), time.perf_counter()
        spent["steady"] = None
        try:
            for chunk in original(self, *a, **kw):
                if spent["steady"] is None:
                    spent["steady"], spent["first_seconds"] = time.process_time(), chunk.seconds
                yield chunk
        finally:
            spent["main"] = time.process_time() - t
            spent["steady"] = time.process_time() - spent["steady"]
            spent["engine_wall"] = time.perf_counter() - spent["engine_wall"]  # the workers' feeding, their imports left out

    ProcessEngine.run = run
    from mimi_extract import engines

    local = engines.ENGINES["local"]
    engines.ENGINES["local"] = ProcessEngine  # one feeding process too: the writer in this process, as with more
    results = {}
    for name in args.formats.split(","):
        folder, seconds = make_corpus(os.path.join(args.workdir, "corpus"), name, args.seconds,
                                      lengths=args.utterance_seconds)
        for fmt in args.procs_formats.split(","):
            for k in map(int, args.procs.split(",")):
                out = os.path.join(args.workdir, "out-procs")
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(dumps, ignore_errors=True)
                os.makedirs(dumps)
                settings = Settings(model=model_dir, tap=args.tap, devices=("cpu",) * k, batch_size=64, format=fmt,
                                    max_batch_seconds=300, chunk_seconds=30, num_workers=args.decode_threads, threads=1,
                                    resample_on=args.procs_resample_on)
                t_wall = time.perf_counter()
                summary = run_request(RunRequest(folder, out, settings))
                wall = time.perf_counter() - t_wall
                assert summary.ok == summary.todo
                main = spent["main"]
                workers = [json.load(open(os.path.join(dumps, f))) for f in sorted(os.listdir(dumps))]
                caps, feeding = [], 0.0
                for w in workers:
                    r = w["roles"]
                    gil = (r.get("decode pool", 0) - r.get(DECODER, 0) + r.get("feeder thread", 0)
                           + r.get("encoder thread", 0) - r.get(DEVICE_WORK, 0) + r.get(SHARDS, 0))
                    w["gil_held_cpu_s"] = gil
                    feeding += w["process_cpu_s"] - r.get(DEVICE_WORK, 0)
                    if w["audio_seconds"] > 0 and gil > 0:
                        caps.append(w["audio_seconds"] / gil)
                process_x = sum(caps) / len(caps) if caps else None
                # the steady state: the workers' start (forks, imports) is the writer process's too, once per run
                writer_x = (seconds - spent["first_seconds"]) / spent["steady"]
                results[f"{name} {fmt} x{k}"] = {
                    "feeders": k, "audio_seconds": seconds, "items": summary.ok, "writer_cpu_s": main,
                    "writer_cpu_s_from_first_piece": spent["steady"], "writer_x_per_cpu_s": writer_x,
                    "writer_x_per_cpu_s_with_start": seconds / main, "feeding_cpu_s": feeding, "feeding_us_per_audio_s": 1e6 * feeding / seconds,
                    "process_x_gil_bound": process_x, "machine_x_bound": min(k * process_x, writer_x) if process_x else None,
                    "wall_s": wall, "wall_x_here": seconds / wall,
                    # wall of the engine's run alone (CPU workers are forked from the loaded runner there): the
                    # feeding, without discovery, planning and the imports
                    "wall_x_engine_here": seconds / spent["engine_wall"], "workers": workers}
                r = results[f"{name} {fmt} x{k}"]
                print(f"procs {name:>8} {fmt:>7} x{k}: writer {main:.3f} CPU s ({spent['steady']:.3f} from its first "
                      f"frame chunk) on {seconds:.0f} audio s -> caps at {writer_x:.0f}x; feeding {r['feeding_us_per_audio_s']:.0f} us per audio s in all; one process's "
                      f"GIL caps it at {process_x or 0:.0f}x -> {k} x that or the writer: "
                      f"{r['machine_x_bound'] or 0:.0f}x; here (wall) {seconds / wall:.0f}x, "
                      f"{r['wall_x_engine_here']:.0f}x in the engine's run", flush=True)
                shutil.rmtree(out, ignore_errors=True)
    ProcessEngine.run = original
    DeviceRunner.run = timed_run
    engines.ENGINES["local"] = local
    return results


def write(args) -> dict:
    from mimi_extract.formats import get_format
    from mimi_extract.store.files import write_atomic
    from mimi_extract.store.manifest import ManifestRow
    from mimi_extract.store.writer import ShardWriter
    from mimi_extract.sources import dataset_name

    info = {"model": "synthetic", "num_quantizers": 8, "framing": "transformers", "channel": "mix",
            "dtype": "fp32", "feature_dtype": "float32", "input": "/synthetic", "input_kind": "directory",
            "weights": "0" * 24, "config_hash": "0" * 16, "part": "whole"}
    rng = np.random.default_rng(0)
    frames = 125  # 10 s items at 12.5 Hz
    results = {}
    for tap, make, n in (("codes", lambda: rng.integers(0, 2048, (frames, 8), dtype=np.int16), args.write_items),
                         ("latent", lambda: rng.standard_normal((frames, 512)).astype(np.float32), args.write_items // 4)):
        arrays = [make() for _ in range(n)]
        for fmt in args.write_formats.split(","):
            if fmt == "megatron" and tap != "codes":
                continue  # (token ids: codes only)
            out = os.path.join(args.workdir, f"out-write-{fmt}-{tap}")
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out)
            write_atomic(os.path.join(out, "run.json"), json.dumps({**info, "tap": tap, "format": fmt}))
            attrs = {"tap": tap, "frame_rate": 12.5, "sample_rate": 24000, "num_quantizers": 8,
                     "layout": "[frames, num_quantizers]" if tap == "codes" else "[frames, dims]"}
            # the format's own settings (Megatron: token layout, offset, codebook size, dtype), as a run records them
            attrs.update(get_format(fmt).run_settings(Settings(tap=tap, format=fmt), SimpleNamespace(codebook_size=2048)))
            w = ShardWriter(out, get_format(fmt), attrs, max_items=1000)
            fsyncs, real_fsync = [0], os.fsync

            def counting(fd):
                fsyncs[0] += 1
                return real_fsync(fd)

            os.fsync = counting
            t_proc, t_wall = time.process_time(), time.perf_counter()
            try:
                for i, data in enumerate(arrays):
                    key = f"spk{i % 97:02d}/utt{i:06d}.wav"
                    row = {"path": key, "key": key, "dataset": dataset_name(key), "channel": None, "sample_rate": 24000,
                           "duration": frames * 0.08, "frames": frames, "dims": data.shape[1],
                           "source": {"path": f"/synthetic/{key}", "frames": frames * 1920, "channels": 1}}
                    w.add(key, data, ManifestRow(**row), {"duration": frames * 0.08})
                w.close()
            finally:
                os.fsync = real_fsync
            cpu, wall = time.process_time() - t_proc, time.perf_counter() - t_wall
            nbytes = sum(a.nbytes for a in arrays)
            on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs
                          if f != "run.json")  # shards, manifests, index: what the format stores
            audio = n * frames * 0.08
            results[f"{fmt} {tap}"] = {"items": n, "cpu_s": cpu, "wall_s": wall, "items_per_cpu_s": n / cpu,
                                       "mb_per_cpu_s": nbytes / 1e6 / cpu, "items_per_wall_s": n / wall,
                                       "mb_per_wall_s": nbytes / 1e6 / wall, "fsyncs": fsyncs[0],
                                       "bytes_on_disk_per_array_byte": on_disk / nbytes,
                                       "x_real_time_per_cpu_s": audio / cpu, "x_real_time_wall": audio / wall}
            r = results[f"{fmt} {tap}"]
            print(f"write {fmt:>7} {tap:>6}: {r['items_per_cpu_s']:8.0f} items/CPU-s, {r['mb_per_cpu_s']:7.1f} MB/CPU-s "
                  f"({r['x_real_time_per_cpu_s']:9.0f} x real time of 10 s items), wall {r['items_per_wall_s']:8.0f} "
                  f"items/s {r['mb_per_wall_s']:7.1f} MB/s, {fsyncs[0]} fsyncs; {r['bytes_on_disk_per_array_byte']:.2f} "
                  "bytes on disk per array byte", flush=True)
            shutil.rmtree(out, ignore_errors=True)
    return results


def ray_driver(args) -> dict:
    """Driver CPU per audio second: units of 10 s items (a GPU unit: 64 rows x 300 s holds ~30 of
    them), frame chunks of codes built by one actor; the driver waits, gets, and writes (HDF5)."""
    import ray

    from mimi_extract.engines.base import FrameChunk
    from mimi_extract.formats import get_format
    from mimi_extract.store.files import write_atomic
    from mimi_extract.store.manifest import ManifestRow
    from mimi_extract.store.writer import ShardWriter
    from mimi_extract.sources import Item, dataset_name

    ray.init(address="local", include_dashboard=False, log_to_driver=False, num_cpus=2)
    try:
        @ray.remote(num_cpus=1)
        class Maker:
            def encode(self, unit: int, per_unit: int):
                rng = np.random.default_rng(unit)
                chunks = []
                for j in range(per_unit):
                    key = f"u{unit:05d}/i{j:03d}.wav"
                    item = Item(path=key, rel=key, key=key, sample_rate=24000, frames=240_000, samples=240_000)
                    chunks.append(FrameChunk(item, rng.integers(0, 2048, (125, 8), dtype=np.int16), True, True, 10.0))
                return chunks

        maker = Maker.remote()
        ray.get(maker.encode.remote(0, 1))  # the actor is up
        out = os.path.join(args.workdir, "out-ray")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        write_atomic(os.path.join(out, "run.json"), json.dumps({"tap": "codes", "format": "hdf5"}))
        w = ShardWriter(out, get_format("hdf5"), {"tap": "codes", "frame_rate": 12.5, "sample_rate": 24000,
                                                  "num_quantizers": 8, "layout": "[frames, num_quantizers]"})
        units, per_unit = args.ray_units, 30
        t_proc, t_wall = time.process_time(), time.perf_counter()
        pending = [maker.encode.remote(u, per_unit) for u in range(min(2, units))]
        submitted, items = len(pending), 0
        get_cpu = 0.0
        while pending:
            t = time.process_time()
            ready, pending = ray.wait(pending, num_returns=1)
            chunks = ray.get(ready[0])
            get_cpu += time.process_time() - t
            if submitted < units:
                pending.append(maker.encode.remote(submitted, per_unit))
                submitted += 1
            for p in chunks:
                w.add(p.item.key, p.data, ManifestRow(p.item.key, path=p.item.key, dataset=dataset_name(p.item.key)),
                      {"duration": 10.0})
                items += 1
        w.close()
        cpu, wall = time.process_time() - t_proc, time.perf_counter() - t_wall
        audio = items * 10.0
        result = {"units": units, "items": items, "driver_cpu_s": cpu, "wait_get_cpu_s": get_cpu, "wall_s": wall,
                  "driver_x_per_cpu_s": audio / cpu, "units_per_driver_cpu_s": units / cpu}
        print(f"ray driver: {items} items in {units} units, driver {cpu:.2f} CPU s ({get_cpu:.2f} in wait/get) -> "
              f"{result['driver_x_per_cpu_s']:.0f} x real time per driver CPU second", flush=True)
        shutil.rmtree(out, ignore_errors=True)
        return result
    finally:
        ray.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="/tmp/mimi-ceilings")
    p.add_argument("--sections", default="feed,procs,write,ray")
    p.add_argument("--formats", default=",".join(FORMATS), help=f"feed corpora: {', '.join(FORMATS)}")
    p.add_argument("--seconds", type=float, default=1200.0, help="audio seconds per feed corpus")
    p.add_argument("--utterance-seconds", default=UTTERANCES, type=lambda v: tuple(map(float, v.split(","))),
                   help="MIN,MAX: the corpora's utterances, uniform in this range (default 2,20; 1,4 for short clips)")
    p.add_argument("--tap", default="codes")
    p.add_argument("--decode-threads", type=int, default=2, help="--num-workers of the run (the decode pool)")
    p.add_argument("--torch-threads", type=int, default=2, help="torch's intra-op threads (a GPU worker's: 2); with "
                   "1 every resampling convolution runs in the thread that calls it, so the device's share is all timed")
    p.add_argument("--resample-on", default="host", help="feed: host, device or both (host,device): where the run "
                   "resamples; device: its convolution is timed apart (the GPU's work) and left out of the host's")
    p.add_argument("--write-formats", default="hdf5,parquet,shar")
    p.add_argument("--procs-formats", default="hdf5,parquet", help="output formats of the procs section")
    p.add_argument("--procs", default="1,2,3,4", help="procs: feeding processes, one run for each count")
    p.add_argument("--procs-resample-on", default="device", help="procs: where the feeding processes resample")
    p.add_argument("--write-items", type=int, default=8000)
    p.add_argument("--ray-units", type=int, default=200)
    p.add_argument("--json")
    args = p.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    torch.set_num_threads(args.torch_threads)
    results = {"cores": os.cpu_count(), "torch": torch.__version__, "host": host_facts.report()}
    sections = args.sections.split(",")

    def save():  # after each section: a later one failing (Ray's start on a loaded machine) loses nothing
        if args.json:
            json.dump({**results, "host": host_facts.report()}, open(args.json, "w"), indent=2)
    if "feed" in sections:
        model_dir = os.path.join(args.workdir, "tiny-model")
        if not os.path.exists(model_dir):
            random_model(seed=0).save_pretrained(model_dir)
        install_probes()
        results["feed"] = feed(args, model_dir)
        save()
    if "procs" in sections:
        model_dir = os.path.join(args.workdir, "tiny-model")
        if not os.path.exists(model_dir):
            random_model(seed=0).save_pretrained(model_dir)
        results["procs"] = feed_processes(args, model_dir)
        save()
    if "write" in sections:
        results["write"] = write(args)
        save()
    if "ray" in sections:
        results["ray"] = ray_driver(args)
        save()


if __name__ == "__main__":
    print(host_facts.header(), flush=True)
    main()
    print(host_facts.footer(), flush=True)
