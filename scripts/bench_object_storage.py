"""Read throughput of the packed inputs from S3 against local disk: the same tar shard and Parquet
file, read as a run reads them (index / footer, then every item's bytes through the source's own
``open``), from a local folder and from a moto S3 server on loopback (in its own process, so it
does not share this one's GIL).  Loopback moto has no network latency but is a Python server: the
ratio is a floor for what fsspec's ranged reads cost, not a prediction for AWS.

    python scripts/bench_object_storage.py [--mb 64] [--member-kb 1024] [--repeat 3]
"""

from __future__ import annotations

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
import time

import numpy as np
import soundfile as sf


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def members(total_mb: int, member_kb: int) -> list[tuple[str, bytes]]:
    """WAV members of ``member_kb`` (16-bit noise at 24 kHz) adding up to ``total_mb``."""
    rng = np.random.default_rng(0)
    frames = member_kb * 1024 // 2
    out = []
    for i in range(max(1, total_mb * 1024 // member_kb)):
        buffer = io.BytesIO()
        sf.write(buffer, (0.1 * rng.standard_normal(frames)).astype(np.float32), 24_000, format="WAV", subtype="PCM_16")
        out.append((f"s{i:06d}.wav", buffer.getvalue()))
    return out


def write_inputs(folder: str, items) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.join(folder, "tar"))
    with tarfile.open(os.path.join(folder, "tar", "a-000000.tar"), "w") as tf:
        for name, data in items:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    os.makedirs(os.path.join(folder, "parquet"))
    audio = pa.array([{"bytes": d, "path": n} for n, d in items], pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    pq.write_table(pa.table({"audio": audio}), os.path.join(folder, "parquet", "train.parquet"), row_group_size=16)


def read_all(source: str) -> tuple[int, float, int]:
    """(bytes read, seconds, items): discover (headers), then every item's bytes via its source."""
    from mimi_extract.sources import discover, open_audio

    started = time.perf_counter()
    found = discover(source)
    total = 0
    for item in found.items:
        handle = open_audio(item)
        try:
            total += len(handle.read())
        finally:
            handle.close()
    return total, time.perf_counter() - started, len(found.items)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--member-kb", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        os.environ.update(env, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
        import s3fs

        fs = s3fs.S3FileSystem()
        for _ in range(100):  # the server's start
            try:
                fs.mkdir("bench")
                break
            except OSError:
                time.sleep(0.1)
        with tempfile.TemporaryDirectory() as folder:
            write_inputs(folder, members(args.mb, args.member_kb))
            fs.put(folder + "/", "s3://bench/", recursive=True)
            started = time.perf_counter()  # the server's own ceiling: one GET of the whole shard
            whole = len(fs.cat_file("bench/tar/a-000000.tar"))
            print(json.dumps({"kind": "tar", "where": "s3, one GET of the whole object",
                              "MiB/s": round(whole / (time.perf_counter() - started) / 2**20, 1)}))
            for kind in ("tar", "parquet"):
                best = {}
                for where, source in (("local", os.path.join(folder, kind)), ("s3", f"s3://bench/{kind}")):
                    runs = [read_all(source) for _ in range(args.repeat)]
                    size, seconds, items = min(runs, key=lambda r: r[1])
                    best[where] = size / seconds / 2**20
                    print(json.dumps({"kind": kind, "where": where, "items": items, "MiB": round(size / 2**20, 1),
                                      "seconds": round(seconds, 3), "MiB/s": round(best[where], 1)}))
                print(json.dumps({"kind": kind, "s3/local": round(best["s3"] / best["local"], 3)}))
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    print(host_facts.header(), flush=True)
    main()
    print(host_facts.footer(), flush=True)
