"""lhotse in and out: ``cuts.jsonl.gz`` next to the manifest, and lhotse manifests as inputs.

Output: one ``MonoCut`` per ok item whose custom field (``mimi_codes``, ``mimi_latent`` or
``mimi_encoder``) is a ``TemporalArray`` with ``numpy_hdf5`` storage pointing *into* our shard
(absolute path, the dataset's name as key), so lhotse reads the very bytes ``mimi_extract.read``
does -- no copy.  Shards are time-first, the only layout lhotse's partial loads slice correctly.
lhotse keeps ``round(duration / frame_shift)`` frames of a cut (half up), so each cut spans its
item's whole frame grid (``frames x frame_shift``, at most one frame longer than the audio, which
lhotse pads): ``cut.load_custom(...)`` then equals ``read()``, trailing partial frame included,
and ``cut.truncate(...)`` loads the matching frames.

The cuts file is written with plain JSON (it is lhotse's serialisation, checked by a round trip
through lhotse in the tests), so extraction needs no lhotse import; *reading* lhotse manifests as
inputs uses lhotse itself (``pip install 'mimi-extract[lhotse]'``).
"""

from __future__ import annotations

import gzip
import json
import os

from .sources import Entry
from .writer import _write_file, committed_rows, read_run_info, run_dirs

CUTS = "cuts.jsonl.gz"
FIELDS = {"codes": "mimi_codes", "latent": "mimi_latent", "encoder": "mimi_encoder"}


def _lhotse():
    try:
        import lhotse
    except ImportError as e:
        raise RuntimeError(f"lhotse manifests need lhotse: pip install 'mimi-extract[lhotse]' ({e})") from None
    return lhotse


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
    if read_run_info(run_dir) is None:
        return None
    lines = [json.dumps(c, ensure_ascii=False) for c in cut_dicts(run_dir)]
    path = os.path.join(run_dir, CUTS)
    _write_file(path + ".tmp", gzip.compress(("\n".join(lines) + ("\n" if lines else "")).encode("utf-8"), 6))
    os.replace(path + ".tmp", path)
    return path


def read_cuts(out_dir: str):
    """The lhotse CutSet of every committed ok item of OUT (all parts of a job array), built from
    the manifests, so it is never behind them (the ``cuts.jsonl.gz`` files can be, after a kill)."""
    lhotse = _lhotse()
    dirs = [d for d in run_dirs(out_dir) if read_run_info(d) is not None]
    if not dirs:
        raise FileNotFoundError(f"{out_dir} holds no mimi-extract run (no run.json)")
    return lhotse.CutSet.from_dicts([c for d in dirs for c in cut_dicts(d)])


def _file_source(recording, channel: int):
    """(audio path, channel within that file) for a lhotse recording's channel."""
    for src in recording.sources:
        chans = src.channels if isinstance(src.channels, list) else [src.channels]
        if channel in chans:
            if src.type != "file":
                raise ValueError(f"audio source type {src.type!r} (only 'file' sources can be read)")
            return src.source, chans.index(channel)
    raise ValueError(f"recording {recording.id!r} has no channel {channel}")


def read_lhotse_manifest(path: str, recordings: str | None = None) -> list[Entry]:
    """Entries of a lhotse RecordingSet, CutSet or SupervisionSet (with ``recordings``):
    recordings are whole files (one entry per channel), cuts and supervisions are segments keyed
    by their ids."""
    lhotse = _lhotse()
    manifest = lhotse.load_manifest_lazy(path) if path.endswith((".jsonl", ".jsonl.gz")) else lhotse.load_manifest(path)
    if manifest is None:
        return []
    entries: list[Entry] = []

    def add(key, recording, start, duration, channels):
        channels = channels if isinstance(channels, list) else [channels]
        for ch in channels:
            k = key if len(channels) == 1 else f"{key}#ch{ch}"
            try:
                if getattr(recording, "transforms", None):
                    raise ValueError("recordings with transforms (speed/volume perturbation) are not supported")
                audio, index = _file_source(recording, ch)
                full = audio if os.path.isabs(audio) else os.path.abspath(audio)
                entries.append(Entry(full, audio, key=k, start=start, duration=duration,
                                     channel=index if len(recording.channel_ids) > 1 else None))
            except ValueError as e:
                entries.append(Entry("", str(recording.id), key=k, error=str(e)))

    if isinstance(manifest, lhotse.RecordingSet):
        for rec in manifest:
            add(rec.id, rec, None, None, rec.channel_ids if len(rec.channel_ids) > 1 else rec.channel_ids[0])
    elif isinstance(manifest, lhotse.SupervisionSet):
        if not recordings:
            raise ValueError(f"{path} is a SupervisionSet: give the recordings too (--recordings recordings.jsonl.gz)")
        recs = lhotse.load_manifest(recordings)
        for sup in manifest:
            if sup.recording_id not in recs:
                entries.append(Entry("", sup.id, key=sup.id, error=f"recording {sup.recording_id!r} not in {recordings}"))
                continue
            add(sup.id, recs[sup.recording_id], sup.start, sup.duration, sup.channel)
    elif isinstance(manifest, lhotse.CutSet):
        for cut in manifest:
            if not hasattr(cut, "recording") or cut.recording is None or type(cut).__name__ == "MixedCut":
                entries.append(Entry("", cut.id, key=cut.id, error="only cuts with one recording (MonoCut) are supported"))
                continue
            add(cut.id, cut.recording, cut.start, cut.duration, cut.channel)
    else:
        raise ValueError(f"{path}: a {type(manifest).__name__} is not an input (use recordings, supervisions or cuts)")
    return entries
