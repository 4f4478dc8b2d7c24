"""Cost growth of the operations commands: ``status``, ``status --missing``, ``info``, ``cuts`` and
``report --manifest-only`` on local job-array OUTs of 10, 100 and 1,000 parts, and ``status`` /
``info`` on a remote OUT of 100 parts (time, and the requests an S3 server served: GETs, bytes,
LISTs, HEADs).  Each command runs in this process through the CLI (``typer``'s runner: what a user
types, without the interpreter's start-up), best of ``--repeat``.

The OUTs are built from one real run (the demo's tiny model over a few files): each part is a copy
of its run directory (run.json, plan.json, manifest, shards) with the keys made its own, so the
manifests, listings and run.json files are what a real job array has, at any number of parts, in
seconds.  The remote OUT is the same parts in the layout a run on object storage leaves (run.json,
plan.json, shards, one manifest segment per shard commit), served by moto's S3 server on loopback
in this process (its request log counts what each command asked for).

    python scripts/bench_ops.py [--parts 10,100,1000] [--items 10] [--shard-size 5] [--remote-parts 100]
"""

from __future__ import annotations

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))  # (the tests' S3 server with its request log)


def make_seed(folder: str, items: int, shard_size: int) -> str:
    """One real run directory: ``items`` short files encoded by the demo's tiny model."""
    import numpy as np
    import soundfile as sf

    from mimi_extract.codec.demo import random_model
    from mimi_extract.config.request import RunRequest
    from mimi_extract.run.runner import run_request
    from mimi_extract.config.settings import Settings

    audio = os.path.join(folder, "in")
    os.makedirs(audio)
    rng = np.random.default_rng(0)
    for i in range(items):
        sf.write(os.path.join(audio, f"f{i:03d}.wav"), 0.1 * rng.standard_normal(12_000 + 480 * i), 24_000)
    model = os.path.join(folder, "model")
    random_model(seed=0).save_pretrained(model)
    out = os.path.join(folder, "seed")
    summary = run_request(RunRequest(audio, out, Settings(model=model, tap="codes", num_workers=1, devices=["cpu"]),
                                     shard_size=shard_size))
    assert summary.ok == items, summary
    return out


def part_files(seed: str, index: int, count: int) -> dict[str, bytes]:
    """The files of part ``index`` of ``count``: the seed's, keys prefixed with the part's."""
    files = {}
    for name in sorted(os.listdir(seed)):
        path = os.path.join(seed, name)
        if name in ("lock", "stats.json", "cuts.jsonl.gz") or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        if name == "run.json":
            info = json.loads(data)
            info["part"] = f"{index}/{count}"
            data = json.dumps(info).encode()
        elif name == "manifest.jsonl":
            rows = [json.loads(line) for line in data.decode().splitlines()]
            data = "".join(json.dumps({**r, "key": f"p{index}/{r['key']}"}) + "\n" for r in rows).encode()
        files[name] = data
    return files


def make_local(seed: str, out: str, parts: int) -> None:
    for i in range(parts):
        d = os.path.join(out, f"part-{i}-of-{parts}")
        os.makedirs(d)
        for name, data in part_files(seed, i, parts).items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)


def upload_remote(fs, seed: str, url: str, parts: int) -> int:
    """The parts as a run on object storage leaves them (one manifest segment per shard commit);
    returns the number of objects."""
    objects = {}
    for i in range(parts):
        files = part_files(seed, i, parts)
        rows = files.pop("manifest.jsonl").decode().splitlines(keepends=True)
        by_shard: dict[str, list[str]] = {}
        for line in rows:
            by_shard.setdefault(json.loads(line)["shard"], []).append(line)
        for n, lines in enumerate(by_shard.values()):
            files[f"manifest.d/g000000-{n:010d}.jsonl"] = "".join(lines).encode()
        for name, data in files.items():
            objects[f"{url}/part-{i}-of-{parts}/{name}"] = data
    fs.pipe(objects)
    fs.invalidate_cache()
    return len(objects)


def timed(args: list[str], repeat: int) -> float:
    from typer.testing import CliRunner

    from mimi_extract.cli.app import app

    runner = CliRunner()
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        result = runner.invoke(app, args)
        best = min(best, time.perf_counter() - started)
        if result.exit_code not in (0, 1):
            raise SystemExit(f"{' '.join(args)}: exit {result.exit_code}: {result.output}")
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="10,100,1000")
    parser.add_argument("--items", type=int, default=10, help="items (manifest rows) per part")
    parser.add_argument("--shard-size", type=int, default=5, help="items per shard (a shard commit: a segment)")
    parser.add_argument("--remote-parts", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-ops-")
    try:
        seed = make_seed(work, args.items, args.shard_size)
        commands = {"status": ["status"], "status --missing": ["status", "--missing"], "info": ["info"],
                    "cuts": ["cuts", "-o", os.path.join(work, "cuts.jsonl.gz")],
                    "report --manifest-only": ["report", "--manifest-only"]}
        print(f"local OUTs: {args.items} rows per part, {args.items // args.shard_size} shards per part; "
              f"best of {args.repeat}, seconds")
        counts = [int(p) for p in args.parts.split(",")]
        print("| command | " + " | ".join(f"{n} parts ({n * args.items} rows)" for n in counts) + " | per part (largest) |")
        print("|---|" + "---|" * (len(counts) + 1))
        results = {}
        for n in counts:
            out = os.path.join(work, f"out-{n}")
            make_local(seed, out, n)
            for name, argv in commands.items():
                results[name, n] = timed(argv[:1] + [out] + argv[1:], args.repeat)
            shutil.rmtree(out)
        for name in commands:
            cells = " | ".join(f"{results[name, n]:.3f}" for n in counts)
            print(f"| `{name}` | {cells} | {1000 * results[name, counts[-1]] / counts[-1]:.2f} ms |")
        if args.remote_parts:
            remote(seed, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def remote(seed: str, args) -> None:
    import s3fs

    from s3_server import BUCKET, RequestLog, start_server

    log = RequestLog()
    server, endpoint = start_server(log)
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_ENDPOINT_URL": endpoint})
    try:
        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3fs.S3FileSystem()
        fs.mkdir(BUCKET)
        url = f"s3://{BUCKET}/ops"
        objects = upload_remote(fs, seed, url, args.remote_parts)
        rows = args.remote_parts * args.items
        print(f"\nremote OUT on moto (loopback, in this process): {args.remote_parts} parts, {rows} rows, {objects} objects")
        print("| command | seconds | GETs | bytes read | LISTs | HEADs | shard GETs |")
        print("|---|---|---|---|---|---|---|")
        for name, argv in {"status": ["status", url], "status --missing": ["status", url, "--missing"],
                           "info": ["info", url], "report --manifest-only": ["report", url, "--manifest-only"]}.items():
            seconds = timed(argv, args.repeat)
            mark = log.mark()
            timed(argv, 1)
            served = log.since(mark)
            gets = [r for r in served if r.kind == "GET"]
            shards = [r for r in gets if r.path.endswith((".h5", ".parquet", ".tar"))]
            print(f"| `{name}` | {seconds:.3f} | {len(gets)} | {sum(r.sent for r in gets)} | "
                  f"{sum(r.kind == 'LIST' for r in served)} | {sum(r.kind == 'HEAD' for r in served)} | {len(shards)} |")
    finally:
        server.stop()


if __name__ == "__main__":
    print(host_facts.header(), flush=True)
    main()
    print(host_facts.footer(), flush=True)
