"""The lhotse cuts of an OUT: what ``cuts.jsonl.gz`` next to the manifest holds (``store/directory.py``
writes it; lhotse manifests as *inputs* are a source kind: ``sources/lhotse.py``).

Output: one ``MonoCut`` per ok item whose custom field (``mimi_codes``, ``mimi_latent`` or
``mimi_encoder``) is a ``TemporalArray`` pointing *into* our shard (absolute path), so lhotse
reads the very bytes ``mimi_extract.read`` does -- no copy.  HDF5 shards use lhotse's own
``numpy_hdf5`` storage (the dataset's name as key); Parquet and Megatron shards a
``mimi_extract_parquet`` / ``mimi_extract_megatron`` storage, lhotse ``FeaturesReader`` classes that
:func:`register_lhotse_readers` adds to lhotse's registry (``read_cuts`` calls it; a process that
loads a written ``cuts.jsonl.gz`` of such an OUT must ``import mimi_extract.formats.cuts`` and call
it first).  Shards are time-first, the only layout lhotse's partial loads slice correctly.
lhotse keeps ``round(duration / frame_shift)`` frames of a cut (half up), so each cut spans its
item's whole frame grid (``frames x frame_shift``, at most one frame longer than the audio, which
lhotse pads): ``cut.load_custom(...)`` then equals ``read()``, trailing partial frame included,
and ``cut.truncate(...)`` loads the matching frames.

The cuts file is written with plain JSON (it is lhotse's serialisation, checked by a round trip
through lhotse in the tests), so extraction needs no lhotse import.
"""

from __future__ import annotations

import os

from ..common import remote
from ..config.choices import FIDELITY_FIELDS
from .records import StoredRow
from .registry import format_of

FIELDS = {"codes": "mimi_codes", "latent": "mimi_latent", "encoder": "mimi_encoder"}
# a lhotse supervision's fields, and the names an input row may give them under (the first present wins)
# (raw_text, normalized_text: VoxPopuli's TSV columns)
SUPERVISION_FIELDS = {"text": ("text", "transcript", "transcription", "sentence", "raw_text", "normalized_text"),
                      "speaker": ("speaker", "speaker_id"),
                      "language": ("language", "lang", "locale"), "gender": ("gender",)}


def cut_metadata(row: StoredRow, recording_id: str, channel, duration: float) -> tuple[list[dict], dict]:
    """(supervisions, custom fields) of an ok row's cut, from what its input said (``row.meta``).
    A lhotse input's supervisions are its cut's (times already relative to the item: only the
    recording and channel become the output cut's); an item with a ``text`` (``speaker``,
    ``language``, ``gender``) but no supervisions (a sidecar, a list or Parquet row) gets one
    supervision over the whole item, so lhotse recipes find ``cut.supervisions[0].text``.  Every
    other kept field is a custom field, and so are ``--fidelity``'s ``si_sdr`` and ``mel_distance``."""
    meta = row.meta or {}
    custom = {k: v for k, v in meta.items() if k != "supervisions"}
    custom.update({k: getattr(row, k) for k in FIDELITY_FIELDS if getattr(row, k) is not None})  # --fidelity: lhotse filters
    if "supervisions" in meta:
        return [{**s, "recording_id": recording_id, "channel": channel} for s in meta["supervisions"]], custom
    fields = {}
    for name, aliases in SUPERVISION_FIELDS.items():
        found = next((a for a in aliases if custom.get(a) is not None), None)
        if found is not None:
            fields[name] = str(custom.pop(found))
    if not fields:
        return [], custom
    return [{"id": row.key, "recording_id": recording_id, "start": 0.0, "duration": duration, "channel": channel,
             **fields}], custom


