"""Object storage as INPUT (and OUT): tar, Parquet and Shar read from ``s3://`` give, bit for bit,
what the same files give from local disk, and a rewritten object refuses a resume as a rewritten
local shard does.  The S3 endpoint is real: moto's server on a free loopback port, spoken to by
s3fs through HTTP (nothing of fsspec is mocked).  See docs/object-storage.md."""

import functools
import os
import re
import shutil
import subprocess
import sys

import pytest

from mimi_extract.store.files import OutputError
from mimi_extract.store.identity import read_run_info
from mimi_extract.store.manifest import read_manifest
from mimi_extract.store.mirror import SEGMENTS
from support import extract
from mimi_extract.sources import Options, discover
from support import check_consistency, interrupt_after_items
from support import ONE_WORKER, cli
from support.s3_server import BUCKET, s3_fixture
from support.corpora import FILES, assert_equal_arrays, settings, write_tar


s3 = s3_fixture()  # moto's server on loopback, with its request log (tests/support/s3_server.py)


def upload(fs, local: str, name: str) -> str:
    """A local folder copied to ``s3://BUCKET/name`` (its files, recursively); the URL."""
    url = f"s3://{BUCKET}/{name}"
    fs.put(local.rstrip("/") + "/", url + "/", recursive=True)
    fs.invalidate_cache()
    return url


def same_outputs(got: str, want: str) -> None:
    """Two OUTs with the same keys, bit-identical arrays and the same manifest rows (but paths)."""
    assert_equal_arrays(check_consistency(got), check_consistency(want))

    def rows(out):
        return sorted((r["key"], r["status"], r.get("frames"), r.get("sha256") or r.get("checksum"))
                      for r in read_manifest(out))

    assert rows(got) == rows(want)


@pytest.mark.parametrize("kind", ["tar", "parquet", "parquet-saved", "shar"])
def test_s3_input_equals_the_local_copy(kind, s3, shards, hf_dataset, shar, tiny_model_dir, tmp_path):  # noqa: F811 (fixtures)
    """Each packed kind read through s3:// (a folder, a brace pattern, a glob) equals, key for key
    and bit for bit, the same files read from disk; run.json records the URLs and their ETags."""
    local, remote_path, options = {
        "tar": (shards, "en-{000000..000001}.tar", Options(id_field="id")),
        "parquet": (os.path.join(hf_dataset, "data"), "train-*.parquet", Options(id_column="id")),
        "parquet-saved": (os.path.join(hf_dataset, "saved"), "", Options(id_column="id")),
        "shar": (shar, "", Options()),
    }[kind]
    url = upload(s3, local, kind)
    source = f"{url}/{remote_path}" if remote_path else url
    found = discover(source, options=options)
    assert found.kind == kind.split("-")[0] and len(found.items) == len(FILES) and not found.bad
    here, there = str(tmp_path / "local"), str(tmp_path / "s3")
    assert extract(local, here, settings(tiny_model_dir), options=options).ok == len(FILES)
    assert extract(source, there, settings(tiny_model_dir), options=options).ok == len(FILES)
    same_outputs(there, here)
    info = read_run_info(there)
    assert info["input"] == source.rstrip("/")
    listed = next(iter(info["input_identity"].values()))
    assert listed and all(path.startswith(f"s3://{BUCKET}/{kind}/") and size > 0 and len(tag) == 32
                          for path, size, tag in listed)  # (moto's ETag: the MD5 of a single-part upload)
    rows = [r for r in read_manifest(there) if r["status"] == "ok"]
    assert all(r["source"]["path"].startswith(f"s3://{BUCKET}/{kind}/") for r in rows)


