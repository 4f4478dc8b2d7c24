"""Integrity under faults: kill -9, signals, two runs, a full disk, damaged shards, swapped
weights or inputs, odd file trees.  Each ends in a consistent OUT that resumes to exactly the
result of an uninterrupted run (checked by ``tests/support/__init__.py``'s ``check_consistency``)."""

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
import soundfile as sf

from support import ONE_WORKER, cli, cli_process, write_noise
from mimi_extract import read_manifest
from support import extract
from mimi_extract.config.settings import Settings
from mimi_extract.codec.demo import random_model, tiny_config
from support import check_consistency
from support.kill_trials import KillTrial, checked_arrays, kill_9_then_resume
from support.registered import format_case, format_cases
from mimi_extract.formats import get_format
from support.waits import HANG_S, read_until, wait_for
from mimi_extract.store.files import LockedError
from mimi_extract.store.lock import RunLock


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """120 short files (0.2-1.2 s, two rates): a run that lasts a few seconds on the tiny model."""
    root = tmp_path_factory.mktemp("many")
    rng = np.random.default_rng(0)
    for d in range(4):
        (root / f"d{d}").mkdir()
    for i in range(120):
        rate = 16_000 if i % 3 == 0 else 24_000
        n = int(rate * (0.2 + rng.random()))
        write_noise(root / f"d{i % 4}" / f"f{i:03d}.wav", n, rate, rng)
    return str(root)


@pytest.fixture(scope="module")
def reference_run(many, tiny_model_dir, tmp_path_factory):
    """The uninterrupted result every interrupted-and-resumed OUT must equal, array for array."""
    out = str(tmp_path_factory.mktemp("ref") / "out")
    summary = extract(many, out, Settings(model=tiny_model_dir, tap="codes", num_workers=1), shard_size=7)
    assert summary.ok == 120
    return check_consistency(out)


def assert_same(out, reference):
    arrays = check_consistency(out, reference.keys())
    for key, ref in reference.items():
        assert np.array_equal(arrays[key], ref), key


def start(many, out, model_dir, *extra):
    proc = cli_process("codes", many, out, "--model", model_dir, "--shard-size", 7, *extra, start_new_session=True)
    return proc, read_until(proc.stdout, "to encode", "start-up")  # start-up over, encoding begins


def wait_for_rows(out, n):
    """Until OUT's manifest has ``n`` rows (so a signal lands mid-run, whatever the machine's speed)."""
    path = os.path.join(out, "manifest.jsonl")
    wait_for(lambda: os.path.exists(path) and sum(1 for _ in open(path)) >= n, f"{n} manifest rows")


def finish(proc):
    out, _ = proc.communicate(timeout=HANG_S)
    return proc.returncode, out


@pytest.mark.slow
@pytest.mark.parametrize("fmt", format_cases("kill_9"))
def test_kill_9_at_random_points_then_resume(many, tiny_model_dir, reference_run, tmp_path, fmt):
    """kill -9 twice, each once a random number of rows is committed (never before the first
    commit or after the last): after each kill OUT is consistent (the format's own check: a Shar
    OUT's is read by lhotse) and the next run resumes exactly what was committed; the final resume
    equals the uninterrupted run (an HDF5 run: every format stores the same arrays).  The first kill
    lands on three device workers, each writing its own 3-item shards (a shard every few ms from
    each, their .tmp files side by side, the runner committing them in turn): only the parent is
    killed, so no worker may outlive it (observation 7), and after the kill only uncommitted
    shards' .tmp files are left, whichever worker wrote them, nothing is stored twice.  The second
    kills the whole process group of a one-process run resuming that OUT.  (Three writers commit
    in bursts, tens of rows past the target under load: a third kill could find the run ended.)"""
    out = str(tmp_path / "out")
    trials = [KillTrial("3", (1, 30)), KillTrial("1", (1, 15))]
    kill_9_then_resume(many, out, tiny_model_dir, reference_run, trials, random.Random(0), fmt, check=kill_checks(fmt))
    shards = {r["shard"] for r in read_manifest(out) if r["shard"]}
    assert shards and all(get_format(fmt).is_shard(s) for s in shards), shards
    rows = read_manifest(out)
    assert len(rows) == len({r["key"] for r in rows}) == 120


