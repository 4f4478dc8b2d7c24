"""Packaged corpora under faults and on Ray: for every packaged input kind (drawn from the input-kind
registry: tar, .tar.gz, Parquet, lhotse Shar), kill -9 mid-run then resume gives exactly the
uninterrupted result; ``--engine ray`` actors read the shards themselves (by offset, by row group) and
give the local result, into Parquet and Shar outputs too."""

import os
import random
from dataclasses import replace

import numpy as np
import pytest

from support import extract
from mimi_extract.config.settings import Settings
from support import check_consistency
from support import OnDemand, write_noise
from support.kill_trials import KillTrial, kill_9_then_resume
from support.registered import kind_case, kind_cases


@pytest.fixture(scope="module")
def many_packed(tmp_path_factory):
    """The same 120 short samples (0.2-1.2 s, two rates) as an input of each kind (its KindCase's
    build: tests/support/registered.py): three WebDataset shards, a .tar.gz, a Parquet file (datasets'
    Audio struct, 30-row groups), a lhotse Shar written by lhotse itself..."""
    root = tmp_path_factory.mktemp("many-packed")
    loose = root / "loose"
    loose.mkdir()
    rng = np.random.default_rng(0)
    for i in range(120):
        rate = 16_000 if i % 3 == 0 else 24_000
        write_noise(loose / f"f{i:03d}.flac", int(rate * (0.2 + rng.random())), rate, rng)
    names = sorted(os.listdir(loose))
    return OnDemand(lambda kind: kind_case(kind).build(str(loose), names, str(tmp_path_factory.mktemp(kind))))


@pytest.fixture(scope="module")
def packed_reference(many_packed, tiny_model_dir, tmp_path_factory):
    """Each kind's uninterrupted run (HDF5), once a test asks for it."""
    def run(kind):
        out = str(tmp_path_factory.mktemp(f"ref-{kind}") / "out")
        assert extract(many_packed[kind], out, Settings(model=tiny_model_dir, tap="codes", num_workers=1),
                       shard_size=7).ok == 120
        return check_consistency(out)

    return OnDemand(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", kind_cases("kill_9"))
def test_an_input_kind_kill_9_then_resume_equals_uninterrupted(kind, many_packed, packed_reference, tiny_model_dir,
                                                               tmp_path):
    """kill -9 part-way (its process group), then the resume equals the uninterrupted run of the same
    input exactly."""
    kill_9_then_resume(many_packed[kind], str(tmp_path / "out"), tiny_model_dir, packed_reference[kind],
                       [KillTrial("1", (5, 30))], random.Random(3))


@pytest.mark.slow
def test_tar_on_ray_equals_local(many_packed, tiny_model_dir, packed_reference, ray_cluster, tmp_path):
    out = str(tmp_path / "out")
    settings = Settings(model=tiny_model_dir, tap="codes", num_workers=1, engine="ray", ray_cpu_actors=2)
    summary = extract(many_packed["tar"], out, settings, limit=40)
    assert summary.ok == 40
    got = check_consistency(out)
    assert len(got) == 40 and all(np.array_equal(got[k], packed_reference["tar"][k]) for k in got)
    assert all(k.startswith("part-000000.tar/") for k in got)


@pytest.mark.slow
@pytest.mark.parametrize("kind, fmt", [("parquet", "parquet"), ("shar", "shar")])
def test_packed_inputs_on_ray_into_every_format(kind, fmt, many_packed, packed_reference, tiny_model_dir, ray_cluster,
                                                tmp_path):
    """Ray actors read Parquet row groups and Shar members themselves (on the session's cluster); the
    output written as Parquet or Shar equals the local HDF5 run of the same input, array for array."""
    out = str(tmp_path / "out")
    settings = Settings(model=tiny_model_dir, tap="codes", num_workers=1, engine="ray", ray_cpu_actors=2)
    summary = extract(many_packed[kind], out, replace(settings, format=fmt), limit=40)
    assert summary.ok == 40
    got = check_consistency(out)
    assert len(got) == 40 and all(np.array_equal(got[k], packed_reference[kind][k]) for k in got)


@pytest.mark.slow
@pytest.mark.parametrize("kind", kind_cases("parts"))
def test_packed_parts_union_equals_a_whole_run(kind, many_packed, packed_reference, tiny_model_dir, tmp_path):
    """--part by key hash over a packaged input: two parts into one OUT hold every item once,
    each equal to the whole run's."""
    from mimi_extract.config.settings import Part

    out = str(tmp_path / "out")
    settings = Settings(model=tiny_model_dir, tap="codes", num_workers=1)
    counts = [extract(many_packed[kind], out, settings, part=Part(i, 2)).ok for i in range(2)]
    assert sum(counts) == 120 and all(counts)
    from mimi_extract.store.identity import read_run_info

    infos = [read_run_info(os.path.join(out, Part(i, 2).dirname)) for i in range(2)]
    if kind == "shar":  # three shards: whole shards (0 and 2, then 1), each part's identity only its own files
        assert [len(i["part_shards"]) for i in infos] == [3, 3]
        assert [sorted(os.path.basename(s[0]) for s in i["input_identity"]["shards"]) for i in infos] == [
            ["cuts.000000.jsonl.gz", "cuts.000002.jsonl.gz", "recording.000000.tar", "recording.000002.tar"],
            ["cuts.000001.jsonl.gz", "recording.000001.tar"]]
        assert counts == [80, 40]
    else:  # one file, two parts: divided by key (no part idle)
        assert all("part_shards" not in i for i in infos)
    got = check_consistency(out)
    assert set(got) == set(packed_reference[kind])
    assert all(np.array_equal(got[k], packed_reference[kind][k]) for k in got)
