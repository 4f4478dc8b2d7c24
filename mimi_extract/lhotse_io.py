"""lhotse out: ``cuts.jsonl.gz`` next to the manifest (lhotse manifests as *inputs* are a source
kind: ``sources/lhotse.py``).

Output: one ``MonoCut`` per ok item whose custom field (``mimi_codes``, ``mimi_latent`` or
``mimi_encoder``) is a ``TemporalArray`` with ``numpy_hdf5`` storage pointing *into* our shard
(absolute path, the dataset's name as key), so lhotse reads the very bytes ``mimi_extract.read``
does -- no copy.  Shards are time-first, the only layout lhotse's partial loads slice correctly.
lhotse keeps ``round(duration / frame_shift)`` frames of a cut (half up), so each cut spans its
item's whole frame grid (``frames x frame_shift``, at most one frame longer than the audio, which
lhotse pads): ``cut.load_custom(...)`` then equals ``read()``, trailing partial frame included,
and ``cut.truncate(...)`` loads the matching frames.

The cuts file is written with plain JSON (it is lhotse's serialisation, checked by a round trip
through lhotse in the tests), so extraction needs no lhotse import.
"""

from __future__ import annotations

import gzip
import json
import os

from .writer import _write_file, committed_rows, read_run_info, run_dirs

CUTS = "cuts.jsonl.gz"
FIELDS = {"codes": "mimi_codes", "latent": "mimi_latent", "encoder": "mimi_encoder"}


def cut_dict(row: dict, run_dir: str, field: str, frame_shift: float) -> dict:
    src = row["source"]
    rate, start = row["sample_rate"], row.get("start") or 0.0
    channels = list(range(src["channels"]))
    shard = os.path.abspath(os.path.join(run_dir, row["shard"]))
    frames = row["frames"]
    dims = row.get("dims")
    array = {"storage_type": "numpy_hdf5", "storage_path": shard, "storage_key": row["dataset"],
             "shape": [frames] + ([dims] if dims else [])}
    recording_id = row["path"]
    if row.get("channel") is not None:
        channel, kind = row["channel"], "MonoCut"
    elif len(channels) > 1:  # a mix of every channel
        channel, kind = channels, "MultiCut"
    else:
        channel, kind = 0, "MonoCut"
    return {
        "id": row["key"], "start": start, "duration": round(frames * frame_shift, 6),
        "channel": channel, "supervisions": [],
        "recording": {"id": recording_id, "sources": [{"type": "file", "channels": channels, "source": src["path"]}],
                      "sampling_rate": rate, "num_samples": src["frames"], "duration": src["frames"] / rate,
                      "channel_ids": channels},
        "custom": {field: {"array": array, "temporal_dim": 0, "frame_shift": frame_shift, "start": start}},
        "type": kind,
    }


def cut_dicts(run_dir: str) -> list[dict]:
    """One cut per committed ok row of a run directory (lhotse's serialisation of a MonoCut/MultiCut)."""
    info = read_run_info(run_dir)
    if info is None:
        return []
    tap = info["tap"]
    frame_shift = 0.04 if tap == "encoder" else 0.08
    return [cut_dict(r, run_dir, FIELDS[tap], frame_shift)
            for r in committed_rows(run_dir) if r.get("status") == "ok" and r.get("source")]


def write_cuts(run_dir: str) -> str | None:
    """(Re)write ``run_dir/cuts.jsonl.gz`` from the manifest's committed ok rows, atomically.  Every
    run ends with it, an interrupted one too; after a kill -9 it lags the manifest until the next
    run of that directory (``read_cuts`` never does: it reads the manifest)."""
    info = read_run_info(run_dir)
    if info is None or info.get("format", "hdf5") != "hdf5":  # Shar's cuts are its shar/cuts.* files
        return None
    lines = [json.dumps(c, ensure_ascii=False) for c in cut_dicts(run_dir)]
    path = os.path.join(run_dir, CUTS)
    _write_file(path + ".tmp", gzip.compress(("\n".join(lines) + ("\n" if lines else "")).encode("utf-8"), 6))
    os.replace(path + ".tmp", path)
    return path


def read_cuts(out_dir: str):
    """The lhotse CutSet of every committed ok item of OUT (all parts), lazy: see ``reader.read_cuts``."""
    from .reader import read_cuts

    return read_cuts(out_dir)

