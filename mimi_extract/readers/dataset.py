"""Training-side reading of an OUT: a picklable map-style Dataset, a padding collate, and a lhotse
dataset that yields the stored arrays with the supervisions' text.

Everything here is a module-level class, so DataLoader workers started with ``spawn`` (the
default on macOS, and the only safe choice once CUDA is initialised) can unpickle it; a class
defined inside a method cannot be pickled.  Shard handles are never pickled: each worker opens
its own (``Reader.__getstate__``; a forked worker drops the parent's, ``Reader._shard``).

::

    from torch.utils.data import DataLoader
    from mimi_extract.dataset import OutDataset, pad_collate

    loader = DataLoader(OutDataset("out"), batch_size=16, num_workers=4, collate_fn=pad_collate,
                        multiprocessing_context="spawn")
    for batch in loader:  # batch["data"] [B, T, D], batch["lengths"] [B], batch["mask"] [B, T]
        ...

lhotse (samplers batch cuts; the dataset turns a batch of cuts into tensors)::

    from lhotse.dataset import DynamicBucketingSampler
    from mimi_extract.dataset import CutsDataset

    cuts = mimi_extract.read_cuts("out")   # or CutSet.from_shar(...) / a --shar-extend field
    sampler = DynamicBucketingSampler(cuts, max_duration=200, shuffle=True)
    loader = DataLoader(CutsDataset(), sampler=sampler, batch_size=None, num_workers=4)
    for batch in loader:  # batch["data"], ["lengths"], ["mask"], ["ids"], ["text"]
        ...
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from .reader import OutDataset


class PadCollate:
    """Batch items of different lengths: ``data`` ``[B, T_max, D]`` right-padded with
    ``pad_value``, ``lengths`` ``[B]`` (int64, frames), ``mask`` ``[B, T_max]`` (True on real
    frames), and every other field as a list (``key``, ``frames``...).  Codes keep their int16
    dtype: pad with a value no codebook uses (``-1``) when the model must not see padding as a code.
    ``field``: the name of the array in each item (``"data"``)."""

    def __init__(self, pad_value: float = 0, field: str = "data"):
        self.pad_value, self.field = pad_value, field

    def __call__(self, items: list[dict]) -> dict:
        arrays = [torch.as_tensor(it[self.field]) for it in items]
        lengths = torch.tensor([a.shape[0] for a in arrays], dtype=torch.int64)
        longest = int(lengths.max()) if len(arrays) else 0
        shape = (len(arrays), longest, *arrays[0].shape[1:]) if arrays else (0, 0)
        data = torch.full(shape, self.pad_value, dtype=arrays[0].dtype if arrays else torch.float32)
        for row, a in zip(data, arrays):
            row[: a.shape[0]] = a
        batch = {k: [it[k] for it in items] for k in (items[0] if items else {}) if k != self.field}
        batch.update({self.field: data, "lengths": lengths, "mask": torch.arange(longest)[None] < lengths[:, None]})
        return batch


pad_collate = PadCollate()


class CutsDataset(Dataset):
    """A lhotse dataset: ``__getitem__`` takes a batch of cuts (what a lhotse sampler yields) and
    returns :class:`PadCollate`'s batch of their stored arrays (``cut.load_custom(field)``) with
    ``ids`` (cut ids) and ``text`` (per cut, its supervisions' texts joined by a space, in time
    order; "" when it has none).  ``field``: ``mimi_codes``, ``mimi_latent`` or ``mimi_encoder``
    (None: the one each cut has).  Cuts without the field (a ``--shar-extend`` placeholder for an
    item that failed) are left out of the batch.  Works over the cuts of every format (HDF5,
    Parquet: its lhotse storage backend is registered in each worker; Shar)."""

    def __init__(self, field: str | None = None, pad_value: float = 0):
        self.field = field
        self.collate = PadCollate(pad_value)

    def __getitem__(self, cuts) -> dict:
        from ..formats.cuts import register_lhotse_readers

        register_lhotse_readers()  # a spawned worker starts with lhotse's registry as lhotse ships it
        items = []
        for cut in cuts:
            field = self.field or next((f for f in ("mimi_codes", "mimi_latent", "mimi_encoder")
                                        if cut.has_custom(f)), None)
            if field is None or not cut.has_custom(field):
                continue
            text = " ".join(s.text for s in sorted(cut.supervisions, key=lambda s: s.start) if s.text)
            items.append({"data": torch.from_numpy(np.ascontiguousarray(cut.load_custom(field))), "ids": cut.id,
                          "text": text})
        return self.collate(items)


__all__ = ["OutDataset", "PadCollate", "pad_collate", "CutsDataset"]
