"""``decode``: codes (or features) stored in an OUT back to 24 kHz audio, to listen to what they
keep: ``MimiModel.decode`` of each item alone, computed in length-sorted padded batches by the
exact :class:`~mimi_extract.codec.decoder.PaddedMimiDecoder` (long items in chunks with state).  Imports torch and transformers (the light ``status`` and ``info`` are
``outputs.py``)."""

from __future__ import annotations

import os

import numpy as np

from ..formats.records import RunInfo, StoredRow
from ..store.identity import read_run
from ..store.manifest import out_files, out_rows, shard_attrs
from .outputs import require_runs


def _samples_24k(row: StoredRow, info: RunInfo) -> int:
    """The item's length at 24 kHz (before the framing's padding), from its exact source length."""
    from ..audio.framing import Framing
    from ..sources import seconds_to_samples

    rate = row.sample_rate
    if row.end is not None:
        frames = seconds_to_samples(row.end - row.start, rate)  # as discovery counted them
    elif row.source:
        frames = row.source.frames
    else:
        frames = round(row.duration * rate)
    framing = Framing(info.framing, info.causal_16k, length=info.resampled_length)  # (before 0.3: exact, RunInfo)
    return max(1, framing.resampled_length(frames, rate))


def mirrored_paths(folder: str, keys: list[str]) -> dict[str, str]:
    """Where each key's wav goes under ``folder``: the key's own folders (``sub/x.flac`` ->
    ``folder/sub/x.flac.wav``), so a decoded corpus looks like its source.  Each part of the key is
    escaped as :func:`~mimi_extract.sources.dataset_name` escapes a whole key ('%' -> %25, a leading
    '.' -> %2E: no ``..`` leaves ``folder``, no hidden file), an empty part (``a//b``, a leading '/')
    is '%' (what no escaped part is).  ValueError, before anything is written, when two keys would
    share a file (``x`` and ``x.wav``: '.wav' is not repeated) or one key's file would be another's
    folder (``a.wav`` and ``a.wav/b``)."""
    from ..sources import dataset_name

    def part(name: str) -> str:
        return dataset_name(name) if name else "%"

    paths = {}
    for key in keys:
        *dirs, name = key.split("/")
        paths[key] = os.path.join(folder, *map(part, dirs), part(name).removesuffix(".wav") + ".wav")
    files: dict[str, str] = {}
    for key, path in paths.items():
        other = files.setdefault(os.path.relpath(path, folder), key)
        if other != key:
            raise ValueError(f"keys {other!r} and {key!r} would both be {path}; decode them one at a time with -o FILE")
    for key, path in paths.items():
        parent = os.path.dirname(os.path.relpath(path, folder))
        while parent:
            if parent in files:
                raise ValueError(f"keys {files[parent]!r} and {key!r}: the first's file would be the second's "
                                 "folder; decode them one at a time with -o FILE")
            parent = os.path.dirname(parent)
    return paths


