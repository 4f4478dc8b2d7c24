"""Job-array parts on one shared OUT: each part alone, the union equal to one full run."""

import json
import os
import shutil
import signal

import numpy as np
import pytest
import soundfile as sf

from support import ONE_WORKER, cli, cli_process, write_noise
from mimi_extract import read, read_manifest
from mimi_extract.config.settings import Part
from mimi_extract.engines.plan import part_of
from support import extract
from mimi_extract.config.settings import Settings
from support import check_consistency
from support.waits import wait_for


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    rng = np.random.default_rng(3)
    for i in range(36):
        write_noise(root / f"u{i:02d}.wav", int(24_000 * (0.2 + rng.random())), rng=rng)
    return root


def settings(model_dir):
    return Settings(model=model_dir, tap="codes", num_workers=1)


def test_parts_equal_one_full_run(files, tiny_model_dir, tmp_path):
    full = str(tmp_path / "full")
    extract(str(files), full, settings(tiny_model_dir))
    whole = check_consistency(full)
    out = str(tmp_path / "parts")
    for i in range(3):
        summary = extract(str(files), out, settings(tiny_model_dir), part=Part(i, 3))
        assert summary.run_dir == os.path.join(out, Part(i, 3).dirname)
        # length-sorted batching happens inside each part: only that part's keys
        assert {r["key"] for r in read_manifest(summary.run_dir)} == {k for k in whole if part_of(k, 3) == i}
    union = check_consistency(out, whole.keys())
    assert all(np.array_equal(union[k], whole[k]) for k in whole)
    assert all(np.array_equal(read(out, k), whole[k]) for k in list(whole)[:5])
    status = cli("status", out)
    assert status.exit_code == 0 and "complete: 36 ok, 0 errors, 0 not yet encoded" in status.text, status.output
    report = json.loads(cli("status", out, "--json").output)
    assert sorted(report["runs"]) == [Part(i, 3).dirname for i in range(3)] and report["complete"]


def committed_ok(run_dir: str) -> int:
    return sum(r["status"] == "ok" for r in read_manifest(run_dir)) if os.path.isdir(run_dir) else 0


