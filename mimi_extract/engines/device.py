"""The engine on one device: :class:`DeviceRunner`.

A *feeder* thread composes each step ahead of the encoder: it keeps up to ``batch_size`` rows, each
a stream (an item being read chunk by chunk through :class:`~mimi_extract.audio.reader.AudioReader`),
refills a row as soon as its stream ends (continuous batching), decodes in a small thread pool, and
stays under the padded-seconds budget.  The encoder thread runs the exact
:class:`~mimi_extract.codec.encoder.PaddedMimiEncoder` on each step with the rows'
:class:`~mimi_extract.codec.encoder.EncoderState`, and emits a :class:`~.base.FrameChunk` per row.  A step
whose rows all start and end in it (short files) takes the single-shot path.  Every engine runs
its units through one of these, wherever it runs.
"""

from __future__ import annotations


import queue as queue_mod
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import torch

from ..config.choices import SAMPLE_RATE
from ..audio.decoders import AudioError, seek_is_exact
from ..audio.reader import AudioReader, PieceReader
from ..audio.device import NativeChunk, NativeGroup, NativeReader, StepBuffers, device_resamplable, resample_rows
from ..codec.decoder import PaddedMimiDecoder
from ..codec.encoder import EncoderOutput, PaddedMimiEncoder, frames_of, stored_array
from ..codec.fidelity import Fidelity, FidelityMeter
from ..codec.model import load_model, prepare
from ..common.malloc import keep_large_blocks
from ..audio.framing import Framing
from ..config.settings import Settings, default_cpu_workers
from ..sources import Item, bytes_name, open_audio
from .base import DONE, FrameChunk, Stats, AnyEvent, get_while, is_out_of_memory

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}  # choices.DTYPES


def resolve_devices(spec: str, cpu_workers: int | None = None, feeders: int | None = None) -> tuple[str, ...]:
    """``auto`` -> every CUDA device (or the CPU); else a comma-separated list such as
    ``cuda:0,cuda:1``.  ``cpu`` becomes ``cpu_workers`` single-device workers (default: one per
    core pair measured best on CPU, see README: two 1-thread workers beat one 2-thread one).  Each
    GPU is named once: ``Settings.fed`` gives it its feeding processes (``feeders``, --feeders-per-gpu;
    by default :func:`~mimi_extract.config.settings.feeders_per_gpu` for the corpus's codecs, once the
    run has found its items); a list that names a GPU twice says the count by hand."""
    spec = spec.strip()
    if spec == "auto":
        n = torch.cuda.device_count()
        devices: tuple[str, ...] = tuple(f"cuda:{i}" for i in range(n)) or ("cpu",)
    else:
        devices = tuple(d.strip() for d in spec.split(",") if d.strip())
        if not devices:
            raise ValueError(f"--device {spec!r} names no device; use auto, cpu, cuda, cuda:N or a list")
    for d in devices:
        try:
            dev = torch.device(d)
        except RuntimeError:
            raise ValueError(f"--device: {d!r} is not a device name (use cpu, cuda or cuda:N)") from None
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"--device {d!r}: only cpu and cuda devices are supported")
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"device {d!r} requested but CUDA is not available")
            if dev.index is not None and dev.index >= torch.cuda.device_count():
                raise ValueError(f"device {d!r}: this machine has {torch.cuda.device_count()} GPU(s)")
    if devices == ("cpu",):
        devices = ("cpu",) * (cpu_workers or default_cpu_workers())
    gpus = [d for d in devices if d.startswith("cuda")]
    if gpus and len(set(gpus)) < len(gpus) and feeders is not None:
        raise ValueError("--feeders-per-gpu and a --device list that names a GPU twice both say how many "
                         "processes feed it: give one of them")
    return devices


