"""``from mimi_extract.dataset import OutDataset, pad_collate, CutsDataset, PadCollate`` (docs/outputs.md):
the training-side datasets, kept at this documented path; they live in :mod:`mimi_extract.readers.dataset`."""

from .readers.dataset import CutsDataset, OutDataset, PadCollate, pad_collate

__all__ = ["CutsDataset", "OutDataset", "PadCollate", "pad_collate"]