@pytest.mark.slow
def test_part_killed_and_rerun_alone(files, tiny_model_dir, tmp_path):
    """Part 1 is killed mid-run (frozen with SIGSTOP as soon as its first shard is committed, so the
    kill lands with some items done and some not), then rerun alone; part 2 runs as a Slurm task.
    The union equals one full run, array for array."""
    full = str(tmp_path / "full")
    extract(str(files), full, settings(tiny_model_dir))
    whole = check_consistency(full)
    out = str(tmp_path / "out")
    extract(str(files), out, settings(tiny_model_dir), part=Part(0, 3))
    part1 = os.path.join(out, Part(1, 3).dirname)
    in_part1 = sum(part_of(k, 3) == 1 for k in whole)
    proc = cli_process("codes", files, out, "--model", tiny_model_dir, "--part", "1/3", "--shard-size", 1, *ONE_WORKER)
    wait_for(lambda: committed_ok(part1) > 0 or proc.poll() is not None, "part 1's first shard", poll=0.005)
    proc.send_signal(signal.SIGSTOP)
    done_before_kill = committed_ok(part1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 0 < done_before_kill < in_part1, (done_before_kill, in_part1)  # killed mid-run
    check_consistency(part1, killed=True)  # consistent as the kill left it
    status = cli("status", out)
    assert "part 2/3: not started" in status.text and "incomplete" in status.text, status.output
    info = json.loads(cli("info", out, "--json").output)  # inputs as planned, not rows written
    assert info["inputs"] == 36 - sum(part_of(k, 3) == 2 for k in whole) and info["pending"] == in_part1 - done_before_kill
    assert cli("codes", files, out, "--model", tiny_model_dir, "--part", "1/3", *ONE_WORKER).exit_code == 0
    env = {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "0"}
    result = cli("codes", files, out, "--model", tiny_model_dir, "--part", "slurm", *ONE_WORKER, env=env)
    assert result.exit_code == 0, result.output
    union = check_consistency(out, whole.keys())
    assert all(np.array_equal(union[k], whole[k]) for k in whole)
    assert "complete" in cli("status", out).text


def test_added_files_keep_their_parts(files, tiny_model_dir, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(files, src)
    out = str(tmp_path / "out")
    for i in range(2):
        extract(str(src), out, settings(tiny_model_dir), part=Part(i, 2))
    before = {r["key"]: r["shard"].split("/")[0] for r in read_manifest(out)}
    for i in range(8):
        sf.write(str(src / f"new{i}.wav"), np.zeros(4000, np.float32), 24_000)
    runs = [extract(str(src), out, settings(tiny_model_dir), part=Part(i, 2)) for i in range(2)]
    assert sum(r.ok for r in runs) == 8 and sum(r.skipped for r in runs) == 36  # only the new files
    after = {r["key"]: r["shard"].split("/")[0] for r in read_manifest(out)}
    assert all(after[k] == v for k, v in before.items())
    check_consistency(out, set(before) | {f"new{i}.wav" for i in range(8)})


def test_layouts_are_not_mixed(files, tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    assert cli("codes", files, out, "--model", tiny_model_dir, "--part", "0/2", "--limit", 2, *ONE_WORKER).exit_code == 0
    other_n = cli("codes", files, out, "--model", tiny_model_dir, "--part", "0/3", *ONE_WORKER)
    assert other_n.exit_code == 2 and "N=2, not N=3" in other_n.text
    whole = cli("codes", files, out, "--model", tiny_model_dir, *ONE_WORKER)
    assert whole.exit_code == 2 and "holds parts of a job array" in whole.text
    no_slurm = {name: None for name in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN")}
    bad = cli("codes", files, tmp_path / "o2", "--model", tiny_model_dir, "--part", "slurm", *ONE_WORKER, env=no_slurm)
    assert bad.exit_code == 2 and "SLURM_ARRAY_TASK_ID is not set" in bad.text


def test_parts_with_other_settings_are_refused(files, tiny_model_dir, tmp_path):
    """Every part of one OUT must come from the same input, model and settings: a part run with
    other codebooks or other weights would make a union that means nothing."""
    from mimi_extract.codec.demo import random_model

    out = tmp_path / "out"
    assert cli("codes", files, out, "--model", tiny_model_dir, "--part", "0/2", *ONE_WORKER).exit_code == 0
    fewer = cli("codes", files, out, "--model", tiny_model_dir, "--part", "1/2", "-q", 4, *ONE_WORKER)
    assert fewer.exit_code == 2 and "another part of this job array" in fewer.text and "num_quantizers" in fewer.text
    other = str(tmp_path / "other-weights")
    random_model(seed=1).save_pretrained(other)
    weights = cli("codes", files, out, "--model", other, "--part", "1/2", *ONE_WORKER)
    assert weights.exit_code == 2 and "other checkpoint" in weights.text, weights.output
    assert not os.path.exists(out / Part(1, 2).dirname / "manifest.jsonl")
    same = cli("codes", files, out, "--model", tiny_model_dir, "--part", "1/2", *ONE_WORKER)
    assert same.exit_code == 0, same.output
    check_consistency(str(out), {f"u{i:02d}.wav" for i in range(36)})


@pytest.mark.slow
def test_status_missing_lists_parts_to_resubmit(files, tiny_model_dir, tmp_path):
    """``status OUT --missing``: the parts not complete (never started, stopped after planning) as
    ``sbatch --array=`` takes them; exit 1 while something is missing, 0 once nothing is, 2 when
    OUT is not a run."""
    import threading

    assert cli("status", tmp_path / "nothing", "--missing").exit_code == 2
    out = str(tmp_path / "out")
    for i in (0, 1, 4):
        extract(str(files), out, settings(tiny_model_dir), part=Part(i, 6))
    stopped = threading.Event()
    stopped.set()  # part 2 plans (plan.json) and stops before encoding anything: started, not complete
    extract(str(files), out, settings(tiny_model_dir), part=Part(2, 6), stop=stopped)
    missing = cli("status", out, "--missing")
    assert missing.exit_code == 1 and missing.output == "2-3,5\n", missing.output
    report = json.loads(cli("status", out, "--missing", "--json").output)
    assert report == {"parts": 6, "incomplete_parts": [2, 3, 5], "array": "2-3,5", "incomplete_shards": None}
    by_key = cli("status", out, "--missing", "--shards")  # a folder of files: parts divided by key, no shards
    assert by_key.exit_code == 1 and "by key, not by input shard" in by_key.text
    for i in (2, 3, 5):
        extract(str(files), out, settings(tiny_model_dir), part=Part(i, 6))
    done = cli("status", out, "--missing")
    assert done.exit_code == 0 and done.output == "\n", done.output
    whole = str(tmp_path / "whole")
    extract(str(files), whole, settings(tiny_model_dir), stop=stopped)
    assert cli("status", whole, "--missing").output == "0\n"


def test_array_spec():
    from mimi_extract.audit.outputs import array_spec

    assert array_spec([]) == "" and array_spec([4]) == "4" and array_spec([7, 0, 3, 5, 6]) == "0,3,5-7"
