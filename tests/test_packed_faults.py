"""A tar corpus under faults and on Ray: kill -9 mid-run then resume gives exactly the uninterrupted
result; ``--engine ray`` actors read the shards themselves by offset and give the local result."""

import os
import random
import tarfile

import numpy as np
import pytest

from mimi_extract.runner import extract
from mimi_extract.settings import Settings
from mimi_extract.testing import check_consistency
from conftest import write_noise
from test_integrity import _check_after_kill, _kill_9_part_way, _start_kill_trial, assert_same, no_processes_left


@pytest.fixture(scope="module")
def many_tar(tmp_path_factory):
    """120 short samples (0.2-1.2 s, two rates) in three WebDataset shards, flac + json each."""
    root = tmp_path_factory.mktemp("many-tar")
    loose = root / "loose"
    loose.mkdir()
    rng = np.random.default_rng(0)
    for i in range(120):
        rate = 16_000 if i % 3 == 0 else 24_000
        write_noise(loose / f"f{i:03d}.flac", int(rate * (0.2 + rng.random())), rate, rng)
    shards = root / "shards"
    shards.mkdir()
    for s in range(3):
        with tarfile.open(shards / f"part-{s:06d}.tar", "w") as tf:
            for i in range(s * 40, s * 40 + 40):
                tf.add(loose / f"f{i:03d}.flac", arcname=f"f{i:03d}.flac")
    return str(shards / "part-{000000..000002}.tar")


@pytest.fixture(scope="module")
def tar_reference(many_tar, tiny_model_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("tar-ref") / "out")
    assert extract(many_tar, out, Settings(model=tiny_model_dir, tap="codes", num_workers=1), shard_size=7)["ok"] == 120
    return check_consistency(out)


def test_tar_kill_9_then_resume_equals_uninterrupted(many_tar, tiny_model_dir, tar_reference, tmp_path):
    out = str(tmp_path / "out")
    proc, done = _start_kill_trial(many_tar, out, tiny_model_dir, "1")
    assert done == 0
    at_kill = _kill_9_part_way(proc, out, random.Random(1).randint(5, 30), random.Random(2), group=True)
    assert no_processes_left(proc.pid)
    kept = _check_after_kill(out, tar_reference)
    assert at_kill <= len(kept) < 120
    summary = extract(many_tar, out, Settings(model=tiny_model_dir, tap="codes", num_workers=1), shard_size=7)
    assert summary["skipped"] == len(kept) and summary["ok"] == 120 - len(kept)
    assert_same(out, tar_reference)


def test_tar_on_ray_equals_local(many_tar, tiny_model_dir, tar_reference, tmp_path):
    pytest.importorskip("ray")
    out = str(tmp_path / "out")
    settings = Settings(model=tiny_model_dir, tap="codes", num_workers=1, engine="ray", ray_cpu_actors=2)
    summary = extract(many_tar, out, settings, limit=40)
    assert summary["ok"] == 40
    got = check_consistency(out)
    assert len(got) == 40 and all(np.array_equal(got[k], tar_reference[k]) for k in got)
    assert all(k.startswith("part-000000.tar/") for k in got)
