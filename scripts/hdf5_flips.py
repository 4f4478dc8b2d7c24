"""Flip each byte of an HDF5 shard in turn and read, in a child process with a time limit, what the
tool and a user's h5py code read: the file's and each dataset's attributes and every array.

    python scripts/hdf5_flips.py OUT/shard-00000.h5

Prints how many flips gave an error, the same read, a different read without an error ("silent")
and a read that never ended ("hang", 3 s; the offsets). The figures in docs/integrity.md: the demo
shard (`scripts/make_demo.py demo --random-model tiny`, then `mimi-extract codes demo out
--num-quantizers 8 --model tiny`) written by 0.3.0 and by 0.3.1. ~10 ms per flip."""

import multiprocessing as mp
import os
import sys

import h5py


def _read(path, queue):
    try:
        with h5py.File(path, "r") as f:
            attrs = repr(dict(f.attrs))
            items = {name: (f[name][()].tobytes(), repr(dict(f[name].attrs))) for name in f}
        queue.put(("ok", attrs, repr(items)))
    except Exception as e:  # noqa: BLE001 -- any error is the outcome counted
        queue.put(("error", type(e).__name__, ""))


def _outcome(data: bytes) -> tuple:
    path = f"/dev/shm/hdf5-flip-{os.getpid()}.h5" if os.path.isdir("/dev/shm") else f"hdf5-flip-{os.getpid()}.h5"
    with open(path, "wb") as f:
        f.write(data)
    queue = mp.Queue()
    child = mp.Process(target=_read, args=(path, queue))
    child.start()
    child.join(3)
    if child.is_alive():
        child.kill()
        child.join()
        return ("hang",)
    return queue.get() if not queue.empty() else ("crash",)


def main(path: str) -> None:
    mp.set_start_method("fork")
    original = open(path, "rb").read()
    reference = _outcome(original)
    counts, hangs = {}, []
    for offset in range(len(original)):
        data = bytearray(original)
        data[offset] ^= 0xFF
        got = _outcome(bytes(data))
        kind = got[0] if got[0] != "ok" else ("same" if got == reference else "silent")
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "hang":
            hangs.append(offset)
    print(f"{path}: {len(original)} bytes, {counts}; hangs at {hangs}")


if __name__ == "__main__":
    main(sys.argv[1])