def kill_checks(fmt: str):
    """OUT's check after a kill: the generic one (``checked_arrays``: only uncommitted shards' .tmp
    files left, whichever worker wrote them), then the format's own where it has one (Shar's: read
    by lhotse), which returns the arrays."""
    own = format_case(fmt).kill_check

    def check(out, killed=False):
        if own is not checked_arrays:
            checked_arrays(out, killed=killed)
        return own(out, killed=killed)

    return check


def worker_pids(parent: int) -> list[int]:
    """The device workers of ``parent`` (forked on CPU, spawned on GPU; not multiprocessing's
    resource tracker)."""
    with open(f"/proc/{parent}/task/{parent}/children") as f:
        children = [int(p) for p in f.read().split()]
    return [p for p in children if b"resource_tracker" not in open(f"/proc/{p}/cmdline", "rb").read()]


@pytest.mark.parametrize("sig,group,fmt", [(signal.SIGINT, False, "hdf5"), (signal.SIGTERM, True, "hdf5"),
                                           (signal.SIGTERM, True, "parquet")])
@pytest.mark.slow
def test_signal_commits_what_was_encoded(many, tiny_model_dir, reference_run, tmp_path, sig, group, fmt):
    """``group``: SIGTERM to the whole process group of a two-worker run, as Slurm's scancel or a
    time limit sends it: the workers must not die before the parent has committed.  (The parent
    takes SIGINT and SIGTERM with one handler, ``runner._Signals``: SIGTERM to a one-process run
    is the SIGINT case's path, its own name printed as the group cases print it.)  The resume runs
    in-process: what it resumes is the run's summary, which the CLI prints."""
    out = str(tmp_path / "out")
    workers = ["--device", "cpu", "--cpu-workers", "2", "--num-workers", "1"] if group else ONE_WORKER
    proc, _ = start(many, out, tiny_model_dir, *workers, "--format", fmt)
    wait_for_rows(out, 14)  # two shards committed
    os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
    code, text = finish(proc)
    assert code == 130, text
    assert f"interrupted ({signal.Signals(sig).name})" in text and "run the same command again to resume" in text
    assert "Traceback" not in text
    committed = check_consistency(out)  # as left: no tmp file, no dataset without its row
    assert 0 < len(committed) < 120, "the signal came too late or too early to test anything"
    for key, data in committed.items():
        assert np.array_equal(data, reference_run[key])
    summary = extract(many, out, Settings(model=tiny_model_dir, tap="codes", num_workers=1, format=fmt), shard_size=7)
    assert summary.skipped == len(committed) and summary.ok == 120 - len(committed), summary
    assert_same(out, reference_run)


@pytest.mark.slow
def test_a_dead_worker_hands_its_units_to_the_other(many, tiny_model_dir, reference_run, tmp_path):
    out = str(tmp_path / "out")
    proc, _ = start(many, out, tiny_model_dir, "--device", "cpu", "--cpu-workers", "2", "--num-workers", "1")
    wait_for_rows(out, 14)
    os.kill(worker_pids(proc.pid)[0], signal.SIGKILL)
    code, text = finish(proc)
    assert code == 0 and "died" in text and "handed to the others" in text, text
    assert_same(out, reference_run)  # nothing lost, nothing twice: one row per input
    rows = [json.loads(line) for line in open(os.path.join(out, "manifest.jsonl"))]
    assert len(rows) == len({r["key"] for r in rows}) == 120


@pytest.mark.slow
def test_second_signal_stops_at_once_and_startup_interrupt_is_clean(many, tiny_model_dir, reference_run, tmp_path):
    out = str(tmp_path / "out")
    proc, _ = start(many, out, tiny_model_dir, *ONE_WORKER)
    wait_for_rows(out, 7)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    code, text = finish(proc)
    assert code == 130 and "Traceback" not in text, text  # "again": stopped at once, unless it had already stopped
    extract(many, out, Settings(model=tiny_model_dir, tap="codes", num_workers=1), shard_size=7)
    assert_same(out, reference_run)
    early = cli_process("codes", many, str(tmp_path / "early"), "--model", tiny_model_dir, *ONE_WORKER)
    wait_for(lambda: importing_torch(early.pid) or early.poll() is not None, "the run importing torch")  # start-up: the interrupt lands there
    early.send_signal(signal.SIGINT)
    code, text = finish(early)
    assert code == 130 and "Traceback" not in text, text


