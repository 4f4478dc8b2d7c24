"""Mimi in your own Ray Data pipeline: :class:`MimiEncode`, a callable class for ``map_batches``.

    ds = ray.data.read_parquet("hf-dataset/data/")          # or read_webdataset("shards/{000..099}.tar")
    ds = ds.map_batches(MimiEncode, fn_constructor_kwargs={"model": "kyutai/mimi", "tap": "codes"},
                        batch_size=64, compute=ray.data.ActorPoolStrategy(size=4), num_gpus=1)
    ds.write_parquet("codes/")

One model per actor (loaded in ``__init__``).  Each row's audio goes through the CLI's own decoding,
channel and resampling path (:class:`~mimi_extract.audio.reader.AudioReader`) and the exact padded encoder
(:class:`~mimi_extract.codec.encoder.PaddedMimiEncoder`): inside a batch the rows are sorted by length,
packed into steps under the padded-seconds budget by the engines' own rule (``plan.pack``), and rows
longer than ``chunk_seconds`` are streamed in chunks with the encoder's carried state by the
package's one chunked loop (``encoder.encode_chunked``), so every row equals the item encoded alone.

This is the entry for a pipeline that owns its sink: it gives no resume, identity checks, checksums
or exactly-once commit beyond Ray Data's own (``mimi-extract --engine ray`` does).  The output is a
``pyarrow.Table``: Arrow lists, not Ray's pickled objects, so a row that fails to decode can hold a
null and any Parquet reader can read the result.  Engine level: nothing in the package imports it.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

import numpy as np
import torch

from ..config.choices import SAMPLE_RATE
from ..audio.decoders import AudioError
from ..audio.reader import AudioReader
from ..codec.encoder import encode_chunked, frames_of, stored_array
from .device import TORCH_DTYPES, build_encoder
from ..audio.framing import Framing
from ..config.settings import Settings
from .plan import pack


@dataclass
class _Row:
    """One decoded row: its index in the batch and its encoder input (24 kHz, framed)."""

    index: int
    audio: torch.Tensor


def _source(value, rate) -> object:
    """What :class:`AudioReader` decodes for one cell: a file-like object, or a path."""
    if isinstance(value, dict):  # the `datasets` Audio struct {bytes, path} (or decoded {array, sampling_rate})
        if value.get("bytes") is not None:
            return io.BytesIO(bytes(value["bytes"]))
        if value.get("array") is not None:
            return _source(np.asarray(value["array"]), value.get("sampling_rate"))
        path = value.get("path")
        if path and os.path.isfile(path):
            return path
        raise AudioError("null audio bytes" + (f" (path {path!r} not found)" if path else ""))
    if isinstance(value, (bytes, bytearray, memoryview, np.bytes_)):  # webdataset's flac/wav/mp3 column
        return io.BytesIO(bytes(value))
    if isinstance(value, str):
        if not os.path.isfile(value):
            raise AudioError(f"no such file {value!r}")
        return value
    if isinstance(value, (np.ndarray, list)):  # samples [T] or [T, channels], with a sample rate
        data = np.asarray(value, dtype=np.float32)
        if rate is None or not np.isfinite(rate) or int(rate) <= 0:
            raise AudioError("an array of samples needs a positive sample rate (the sample_rate column)")
        if data.ndim not in (1, 2) or data.size == 0:
            raise AudioError(f"samples must be [T] or [T, channels], not shape {data.shape}")
        import soundfile as sf

        # a float WAV in memory: lossless for float32, and decoded by the very path a file takes
        buffer = io.BytesIO()
        sf.write(buffer, data, int(rate), format="WAV", subtype="FLOAT")
        buffer.seek(0)
        return buffer
    if value is None:
        raise AudioError("no audio (null cell)")
    raise AudioError(f"cannot decode a {type(value).__name__} cell (bytes, an Audio struct, a path or samples)")


def _columns(batch) -> dict[str, list]:
    """The batch as {column: list of row values}, whatever Ray handed over (numpy dict, pandas, Arrow)."""
    if hasattr(batch, "to_pydict"):  # pyarrow.Table
        return batch.to_pydict()
    if hasattr(batch, "to_dict") and hasattr(batch, "columns"):  # pandas.DataFrame
        return {c: list(batch[c]) for c in batch.columns}
    return {c: list(v) for c, v in batch.items()}


def _arrow_column(values: list):
    import pyarrow as pa

    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):  # tensors: nested lists
        return pa.array([v.tolist() if isinstance(v, np.ndarray) else v for v in values])


def _ragged(arrays: list[np.ndarray | None]):
    """Per-row ``[frames, width]`` arrays (None: a null row) as an Arrow ``list<fixed_size_list>``
    column, built from one flat buffer (no per-value Python objects)."""
    import pyarrow as pa

    present = [a for a in arrays if a is not None]
    dtype = present[0].dtype if present else np.dtype(np.int16)
    width = present[0].shape[1] if present else 1
    flat = np.concatenate([a.reshape(-1) for a in present]) if present else np.zeros(0, dtype)
    offsets = np.zeros(len(arrays) + 1, np.int32)
    offsets[1:] = np.cumsum([0 if a is None else len(a) for a in arrays])
    inner = pa.FixedSizeListArray.from_arrays(pa.array(flat), width)
    mask = pa.array([a is None for a in arrays])
    return pa.ListArray.from_arrays(pa.array(offsets), inner, mask=mask)


class MimiEncode:
    """``ray.data.Dataset.map_batches`` callable: Mimi codes (or features) of each row, exact.

    ``audio_column``: bytes (webdataset), the `datasets` Audio struct ``{bytes, path}``, a path, or
    float samples with a ``sample_rate`` column.  Adds ``output_column`` (codes: int16
    ``[frames][num_quantizers]``; features: float32 ``[frames][dim]``), ``frames`` and ``error``
    (null when the row encoded; else the reason, with a null output: a bad row never fails the
    batch).  The audio column is dropped unless ``keep_audio``.  ``device``: ``auto`` (the actor's
    GPU when Ray gave it one, else the CPU), ``cpu`` or ``cuda[:N]``; ``dtype`` fp32/bf16/fp16 (the
    latter two on GPU only); ``max_batch_seconds``/``chunk_seconds``/``batch_rows``: as the CLI's
    ``--max-batch-seconds``/``--chunk-seconds``/``--batch-size`` (same defaults)."""

    def __init__(self, model: str = "kyutai/mimi", tap: str = "codes", num_quantizers: int = 8,
                 device: str = "auto", dtype: str = "fp32", audio_column: str = "audio",
                 key_column: str | None = None, output_column: str = "codes",
                 max_batch_seconds: float | None = None, chunk_seconds: float | None = None,
                 batch_rows: int | None = None, sample_rate_column: str = "sample_rate",
                 channel: str = "mix", framing: str = "transformers", feature_dtype: str = "float32",
                 keep_audio: bool = False):
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype {dtype!r}: choose from {', '.join(TORCH_DTYPES)}")
        self.settings = Settings(model=model, tap=tap, num_quantizers=num_quantizers, devices=(device,),
                                 dtype=dtype, batch_size=batch_rows, max_batch_seconds=max_batch_seconds,
                                 chunk_seconds=chunk_seconds, channel=channel, framing=framing,
                                 feature_dtype=feature_dtype)
        self.encoder = build_encoder(self.settings, device)
        self.device = next(self.encoder.parameters()).device
        self.chunk = self.settings.chunk_samples(self.encoder.hop)
        self.budget = max(int(self.settings.step_seconds * SAMPLE_RATE), self.chunk)
        self.audio_column, self.key_column, self.output_column = audio_column, key_column, output_column
        self.sample_rate_column, self.keep_audio = sample_rate_column, keep_audio
        self.channel = channel if channel in ("mix", "first") else int(channel)  # as --channel

    # -- decoding --------------------------------------------------------------------------
    def _decode(self, value, rate) -> torch.Tensor:
        reader = AudioReader(_source(value, rate), self.channel, Framing.of(self.settings))
        try:
            return reader.read_all()
        finally:
            reader.close()

    # -- encoding --------------------------------------------------------------------------
    def _single_shot(self, rows: list[_Row]) -> list[torch.Tensor]:
        """Whole rows in one padded step (each row shorter than a chunk)."""
        lengths = torch.tensor([len(r.audio) for r in rows])
        audio = torch.zeros(len(rows), int(lengths.max()))
        for i, r in enumerate(rows):
            audio[i, : len(r.audio)] = r.audio
        audio = audio.to(self.device, TORCH_DTYPES[self.settings.dtype])
        tap = self.settings.tap
        out = self.encoder(audio, lengths, (tap,), self.settings.num_quantizers)
        return [frames_of(out, tap, i) for i in range(len(rows))]

    def _chunked(self, rows: list[_Row]) -> list[torch.Tensor]:
        """Rows longer than a chunk, streamed chunk by chunk with the encoder's carried state (the
        package's one chunked loop, ``encode_chunked``: one state row per stream, rows leave the step
        as they end)."""
        tap = self.settings.tap
        out = encode_chunked(self.encoder, [r.audio for r in rows], self.chunk, (tap,), self.settings.num_quantizers)
        return [o[tap] for o in out]

    def _steps(self, rows: list[_Row]) -> list[list[_Row]]:
        """Length-sorted rows packed into steps by the engines' packing rule (``plan.pack``): at most
        ``batch_rows`` rows and ``rows x longest`` padded samples within the budget, rows longer than a
        chunk (streamed: a chunk each) in steps of their own."""
        ordered = sorted(rows, key=lambda r: len(r.audio))
        short = [r for r in ordered if len(r.audio) <= self.chunk]
        long = [r for r in ordered if len(r.audio) > self.chunk]
        return ([[short[i] for i in b] for b in pack([len(r.audio) for r in short], self.budget, self.settings.rows)]
                + [[long[i] for i in b] for b in pack([self.chunk] * len(long), self.budget, self.settings.rows)])

    def _encode(self, rows: list[_Row]) -> dict[int, np.ndarray]:
        s = self.settings
        out: dict[int, np.ndarray] = {}
        for step in self._steps(rows):
            frames = self._chunked(step) if len(step[0].audio) > self.chunk else self._single_shot(step)
            for row, f in zip(step, frames):
                out[row.index] = stored_array(f, s.tap, s.feature_dtype)
        return out

    # -- the map_batches call ----------------------------------------------------------------
    def __call__(self, batch):
        import pyarrow as pa

        columns = _columns(batch)
        if self.audio_column not in columns:
            raise KeyError(f"no audio column {self.audio_column!r} in the batch (columns: {', '.join(columns)}); "
                           "pass audio_column= (webdataset: the extension, e.g. 'flac')")
        if self.key_column is not None and self.key_column not in columns:
            raise KeyError(f"no key column {self.key_column!r} in the batch (columns: {', '.join(columns)})")
        values = columns[self.audio_column]
        rates = columns.get(self.sample_rate_column, [None] * len(values))
        rows, errors = [], [None] * len(values)
        for i, (value, rate) in enumerate(zip(values, rates)):
            try:
                rows.append(_Row(i, self._decode(value, rate)))
            except Exception as e:  # noqa: BLE001 -- any decoder failure is this row's error, never the batch's
                key = f"{columns[self.key_column][i]}: " if self.key_column else ""
                errors[i] = f"{key}{e}" if isinstance(e, AudioError) else f"{key}{type(e).__name__}: {e}"
        encoded = self._encode(rows)
        result = {c: _arrow_column(v) for c, v in columns.items() if self.keep_audio or c != self.audio_column}
        result[self.output_column] = _ragged([encoded.get(i) for i in range(len(values))])
        result["frames"] = pa.array([len(encoded[i]) if i in encoded else None for i in range(len(values))],
                                    type=pa.int32())
        result["error"] = pa.array(errors, type=pa.string())
        return pa.table(result)
