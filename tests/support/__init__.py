"""What the tests share, imported as ``from support import ...`` (a helper package, not a test
module): the CLI in-process and in a subprocess, one run as the tests ask it, noise files, the
float tolerance, and the checks of an output directory (they ``assert``: kept out of the package).
The shared fixtures are the pytest plugins ``support.fixtures`` and ``support.corpora`` (registered
in tests/conftest.py); ``support.outs`` writes and damages OUTs by hand, ``support.kill_trials`` kills
runs, ``support.s3_server`` serves S3, ``support.moshi_ref`` and ``support.shapes`` are references;
``support.registered`` is the tests' table of the registered output formats and input kinds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from decimal import ROUND_HALF_UP, Decimal

import numpy as np
import soundfile as sf
import torch

ONE_WORKER = ["--device", "cpu", "--cpu-workers", "1", "--num-workers", "1"]  # a CLI run in one process


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository


def tolerance(reference: torch.Tensor) -> float:
    """1e-5, scaled by the output magnitude when it exceeds 1: fp32 rounding is relative, and
    oneDNN picks different conv kernels for different lengths (measured: ~1e-6 relative)."""
    return 1e-5 * max(1.0, float(reference.abs().max()))


def write_noise(path, samples: int, rate: int = 24_000, rng=None, level: float = 0.2, channels: int = 1,
                subtype: str | None = None) -> None:
    """A white-noise file of ``samples`` frames (PCM-16 unless ``subtype``, e.g. "FLOAT")."""
    rng = np.random.default_rng(0) if rng is None else rng
    data = (level * rng.standard_normal(samples if channels == 1 else (samples, channels))).astype(np.float32)
    sf.write(str(path), data, rate, **({"subtype": subtype} if subtype else {}))


def entry_point_report(script: str, tmp_path, model_dir: str, env: dict, *script_args: str) -> dict:
    """A ``codes`` run of one 2-s WAV (one process, the CPU) through ``script``, a fresh interpreter's
    ``python -c`` that runs the console entry point as ``mimi-extract`` would and prints a JSON report
    as its last line; ``env`` is its environment (this package's path, offline and one OpenMP thread
    added), ``script_args`` come before the CLI's.  Its report, once it exited 0 (and the run's exit
    code, where the report has one, is 0)."""
    src = tmp_path / "in"
    src.mkdir()
    write_noise(src / "a.wav", 24_000 * 2)
    env = {**env, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", script, *script_args, "codes", str(src), str(tmp_path / "out"),
                          "--model", model_dir, *ONE_WORKER], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads(run.stdout.strip().split("\n")[-1])
    assert report.get("exit") in (0, None), run.stdout[-2000:]
    return report


def garbage_mp3(path):
    """Random bytes with MPEG frame sync words (libsndfile's libmpg123 printed warnings on stderr and
    then said the file "does not exist or is not a regular file"; FFmpeg finds no audio in it)."""
    data = bytearray(np.random.default_rng(0).integers(0, 256, 30000, dtype=np.uint8).tobytes())
    for i in range(0, len(data), 400):
        data[i:i + 4] = b"\xff\xfb\x90\x64"
    path.write_bytes(bytes(data))


def ragged(lengths, seed=0, garbage=None):
    """Items and their right-padded batch; the padding holds ``garbage`` to prove it is ignored."""
    g = torch.Generator().manual_seed(seed)
    items = [0.3 * torch.randn(n, generator=g) for n in lengths]
    batch = torch.nn.utils.rnn.pad_sequence(items, batch_first=True)
    if garbage is not None:
        for row, n in enumerate(lengths):
            batch[row, n:] = garbage
    return items, batch


def cli(*args, env=None):
    """The CLI in-process; ``text`` is the output with rich's line wrapping (long paths) undone."""
    from typer.testing import CliRunner

    from mimi_extract.cli.app import app

    result = CliRunner().invoke(app, [str(a) for a in args], env=env)
    result.text = " ".join(result.output.split())
    return result


