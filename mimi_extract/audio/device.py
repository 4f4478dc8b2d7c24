"""Resampling to 24 kHz on the device: the host sends native-rate samples, the device resamples.

On a GPU the host's CPU cores decide throughput, and resampling was about half of their work
(16 kHz PCM decodes at ~23,000x real time per core, ~2,900x with the resampling).  So with
``--resample-on device`` (the default on a GPU) the feeder no longer resamples: a
:class:`NativeReader` hands the device, for each row of a step, the *native-rate* samples that the
row's 24 kHz chunk is computed from (int16 where the source is 16-bit PCM and one channel is
taken: half the bytes, and libsndfile's float decode is exactly that int16 / 32768), and
:func:`resample_rows` computes them there, all rows of one rate in one fp32 convolution (TF32 off).

Exact by construction, not by approximation: the kernel is :class:`~mimi_extract.audio.resample.SincResampler`'s
(torchaudio's formula), and each output block ``j`` of ``new`` samples is the dot product of the
kernel with the padded input ``P[j*orig : j*orig + size]``, where ``P`` is the item's samples
preceded by ``width + delay`` zeros and followed, once its end is known, by ``width + orig`` zeros
(what the streaming resampler pads).  The host keeps ``P`` from the first block not yet computed, so
each row of a step carries its own history: the device keeps no state between steps (a chunked
long item, a row refilled mid-run, an out-of-memory retry and a piece of a split recording all need
nothing more), and the overlap resent per step is ``size - orig`` samples (~26 at 16 kHz).  The
trimming to the framing's length and its zero padding are arithmetic the host already knows
(:class:`~mimi_extract.audio.framing.Framing`).  Float noise only: the device's convolution sums the same
products in another order than the host's (measured: see docs/performance.md).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import soundfile as sf
import torch

from ..config.choices import SAMPLE_RATE
from .decoders import BLOCK, AudioError, DrFlacFile, decode_turn, largest_read
from .reader import AudioReader
from .framing import Framing
from .resample import reduced_rates, sinc_kernel

INT16_SCALE = 1 / 32768  # libsndfile's float from 16-bit PCM (exact: a power of two)
SKIP_STEP = 128 * 1920  # PieceReader drops a piece's warm-up in reads of this many 24 kHz samples


def device_resamplable(rate: int, chunk: int) -> bool:
    """Whether items at ``rate`` can be resampled on the device in chunks of ``chunk`` 24 kHz
    samples: the polyphase blocks (``new`` outputs each) must tile every chunk and every skipped
    warm-up step (``new`` divides 960).  True for every common rate (8-96 kHz, 11.025/22.05/44.1/88.2
    kHz); 24 kHz needs no resampling, and a rate such as 44,056 Hz (3,000 outputs per block) stays on
    the host path."""
    if rate == SAMPLE_RATE or rate <= 0:
        return False
    _, new = reduced_rates(rate, SAMPLE_RATE)
    return chunk % new == 0 and SKIP_STEP % new == 0


@dataclass
class NativeChunk:
    """What the device needs to compute one row's next 24 kHz chunk: ``parts`` (int16 or float32,
    native rate: the padded input from the row's first block not yet computed, as consecutive pieces
    of the decoded blocks, never joined on the host: the step's buffer is their one copy), how many
    of its ``blocks`` of ``new`` outputs are the item's (``keep``; the rest of the row's ``length``
    24 kHz samples are the framing's zero padding), and the rate's reduced ratio ``orig:new``.
    ``len()`` is its 24 kHz length, as a host-resampled chunk's is."""

    parts: list[np.ndarray]
    dtype: np.dtype
    orig: int
    new: int
    blocks: int
    keep: int
    length: int

    def __len__(self) -> int:
        return self.length

    @property
    def size(self) -> int:
        """Native samples it carries."""
        return sum(len(p) for p in self.parts)

    @property
    def group(self) -> tuple[int, int, str]:
        """Rows that share a kernel and a dtype are resampled in one convolution."""
        return self.orig, self.new, self.dtype.name


