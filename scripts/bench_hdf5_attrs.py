"""HDF5 shard building with the string attributes of 0.3.0 (h5py's variable-length strings) and of
0.3.1 (fixed-length UTF-8, ``formats.hdf5.write_attrs``), side by side in one process, alternating:

    python scripts/bench_hdf5_attrs.py

1,000 items of codes (int16 [25..250, 8]) into one in-memory shard, as the writer builds it; items
per CPU second (median of 6 builds each) and the shard's bytes. Figures: docs/integrity.md."""

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import os
import sys
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mimi_extract.formats.hdf5 as hdf5  # noqa: E402
from mimi_extract.formats.records import StoredRow  # noqa: E402
from mimi_extract.sources.keys import dataset_name  # noqa: E402

FILE_ATTRS = {"tap": "codes", "model": "kyutai/mimi", "weights": "da6b0984e74bde55afe6b912", "framing": "transformers",
              "config_hash": "290392974bf177a3", "tool_version": "0.3.1", "dtype": "fp32",
              "layout": "[frames, num_quantizers]", "num_quantizers": 8, "frame_rate": 12.5, "sample_rate": 24000}


def variable_length(oid, values: dict) -> None:
    """0.3.0's attributes: h5py's defaults (variable-length strings), on the object ``oid`` names."""
    (h5py.File(oid) if isinstance(oid, h5py.h5f.FileID) else h5py.Dataset(oid)).attrs.update(values)


WAYS = {"0.3.0 variable-length": variable_length, "0.3.1 fixed-length": hdf5.write_attrs}


def build(write_attrs, arrays) -> tuple[float, int]:
    hdf5.write_attrs = write_attrs
    t = time.process_time()
    shard = hdf5.HDF5Shard(FILE_ATTRS)
    for i, data in enumerate(arrays):
        key = f"spk{i % 7}/utt{i:05d}.flac"
        shard.add(key, data, StoredRow(key, dataset=dataset_name(key)), {"duration": len(data) / 12.5, "source_sample_rate": 16000})
    image = shard.files("shard-00000.h5")["shard-00000.h5"]
    shard.close()
    return time.process_time() - t, len(image)


def main() -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 2048, (int(f), 8), dtype=np.int16) for f in rng.integers(25, 250, 1000)]
    runs = {name: [] for name in WAYS}
    for r in range(6):
        for name in (list(WAYS) if r % 2 else list(WAYS)[::-1]):
            runs[name].append(build(WAYS[name], arrays))
    for name, got in runs.items():
        cpu = sorted(t for t, _ in got)[len(got) // 2]
        print(f"{name}: {len(arrays) / cpu:,.0f} items per CPU s, shard {got[0][1] / 1e6:.2f} MB")


if __name__ == "__main__":
    print(host_facts.header(), flush=True)
    main()
    print(host_facts.footer(), flush=True)