def decode_items(out_dir: str, keys: list[str] | None, output: str | None, model: str | None = None,
                 device: str = "cpu", on_item=None, overwrite: bool = False) -> list[str]:
    """Decode stored items to 24 kHz wav files; returns the written paths.  ``output``: a file (one
    key; by default ``<key>.wav`` here) or a folder (needed for several), where each key's file
    mirrors its folders (:func:`mirrored_paths`).  An existing file is never
    replaced unless ``overwrite`` (FileExistsError, before anything is decoded): the default name
    of one key is the source's own name, and decoding in the corpus's folder replaced the source."""
    import soundfile as sf
    import torch

    from ..codec.decoder import PaddedMimiDecoder, decode_chunked
    from ..codec.model import load_model
    from ..readers.reader import Reader
    from ..sources import dataset_name

    files = out_files(out_dir)
    info = read_run(require_runs(out_dir, files)[0].path)
    rows = {r.key: r for r in out_rows(out_dir, files) if r.ok}
    keys = keys or sorted(rows)
    missing = [k for k in keys if k not in rows]
    if missing:
        raise KeyError(f"no ok item {missing[0]!r} in {out_dir}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if output is None:
        if len(keys) > 1:
            raise ValueError(f"{len(keys)} items to decode: name a folder for them with -o")
        output = dataset_name(keys[0]).removesuffix(".wav") + ".wav"
    folder = len(keys) > 1 or os.path.isdir(output) or output.endswith(os.sep)
    paths = mirrored_paths(output, keys) if folder else {keys[0]: output}
    taken = [p for p in paths.values() if os.path.exists(p)]
    if taken and not overwrite:
        raise FileExistsError(f"{taken[0]} exists" + (f" (and {len(taken) - 1} more)" if len(taken) > 1 else "")
                              + ": decode writes no file over another; choose another -o, or pass --overwrite")
    if folder:
        for path in paths.values():
            os.makedirs(os.path.dirname(path), exist_ok=True)
    mimi = load_model(model or info.model, device)
    decoder = PaddedMimiDecoder(mimi)
    reader = Reader(out_dir)
    written = []

    def codes_of(key: str) -> torch.Tensor:
        """The item's codes [frames, N] (features go through the quantizer, all codebooks)."""
        tap = shard_attrs(out_dir, rows[key].shard).get("tap", info.tap)
        data = torch.from_numpy(np.ascontiguousarray(reader[key])).to(device)
        if tap == "codes":
            return data.long()
        latent = data.float().T[None]  # [1, D, frames]
        if tap == "encoder":
            from ..codec.internals import encoder_parts

            latent = encoder_parts(mimi)[2](latent)
        return mimi.quantizer.encode(latent, mimi.config.num_quantizers)[:, 0].T

    with torch.no_grad():
        batch_frames, chunk_frames = decode_limits(device)
        for batch in decode_batches(keys, [rows[k].frames for k in keys], batch_frames, chunk_frames):
            audios = decode_chunked(decoder, [codes_of(k) for k in batch], chunk_frames)
            for key, audio in zip(batch, audios):
                audio = audio[: _samples_24k(rows[key], info)].float().cpu().numpy()
                path = paths[key]
                sf.write(path, audio, 24_000, subtype="FLOAT")
                written.append(path)
                if on_item:
                    on_item(key, path)
    return written


def decode_limits(device: str) -> tuple[int, int]:
    """(padded frames per batch, frames per chunk of a long item) on ``device``: the encoder's step
    and chunk (``Settings.step_seconds``, ``chunk_samples``: 4 s and 4 s on CPU, 300 s and 30 s on a
    GPU).  On CPU a padded batch is slower than items one by one (measured with
    scripts/bench_decode.py: the 24 kHz activations of a 64-channel SEANet stage, rows x samples,
    leave the caches), so a CPU batch is one item and a long item goes in 4 s chunks, which keep them
    in cache; a GPU gets the rows."""
    from ..config.settings import Settings

    settings = Settings(devices=(device,))
    return max(1, int(settings.step_seconds * FRAME_RATE)), settings.chunk_samples(HOP) // HOP


FRAME_RATE, HOP = 12.5, 1920


def decode_batches(keys: list[str], frames: list[int], batch_frames: int, chunk_frames: int) -> list[list[str]]:
    """``keys`` in length-sorted batches of at most ``batch_frames`` padded frames (rows x the
    longest): little padding, bounded memory; an item longer than ``chunk_frames`` goes alone, as a
    stream of chunks."""
    batches: list[list[str]] = []
    current: list[str] = []
    for n, key in sorted(zip(frames, keys)):
        if current and (n > chunk_frames or (len(current) + 1) * n > batch_frames):
            batches.append(current)
            current = []
        current.append(key)
        if n > chunk_frames:  # alone
            batches.append(current)
            current = []
    return batches + ([current] if current else [])