def build_encoder(settings: Settings, device: str, model=None) -> PaddedMimiEncoder:
    if settings.dtype != "fp32" and not device.startswith("cuda"):
        raise ValueError(f"--dtype {settings.dtype} is for GPUs; use fp32 on {device}")
    if device.startswith("cuda"):
        if settings.dtype == "fp32":
            # keep fp32 really fp32: TF32 matmuls/convs would break equality with the reference
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True  # step shapes are bucketed, so autotuning is reused
    dtype = TORCH_DTYPES[settings.dtype]
    model = prepare(model, device, dtype) if model is not None else load_model(settings.model, device, dtype)
    return PaddedMimiEncoder(model, Framing.of(settings).stream_frames)


@dataclass
class _Stream:
    item: Item
    reader: AudioReader
    slot: int
    emitted: int = 0  # samples handed to the encoder


@dataclass(frozen=True)
class _Step:
    audio: torch.Tensor  # [R, T] (24 kHz); with device resampling, only the rows ``host_rows``
    lengths: torch.Tensor
    final: torch.Tensor
    fresh: torch.Tensor  # rows whose stream starts with this step
    slots: torch.Tensor
    items: list[Item]
    errors: list[FrameChunk] = field(default_factory=list)
    # resampling on the device (device_resample): the rows that ``audio`` holds, and the native-rate rest
    host_rows: torch.Tensor | None = None  # None: audio holds every row
    groups: list[NativeGroup] = field(default_factory=list)
    buffers: tuple[torch.Tensor, ...] = ()  # the CPU device's step buffers (its pool's), given back once encoded

    @classmethod
    def only_errors(cls, errors: list[FrameChunk]) -> "_Step":
        empty = torch.zeros(0)
        return cls(torch.zeros(0, 0), empty, empty, empty, empty, [], errors)

    @property
    def size(self) -> int:
        return self.audio.shape[-1]

    def rows(self, index: list[int]) -> "_Step":
        """The sub-step of rows ``index`` (out-of-memory splitting, failed streams dropped); trimmed
        when all of them end."""
        sel = torch.tensor(index, dtype=torch.long)
        lengths, final = self.lengths[sel], self.final[sel]
        size = self.size if not bool(final.all()) else int(lengths.max())
        host_rows, groups, audio = None, [], self.audio[sel, :size] if self.host_rows is None else None
        if self.host_rows is not None:  # not resampled yet: pick among the host rows and the groups
            at = {int(r): i for i, r in enumerate(self.host_rows.tolist())}
            mine = [k for k, r in enumerate(index) if r in at]
            audio = self.audio[torch.tensor([at[index[k]] for k in mine], dtype=torch.long), :size]
            host_rows = torch.tensor(mine, dtype=torch.long)
            groups = [g for g in (g.select(sel) for g in self.groups) if g is not None]
        return _Step(audio, lengths, final, self.fresh[sel], self.slots[sel], [self.items[i] for i in index],
                     host_rows=host_rows, groups=groups)


LATER = object()  # next_unit(block=False): nothing to hand out right now
IDLE = object()  # next_unit(block=True): nothing to hand out until what was handed is stored (then ask again)
_IDLE = object()  # on the steps queue: the feeder waits for work (DeviceRunner.run's idle)


class _Stopped(Exception):
    """The run stopped while the feeder waited to hand something over (the feeder ends)."""


@dataclass(frozen=True)
class _Row:
    """A row of the step being composed: its stream's next chunk."""

    stream: _Stream
    chunk: torch.Tensor | NativeChunk  # 24 kHz samples, or native-rate ones the encoder thread resamples
    final: bool  # the stream ends with this chunk
    fresh: bool  # the stream starts with this chunk


