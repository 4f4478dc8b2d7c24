"""An address-space limit (ulimit -v) too small for torch: a one-line message and exit 5, whether
the check before the torch import catches it or the import itself fails; light commands still run."""

import os
import resource
import subprocess
import sys
import time

from conftest import ROOT
from mimi_extract import _limits

MIB = 1 << 20


def run_limited(limit: int, *args, env=None):
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))

    env = {**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1", **(env or {})}
    start = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "mimi_extract", *map(str, args)], env=env, capture_output=True,
                       text=True, preexec_fn=cap, timeout=120)
    return p, time.perf_counter() - start


def assert_explained(p, limit):
    lines = p.stderr.strip().splitlines()
    assert p.returncode == _limits.EXIT_ADDRESS_SPACE, (p.returncode, p.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: the address-space limit"), p.stderr[-2000:]
    assert f"({limit // 1024} KiB)" in lines[0] and "ulimit -v unlimited" in lines[0] and "--mem" in lines[0]


def test_limit_below_need_refused_before_torch(tmp_path, tiny_model_dir):
    (tmp_path / "in").mkdir()
    limit = _limits.needed() - 64 * MIB
    p, seconds = run_limited(limit, "codes", tmp_path / "in", tmp_path / "out", "--model", tiny_model_dir,
                             "--device", "cpu")
    assert_explained(p, limit)
    assert not (tmp_path / "out").exists()  # nothing started
    assert seconds < 20  # refused before torch is imported


def test_import_failing_under_the_limit_is_explained(tmp_path, tiny_model_dir):
    """The check skipped: the torch import itself fails under 600 MiB (a CPU build maps about
    0.9 GiB, a CUDA build 4.7) and is reported as the limit, not as a traceback."""
    (tmp_path / "in").mkdir()
    limit = 600 * MIB
    p, _ = run_limited(limit, "codes", tmp_path / "in", tmp_path / "out", "--model", tiny_model_dir,
                       "--device", "cpu", env={_limits.NO_CHECK_ENV: "1"})
    assert_explained(p, limit)
    for light in (["--version"], ["codes", "--help"], ["status", tmp_path / "nothing"]):
        p, _ = run_limited(limit, *light)
        assert "address-space" not in p.stderr and p.returncode in (0, 2), (light, p.stderr[-2000:])
