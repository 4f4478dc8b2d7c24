"""OUT's own safety (issue 16): the layout decided under one lock, manifest rows never trusted to
name paths, shard settings checked at resume, only the writer's temporary files removed, a full
disk on the lock file named."""

import errno
import json
import os
import shutil
import subprocess
import threading
import time

import h5py
import numpy as np
import pytest

from support import write_noise
from mimi_extract import read, read_manifest
from mimi_extract.store import run_info
from mimi_extract.config.settings import Part
from support import extract
from mimi_extract.config.settings import Settings
from mimi_extract.store.files import OutputError
from mimi_extract.store.lock import RunLock
from mimi_extract.store.manifest import committed_rows
from support import check_consistency
from support.waits import wait_for


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("small")
    rng = np.random.default_rng(5)
    for i in range(8):
        write_noise(root / f"s{i}.wav", int(24_000 * (0.2 + 0.3 * rng.random())), rng=rng)
    return str(root)


def settings(model_dir, **kw):
    return Settings(model=model_dir, tap="codes", num_workers=1, **kw)


@pytest.mark.slow
def test_whole_and_part_runs_never_both_complete(small, tiny_model_dir, tmp_path, monkeypatch):
    """Issue 16 defect 3: a whole run writes run.json only after loading the model; a part run
    started in between must be refused (the decision is made under OUT/lock)."""
    out = str(tmp_path / "out")
    real_check = run_info.check_run_info

    def slow_check(*args, **kwargs):  # widen the window between the layout decision and run.json
        time.sleep(1.5)
        return real_check(*args, **kwargs)

    monkeypatch.setattr(run_info, "check_run_info", slow_check)
    results = {}

    def run(name, **kw):
        try:
            results[name] = extract(small, out, settings(tiny_model_dir), **kw).ok
        except OutputError as e:
            results[name] = e

    whole = threading.Thread(target=run, args=("whole",))
    whole.start()
    wait_for(lambda: os.path.exists(os.path.join(out, "lock")), "the whole run's lock")
    time.sleep(0.2)  # (either order of the two runs is asserted below: this only makes the lock's side likelier)
    run("part", part=Part(0, 2))
    whole.join()
    assert results["whole"] == 8, results
    # refused by the lock ("in use by"), or, when the whole run wrote run.json while the part run's
    # own pre-lock identity check slept, by the layout ("holds a whole run"): never both complete
    refusal = str(results["part"])
    assert isinstance(results["part"], OutputError) and (
        "in use by" in refusal or "holds a whole run (not split into parts)" in refusal), results
    assert not os.path.exists(os.path.join(out, Part(0, 2).dirname))
    check_consistency(out)


def test_parts_of_one_array_starting_together_all_run(small, tiny_model_dir, tmp_path):
    """The layout lock is short-lived for parts: two parts deciding at the same instant both go on."""
    out = str(tmp_path / "out")
    errors = []

    def run(i):
        try:
            extract(small, out, settings(tiny_model_dir), part=Part(i, 2))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(check_consistency(out)) == 8