def cli_process(*args, **kwargs) -> subprocess.Popen:
    """The real CLI in a subprocess (python -m mimi_extract), for kill/signal tests."""
    env = {**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1", **kwargs.pop("env", {})}
    # as from a terminal: SIGINT is not ignored (a test session started in the background, `pytest &`,
    # inherits SIG_IGN for it, and Python then keeps ignoring it until the run installs its handlers)
    kwargs.setdefault("preexec_fn", lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return subprocess.Popen([sys.executable, "-m", "mimi_extract", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


def rhu(x: float) -> int:  # lhotse's rounding of seconds to frames
    return int(Decimal(round(x, 8)).quantize(0, rounding=ROUND_HALF_UP))


def check_consistency(out_dir: str, expected_keys=None, killed: bool = False) -> dict[str, "np.ndarray"]:
    """Assert OUT's invariants and return {key: array} of every ok item, for any output format.

    One ok row per key at most; every committed shard on disk (of any format) has ok rows and holds
    exactly the items they name with their frame counts (its format's ``check``: for HDF5, the
    datasets the rows name and no other), so no key is stored twice; every array loads with its
    row's frame count and checksum; no ``.tmp`` file is left (``killed``: OUT as a kill left it,
    where a ``.tmp`` shard being written may remain: readers ignore it and resume removes it).
    With ``expected_keys``, exactly those keys have ok rows."""
    import glob

    from mimi_extract.store.manifest import format_files, out_rows, run_dirs
    from mimi_extract.store.read import load_row

    rows = [r for r in out_rows(out_dir) if r.ok]
    keys = [r.key for r in rows]
    assert len(keys) == len(set(keys)), f"duplicate ok rows: {sorted(k for k in set(keys) if keys.count(k) > 1)[:5]}"
    if expected_keys is not None:
        assert set(keys) == set(expected_keys), (
            f"missing {sorted(set(expected_keys) - set(keys))[:5]}, unexpected {sorted(set(keys) - set(expected_keys))[:5]}")
    by_shard: dict[str, list] = {}
    for r in rows:
        by_shard.setdefault(r.shard, []).append(r)
    for d in run_dirs(out_dir):
        for name, fmt in sorted(format_files(d)):
            if name.endswith(".tmp") or not fmt.is_shard(name):
                continue
            shard = os.path.relpath(os.path.join(d, name), out_dir)
            assert shard in by_shard, f"{shard}: a committed shard without manifest rows"
            problem = fmt.check(os.path.join(d, name), by_shard[shard])
            assert problem is None, f"{shard}: {problem}"
        assert killed or not glob.glob(os.path.join(d, "*.tmp")), f"leftover tmp files in {d}"
    arrays = {}
    for r in rows:
        data = load_row(out_dir, r)
        assert data.shape[0] == r.frames, r.key
        arrays[r.key] = data
    return arrays


def restamp_checksum(out_dir: str, key: str) -> None:
    """Rewrite the manifest checksum of ``key`` (and the shard checksum of its shard's rows) to match
    what its shard now holds: tests that edit a stored array on purpose (to stand for another
    device's output) make it a valid item again, instead of a damaged one that every read refuses."""
    import json

    from mimi_extract.formats.base import array_checksum, bytes_checksum
    from mimi_extract.store.files import write_atomic
    from mimi_extract.store.manifest import format_of_path, read_rows, run_dirs

    for d in run_dirs(out_dir):
        rows = read_rows(d)
        hit = {r.shard for r in rows if r.key == key and r.ok}
        rows = [replace(r, checksum=array_checksum(format_of_path(r.shard).load(os.path.join(d, r.shard), r)))
                if r.key == key and r.ok else r for r in rows]
        for shard in hit:
            with open(os.path.join(d, shard), "rb") as f:
                whole = bytes_checksum(f.read())
            rows = [replace(r, shard_checksum=whole) if r.shard == shard and r.shard_checksum else r for r in rows]
        if hit:
            write_atomic(os.path.join(d, "manifest.jsonl"), "".join(json.dumps(r.to_dict()) + "\n" for r in rows))


def interrupt_after_items(n: int):
    """An ``on_progress`` callback that raises KeyboardInterrupt once ``n`` items were stored ok
    (an interruption at a known point of a run, whatever the machine's speed)."""
    seen = []

    def on_progress(items, seconds, errors):
        seen.extend([1] * (items - errors))
        if len(seen) >= n:
            raise KeyboardInterrupt

    return on_progress


def extract(source: str, out_dir: str, settings, **asked):
    """One run as the tests ask it: ``run_request`` of ``RunRequest(source, out_dir, settings, **asked)``
    (``options``, ``part``, ``limit``, ``shard_size``...: the request's fields; ``on_plan``,
    ``on_progress``, ``on_signal``, ``stop``, ``on_phase``: the run's callbacks)."""
    from mimi_extract.config.request import RunRequest
    from mimi_extract.run.runner import run_request

    callbacks = {k: asked.pop(k) for k in ("on_plan", "on_progress", "on_signal", "stop", "on_phase") if k in asked}
    return run_request(RunRequest(source, out_dir, settings, **asked), **callbacks)


class OnDemand(dict):
    """{name: what} made by ``make(name)`` once a test first asks for it (a module fixture over every
    registered format or input kind: running one case's tests makes no other case's)."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, name):
        self[name] = self.make(name)
        return self[name]
