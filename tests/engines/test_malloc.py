"""A process that feeds keeps glibc's large blocks in its heaps (mimi_extract.common.malloc): after a
run through the console entry point, in that process, a 48 MiB block comes from the heap and its
memory stays there once freed -- read back from glibc itself (``mallinfo2``), in a fresh interpreter,
where by default glibc maps every block over 32 MiB afresh; the same in a spawned device worker once
it has built its runner (a forked one inherits it with its memory; a Ray actor builds the same
``DeviceRunner``); a user's own malloc setting is kept."""

import ctypes
import multiprocessing
import os
import queue as queue_mod
import sys

import pytest

from mimi_extract import _boot
from mimi_extract.common.malloc import (M_MMAP_THRESHOLD, M_TOP_PAD, M_TRIM_THRESHOLD, MMAP_THRESHOLD, TOP_PAD,
                                         TRIM_THRESHOLD, apply_to, users_own)
from mimi_extract.config.settings import Settings
from support import ROOT, entry_point_report

glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL(None), "mallinfo2"),
                           reason="glibc's malloc (mallinfo2: glibc 2.33 and later)")

# a 48 MiB block malloc'ed and freed, before and after a run of the console entry point in this
# process (support/glibc_malloc.py, loaded by its directory: nothing imported before the run)
AROUND_A_RUN = r"""
import json, sys

sys.path.insert(0, sys.argv.pop(1))
from glibc_malloc import large_block as block

report = {"before": block()}
sys.argv = ["mimi-extract", *sys.argv[1:]]
from mimi_extract import _entry
try:
    code = _entry.run()
except SystemExit as e:
    code = e.code
report.update(after=block(), exit=code)
print(json.dumps(report))
"""


def _around_a_run(tmp_path, tiny_model_dir, user_env):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    report = entry_point_report(AROUND_A_RUN, tmp_path, tiny_model_dir, {**env, **user_env},
                                os.path.join(ROOT, "tests", "support"))
    assert "exit" in report, report  # (the run returned: its exit code is in the report, 0)
    return report


@glibc
def test_a_feeding_process_keeps_large_blocks_in_its_heap(tmp_path, tiny_model_dir):
    assert 48 << 20 <= MMAP_THRESHOLD
    report = _around_a_run(tmp_path, tiny_model_dir, {})
    assert report["before"] == {"mapped": True, "kept_free": False}  # glibc's default: mapped, then unmapped
    assert report["after"] == {"mapped": False, "kept_free": True}


def _report_of(proc, reports):
    """The worker's report, once it has put it; a worker that ends without one fails the test at
    once (``_boot.worker_main`` does not hand exceptions back), however long its start takes."""
    while True:
        try:
            return reports.get(timeout=5)  # (a state is waited for: the report, or the worker's end)
        except queue_mod.Empty:
            if not proc.is_alive():
                try:
                    return reports.get(timeout=5)  # (put just before it ended)
                except queue_mod.Empty:
                    pytest.fail(f"the spawned worker ended (exit code {proc.exitcode}) without a report")


@glibc
def test_a_spawned_device_worker_keeps_large_blocks_in_its_heap(tiny_model_dir, monkeypatch):
    """A spawned worker is a fresh interpreter (nothing inherited from this process's malloc): it
    started through the boot code every device worker runs, and built its runner."""
    for name in [n for n in os.environ if n.startswith("MALLOC_")] + ["GLIBC_TUNABLES"]:
        monkeypatch.delenv(name, raising=False)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    settings = Settings(model=tiny_model_dir, tap="codes", devices=("cpu",), threads=1)
    proc = ctx.Process(target=_boot.worker_main, args=(os.getpid(), settings, "support.probes:report_malloc", queue))
    proc.start()
    try:
        seen = _report_of(proc, queue)
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.kill()
    assert seen == {"before": True, "after": False, "applied": True}


@glibc
def test_a_users_own_malloc_setting_is_kept(tmp_path, tiny_model_dir):
    report = _around_a_run(tmp_path, tiny_model_dir, {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)})
    assert report["before"]["mapped"] and report["after"]["mapped"]


def test_which_settings_are_the_users():
    assert users_own({}) is None and users_own({"MALLOC_TOP_PAD_": "0"}) == "MALLOC_TOP_PAD_"
    assert users_own({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}) == "GLIBC_TUNABLES"
    assert users_own({"GLIBC_TUNABLES": "glibc.rtld.nns=2"}) is None


class _Mallopt:
    """``mallopt``'s answers as an older glibc gives them (a threshold above ``largest`` refused: glibc
    up to 2.34 refuses one above 32 MiB), the calls it took, in order."""

    def __init__(self, largest: int):
        self.largest, self.calls = largest, []

    def mallopt(self, param: int, value: int) -> int:
        if param == M_MMAP_THRESHOLD and value > self.largest:
            return 0
        self.calls.append((param, value))
        return 1


def test_the_threshold_is_set_first_and_an_older_glibcs_limit_kept(monkeypatch):
    """Any accepted setting turns glibc's dynamic threshold off: one accepted before a refused
    threshold would leave blocks over 128 KiB mapped afresh. So the threshold goes first; an older
    glibc's 32 MiB is taken instead of 64; refused outright, nothing else is set."""
    for name in [n for n in os.environ if n.startswith("MALLOC_")] + ["GLIBC_TUNABLES"]:
        monkeypatch.delenv(name, raising=False)
    new = _Mallopt(largest=1 << 40)
    assert apply_to(new).applied and new.calls[0] == (M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    old = _Mallopt(largest=32 << 20)
    setting = apply_to(old)
    assert setting.applied and "32 MiB" in setting.reason
    assert old.calls == [(M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD)]
    none = _Mallopt(largest=0)
    assert not apply_to(none).applied and none.calls == []
