"""Finding audio, planning length-sorted batches, and decoding them in DataLoader workers.

Lengths come from file headers (no decoding), so a million-file corpus can be sorted and packed
up front: similar lengths share a batch and the padding (wasted compute) stays small.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import soundfile as sf
import torch
from torch.utils.data import Dataset

from .audio import SAMPLE_RATE, AudioError, load

AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".mp3", ".opus", ".aiff", ".aif")


@dataclass
class Item:
    """One utterance to encode: a file, or one channel of it with ``--channel each``."""

    path: str  # absolute
    rel: str  # relative to the input dir, with '/' separators
    key: str  # dataset name in the shard
    channel: int | str = "mix"
    sample_rate: int = 0
    samples: int = 0  # at 24 kHz, estimated from the header
    error: str | None = None

    @property
    def duration(self) -> float:
        return self.samples / SAMPLE_RATE


def find_audio(root: str) -> list[str]:
    """Audio files below ``root`` (recursive, symlinks followed), sorted for reproducible runs."""
    if not os.path.isdir(root):
        raise FileNotFoundError(f"input directory {root!r} does not exist")
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames.sort()
        found += [os.path.join(dirpath, f) for f in sorted(filenames) if f.lower().endswith(AUDIO_EXTENSIONS)]
    return found


def probe(path: str, root: str, channel_mode: str = "mix") -> list[Item]:
    """Header-only look at one file -> its items (one per channel with ``each``), or one error item."""
    rel = os.path.relpath(path, root).replace(os.sep, "/")
    try:
        if os.path.getsize(path) == 0:
            raise AudioError("empty file (0 bytes)")
        try:
            info = sf.info(path)
        except Exception as e:
            raise AudioError(f"unreadable or corrupt audio header: {e}") from e
        if info.frames <= 0:
            raise AudioError("no audio samples (zero-length)")
    except (AudioError, OSError) as e:
        return [Item(path, rel, rel, error=str(e))]
    samples = math.ceil(info.frames * SAMPLE_RATE / info.samplerate)
    channels = range(info.channels) if channel_mode == "each" else [channel_mode]
    return [
        Item(path, rel, f"{rel}#ch{c}" if channel_mode == "each" else rel, c, info.samplerate, samples)
        for c in channels
    ]


def plan_batches(items: list[Item], max_batch_seconds: float, batch_size: int) -> list[list[Item]]:
    """Sort by length and pack greedily so that (items x longest item) stays under the budget.

    An item longer than the budget gets a batch of its own."""
    budget = max_batch_seconds * SAMPLE_RATE
    batches: list[list[Item]] = []
    current: list[Item] = []
    for item in sorted(items, key=lambda it: (it.samples, it.key)):
        if current and (len(current) >= batch_size or (len(current) + 1) * item.samples > budget):
            batches.append(current)
            current = []
        current.append(item)
    if current:
        batches.append(current)
    return batches


def padding_fraction(batches: list[list[Item]]) -> float:
    """Share of padded (wasted) samples over all batches, from header lengths."""
    padded = sum(len(b) * max(it.samples for it in b) for b in batches)
    real = sum(it.samples for b in batches for it in b)
    return 1 - real / padded if padded else 0.0


@dataclass
class LoadedBatch:
    """A decoded, right-padded batch; items that failed to decode are in ``errors``."""

    items: list[Item]
    audio: torch.Tensor  # [B, T] float32, zero padded
    lengths: torch.Tensor  # [B] samples
    errors: list[tuple[Item, str]] = field(default_factory=list)
    index: int = 0


class BatchDataset(Dataset):
    """Each element is one whole planned batch, so DataLoader workers decode batches in parallel."""

    def __init__(self, batches: list[list[Item]], causal_16k: bool = True):
        self.batches = batches
        self.causal_16k = causal_16k

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> LoadedBatch:
        ok, wavs, errors = [], [], []
        for item in self.batches[index]:
            try:
                wavs.append(load(item.path, item.channel, self.causal_16k))
                ok.append(item)
            except AudioError as e:
                errors.append((item, str(e)))
        lengths = torch.tensor([len(w) for w in wavs], dtype=torch.long)
        audio = torch.nn.utils.rnn.pad_sequence(wavs, batch_first=True) if wavs else torch.zeros(0, 0)
        return LoadedBatch(ok, audio, lengths, errors, index)


def collate(batch):  # DataLoader with batch_size=None passes our LoadedBatch through untouched
    return batch