def _tampered_resume(out, small, model_dir, row):
    with open(os.path.join(out, "manifest.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")
    with pytest.raises(OutputError) as e:
        extract(small, out, settings(model_dir))
    return str(e.value)


def test_manifest_rows_never_name_paths(small, tiny_model_dir, tmp_path):
    """Issue 16 defect 4: a row naming ``../victim.txt`` (or an absolute path) as its shard made
    resume move that file into quarantine (or rename it in place).  Now every reader refuses the
    row, naming it, and the file is untouched."""
    out = str(tmp_path / "out")
    extract(small, out, settings(tiny_model_dir))
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    absolute = tmp_path / "absolute.txt"
    absolute.write_text("mine too")
    good = open(os.path.join(out, "manifest.jsonl")).read()
    for shard in ("../victim.txt", str(absolute)):
        message = _tampered_resume(out, small, tiny_model_dir,
                                   {"key": "z", "status": "ok", "shard": shard, "dataset": "x", "frames": 1})
        assert "line 9" in message and repr(shard) in message and "'z'" in message, message
        for reader in (read_manifest, lambda o: read(o, "z"), lambda o: committed_rows(o)):
            with pytest.raises(OutputError, match="not a shard name"):
                reader(out)
        assert victim.read_text() == "mine" and absolute.read_text() == "mine too"
        assert not os.path.exists(os.path.join(out, "quarantine"))
        open(os.path.join(out, "manifest.jsonl"), "w").write(good)
    assert len(check_consistency(out)) == 8


def test_resume_removes_only_the_writers_temporary_files(small, tiny_model_dir, tmp_path):
    """Issue 16 defect 6: resume deleted every *.tmp in OUT, the user's too."""
    out = str(tmp_path / "out")
    extract(small, out, settings(tiny_model_dir, ), limit=3)
    mine = {"notes.tmp": "user", "shard-1.h5.tmp": "user", "data.h5.tmp": "user"}
    for name, text in mine.items():
        open(os.path.join(out, name), "w").write(text)
    for name in ("shard-00007.h5.tmp", "manifest.jsonl.tmp", "cuts.jsonl.gz.tmp"):
        open(os.path.join(out, name), "wb").write(b"half written")
    extract(small, out, settings(tiny_model_dir))
    left = sorted(n for n in os.listdir(out) if n.endswith(".tmp"))
    assert left == sorted(mine), left


def test_disk_full_on_the_lock_file_names_it(tmp_path):
    """Issue 16 defect 9: ENOSPC writing the lock file's text printed a bare ``[Errno 28]``."""
    mount = tmp_path / "full"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        out = mount / "out"
        out.mkdir()
        try:
            with open(mount / "filler", "wb") as f:
                f.write(b"\0" * (1 << 20))
        except OSError as e:
            assert e.errno == errno.ENOSPC
        with pytest.raises(OutputError) as e:
            RunLock(str(out))
        assert str(e.value) == f"no space left on device while writing {out}/lock", str(e.value)
    finally:
        subprocess.run(["umount", str(mount)])


def test_resume_checks_every_shards_settings(small, tiny_model_dir, tmp_path):
    """Issue 16 defect 5: with run.json deleted, ``-q 4`` resumed over ``-q 8`` shards; attributes
    edited in place (weights, num_quantizers) passed too.  The shards' own settings are checked."""
    out = str(tmp_path / "out")
    extract(small, out, settings(tiny_model_dir), limit=4, shard_size=2)
    os.remove(os.path.join(out, "run.json"))
    with pytest.raises(OutputError) as e:
        extract(small, out, settings(tiny_model_dir, num_quantizers=4), shard_size=2)
    assert "shard-00000.h5 was made with other settings" in str(e.value) and "num_quantizers: 8 -> 4" in str(e.value)
    extract(small, out, settings(tiny_model_dir), limit=4, shard_size=2)  # the same settings: resumes
    for attr, value in (("weights", "0" * 24), ("num_quantizers", 4)):
        with h5py.File(os.path.join(out, "shard-00001.h5"), "r+") as f:
            old = f.attrs[attr]
            f.attrs[attr] = value
        with pytest.raises(OutputError) as e:
            extract(small, out, settings(tiny_model_dir), shard_size=2)
        assert "shard-00001.h5 was made with other settings" in str(e.value) and f"{attr}: " in str(e.value)
        with h5py.File(os.path.join(out, "shard-00001.h5"), "r+") as f:
            f.attrs[attr] = old
    assert extract(small, out, settings(tiny_model_dir), shard_size=2).skipped == 4
    assert len(check_consistency(out)) == 8


def test_a_forked_worker_does_not_keep_outs_lock_after_its_runner_dies(tmp_path):
    """CPU workers are forked from the runner, and flock belongs to the open file a fork shares: a
    worker still alive after its runner was killed -9 held OUT, and the immediate resume was refused
    naming the dead runner (a kill trial failed this way under load). The child lets its copy go."""
    import signal
    import sys

    code = ("import os, time\n"
            "from mimi_extract.store.lock import RunLock\n"
            f"lock = RunLock({str(tmp_path)!r})\n"
            "child = os.fork()\n"
            # each line in one write(2): the two processes share the pipe (print may write a line in two
            # pieces, and a busy machine interleaved them: '21866child ready')
            "if child == 0:\n    os.write(1, b'child ready\\n')\n    time.sleep(3600)\n    os._exit(0)\n"
            "os.write(1, f'{child}\\n'.encode())\ntime.sleep(3600)\n")
    runner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    # the child's fork hook has run once it prints (it runs before os.fork returns there): without
    # waiting for that, a loaded machine could run the test's kill and lock before the child ran at all
    lines = {runner.stdout.readline().strip() for _ in range(2)}
    assert "child ready" in lines, lines
    child = int(next(line for line in lines if line != "child ready"))
    try:
        with pytest.raises(OutputError, match="is in use by pid"):
            RunLock(str(tmp_path))  # the runner holds it
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait()
        os.kill(child, 0)  # the forked worker lives on ...
        RunLock(str(tmp_path)).release()  # ... and OUT is free
    finally:
        runner.kill()
        os.kill(child, signal.SIGKILL)
