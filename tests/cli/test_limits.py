"""An address-space limit (ulimit -v) too small for torch: a one-line message and exit 5, whether
the check before the torch import catches it or the import itself fails; light commands still run."""

import os
import resource
import subprocess
import sys

from support import ROOT
from support.waits import HANG_S
from mimi_extract.cli import limits

MIB = 1 << 20


# the real CLI in a fresh interpreter; as it exits (os._exit included) it writes whether torch was
# imported to $IMPORTED_TORCH
PROBE = ("import atexit, os, sys, runpy\n"
         "def record(): open(os.environ['IMPORTED_TORCH'], 'w').write(str('torch' in sys.modules))\n"
         "atexit.register(record)\n"
         "_exit = os._exit\n"
         "os._exit = lambda code: (record(), _exit(code))\n"
         "sys.argv = ['mimi-extract'] + sys.argv[1:]\n"
         "runpy.run_module('mimi_extract', run_name='__main__')\n")


def run_limited(limit: int, *args, env=None, tmp_path=None):
    """The CLI under RLIMIT_AS = ``limit``; with ``tmp_path``, also whether it imported torch."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))

    env = {**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1", **(env or {})}
    if tmp_path is None:
        command = [sys.executable, "-m", "mimi_extract"]
    else:
        env["IMPORTED_TORCH"] = str(tmp_path / "imported-torch")
        command = [sys.executable, "-c", PROBE]
    p = subprocess.run([*command, *map(str, args)], env=env, capture_output=True, text=True, preexec_fn=cap,
                       timeout=HANG_S)
    if tmp_path is None:
        return p, None
    return p, (tmp_path / "imported-torch").read_text()


def assert_explained(p, limit):
    lines = p.stderr.strip().splitlines()
    assert p.returncode == limits.EXIT_ADDRESS_SPACE, (p.returncode, p.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: the address-space limit"), p.stderr[-2000:]
    assert f"({limit // 1024} KiB)" in lines[0] and "ulimit -v unlimited" in lines[0] and "--mem" in lines[0]


def test_limit_below_need_refused_before_torch(tmp_path, tiny_model_dir):
    (tmp_path / "in").mkdir()
    limit = limits.needed() - 64 * MIB
    p, imported_torch = run_limited(limit, "codes", tmp_path / "in", tmp_path / "out", "--model", tiny_model_dir,
                                    "--device", "cpu", tmp_path=tmp_path)
    assert_explained(p, limit)
    assert not (tmp_path / "out").exists()  # nothing started
    assert imported_torch == "False"  # refused before torch is imported (was: a wall-time bound)


def test_import_failing_under_the_limit_is_explained(tmp_path, tiny_model_dir):
    """The check skipped: the torch import itself fails under 600 MiB (a CPU build maps about
    0.9 GiB, a CUDA build 4.7) and is reported as the limit, not as a traceback."""
    (tmp_path / "in").mkdir()
    limit = 600 * MIB
    p, _ = run_limited(limit, "codes", tmp_path / "in", tmp_path / "out", "--model", tiny_model_dir,
                       "--device", "cpu", env={limits.NO_CHECK_ENV: "1"})
    assert_explained(p, limit)
    for light in (["--version"], ["codes", "--help"], ["status", tmp_path / "nothing"]):
        p, _ = run_limited(limit, *light)
        assert "address-space" not in p.stderr and p.returncode in (0, 2), (light, p.stderr[-2000:])
