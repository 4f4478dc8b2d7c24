"""HDF5 shards + JSONL manifest, crash-safe and resumable.

Commit protocol for a shard: (1) write and close ``shard-N.h5.tmp``; (2) append its rows to the
manifest and fsync; (3) rename to ``shard-N.h5``.  A kill before (2) leaves only a ``.tmp`` file,
a kill between (2) and (3) leaves rows pointing at a missing shard: on restart both are dropped
and those inputs are encoded again, so nothing is lost, half-written or duplicated.
"""

from __future__ import annotations

import glob
import json
import os
import re

import h5py
import numpy as np

MANIFEST = "manifest.jsonl"
RUN_INFO = "run.json"
_SHARD_RE = re.compile(r"shard-(\d{5,})\.h5(\.tmp)?$")


def read_manifest(out_dir: str) -> list[dict]:
    """All rows; a torn last line (killed mid-write) is ignored."""
    path = os.path.join(out_dir, MANIFEST)
    rows = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return rows


def _write_atomic(path: str, text: str) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def check_run_info(out_dir: str, info: dict) -> None:
    """Refuse to mix outputs of different settings (tap, model, quantizers...) in one OUT dir."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, RUN_INFO)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        diff = {k: (old.get(k), v) for k, v in info.items() if old.get(k) != v}
        if diff:
            changes = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items())
            raise ValueError(f"{out_dir} holds a run with other settings ({changes}); use a new OUT directory")
    else:
        _write_atomic(path, json.dumps(info, indent=2, sort_keys=True))


def recover(out_dir: str) -> dict[str, dict]:
    """Make OUT consistent after any interruption; return committed ``ok`` rows by key.

    Error rows are dropped so those inputs are retried; the manifest is rewritten atomically."""
    for tmp in glob.glob(os.path.join(out_dir, "shard-*.h5.tmp")):
        os.remove(tmp)
    done = {}
    for row in read_manifest(out_dir):
        if row.get("status") == "ok" and os.path.exists(os.path.join(out_dir, row["shard"])):
            done[row["key"]] = row
    if os.path.exists(os.path.join(out_dir, MANIFEST)):
        _write_atomic(os.path.join(out_dir, MANIFEST), "".join(json.dumps(r) + "\n" for r in done.values()))
    return done


def next_shard_index(out_dir: str) -> int:
    used = [int(m.group(1)) for f in os.listdir(out_dir) if (m := _SHARD_RE.match(f))]
    used += [int(m.group(1)) for r in read_manifest(out_dir) if (m := _SHARD_RE.match(r.get("shard") or ""))]
    return max(used, default=-1) + 1


class ShardWriter:
    """Streams utterances into size-capped shards and the manifest (one row per input)."""

    def __init__(self, out_dir: str, file_attrs: dict, max_items: int = 1000, max_bytes: int = 1 << 30):
        self.out_dir = out_dir
        self.file_attrs = file_attrs
        self.max_items, self.max_bytes = max_items, max_bytes
        self.index = next_shard_index(out_dir)
        self._h5 = None
        self._rows: list[dict] = []
        self._bytes = 0
        self._manifest = open(os.path.join(out_dir, MANIFEST), "a", encoding="utf-8")

    @property
    def shard_name(self) -> str:
        return f"shard-{self.index:05d}.h5"

    def add(self, key: str, data: np.ndarray, row: dict, attrs: dict | None = None) -> None:
        """Store one utterance; its manifest row is committed together with the shard."""
        if self._h5 is None:
            self._h5 = h5py.File(os.path.join(self.out_dir, self.shard_name + ".tmp"), "w")
            self._h5.attrs.update(self.file_attrs)
        ds = self._h5.create_dataset(key, data=data)
        ds.attrs.update(attrs or {})
        self._rows.append({**row, "key": key, "shard": self.shard_name, "status": "ok", "error": None})
        self._bytes += data.nbytes
        if len(self._rows) >= self.max_items or self._bytes >= self.max_bytes:
            self.commit()

    def add_error(self, row: dict, message: str) -> None:
        self._append([{**row, "shard": None, "status": "error", "error": message}])

    def _append(self, rows: list[dict]) -> None:
        self._manifest.write("".join(json.dumps(r) + "\n" for r in rows))
        self._manifest.flush()
        os.fsync(self._manifest.fileno())

    def commit(self) -> None:
        """Close the open shard and make it (and its rows) durable."""
        if self._h5 is None:
            return
        self._h5.close()
        self._h5 = None
        self._append(self._rows)
        os.replace(os.path.join(self.out_dir, self.shard_name + ".tmp"), os.path.join(self.out_dir, self.shard_name))
        self._rows, self._bytes = [], 0
        self.index += 1

    def close(self) -> None:
        self.commit()
        self._manifest.close()


def read(out_dir: str, key: str) -> np.ndarray:
    """Load one utterance's features ``[frames, dim]`` or codes ``[N, frames]`` by its key."""
    rows = [r for r in read_manifest(out_dir) if r.get("key") == key and r.get("status") == "ok"]
    if not rows:
        raise KeyError(f"{key!r} has no ok row in {os.path.join(out_dir, MANIFEST)}")
    with h5py.File(os.path.join(out_dir, rows[-1]["shard"]), "r") as f:
        return f[key][()]