def test_a_shared_cell_over_the_limit_on_s3_is_refused_page_by_page(s3, loose, tmp_path, monkeypatch):  # noqa: F811
    """On object storage too, a cell over MIMI_EXTRACT_MAX_CELL_MB that shares its row group is
    refused from its page (the row group read page by page, once: not decoded by pyarrow); the
    other rows are items, their cells as pyarrow reads them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mimi_extract.sources import parquet as parquet_source

    with open(os.path.join(loose, "a.flac"), "rb") as f:
        small = f.read()
    big = small + b"\0" * (300_000 - len(small))  # 0.29 MiB: over a 0.25 MiB limit
    audio = pa.array([{"bytes": small, "path": "a.flac"}, {"bytes": big, "path": "big.flac"},
                      {"bytes": small, "path": "c.flac"}], pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    os.makedirs(tmp_path / "cells")
    pq.write_table(pa.table({"audio": audio}), tmp_path / "cells" / "x.parquet", row_group_size=3)
    url = upload(s3, str(tmp_path / "cells"), "cells") + "/x.parquet"
    monkeypatch.setenv(parquet_source.MAX_CELL_ENV, "0.25")
    assert isinstance(parquet_source._group_column(url, 0, "audio"), parquet_source.PageCells)
    found = discover(url)
    assert sorted(it.key for it in found.items) == ["x.parquet/0", "x.parquet/2"]
    assert [it.error for it in found.bad] == ["x.parquet:row 1: audio cell of 0.3 MiB is over the 0.25 MiB limit of "
                                              "one Parquet cell (set MIMI_EXTRACT_MAX_CELL_MB to raise it)"]
    buffer, name = parquet_source._cell(url, 0, 2, "audio")
    assert buffer.to_pybytes() == small and name == "c.flac"


def test_cli_codes_from_s3_in_a_worker_process(s3, shards, loose_run, tiny_model_dir, tmp_path):  # noqa: F811
    """The CLI, one worker process opening the objects itself (each process its own s3fs client)."""
    url = upload(s3, shards, "cli-tar")
    out = str(tmp_path / "out")
    result = cli("codes", url, out, "--model", tiny_model_dir, "--id-field", "id", *ONE_WORKER)
    assert result.exit_code == 0, result.text
    assert_equal_arrays(check_consistency(out), loose_run)


def test_a_rewritten_object_refuses_the_resume(s3, loose, tiny_model_dir, tmp_path):  # noqa: F811
    """The identity of an object is its size and ETag: rewritten with other bytes, the resume is
    refused (as for a local shard with another mtime) and --reencode-changed encodes its items
    again; the same bytes uploaded again are the same version (the ETag is their MD5)."""
    names = sorted(FILES)
    first, second = write_tar(tmp_path / "en-000000.tar", loose, names[:3]), \
        write_tar(tmp_path / "en-000001.tar", loose, names[3:])
    url = f"s3://{BUCKET}/changed"
    s3.put(first, f"{url}/en-000000.tar")
    s3.put(second, f"{url}/en-000001.tar")
    out = str(tmp_path / "out")
    run = functools.partial(extract, url, out, settings(tiny_model_dir), shard_size=1, options=Options(id_field="id"))
    assert run().ok == len(FILES)
    s3.put(second, f"{url}/en-000001.tar")  # the same bytes again: not a change (resumed, nothing to do)
    assert run().skipped == len(FILES)
    write_tar(tmp_path / "other.tar", loose, names[3:], extra=[("zz.txt", b"another member")])
    s3.put(str(tmp_path / "other.tar"), f"{url}/en-000001.tar")
    with pytest.raises(OutputError, match="en-000001.tar"):
        run()
    summary = run(reencode_changed=True)
    assert summary.ok == 3 and summary.skipped == 3, summary
    assert summary.errors == 1  # the new version's extra member (no audio): the object is read as it is now
    assert "1 rewritten input shard(s) (en-000001.tar)" in summary.notes[0]
    assert read_run_info(out)["input_identity"]["shards"][1][2] == s3.info(f"{url}/en-000001.tar")["ETag"].strip('"')


# -- OUT on object storage ------------------------------------------------------------------------
def remote_names(fs, url: str) -> list[str]:
    fs.invalidate_cache()
    root = url.removeprefix("s3://")
    return sorted(p.removeprefix(root + "/") for p in fs.find(root))


def pulled(url: str, where: str) -> str:
    """The remote OUT as a reader sees it: its committed state pulled into a fresh folder."""
    from mimi_extract.store.mirror import pull

    pull(url, where)
    return where


@pytest.mark.parametrize("fmt", ["hdf5", pytest.param("parquet", marks=pytest.mark.slow),
                                 pytest.param("shar", marks=pytest.mark.slow),
                                 pytest.param("megatron", marks=pytest.mark.slow)])
def test_s3_out_resumes_after_an_interruption_on_another_machine(fmt, s3, shards, tiny_model_dir, tmp_path,  # noqa: F811
                                                                 monkeypatch):
    """OUT on s3://: interrupted after two items (one item per shard), the remote holds committed
    shards and their manifest segments; a resume from an empty staging (another machine), over a
    stale lock and an orphan shard (a kill between a shard's PUT and its segment's), completes it,
    bit for bit what a local OUT holds, and leaves no lock, orphan or older manifest generation."""
    if fmt == "shar":
        pytest.importorskip("lhotse")
    from mimi_extract.store.mirror import SEGMENTS

    monkeypatch.setenv("MIMI_EXTRACT_STAGING", str(tmp_path / "staging"))
    run = functools.partial(extract, shards, settings=settings(tiny_model_dir, format=fmt), shard_size=1,
                            options=Options(id_field="id"))
    local = str(tmp_path / "local")
    assert run(out_dir=local).ok == len(FILES)
    url = f"s3://{BUCKET}/out-{fmt}"
    with pytest.raises(KeyboardInterrupt):
        run(out_dir=url, on_progress=interrupt_after_items(2))
    names = remote_names(s3, url)
    assert "lock" not in names and "run.json" in names and any(n.startswith(SEGMENTS + "/") for n in names)
    partial = check_consistency(pulled(url, str(tmp_path / "partial")))
    assert 2 <= len(partial) < len(FILES)
    # what a kill -9 leaves: a lock whose lease ran out, a shard PUT whose segment never was
    s3.pipe(f"{url}/lock", b'{"pid": 1, "host": "gone", "expires": 0}')
    shard = next(r["shard"] for r in read_manifest(str(tmp_path / "partial")) if r["status"] == "ok")
    orphan = re.sub(r"\d{5,}", lambda m: "9" * len(m.group()), shard, count=1)  # a later shard number
    s3.pipe(f"{url}/{orphan}", b"a half-committed shard")
    shutil.rmtree(tmp_path / "staging")  # another machine: nothing staged
    summary = run(out_dir=url)
    assert summary.skipped == len(partial) and summary.ok == len(FILES) - len(partial)
    names = remote_names(s3, url)
    assert "lock" not in names and orphan not in names, names
    assert len({n.split("/")[1].split("-")[0] for n in names if n.startswith(SEGMENTS)}) == 1  # one generation
    same_outputs(pulled(url, str(tmp_path / "final")), local)


@pytest.mark.parametrize("fmt,engine", [("hdf5", "processes"), pytest.param("shar", "processes", marks=pytest.mark.slow),
                                        pytest.param("hdf5", "ray", marks=pytest.mark.slow)])
def test_s3_out_written_by_several_workers_resumes_to_the_whole_result(fmt, engine, s3, shards, tiny_model_dir,  # noqa: F811
                                                                       tmp_path, monkeypatch, request):
    """OUT on s3:// written by two device workers, or two Ray actors (each builds and writes its own
    shards in the staging, the runner commits and mirrors them): interrupted part-way, the remote
    holds only committed shards (no worker's temporary); resumed from another machine's empty
    staging, it is, bit for bit, what a local one-process run writes."""
    if fmt == "shar":
        pytest.importorskip("lhotse")
    monkeypatch.setenv("MIMI_EXTRACT_STAGING", str(tmp_path / "staging"))
    local = str(tmp_path / "local")
    options = Options(id_field="id")
    assert extract(shards, local, settings(tiny_model_dir, format=fmt), shard_size=1, options=options).ok == len(FILES)
    if engine == "ray":
        request.getfixturevalue("ray_cluster")
        two = settings(tiny_model_dir, format=fmt, engine="ray", ray_cpu_actors=2)
    else:
        two = settings(tiny_model_dir, format=fmt, devices=("cpu", "cpu"))
    url = f"s3://{BUCKET}/out-two-{fmt}-{engine}"
    with pytest.raises(KeyboardInterrupt):
        extract(shards, url, two, shard_size=1, options=options, on_progress=interrupt_after_items(2))
    names = remote_names(s3, url)
    assert not any(n.endswith(".tmp") for n in names) and "lock" not in names, names
    partial = check_consistency(pulled(url, str(tmp_path / "partial")))
    assert 2 <= len(partial) <= len(FILES)
    shutil.rmtree(tmp_path / "staging")  # another machine: nothing staged
    summary = extract(shards, url, two, shard_size=1, options=options)
    assert summary.skipped == len(partial) and summary.ok == len(FILES) - len(partial)
    same_outputs(pulled(url, str(tmp_path / "final")), local)


def test_a_live_lock_object_refuses_a_second_run(s3, shards, tiny_model_dir, tmp_path, monkeypatch):  # noqa: F811
    """A lock object whose lease runs (another machine writing this OUT) refuses the run, and
    nothing of the remote OUT is touched."""
    import json
    import time

    from mimi_extract.store.files import LockedError

    monkeypatch.setenv("MIMI_EXTRACT_STAGING", str(tmp_path / "staging"))
    url = f"s3://{BUCKET}/locked"
    s3.pipe(f"{url}/lock", json.dumps({"pid": 7, "host": "elsewhere", "expires": time.time() + 600}).encode())
    with pytest.raises(LockedError, match="pid 7 on elsewhere holds this OUT's lock") as refused:
        extract(shards, url, settings(tiny_model_dir), options=Options(id_field="id"))
    assert remote_names(s3, url) == ["lock"]
    # the message says the holder may be gone, and when its lock can be taken over
    assert "or it was stopped" in str(refused.value) and re.search(r"taken over in \d+ s, at \d\d:\d\d:\d\d UTC",
                                                                   str(refused.value)), refused.value


def test_a_lock_object_is_taken_over_at_once_only_from_a_holder_certainly_gone(s3, tmp_path, monkeypatch):
    """A lock object whose lease runs is taken over before it ends only when its holder ran on this
    host, since this boot, in this PID namespace, and is gone (its PID runs no more, or runs a
    process started at another time: a reused PID); a live holder, or one that may be alive where
    this machine cannot see (another host, another container's PID namespace, a record without
    these fields), keeps it."""
    import json
    import time

    from mimi_extract.store.files import LockedError
    from mimi_extract.store.lock import process_identity
    from mimi_extract.store.mirror import RemoteLock

    me = process_identity()
    assert {"pid", "host", "boot", "pidns", "start"} <= set(me)  # (Linux: /proc)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a process of this host that ran and is gone (its PID is not reused this soon)
    url = f"s3://{BUCKET}/takeover"
    lease = time.time() + 600
    cases = {"alive (this process)": (me, False), "gone": ({**me, "pid": gone.pid}, True),
             "a reused PID": ({**me, "start": me["start"] - 1}, True),
             "another host": ({**me, "pid": gone.pid, "host": "elsewhere"}, False),
             "another PID namespace": ({**me, "pid": gone.pid, "pidns": "pid:[1]"}, False),
             "another boot": ({**me, "pid": gone.pid, "boot": "another"}, False),
             "no identity (an older record)": ({"pid": gone.pid, "host": me["host"]}, False)}
    for case, (holder, taken) in cases.items():
        s3.pipe(f"{url}/lock", json.dumps({**holder, "expires": lease}).encode())
        lock = RemoteLock(url)
        if taken:
            lock.acquire()
            assert json.loads(s3.cat_file(f"{url}/lock"))["pid"] == os.getpid(), case
            lock.release()
        else:
            with pytest.raises(LockedError, match="holds this OUT's lock"):
                lock.acquire()
            assert json.loads(s3.cat_file(f"{url}/lock")) == {**holder, "expires": lease}, case


def test_a_resume_right_after_a_kill_9_on_this_host_takes_the_lock_over(s3, tiny_model_dir, tmp_path, monkeypatch):
    """kill -9 of a run writing an s3:// OUT leaves its lock object with most of its lease (120 s)
    to run.  The resume right after it on the same host (a Slurm requeue) takes the lock over at
    once: its holder's PID runs no more (it was refused until the lease ran out, naming the dead
    process as "writing this OUT").  The resumed OUT equals an uninterrupted run."""
    import json
    import signal
    import time

    import numpy as np

    from support import cli_process, write_noise

    corpus = tmp_path / "in"
    corpus.mkdir()
    rng = np.random.default_rng(0)
    for i in range(60):
        write_noise(corpus / f"f{i:02d}.wav", int(24_000 * (0.2 + rng.random())), 24_000, rng)
    local = str(tmp_path / "local")
    assert extract(str(corpus), local, settings(tiny_model_dir), shard_size=3).ok == 60
    monkeypatch.setenv("MIMI_EXTRACT_STAGING", str(tmp_path / "staging"))
    monkeypatch.delenv("MIMI_EXTRACT_LOCK_LEASE", raising=False)
    url = f"s3://{BUCKET}/killed"
    proc = cli_process("codes", corpus, url, "--model", tiny_model_dir, "--shard-size", 3, "--device", "cpu",
                       "--cpu-workers", "1", "--num-workers", "1", start_new_session=True)
    while not [n for n in remote_names(s3, url) if n.startswith(SEGMENTS)]:  # a shard committed in the bucket
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    s3.invalidate_cache()
    left = json.loads(s3.cat_file(f"{url}/lock"))
    assert left["pid"] == proc.pid and left["expires"] > time.time() + 30  # its lease runs on
    summary = extract(str(corpus), url, settings(tiny_model_dir), shard_size=3)
    assert summary.skipped > 0 and summary.skipped + summary.ok == 60, summary
    assert "lock" not in remote_names(s3, url)
    same_outputs(pulled(url, str(tmp_path / "pulled")), local)