def _slice(parts: list[np.ndarray], start: int, stop: int | None = None) -> list[np.ndarray]:
    """Samples ``[start, stop)`` of the concatenation of ``parts``, as views of them (no copy)."""
    out, at = [], 0
    for p in parts:
        end = at + len(p)
        lo, hi = max(start, at), end if stop is None else min(stop, end)
        if hi > lo:
            out.append(p[lo - at: hi - at])
        at = end
    return out


class NativeReader(AudioReader):
    """:class:`~mimi_extract.audio.reader.AudioReader` whose chunks are :class:`NativeChunk` s: the same
    decoding (seeks, warnings, channels, errors), no resampling.  ``next_chunk(n)`` with ``n`` a
    multiple of the rate's ``new`` (every chunk of a run is: :func:`device_resamplable`)."""

    def __init__(self, path, channel: int | str = "mix", framing: Framing = Framing(), start: int = 0,
                 frames: int | None = None):
        super().__init__(path, channel, framing, start, frames)
        self.orig, self.new = reduced_rates(self.rate, SAMPLE_RATE)
        if self.rate == SAMPLE_RATE or SKIP_STEP % self.new:  # (the engine asks only for rates that are not)
            self.close()
            raise AudioError(f"its sample rate, {self.rate} Hz, is not one the device resamples: did the file change "
                             "since the run was planned?")
        self.resampler = None
        kernel, self.width = sinc_kernel(self.orig, self.new)
        self.size = kernel.shape[-1]
        # int16 transport where libsndfile's float would be that int16 / 32768 and no channels are mixed
        # (libsndfile's 16-bit PCM and FLAC; dr_flac's 16-bit FLAC)
        self.dtype = "int16" if (isinstance(self.file, (sf.SoundFile, DrFlacFile)) and self.file.subtype == "PCM_16"
                                 and (self.file.channels == 1 or channel != "mix")) else "float32"
        self.largest_read = largest_read(self.file)
        self.padded = [np.zeros(self.width + framing.delay(self.rate), self.dtype)]  # P from block `computed` on
        self.padded_len = len(self.padded[0])
        self.computed = 0  # blocks handed out (their outputs are the first computed * new samples)
        self.total = self.target = None  # once the end is known: the framing's length, and the resampled part

    def _decode(self, need: int) -> None:
        """Decode what the chunk asked for still ``need`` s (native samples of P), in one read where
        it is at most the decoder's :func:`~mimi_extract.audio.decoders.largest_read` (``MAX_READ``,
        2^20: a 30 s chunk of 16 kHz is 480,000; FFmpeg's: a ``BLOCK``), at least a ``BLOCK``: each
        read costs the decoder's wrapper and this reader ~20 us of Python whatever its size, and a
        short item was read in 3-4 of them.  The samples are the same whatever the reads' sizes
        (each decoder's reads are consecutive); a chunk holds what it needs either way.  Where one
        read is not enough (FFmpeg's ``BLOCK`` s), the reads follow each other in one turn of the
        process's FFmpeg decodes (:func:`~mimi_extract.audio.decoders.decode_turn`), as the parts of
        the chunk they are (never joined here)."""
        with decode_turn(self.file):
            while True:
                data, end = self._decode_block(self.dtype, min(max(need, BLOCK), self.largest_read))
                self.padded.append(data)
                self.padded_len += len(data)
                need -= len(data)
                if end or need <= 0:
                    break
        if end:
            self.close()
            if self.source_samples == 0:
                raise AudioError("no audio samples (zero-length)")
            self.padded.append(np.zeros(self.width + self.orig, self.dtype))
            self.padded_len += self.width + self.orig
            self.total = self.framing.input_length(self.source_samples, self.rate)
            self.target = min(self.total, self.framing.resampled_length(self.source_samples, self.rate))
            self.done = True

    def _take(self, blocks: int, advance: int) -> list[np.ndarray]:
        """P's samples for the next ``blocks`` blocks (views of the decoded blocks); then drop the
        first ``advance`` blocks' inputs."""
        need = (blocks - 1) * self.orig + self.size if blocks else 0
        out = _slice(self.padded, 0, need)
        self.padded = _slice(self.padded, advance * self.orig)
        self.padded_len -= min(advance * self.orig, self.padded_len)
        self.computed += advance
        return out

    def next_chunk(self, n: int) -> tuple[NativeChunk, bool]:
        while True:
            if self.done:
                left = self.total - self.emitted
                take = min(n, left)
                keep = max(0, min(take, self.target - self.emitted))
                blocks = -(-keep // self.new)
                if take < left and take % self.new:
                    raise ValueError(f"a chunk that does not end the item must be a multiple of {self.new} samples")
                samples = self._take(blocks, take // self.new)
                break
            lower = self.framing.resampled_length(self.source_samples, self.rate) - 1  # the final length is above
            if lower - self.emitted > n:  # not the item's last chunk
                if n % self.new:
                    raise ValueError(f"a chunk that does not end the item must be a multiple of {self.new} samples")
                blocks = n // self.new
                if self.padded_len >= (blocks - 1) * self.orig + self.size:
                    take = keep = n
                    samples = self._take(blocks, blocks)
                    break
            self._decode(-(-n // self.new) * self.orig + self.size - self.padded_len)
        self.emitted += take
        final = self.done and self.emitted == self.total
        if final:
            self.close()
        return NativeChunk(samples, np.dtype(self.dtype), self.orig, self.new, blocks, keep, take), final

    def read_all(self):
        raise NotImplementedError("NativeReader hands chunks to the device: use next_chunk")


_KERNELS: dict[tuple[int, int, str], torch.Tensor] = {}


def _kernel(orig: int, new: int, device: torch.device) -> torch.Tensor:
    key = (orig, new, str(device))
    if key not in _KERNELS:
        _KERNELS[key] = sinc_kernel(orig, new)[0].to(device)
    return _KERNELS[key]


class StepBuffers:
    """Host buffers for the steps of a run on the CPU device, reused: at most ``count`` kept, each
    handed out again only once the step that held it is given back (:meth:`give`, by the encoder
    thread after its last read of the step).  A fresh buffer's pages are faulted in by the feeder's
    copy into it, while the decoding threads run (docs/performance.md: the copy of 16 kHz FLAC rows
    into their step, 13.7-16.6 us per audio second, 12.0-12.4 with buffers reused).  Nothing waits for a
    buffer: when none fits, a new one is made (and dropped when the pool is full), so a step never
    given back (a run stopping, rows dropped) costs only the reuse.  A GPU run's pinned buffers come
    from torch's pinned-memory cache, which already reuses them: none comes from here."""

    def __init__(self, count: int = 2):
        self.count = count
        self.free: list[torch.UntypedStorage] = []
        self.reused = 0  # buffers handed out again
        self.lock = threading.Lock()

    def take(self, rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised ``[rows, width]`` tensor: the smallest free buffer that holds it, or new."""
        size = rows * width * dtype.itemsize
        if not size:  # (a step with no host rows: nothing to keep)
            return torch.empty(rows, width, dtype=dtype)
        with self.lock:
            fits = [s for s in self.free if s.nbytes() >= size]
            if fits:
                storage = min(fits, key=lambda s: s.nbytes())
                self.free.remove(storage)
                self.reused += 1
                return torch.empty(0, dtype=dtype).set_(storage, 0, (rows, width))
        spare = torch.empty(size + size // 4, dtype=torch.uint8).untyped_storage()  # (later steps are a little wider)
        return torch.empty(0, dtype=dtype).set_(spare, 0, (rows, width))

    def give(self, tensors) -> None:
        """The buffers of a step that nothing reads any more, all taken from here (the largest
        ``count`` are kept; an empty one is not).  Nothing here asks a tensor whether it is pinned:
        on a host with CUDA that question can start CUDA in a run that never uses it, so a GPU
        run's steps hand nothing back (``_Feeder._compose``)."""
        with self.lock:
            for t in tensors:
                if t.untyped_storage().nbytes():
                    self.free.append(t.untyped_storage())
            self.free.sort(key=lambda s: -s.nbytes())
            del self.free[self.count:]


@dataclass
class NativeGroup:
    """The rows of one step that share a kernel and dtype: their padded native samples, right-padded
    to one length ``[rows, L]`` (pinned for a GPU), and each row's 24 kHz samples kept."""

    rows: torch.Tensor  # row indices in the step
    samples: torch.Tensor  # [rows, L], int16 or float32
    keep: torch.Tensor  # [rows]
    orig: int
    new: int

    @classmethod
    def of(cls, rows: list[int], chunks: list[NativeChunk], pin: bool = False,
           buffers: StepBuffers | None = None) -> "NativeGroup":
        """The group of ``chunks`` (the step's rows ``rows``), in a buffer pinned for a GPU, or one of
        ``buffers``' (the CPU device), or new; one write of each sample."""
        width = max(c.size for c in chunks)
        dtype = torch.int16 if chunks[0].dtype == np.int16 else torch.float32
        samples = buffers.take(len(chunks), width, dtype) if buffers is not None and not pin \
            else torch.empty(len(chunks), width, dtype=dtype, pin_memory=pin)
        buffer = samples.numpy()  # (numpy's slice assignment: a tenth of torch's per-call cost)
        for r, c in enumerate(chunks):
            at = 0
            for part in c.parts:
                buffer[r, at: at + len(part)] = part
                at += len(part)
            buffer[r, at:] = 0
        return cls(torch.tensor(rows), samples, torch.tensor([c.keep for c in chunks]), chunks[0].orig, chunks[0].new)

    def select(self, index: torch.Tensor) -> "NativeGroup | None":
        """This group's rows among step rows ``index`` (renumbered as their positions in it)."""
        where = {int(r): i for i, r in enumerate(index.tolist())}
        mine = [i for i, r in enumerate(self.rows.tolist()) if r in where]
        if not mine:
            return None
        pick = torch.tensor(mine)
        return NativeGroup(torch.tensor([where[int(self.rows[i])] for i in mine]), self.samples[pick], self.keep[pick],
                           self.orig, self.new)


@torch.no_grad()
def resample_rows(groups: list[NativeGroup], out: torch.Tensor) -> torch.Tensor:
    """Write each group's rows, resampled to 24 kHz in fp32, into ``out`` [R, T] (on the device,
    zeros where nothing is written: the framing's padding and the step's).  TF32 is kept off for
    the convolution whatever the encoder's dtype: these samples must equal the host's."""
    device = out.device
    for g in groups:
        x = g.samples.to(device, non_blocking=True).float()
        if g.samples.dtype == torch.int16:
            x = x * INT16_SCALE
        kernel = _kernel(g.orig, g.new, device)
        size = kernel.shape[-1]
        if x.shape[1] < size:
            continue  # no row has a block (rows that keep nothing: all padding)
        with _strict_fp32(device):
            y = torch.nn.functional.conv1d(x[:, None], kernel, stride=g.orig)  # [rows, new, blocks]
        y = y.transpose(1, 2).reshape(x.shape[0], -1)
        width = min(y.shape[1], out.shape[1], int(g.keep.max()))
        y = y[:, :width]
        keep = g.keep.to(device)
        y = y.masked_fill(torch.arange(width, device=device)[None, :] >= keep[:, None], 0)
        out[g.rows.to(device), :width] = y
    return out


class _strict_fp32:
    """Around the resampling convolution (a no-op on CPU): cuDNN's TF32 off (these samples must equal
    the host's), and its autotuning off (the encoder's steps are bucketed so that it pays; these
    rows' native lengths are not, and autotuning every new shape costs more than it saves)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.saved = torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark
            torch.backends.cudnn.allow_tf32 = torch.backends.cudnn.benchmark = False

    def __exit__(self, *exc):
        if self.cuda:
            torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = self.saved