def cut_dict(row: StoredRow, run_dir: str, field: str, frame_shift: float, array: dict | None = None) -> dict | None:
    """The cut of one ok row (None when its format gives lhotse no storage: ``Format.lhotse_storage``).
    ``array``: the field's storage given (Shar writes its own placeholder)."""
    src = row.source
    rate, start = row.sample_rate, row.start or 0.0
    channels = list(range(src.channels))
    shard = remote.absolute(remote.join(run_dir, row.shard))  # a URL on object storage: valid on any machine
    frames = row.frames
    dims = row.dims
    if array is None:
        storage = format_of(row.shard).lhotse_storage(shard, row)
        if storage is None:
            return None
        storage_type, storage_key = storage
        array = {"storage_type": storage_type, "storage_path": shard, "storage_key": storage_key,
                 "shape": [frames] + ([dims] if dims else [])}
    recording_id = row.path
    if row.channel is not None:
        channel, kind = row.channel, "MonoCut"
    elif len(channels) > 1:  # a mix of every channel
        channel, kind = channels, "MultiCut"
    else:
        channel, kind = 0, "MonoCut"
    supervisions, custom = cut_metadata(row, recording_id, channel, row.duration)
    return {
        "id": row.key, "start": start, "duration": round(frames * frame_shift, 6),
        "channel": channel, "supervisions": supervisions,
        "recording": {"id": recording_id, "sources": [{"type": "file", "channels": channels, "source": src.path}],
                      "sampling_rate": rate, "num_samples": src.frames, "duration": src.frames / rate,
                      "channel_ids": channels},
        "custom": {field: {"array": array, "temporal_dim": 0, "frame_shift": frame_shift, "start": start}, **custom},
        "type": kind,
    }


_REGISTERED = False


def our_storages() -> tuple[str, ...]:
    """The lhotse storage types that :func:`register_lhotse_readers` adds (a cut naming one needs it)."""
    from . import megatron, parquet
    from .hdf5 import LHOTSE_REMOTE_STORAGE

    return LHOTSE_REMOTE_STORAGE, parquet.LHOTSE_STORAGE, megatron.LHOTSE_STORAGE


def register_lhotse_readers() -> None:
    """Add our storages to lhotse's registry (idempotent): ``mimi_extract_parquet``, a
    ``FeaturesReader`` whose ``read(key, left, right)`` loads row ``INDEX`` of a Parquet shard
    (checking its key) and slices its frames, as lhotse's own readers do; ``mimi_extract_hdf5``,
    lhotse's ``numpy_hdf5`` for a shard on object storage (a URL, which h5py cannot open by name:
    read through a file object, by ranged GETs)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from lhotse.features.io import FeaturesReader, register_reader

    from . import megatron, parquet
    from .hdf5 import LHOTSE_REMOTE_STORAGE, open_hdf5

    @register_reader
    class MimiHdf5Reader(FeaturesReader):
        name = LHOTSE_REMOTE_STORAGE

        def __init__(self, storage_path, *args, **kwargs):
            super().__init__()
            self.path = str(storage_path)

        def read(self, key: str, left_offset_frames: int = 0, right_offset_frames=None):
            handle = _handle(self.path, open_hdf5)
            return handle[key][left_offset_frames:right_offset_frames]

    @register_reader
    class MimiParquetReader(FeaturesReader):
        name = parquet.LHOTSE_STORAGE

        def __init__(self, storage_path, *args, **kwargs):
            super().__init__()
            self.path = str(storage_path)

        def read(self, key: str, left_offset_frames: int = 0, right_offset_frames=None):
            index, _, item = key.partition("/")
            handle = _handle(self.path, parquet.ParquetHandle)
            return handle.item(int(index), item)[left_offset_frames:right_offset_frames]

    @register_reader
    class MimiMegatronReader(FeaturesReader):
        """A Megatron shard's document ``DOCUMENT/KEY`` (its ``.idx`` path), decoded back to codes."""

        name = megatron.LHOTSE_STORAGE

        def __init__(self, storage_path, *args, **kwargs):
            super().__init__()
            self.path = str(storage_path)

        def read(self, key: str, left_offset_frames: int = 0, right_offset_frames=None):
            document, _, item = key.partition("/")
            handle = _handle(self.path, megatron.MegatronHandle)
            return handle.item(int(document), item)[left_offset_frames:right_offset_frames]

    _REGISTERED = True


_HANDLES: dict = {}


def _handle(path: str, opener):
    """A few open shards per process (lhotse readers are built per call; a dataloader reading cuts
    in shard order then opens each shard once, and decodes each Parquet row group once)."""
    key = (path, os.getpid())
    handle = _HANDLES.get(key)
    if handle is None:
        if len(_HANDLES) >= 16:
            _HANDLES.pop(next(iter(_HANDLES))).close()
        handle = _HANDLES[key] = opener(path)
    return handle
