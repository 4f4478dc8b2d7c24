"""Robustness of the commit protocol and of long (chunked) encodes: the order of fsyncs and renames
that makes every shard durable; out of memory in the middle of streamed steps; and the
bounded attention mask and key/value window of the chunked encoder (README "Integrity" and "Long
recordings")."""

import os
from collections import Counter

import numpy as np
import pytest
import torch

from support import write_noise
from mimi_extract.codec.encoder import PaddedMimiEncoder, _WindowCache, encode_chunked
from mimi_extract.codec.reference import reference_single
from mimi_extract.engines import DeviceRunner
from support import extract
from mimi_extract.config.settings import Settings
from support import check_consistency
from mimi_extract.store.manifest import read_rows
from mimi_extract.store import files

FRAME = 1920  # samples per 12.5 Hz frame (24 kHz)


# -- commit protocol: tmp written + fsynced, rows appended + fsynced, rename, directory fsynced -----
def _record_io(monkeypatch, out: str) -> list[tuple]:
    """Wrap the store's one fsync and one rename (``store.files.sync``/``rename``; the real calls
    still happen; the process's ``os`` is not touched) and log, for every call on a file
    under OUT, ``(call, path relative to OUT ('.': OUT itself), detail, rows)``: detail is the
    file's size for an fsync, the new name for a rename; rows counts the manifest's rows per shard
    at that moment (what a crash right then would leave)."""
    root = os.path.realpath(out)
    events: list[tuple] = []
    real = {name: getattr(files, name) for name in ("sync", "rename")}

    def under_out(path):
        path = os.path.realpath(os.fspath(path))
        return os.path.relpath(path, root) if path == root or path.startswith(root + os.sep) else None

    def manifest():
        return Counter(r.shard for r in read_rows(out))

    def fsync(fd):
        try:
            name = under_out(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            name = None
        real["sync"](fd)
        if name is not None:
            events.append(("fsync", name, os.fstat(fd).st_size, manifest()))

    def rename(src, dst):
        real["rename"](src, dst)
        if under_out(src) is not None:
            events.append(("rename", under_out(src), under_out(dst), manifest()))

    monkeypatch.setattr(files, "sync", fsync)
    monkeypatch.setattr(files, "rename", rename)
    return events


def test_commit_protocol_order_of_fsyncs_and_renames(tmp_path, tiny_model_dir, monkeypatch):
    """For each shard: (1) shard-N.h5.tmp written in full, then fsynced, before any row names it;
    (2) all its rows appended to the manifest, then the manifest fsynced; (3) only then the tmp
    renamed to shard-N.h5, and OUT itself fsynced right after (the rename is durable)."""
    root = tmp_path / "in"
    root.mkdir()
    rng = np.random.default_rng(3)
    for i in range(8):
        write_noise(root / f"f{i}.wav", int(24_000 * (0.3 + 0.3 * rng.random())), rng=rng)
    (root / "broken.wav").write_bytes(b"RIFF not audio")  # an error row: appended alone, no shard
    out = str(tmp_path / "out")
    os.makedirs(out)
    events = _record_io(monkeypatch, out)
    summary = extract(str(root), out, Settings(model=tiny_model_dir, tap="codes", num_workers=1), shard_size=3)
    monkeypatch.undo()
    assert summary.ok == 8 and summary.errors == 1
    rows = Counter(r.shard for r in read_rows(out) if r.ok)
    assert sorted(rows) == ["shard-00000.h5", "shard-00001.h5", "shard-00002.h5"]  # 3 + 3 + 2 items
    check_consistency(out)

    def where(call, name, after=-1):
        return [i for i, e in enumerate(events) if i > after and e[0] == call and e[1] == name]

    for shard, count in sorted(rows.items()):
        tmp, what = shard + ".tmp", f"{shard}: "
        syncs = where("fsync", tmp)
        assert len(syncs) == 1, what + f"its .tmp file was fsynced {len(syncs)} times, not once"
        _, _, size, named = events[syncs[0]]
        assert size == os.path.getsize(os.path.join(out, shard)), what + "the .tmp file was fsynced before it was whole"
        assert named[shard] == 0, what + "rows named the shard before its .tmp file was durable"
        durable = [i for i in where("fsync", "manifest.jsonl", after=syncs[0]) if events[i][3][shard] == count]
        assert durable, what + "the manifest was not fsynced with all its rows after the .tmp file"
        renames = [i for i in where("rename", tmp) if events[i][2] == shard]
        assert len(renames) == 1, what + "its .tmp file was not renamed into place exactly once"
        assert renames[0] > durable[0], what + "renamed into place before its rows were durable"
        after = events[renames[0] + 1][:2] if renames[0] + 1 < len(events) else None
        assert after == ("fsync", "."), (
            what + f"OUT was not fsynced right after the rename (the rename is not durable); next: {after}")


# -- out of memory in streamed (stateful) steps -------------------------------------------------
LONG = "x0.wav"  # the item that runs out of memory even alone, part-way through its stream
LENGTHS = [FRAME * 31 + 7, 500, FRAME * 4, FRAME * 17 - 3, 1000, FRAME * 9 + 960, FRAME * 12]


def _streaming_settings(model_dir):
    # 3-frame chunks (0.24 s), 3 rows per step: long files stream side by side, short ones join them
    return Settings(model=model_dir, tap="codes", batch_size=3, max_batch_seconds=60, chunk_seconds=0.24,
                    num_workers=1)


@pytest.fixture(scope="module")
def long_files(tmp_path_factory, tiny_model_dir):
    """Seven files, five of them streamed in 3-frame chunks, and their uninterrupted output."""
    root = tmp_path_factory.mktemp("long")
    rng = np.random.default_rng(0)
    for i, n in enumerate(LENGTHS):
        write_noise(root / f"x{i}.wav", n, rng=rng, subtype="FLOAT")
    out = str(tmp_path_factory.mktemp("long-ref") / "out")
    summary = extract(str(root), out, _streaming_settings(tiny_model_dir))
    assert summary.ok == 7 and summary.streamed == 5
    return str(root), check_consistency(out)


@pytest.mark.parametrize("error", [RuntimeError("CUDA out of memory. Tried to allocate 8.00 GiB"), MemoryError()],
                         ids=["cuda-oom", "MemoryError"])
def test_out_of_memory_in_streamed_steps(long_files, tiny_model_dir, tmp_path, monkeypatch, error):
    """Out of memory *inside* the encoder (after the convs have advanced the chunk's state, before
    the transformer) on every other multi-row streamed step: the step is split and retried from
    the state before it, so every item stays exact.  One item runs out of memory even alone from
    its third chunk on: it gets one error row, the others are exact, and resume then encodes it."""
    root, reference = long_files
    real_forward, real_transformer = DeviceRunner._forward, PaddedMimiEncoder._transformer
    seen = {"step": None, "long_chunks": 0, "multi": 0, "raised_multi": 0, "raised_alone": 0}
    counts = lambda: {k: v for k, v in seen.items() if k != "step"}  # noqa: E731

    def forward(self, step):
        seen["step"] = step
        out = real_forward(self, step)
        seen["long_chunks"] += LONG in [it.key for it in step.items]
        return out

    def transformer(self, h, lengths, state):
        keys = [it.key for it in seen["step"].items]
        if state is not None:  # a streamed step
            if LONG in keys and seen["long_chunks"] >= 2:
                seen["raised_alone"] += len(keys) == 1
                raise error
            if len(keys) > 1:
                seen["multi"] += 1
                if seen["multi"] % 2:
                    seen["raised_multi"] += 1
                    raise error
        return real_transformer(self, h, lengths, state)

    monkeypatch.setattr(DeviceRunner, "_forward", forward)
    monkeypatch.setattr(PaddedMimiEncoder, "_transformer", transformer)
    out = str(tmp_path / "out")
    summary = extract(root, out, _streaming_settings(tiny_model_dir))
    monkeypatch.undo()
    assert seen["raised_multi"] >= 3 and seen["multi"] > seen["raised_multi"], (
        f"the injection did not exercise split streamed steps: {counts()}")
    assert seen["raised_alone"] == 1, (
        f"{LONG} must run out of memory alone exactly once, then never be encoded again: {counts()}")
    assert summary.ok == 6 and summary.errors == 1, summary
    rows = read_rows(out)
    assert sorted(r.key for r in rows) == sorted(reference), "one row per input, nothing twice"
    (bad,) = [r for r in rows if r.status == "error"]
    assert bad.key == LONG and "out of memory" in bad.error, bad
    others = set(reference) - {LONG}
    arrays = check_consistency(out, others)
    for key in others:
        assert np.array_equal(arrays[key], reference[key]), f"{key}: codes differ from the uninterrupted run"
    resumed = extract(root, out, _streaming_settings(tiny_model_dir))  # no injection now
    assert resumed.skipped == 6 and resumed.ok == 1 and resumed.errors == 0, resumed
    arrays = check_consistency(out, reference)
    for key, ref in reference.items():
        assert np.array_equal(arrays[key], ref), f"{key}: codes differ from the uninterrupted run after resume"


# -- the chunked encoder's memory is bounded by the chunk, not the file --------------------------
def test_chunked_encode_never_builds_a_long_mask_or_window(tiny_model, monkeypatch):
    """A 60-frame item (and a 23-frame one beside it) in 2-frame chunks: every attention mask is
    at most chunk x (chunk + window - 1) positions, every carried key/value window at most
    window - 1 positions -- never T x T -- and the codes equal the unchunked reference."""
    encoder = PaddedMimiEncoder(tiny_model)
    window = encoder.window
    hop25 = encoder.hop // 2  # samples per transformer position (25 Hz, before the 2x downsample)
    chunk = 2 * FRAME
    per_chunk = chunk // hop25  # transformer positions per chunk
    assert window is not None and per_chunk == 4 and window == 6
    masks, windows, returned = [], [], []
    real_mask, real_update = PaddedMimiEncoder.attention_mask, _WindowCache.update

    def attention_mask(self, *args, **kwargs):
        mask = real_mask(self, *args, **kwargs)
        masks.append(tuple(mask.shape))
        return mask

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = real_update(self, key_states, value_states, layer_idx, *args, **kwargs)
        returned.append((keys.shape[2], values.shape[2]))
        windows.append((self.state.keys[layer_idx].shape[2], self.state.values[layer_idx].shape[2]))
        return keys, values

    monkeypatch.setattr(PaddedMimiEncoder, "attention_mask", attention_mask)
    monkeypatch.setattr(_WindowCache, "update", update)
    g = torch.Generator().manual_seed(5)
    items = [0.3 * torch.randn(FRAME * 60 + 7, generator=g), 0.3 * torch.randn(FRAME * 23 - 100, generator=g)]
    outs = encode_chunked(encoder, items, chunk, ("codes",), 8)
    monkeypatch.undo()
    chunks = -(-len(items[0]) // chunk)
    assert len(masks) == chunks == 31, f"{len(masks)} masks for {chunks} chunks"
    assert len(windows) == chunks * len(encoder.transformer.layers)
    longest = max(masks, key=lambda s: s[-1])
    for shape in masks:
        assert shape[-2] <= per_chunk and shape[-1] <= per_chunk + window - 1, (
            f"mask {shape}: more than chunk ({per_chunk}) x chunk + window - 1 ({per_chunk + window - 1})")
    assert longest[-1] == per_chunk + window - 1, f"keys {longest[-1]}: the window - 1 past positions are not all kept"
    widest = max(max(w) for w in windows)
    assert widest <= window - 1, f"a carried key/value window holds {widest} positions, more than window - 1"
    assert max(max(r) for r in returned) <= per_chunk + window - 1, "a layer attended over more than its window"
    for item, got in zip(items, outs):
        assert torch.equal(got["codes"], reference_single(tiny_model, item, 8)["codes"])