class _Feeder:
    """The feeder thread's state for one :meth:`DeviceRunner.run`: the streams being read (a row slot
    each), the items of the units handed to it and not started yet, the decode pool; it composes
    each step (see the module docstring) and puts it on ``steps``."""

    def __init__(self, runner: "DeviceRunner", next_unit, steps: queue_mod.Queue, stop):
        self.runner, self.next_unit, self.steps, self.stop = runner, next_unit, steps, stop
        self.pending: deque[Item] = deque()
        self.active: dict[int, _Stream] = {}
        self.free = list(range(runner.rows))[::-1]
        self.units_done = False
        self.errors: list[FrameChunk] = []  # of the step being composed
        self.pool = ThreadPoolExecutor(runner.settings.decode_threads, thread_name_prefix="decode")

    def offer(self, item) -> bool:
        """``item`` onto the steps queue, unless the run stops first (False)."""
        while not self.stop.is_set():
            try:
                self.steps.put(item, timeout=0.2)
                return True
            except queue_mod.Full:
                continue
        return False

    def put(self, item) -> None:
        if not self.offer(item):
            raise _Stopped

    def feed(self) -> None:
        while not self.stop.is_set():
            self.errors = []
            self._drop_failed()
            rows = self._go_on()
            rows += self._begin(self._choose(rows))
            if rows:
                step = self._compose(rows)
                self._advance(rows)
                self.put(step)
                continue
            if self.errors:
                self._deliver_errors()
            if self.units_done and not self.pending and not self.active:
                return

    def close(self) -> None:
        for stream in self.active.values():
            stream.reader.close()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _deliver_errors(self) -> None:
        self.put(_Step.only_errors(self.errors))
        self.errors = []

    def _end(self, stream: _Stream) -> None:
        self.active.pop(stream.slot).reader.close()
        self.free.append(stream.slot)

    def _drop_failed(self) -> None:
        """Streams that failed in the encoder (out of memory alone) free their rows."""
        for stream in [st for st in self.active.values() if st.item.uid in self.runner.failed]:
            self._end(stream)

    def _go_on(self) -> list[_Row]:
        """The next chunk of each running stream, read in the decode pool; a stream that fails to
        read ends with an error."""
        rows = []
        streams = list(self.active.values())
        for stream, result in zip(streams, self.pool.map(self.runner._read, streams)):
            if isinstance(result, AudioError):
                left = (stream.item.samples - stream.emitted) / SAMPLE_RATE
                self.errors.append(FrameChunk(stream.item, None, False, True, max(0.0, left), str(result)))
                self._end(stream)
            else:
                chunk, final = result
                rows.append(_Row(stream, chunk, final, fresh=False))
        return rows

    def _choose(self, rows: list[_Row]) -> list[Item]:
        """The items to start in the free rows, while the step stays within the padded-seconds
        budget; units are asked for as they are needed."""
        runner, chosen = self.runner, []
        size = max((len(row.chunk) for row in rows), default=0)
        while len(chosen) < len(self.free) and len(rows) + len(chosen) < runner.rows:
            if not self.pending:
                if self.units_done:
                    break
                if (rows or chosen) and (len(rows) + len(chosen) + 1) * size > runner.budget:
                    break  # nothing more fits this step: leave the next unit to a free worker
                if not self._take_unit(block=not rows and not chosen):  # never stall running streams
                    break
                continue
            first = min(runner.chunk, self.pending[0].samples)
            n = len(rows) + len(chosen) + 1
            if n > 1 and n * max(size, first) > runner.budget:
                break
            size = max(size, first)
            chosen.append(self.pending.popleft())
        return chosen

    def _take_unit(self, block: bool) -> bool:
        """The next unit's items into ``pending``; False when none comes (none yet, or no more)."""
        if block and self.errors:  # deliver them before waiting: the caller may be waiting for them
            self._deliver_errors()
        unit = self.next_unit(block=block)
        if unit is IDLE:  # no work for a while: once every step fed so far is out, say so
            self.put(_IDLE)
            unit = self.next_unit(block=True)
        if unit is None:
            self.units_done = True
            return False
        if unit is LATER:
            return False
        self.pending.extend(unit.items)
        return True

    def _begin(self, chosen: list[Item]) -> list[_Row]:
        """The chosen items opened (in the decode pool) with their first chunk, each in a free row;
        one that fails to open or read is an error."""
        rows = []
        for item, result in zip(chosen, self.pool.map(self.runner._start, chosen)):
            if not isinstance(result, AudioError):
                stream, chunk = result
                result = chunk if isinstance(chunk, AudioError) else result
            if isinstance(result, AudioError):
                self.errors.append(FrameChunk(item, None, True, True, item.samples / SAMPLE_RATE, str(result)))
                continue
            stream.slot = self.free.pop()
            self.active[stream.slot] = stream
            rows.append(_Row(stream, chunk[0], chunk[1], fresh=True))
        return rows

    def _compose(self, rows: list[_Row]) -> _Step:
        """The step of ``rows``: the host's rows in one zero-padded buffer (pinned for a GPU), written
        once; the native-rate ones grouped by rate for the encoder thread to resample."""
        runner = self.runner
        size = max(len(row.chunk) for row in rows)
        if all(row.final for row in rows):  # rows that go on fix the size (the chunk) themselves
            size = min(-(-size // runner._bucket) * runner._bucket, max(size, runner.chunk))
        pool = runner.buffers
        pin = pool is None  # (a GPU's steps: pinned buffers from torch's cache)
        host = [r for r, row in enumerate(rows) if not isinstance(row.chunk, NativeChunk)]
        # (one write of each sample)
        audio = torch.empty(len(host), size, pin_memory=True) if pin else pool.take(len(host), size, torch.float32)
        for i, r in enumerate(host):
            c = rows[r].chunk
            audio[i, : len(c)] = c
            audio[i, len(c):] = 0
        groups: dict[tuple, list[int]] = {}
        for r, row in enumerate(rows):
            if isinstance(row.chunk, NativeChunk):
                groups.setdefault(row.chunk.group, []).append(r)
        native = [NativeGroup.of(g, [rows[r].chunk for r in g], pin, pool) for g in groups.values()]
        return _Step(audio, lengths=torch.tensor([len(row.chunk) for row in rows]),
                     final=torch.tensor([row.final for row in rows]), fresh=torch.tensor([row.fresh for row in rows]),
                     slots=torch.tensor([row.stream.slot for row in rows]), items=[row.stream.item for row in rows],
                     errors=self.errors,
                     host_rows=None if len(host) == len(rows) else torch.tensor(host, dtype=torch.long),
                     groups=native, buffers=() if pin else (audio, *(g.samples for g in native)))

    def _advance(self, rows: list[_Row]) -> None:
        """After composing: each stream's emitted samples counted; an ending stream frees its row."""
        for row in rows:
            row.stream.emitted += len(row.chunk)
            if row.final:
                if row.stream.reader.warnings:  # before the step is handed over: _encode reads it
                    self.runner.decoder_warnings[row.stream.item.uid] = row.stream.reader.warnings
                self._end(row.stream)


class DeviceRunner:
    """Continuous-batching encode on one device; see the module docstring."""

    def __init__(self, settings: Settings, device: str, model=None, taps: tuple[str, ...] | None = None):
        # every process that feeds runs one of these (the run's own, a device worker, a Ray actor):
        # its large blocks stay in its heaps, not mapped afresh and faulted in for each step
        self.malloc = keep_large_blocks()
        self.settings = settings
        self.taps = taps or (settings.tap,)
        self.multi = taps is not None  # chunks carry {tap: frames} (verify) instead of one array
        self.device = device
        self.encoder = build_encoder(settings, device, model)
        self.chunk = settings.chunk_samples(self.encoder.hop)
        self.rows = settings.rows
        self.budget = max(int(settings.step_seconds * SAMPLE_RATE), self.chunk)
        self.device_resample = settings.device_resample  # native-rate rows, resampled by the encoder thread
        self.state = None
        self.failed: set[str] = set()  # streams (Item.uid) that failed in the encoder (the feeder drops them)
        self.warmup: dict[tuple[str, str], int] = {}  # (piece uid, tap): warm-up frames still to drop
        self.decoder_warnings: dict[str, str] = {}  # stream uid -> what its decoder printed (set as it ends)
        self.stats = Stats()
        # --fidelity: each row's codes decoded as they come (the decoder's own state per slot), compared
        # with the encoder's input of the same step; a meter per stream until its last chunk
        self.decoder = PaddedMimiDecoder(self.encoder.model) if settings.fidelity and not self.multi \
            and settings.tap == "codes" else None
        self.decoder_state = None
        self.meters: dict[str, FidelityMeter] = {}
        # step lengths rounded up to 4 frames (0.32 s): shapes repeat, so cuDNN's autotuning and
        # oneDNN's per-shape kernels are reused (CPU: a new shape costs ~30% more, measured)
        self._bucket = 4 * self.encoder.hop
        # the CPU device's step buffers, reused once a step is encoded (a GPU's pinned ones are torch's: none)
        self.buffers = None if device.startswith("cuda") else StepBuffers()

    # -- feeder ----------------------------------------------------------------------------
    def _open(self, item: Item) -> AudioReader | PieceReader:
        framing = Framing.of(self.settings)
        # resampled by the encoder thread (on the device), or here
        reader = NativeReader if self.device_resample and device_resamplable(item.sample_rate, self.chunk) \
            else AudioReader
        if item.piece is None:
            return reader(open_audio(item), item.channel, framing, item.start, item.frames)
        begin, end, last = item.piece.begin, item.piece.end, item.piece.last
        if item.sample_rate == SAMPLE_RATE and framing.delay(SAMPLE_RATE) == 0 and seek_is_exact(bytes_name(item)):
            # samples are the source's, and a seek lands on exactly them: seek
            frames = item.frames - begin if last else end - begin
            return AudioReader(open_audio(item), item.channel, framing, item.start + begin, frames)
        return PieceReader(reader(open_audio(item), item.channel, framing, item.start, item.frames),
                           begin, None if last else end)

    def _read(self, stream: _Stream):
        try:
            return stream.reader.next_chunk(self.chunk)
        except AudioError as e:
            return e

    def _start(self, item: Item):
        try:
            reader = self._open(item)
        except AudioError as e:
            return e
        stream = _Stream(item, reader, -1)
        result = self._read(stream)
        if isinstance(result, AudioError):
            reader.close()
        return stream, result

    def _feed(self, next_unit, steps: queue_mod.Queue, stop, consumer_gone: threading.Event) -> None:
        """The feeder thread: :class:`_Feeder`'s steps onto ``steps``, then DONE (always, however it ends)."""
        feeder = _Feeder(self, next_unit, steps, stop)
        try:
            feeder.feed()
        except _Stopped:
            pass
        except BaseException as e:  # surfaced in the encoder thread
            feeder.offer(e)
        finally:
            feeder.close()
            while not consumer_gone.is_set():  # the encoder loop drains until it sees this: never dropped
                try:  # while it listens, however long its step takes (a dropped one hung the run for good)
                    steps.put(DONE, timeout=0.2)
                    break
                except queue_mod.Full:
                    continue

    # -- encoder ---------------------------------------------------------------------------
    def _forward(self, step: _Step):
        s = self.settings
        audio = step.audio.to(self.encoder.model.device, TORCH_DTYPES[s.dtype], non_blocking=True)
        offsets = [(r, it.piece.begin) for r, it in enumerate(step.items) if it.piece and it.piece.begin and step.fresh[r]]
        if bool(step.fresh.all()) and bool(step.final.all()) and not offsets:
            return self.encoder(audio, step.lengths, self.taps, s.num_quantizers)
        if self.state is None:
            self.state = self.encoder.init_state(self.rows)
        starting = torch.zeros(self.rows, dtype=torch.bool)
        starting[step.slots[step.fresh]] = True
        self.state.reset(starting)
        for r, begin in offsets:  # a piece of a split recording: its positions are the recording's
            self.state.position[int(step.slots[r])] = begin // self.encoder.step
        sub = self.state.select(step.slots)
        out = self.encoder(audio, step.lengths, self.taps, s.num_quantizers, state=sub, final=step.final)
        self.state.assign(step.slots, sub)  # only after success: an out-of-memory retry starts clean
        return out

    def _resample(self, step: _Step) -> _Step:
        """The step with every row at 24 kHz on the device: the host's rows copied, the native-rate
        ones resampled there (:func:`~mimi_extract.audio.device.resample_rows`)."""
        device = self.encoder.model.device
        audio = torch.zeros(len(step.items), step.size, device=device)
        if len(step.host_rows):
            audio[step.host_rows.to(device)] = step.audio.to(device, non_blocking=True)
        return replace(step, audio=resample_rows(step.groups, audio), host_rows=None, groups=[])

    def _encode(self, step: _Step) -> list[FrameChunk]:
        if step.host_rows is not None:
            step = self._resample(step)
        try:
            out = self._forward(step)
        except Exception as e:
            if not is_out_of_memory(e):
                raise
            if self.device.startswith("cuda"):
                torch.cuda.empty_cache()
            if len(step.items) == 1:
                item = step.items[0]
                self.failed.add(item.uid)
                return [FrameChunk(item, None, False, True, 0.0, "out of memory even alone; lower --chunk-seconds "
                              "or --max-batch-seconds, or use a device with more memory")]
            half = len(step.items) // 2
            return self._encode(step.rows(list(range(half)))) + self._encode(step.rows(list(range(half, len(step.items)))))
        s = self.settings
        fidelity = self._fidelity(step, out) if self.decoder is not None else {}
        # the step's outputs on the host in one copy per tap (not one per row: each a device sync),
        # the rows' flags as Python values once (not a tensor index per row and use)
        host = EncoderOutput({t: out.tensors[t].to("cpu") for t in self.taps}, {t: out.lengths[t].to("cpu") for t in self.taps})
        fresh, ends, lengths = step.fresh.tolist(), step.final.tolist(), step.lengths.tolist()
        chunks = []
        for r, item in enumerate(step.items):
            if self.multi:
                data = {t: self._own(item, t, frames_of(host, t, r), fresh[r]) for t in self.taps}
            else:
                data = stored_array(self._own(item, s.tap, frames_of(host, s.tap, r), fresh[r]), s.tap, s.feature_dtype)
            final = ends[r]
            chunks.append(FrameChunk(item, data, fresh[r], final, lengths[r] / SAMPLE_RATE,
                                warnings=self.decoder_warnings.pop(item.uid, None) if final else None,
                                fidelity=fidelity.get(r)))
        self.stats.steps += 1
        if not bool(step.fresh.all()):
            self.stats.joined += int(step.fresh.sum())
        self.stats.real += int(step.lengths.sum())
        self.stats.padded += step.audio.numel()
        return chunks

    def _fidelity(self, step: _Step, out) -> dict[int, Fidelity]:
        """--fidelity: this step's codes decoded (all its codebooks: the stored ``q``), each row's
        decode compared with the 24 kHz input the encoder saw in this step, over that input's samples
        (a last frame's padding is not compared); {row: the item's fidelity} for the rows whose
        stream ends here.  A piece of a split recording gets none: its decode would need the
        decoder's own warm-up (docs/fidelity.md)."""
        codes, frames = out.tensors["codes"], out.lengths["codes"]
        if bool(step.fresh.all()) and bool(step.final.all()):
            decoded = self.decoder(codes, frames).audio
        else:
            if self.decoder_state is None:
                self.decoder_state = self.decoder.init_state(self.rows)
            starting = torch.zeros(self.rows, dtype=torch.bool)
            starting[step.slots[step.fresh]] = True
            self.decoder_state.reset(starting)
            sub = self.decoder_state.select(step.slots)
            decoded = self.decoder(codes, frames, state=sub, final=step.final).audio
            self.decoder_state.assign(step.slots, sub)
        results = {}
        for r, item in enumerate(step.items):
            if item.piece is not None:
                continue
            if bool(step.fresh[r]):
                self.meters[item.uid] = FidelityMeter()
            n = int(step.lengths[r])
            self.meters[item.uid].update(step.audio[r, :n], decoded[r, :n])
            if bool(step.final[r]):
                results[r] = self.meters.pop(item.uid).result()
        return results

    def _own(self, item: Item, tap: str, frames: torch.Tensor, fresh: bool) -> torch.Tensor:
        """A split recording's piece drops its warm-up frames (they belong to the piece before)."""
        if item.piece is None:
            return frames
        key = (item.uid, tap)
        if fresh:
            per_frame = self.encoder.step if tap == "encoder" else self.encoder.hop
            self.warmup[key] = (item.piece.first - item.piece.begin) // per_frame
        drop = min(self.warmup.get(key, 0), frames.shape[0])
        if drop:
            self.warmup[key] -= drop
            if not self.warmup[key]:
                del self.warmup[key]
        return frames[drop:]

    def run(self, next_unit, emit, stop, idle=None, emit_step=None) -> Stats:
        """Encode every unit ``next_unit(block)`` returns (None: no more; LATER: none yet, only when
        not ``block``; IDLE: none until what was handed out is stored, only when ``block``: ask
        again), ``emit``-ting frame chunks in order.  ``stop`` (an Event) ends the run early.
        ``idle()``: called in the encoder's thread after IDLE, once every step fed before it is
        emitted (a worker writing its own shards writes the open one: the run waits for it).
        ``emit_step(chunks)``: where given, a step's chunks go to it in one call, in order (the
        in-process engine's queue takes a step in one put, so its writer thread wakes once a step,
        not once an item); a step's error chunks still go to ``emit``."""
        steps: queue_mod.Queue = queue_mod.Queue(maxsize=2)
        halt = threading.Event()  # this runner's own stop (an error here must not stop the others)
        feeder_stop = AnyEvent(stop, halt)
        feeder = threading.Thread(target=self._feed, args=(next_unit, steps, feeder_stop, halt), name="feeder",
                                  daemon=True)
        start = time.perf_counter()
        feeder.start()
        try:
            while True:
                t0 = time.perf_counter()
                step = get_while(steps, feeder)
                self.stats.wait_input += time.perf_counter() - t0
                if step is DONE:
                    break
                if step is _IDLE:  # every step fed so far is encoded and emitted
                    if idle is not None:
                        idle()
                    continue
                if isinstance(step, BaseException):
                    raise step
                for e in step.errors:
                    if e.item.uid not in self.failed:  # not already failed here (out of memory alone)
                        emit(e)
                if feeder_stop.is_set():
                    continue  # drain: the feeder is stopping
                if not step.items:
                    continue
                buffers = step.buffers  # (step.rows copies its rows: these stay the ones to give back)
                keep = [r for r, it in enumerate(step.items) if it.uid not in self.failed]
                if len(keep) < len(step.items):
                    if not keep:
                        continue
                    step = step.rows(keep)
                t0 = time.perf_counter()
                chunks = self._encode(step)
                if self.buffers is not None:  # nothing reads them any more: the chunks hold the encoder's outputs
                    self.buffers.give(buffers)
                t1 = time.perf_counter()
                self.stats.busy += t1 - t0
                if emit_step is not None:
                    emit_step(chunks)
                else:
                    for chunk in chunks:
                        emit(chunk)
                self.stats.wait_output += time.perf_counter() - t1
        finally:
            halt.set()
            feeder.join(timeout=10)
            self.stats.wall += time.perf_counter() - start
        return self.stats