@pytest.mark.slow
def test_second_run_is_refused_while_the_first_holds_out(many, tiny_model_dir, reference_run, tmp_path):
    out = str(tmp_path / "out")
    proc, _ = start(many, out, tiny_model_dir, *ONE_WORKER)
    second = cli("codes", many, out, "--model", tiny_model_dir, "--shard-size", 7, *ONE_WORKER)
    assert second.exit_code == 2, second.output
    assert f"is in use by pid {proc.pid}" in second.text and "started" in second.text
    code, text = finish(proc)
    assert code == 0, text
    assert_same(out, reference_run)
    # the lock dies with its holder: after kill -9 the next run proceeds
    holder = subprocess.Popen(["python3", "-c", f"import fcntl,time; f=open({os.path.join(out, 'lock')!r},'a');"
                                                "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(3600)"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(LockedError):
        RunLock(out)
    holder.kill()
    holder.wait()
    RunLock(out).release()


def _fill_disk_run(many, out, model_dir, fmt="hdf5"):
    what = ["codes"] if fmt == "megatron" else ["features", "--tap", "encoder"]  # (token ids: codes only)
    return cli(what[0], many, out, "--model", model_dir, *what[1:], "--shard-size", 10, "--format", fmt, *ONE_WORKER)


def _tmpfs(path, size="64k"):
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True).returncode == 0


def _resume_elsewhere(small, big, many, model_dir, fmt="hdf5"):
    shutil.copytree(small, big)
    result = _fill_disk_run(many, big, model_dir, fmt)
    assert result.exit_code == 0, result.output
    check_consistency(big, {r["key"] for r in read_manifest(big) if r["status"] == "ok"})
    assert sum(r["status"] == "ok" for r in read_manifest(big)) == 120


def test_disk_full_real_tmpfs(many, tiny_model_dir, tmp_path):
    small = str(tmp_path / "small")
    if not _tmpfs(small):
        pytest.skip("cannot mount a tmpfs here (not root); test_disk_full_injected covers the same path")
    try:
        result = _fill_disk_run(many, small, tiny_model_dir)
        assert result.exit_code == 2, result.output
        assert f"no space left on device while writing {small}/" in result.text  # a shard or the manifest
        check_consistency(small)  # what was committed before the disk filled is whole
        _resume_elsewhere(small, str(tmp_path / "big"), many, tiny_model_dir)
    finally:
        subprocess.run(["umount", small])


def _disk_full_run(many, out, model_dir, monkeypatch, fmt="hdf5"):
    """``_fill_disk_run`` with ENOSPC after ~60 KiB of writes, wherever the writer is: at the store's
    one byte writer (``store.files.write_all``: shards, manifest rows, run.json, the lock), not at the
    process's global ``os.write``."""
    from mimi_extract.store import files

    budget = {"left": 60_000}
    real_write = files.write_all

    def write_all(fd, data):
        if budget["left"] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        budget["left"] -= len(data)
        return real_write(fd, data)

    monkeypatch.setattr(files, "write_all", write_all)
    try:
        return _fill_disk_run(many, out, model_dir, fmt)
    finally:
        monkeypatch.setattr(files, "write_all", real_write)


@pytest.mark.parametrize("fmt", ["hdf5", pytest.param("parquet", marks=pytest.mark.slow),
                                 pytest.param("megatron", marks=pytest.mark.slow)])
def test_disk_full_injected(many, tiny_model_dir, tmp_path, monkeypatch, fmt):
    """ENOSPC from the OS after ~60 KiB, wherever the writer is (shard image, manifest, run.json)."""
    small = str(tmp_path / "small")
    result = _disk_full_run(many, small, tiny_model_dir, monkeypatch, fmt)
    assert result.exit_code == 2 and "no space left on device while writing" in result.text, result.output
    assert any(n.startswith("shard-") for n in os.listdir(small)), "the disk filled before any shard was committed"
    check_consistency(small)
    _resume_elsewhere(small, str(tmp_path / "big"), many, tiny_model_dir, fmt)


def test_damaged_shards_are_quarantined_and_redone(many, tiny_model_dir, reference_run, tmp_path):
    out = str(tmp_path / "out")
    extract(many, out, Settings(model=tiny_model_dir, tap="codes", num_workers=1), shard_size=7)
    with open(os.path.join(out, "shard-00003.h5"), "r+b") as f:
        f.truncate(0)
    size = os.path.getsize(os.path.join(out, "shard-00005.h5"))
    with open(os.path.join(out, "shard-00005.h5"), "r+b") as f:
        f.write(b"\0" * size)
    result = cli("codes", many, out, "--model", tiny_model_dir, "--shard-size", 7, *ONE_WORKER)
    assert result.exit_code == 0, result.output
    assert result.text.count("moved damaged shard") == 2 and "quarantine/shard-00003.h5" in result.text
    assert "(106 already done)" in result.text  # 14 items of the two shards encoded again
    assert sorted(os.listdir(os.path.join(out, "quarantine"))) == ["shard-00003.h5", "shard-00005.h5"]
    assert_same(out, reference_run)


def test_other_weights_or_other_input_refused(many, tiny_model_dir, tmp_path):
    out = str(tmp_path / "out")
    assert cli("codes", many, out, "--model", tiny_model_dir, "--limit", 3, *ONE_WORKER).exit_code == 0
    other = str(tmp_path / "other-weights")
    random_model(seed=1).save_pretrained(other)  # same config, other weights
    result = cli("codes", many, out, "--model", other, *ONE_WORKER)
    assert result.exit_code == 2 and "weights" in result.text and "other checkpoint" in result.text, result.output
    twin = str(tmp_path / "twin")
    shutil.copytree(many, twin)  # same relative names, another tree
    result = cli("codes", twin, out, "--model", tiny_model_dir, *ONE_WORKER)
    assert result.exit_code == 2 and "another input" in result.text, result.output
    assert sum(r["status"] == "ok" for r in read_manifest(out)) == 3  # nothing mixed in


def test_key_collisions_markup_and_odd_names(tmp_path, tiny_model_dir):
    root = tmp_path / "no[/x]dir"
    (root / "a.wav#ch0").mkdir(parents=True)
    sf.write(str(root / "a.wav"), np.zeros((4000, 2), np.float32), 24_000)
    for name in ("a.wav#ch0/b.wav", "[/red].wav", "[bold]x.wav"):  # '[/red].wav' is 'red].wav' in a folder '['
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        sf.write(str(root / name), 0.1 * np.ones(3000, np.float32), 24_000)
    out = str(tmp_path / "o[bold]ut[/]")
    result = cli("codes", root, out, "--model", tiny_model_dir, "--channel", "each", *ONE_WORKER)
    assert result.exit_code == 0, result.output
    assert "o[bold]ut[/]/manifest.jsonl" in result.text  # printed as is, not as markup
    keys = set(check_consistency(out))
    assert keys == {"a.wav#ch0", "a.wav#ch1", "a.wav#ch0/b.wav#ch0", "[/red].wav#ch0", "[bold]x.wav#ch0"}
    verify = cli("verify", root, "--model", tiny_model_dir, "--device", "cpu")
    assert verify.exit_code == 0 and "[bold]x.wav" in verify.text and "PASS" in verify.text, verify.output


def test_clear_errors(tmp_path, tiny_model_dir, corpus):
    root, _ = corpus
    broken = str(tmp_path / "broken-model")
    shutil.copytree(tiny_model_dir, broken)
    weights = os.path.join(broken, "model.safetensors")
    with open(weights, "r+b") as f:
        f.truncate(os.path.getsize(weights) // 2)
    cases = {
        "damaged": ["codes", root, tmp_path / "o1", "--model", broken, *ONE_WORKER],
        "only cpu and cuda": ["codes", root, tmp_path / "o2", "--model", tiny_model_dir, "--device", "meta"],
        "names no device": ["codes", root, tmp_path / "o3", "--model", tiny_model_dir, "--device", ","],
    }
    (tmp_path / "a-file").write_text("x")
    cases["exists and is not a directory"] = ["codes", root, tmp_path / "a-file", "--model", tiny_model_dir, *ONE_WORKER]
    two_semantic = str(tmp_path / "two-semantic")
    random_model(tiny_config(num_semantic_quantizers=2)).save_pretrained(two_semantic)
    cases["must be in 2..8"] = ["codes", root, tmp_path / "o4", "--model", two_semantic, "-q", 1, *ONE_WORKER]
    for expected, args in cases.items():
        result = cli(*args)
        assert result.exit_code == 2 and expected in result.text, (expected, result.output)
        assert "Traceback" not in result.output
    unreadable = tmp_path / "unreadable"
    unreadable.mkdir()
    (unreadable / "x.wav").write_bytes(b"RIFF garbage")
    result = cli("verify", unreadable, "--model", tiny_model_dir, "--device", "cpu")
    assert result.exit_code == 1 and "FAIL (nothing compared)" in result.text, result.output


def test_run_json_records_identity(tiny_model_dir, corpus, tmp_path):
    root, _ = corpus
    out = tmp_path / "out"
    assert cli("codes", root, out, "--model", tiny_model_dir, *ONE_WORKER).exit_code == 0
    info = json.loads((out / "run.json").read_text())
    assert len(info["weights"]) == 24 and info["input"] == os.path.realpath(root) and info["framing"] == "transformers"


def test_second_signal_handler_exits_at_once(monkeypatch):
    import threading

    from mimi_extract.run import runner

    exits = []
    stop = threading.Event()
    with runner._Signals(stop, leave=exits.append) as signals:
        signals._handle(signal.SIGTERM, None)
        assert stop.is_set() and signals.received == "SIGTERM" and not exits
        signals._handle(signal.SIGINT, None)
        assert exits == [130]
    # OUT is committed when the block ends: the caller's handlers are back (a library caller's next
    # Ctrl-C must not hit this run's "exit at once")
    assert all(signal.getsignal(sig) == handler for sig, handler in signals.old.items())


@pytest.mark.slow
def test_float_features_after_a_disk_full_resume_differ_by_batch_composition_only(many, tiny_model_dir, tmp_path,
                                                                                  monkeypatch):
    """A full disk, then a resume: the items left are planned again without the committed ones, so
    some sit in other padded batches and their float features move by float noise.  Classified as
    ``verify`` does (``max|d| <= rtol * max|ref| + atol`` per item) against the uninterrupted run,
    none is over; and each re-encoded item is bit-identical to a fresh run over exactly the items
    the resume encoded: the difference is batch composition, nothing else."""
    import torch

    from mimi_extract.audit.verify import FileCheck, _compare_features

    reference = str(tmp_path / "reference")
    assert _fill_disk_run(many, reference, tiny_model_dir).exit_code == 0
    out = str(tmp_path / "out")
    assert _disk_full_run(many, out, tiny_model_dir, monkeypatch).exit_code == 2
    committed = {r["key"] for r in read_manifest(out) if r["status"] == "ok"}
    assert 0 < len(committed) < 120
    assert _fill_disk_run(many, out, tiny_model_dir).exit_code == 0
    resumed, uninterrupted = check_consistency(out), check_consistency(reference)
    assert resumed.keys() == uninterrupted.keys() and len(resumed) == 120
    verdict = {"identical": 0, "within": 0, "over": 0}
    for key, ref in uninterrupted.items():
        check = FileCheck(key, 0.0)
        _compare_features(check, "encoder", torch.from_numpy(resumed[key]), torch.from_numpy(ref), 1e-5, 1e-6)
        verdict["identical" if check.diff["encoder"] == 0 else "within" if check.passed(1e-5, 1e-6) else "over"] += 1
        if key in committed:
            assert np.array_equal(resumed[key], ref), key  # committed before the disk filled: the same batches
    assert verdict["over"] == 0, verdict
    rest = tmp_path / "rest.jsonl"
    rest.write_text("".join(json.dumps({"path": os.path.join(many, k), "id": k}) + "\n"
                            for k in sorted(resumed) if k not in committed))
    fresh = str(tmp_path / "fresh")
    assert _fill_disk_run(str(rest), fresh, tiny_model_dir).exit_code == 0
    for key, data in check_consistency(fresh).items():
        assert np.array_equal(data, resumed[key]), key


def importing_torch(pid: int) -> bool:
    """Whether process ``pid`` has torch's library mapped (its import has begun: Python runs, its
    signal handlers are in place), read from /proc: a state, where a sleep guessed a time."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "libtorch" in f.read()
    except OSError:
        return False
