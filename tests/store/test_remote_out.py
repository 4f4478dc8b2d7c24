"""An OUT on object storage, operated where it lives: status, info, report, cuts, verify, decode and
the reader take its URL and answer what they answer for a local copy of the same run; the manifest-
only commands read run.json, plan.json and the manifest segments, never a shard (counted at the
server); a job array's root is the union of its parts; the cuts resolve on any machine; a byte
flipped inside a stored array is found and re-encoded.  The S3 endpoint is real: moto's server on
loopback, spoken to by s3fs over HTTP (tests/support/s3_server.py)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil

import numpy as np
import pytest

import mimi_extract
from support import extract
from mimi_extract.store.manifest import format_of_path, read_manifest
from support import cli
from support import check_consistency
from support.s3_server import BUCKET, s3_fixture
from support.corpora import FILES, assert_equal_arrays, settings


s3 = s3_fixture()
# the module's tests in one pytest-xdist process: its S3 server and OUTs (each format's, local and in the
# bucket) are then made once, not once in each process that runs one of them (scripts/test.sh: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("remote_out")
SHARD_RE = re.compile(r"shard-\d+\.(h5|parquet|idx|bin)$|\.tar$")  # a shard object's name (HDF5, Parquet, Megatron, Shar)
FORMATS = ["hdf5", pytest.param("parquet", marks=pytest.mark.slow), pytest.param("shar", marks=pytest.mark.slow),
           pytest.param("megatron", marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def made(s3, loose, tiny_model_dir, tmp_path_factory):  # noqa: F811
    """``made(fmt)`` -> (local OUT, URL): the loose files encoded into a local OUT and into one on s3
    (two items a shard), the second's staging removed afterwards: the bucket is all there is of it."""
    root = tmp_path_factory.mktemp("remote-out")
    done = {}

    def make(fmt: str) -> tuple[str, str]:
        if fmt not in done:
            if fmt == "shar":
                pytest.importorskip("lhotse")
            local, url = str(root / f"local-{fmt}"), f"s3://{BUCKET}/ops-{fmt}"
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("MIMI_EXTRACT_STAGING", str(root / "staging"))
                for out in (local, url):
                    assert extract(loose, out, settings(tiny_model_dir, format=fmt), shard_size=2).ok == len(FILES)
            shutil.rmtree(root / "staging")
            done[fmt] = (local, url)
        return done[fmt]

    return make


def ok_json(*args) -> dict:
    result = cli(*args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def without(report: dict, *keys) -> dict:
    return {k: v for k, v in report.items() if k not in keys}


@pytest.mark.parametrize("fmt", FORMATS)
def test_operations_commands_on_a_remote_out_answer_as_on_a_local_one(fmt, made, s3, tmp_path):
    """status (--json, --missing), info, report (full: arrays by ranged reads; --manifest-only),
    verify --checksums and the reader on s3:// give what they give for a local OUT of the same run
    (before: 'holds no mimi-extract run (no run.json)', 'does not exist')."""
    local, url = made(fmt)
    here, there = ok_json("status", local, "--json"), ok_json("status", url, "--json")
    for report in (here, there):
        for run in report["runs"].values():
            run.pop("updated")
    assert there == here and there["complete"] and there["ok"] == len(FILES)
    missing = cli("status", url, "--missing")
    assert missing.exit_code == 0 and missing.stdout.strip() == ""
    plain = cli("status", url)
    assert plain.exit_code == 0 and "complete: 6 ok, 0 errors" in plain.stdout
    here, there = ok_json("info", local, "--json"), ok_json("info", url, "--json")
    assert without(there, "shards", "bytes") == without(here, "shards", "bytes")
    assert set(there["shards"]) == set(here["shards"]) and len(there["shards"]) == 3
    for shard, size in there["shards"].items():  # sizes from the listing: the objects' own, companions included
        companions = format_of_path(shard).companions(shard)
        assert size == sum(s3.info(f"{url}/{name}")["size"] for name in [shard] + companions)
    for extra in ([], ["--manifest-only"]):
        here = ok_json("report", local, "--json", "--workers", "1", *extra)
        there = ok_json("report", url, "--json", "--workers", "1", *extra)
        assert without(there, "out") == without(here, "out") and there["out"] == url and not there["damaged"]
    assert there["items"] == len(FILES)
    checked = cli("verify", "--out", url, "--checksums")
    assert checked.exit_code == 0 and "6 stored items read, 6 against their checksums; 0 damaged; PASS" in checked.output
    reader = mimi_extract.open(url)
    assert_equal_arrays(dict(reader), check_consistency(local))
    assert np.array_equal(mimi_extract.read(url, reader.keys()[0]), reader[reader.keys()[0]])
    item = reader.dataset()[0]
    assert item["key"] == reader.keys()[0] and np.array_equal(item["data"].numpy(), reader[item["key"]])


def test_decode_and_verify_a_sample_of_a_remote_out(made, tmp_path):
    """``decode URL KEY`` writes what it writes from the local copy; ``verify --out URL --sample``
    re-encodes items of the bucket's OUT and finds them equal to what it stores."""
    import soundfile as sf

    local, url = made("hdf5")
    key = sorted(check_consistency(local))[0]
    for out, name in ((local, "here.wav"), (url, "there.wav")):
        result = cli("decode", out, key, "-o", str(tmp_path / name), "--device", "cpu")
        assert result.exit_code == 0, result.output
    assert np.array_equal(sf.read(tmp_path / "there.wav")[0], sf.read(tmp_path / "here.wav")[0])
    audited = cli("verify", "--out", url, "--sample", "2", "--device", "cpu")
    assert audited.exit_code == 0 and "2 files compared, 0 errors" in audited.output, audited.output


def test_training_reads_the_bucket_in_dataloader_workers(made):
    """``mimi_extract.open(url).dataset()`` in a DataLoader with worker processes (each opens its own
    s3fs client and shard handles): every item, equal to the local copy's."""
    import torch

    from mimi_extract.readers.dataset import pad_collate

    local, url = made("hdf5")
    want = check_consistency(local)
    loader = torch.utils.data.DataLoader(mimi_extract.open(url).dataset(), batch_size=2, num_workers=2,
                                         collate_fn=pad_collate)
    seen = {}
    for batch in loader:
        for key, data, length in zip(batch["key"], batch["data"], batch["lengths"]):
            seen[key] = data[:length].numpy()
    assert_equal_arrays(seen, want)


@pytest.mark.slow
def test_the_documented_dataloader_over_a_bucket_spawns_and_drops_cleanly(made, tmp_path):
    """docs/object-storage.md's training script, as written but for the bucket's URL, in a fresh
    interpreter: its spawned workers read every batch; then a loader of the same kind dropped after
    its first batch, whose batch is the local copy's.  The script ends with status 0 and no worker
    crashes (issue 41: each spawned worker of the dropped loader ended with "Unexpected
    segmentation fault encountered in worker", its HDF5 shards open through fsspec's file objects
    left to the interpreter's teardown; readers now close them at exit).  One spawned worker per
    loader where the page says 4 (as tests/readers/test_docs_snippets.py runs outputs.md's): each is
    seconds of imports, the crash was each worker's own, and one shows the spawn, the pickling and
    the ``__main__`` guard (several workers reading a bucket at once:
    test_training_reads_the_bucket_in_dataloader_workers)."""
    import subprocess
    import sys

    from support import ROOT

    local, url = made("hdf5")
    want = check_consistency(local)
    text = open(os.path.join(ROOT, "docs", "object-storage.md")).read()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "multiprocessing_context" in b)
    assert block.count("num_workers=4") == 1, block
    script = block.replace("s3://features/en-codes", url).replace("num_workers=4", "num_workers=1") + """
if __name__ == "__main__":  # (the test's) a loader dropped after its first batch
    import json
    first = next(iter(DataLoader(reader.dataset(), batch_size=2, num_workers=1, collate_fn=pad_collate,
                                 multiprocessing_context="spawn")))
    print(json.dumps({k: d[:n].tolist() for k, d, n in zip(first["key"], first["data"], first["lengths"])}))
"""
    path = tmp_path / "train.py"
    path.write_text(script)
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "segmentation fault" not in (done.stdout + done.stderr).lower(), done.stderr[-3000:]
    first = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(first) == 2 and all(np.array_equal(np.array(v, dtype=np.int16), want[k]) for k, v in first.items())


def test_manifest_only_commands_read_no_shard(made, s3, tmp_path):
    """status, status --missing, status --json, info, report --manifest-only and cuts read run.json,
    plan.json and the manifest segments -- never a shard, never a request per item -- counted at the
    server: every GET is one of those objects, and each is read at most twice (report streams the
    manifest twice)."""
    _, url = made("hdf5")
    prefix = f"/{BUCKET}/{url.split('/', 3)[3]}/"
    names = sorted(p.removeprefix(prefix.lstrip("/")) for p in s3.find(url.removeprefix("s3://")))
    metadata = [n for n in names if n in ("run.json", "plan.json") or n.startswith("manifest.d/")]
    assert len([n for n in names if n.startswith("manifest.d/")]) == 3  # one segment per committed shard
    log = s3.request_log
    counts = {}
    for args in (["status", url], ["status", url, "--missing"], ["status", url, "--json"], ["info", url],
                 ["report", url, "--manifest-only"], ["cuts", url, "-o", str(tmp_path / "c.jsonl.gz")]):
        mark = log.mark()
        result = cli(*args)
        assert result.exit_code == 0, result.output
        requests = log.since(mark)
        gets = [r for r in requests if r.kind == "GET"]
        assert not [r for r in requests if SHARD_RE.search(r.path)], f"{args}: a shard was read"
        assert {r.path.removeprefix(prefix) for r in gets} <= set(metadata), args
        assert len(gets) <= 2 * len(metadata) and not [r for r in requests if r.kind in ("PUT", "POST", "DELETE")]
        counts[" ".join(args[:1] + [a for a in args[2:] if a.startswith("--")])] = (
            len(gets), sum(r.sent for r in gets), sum(r.kind == "LIST" for r in requests),
            sum(r.kind == "HEAD" for r in requests))
    print("\n".join(f"{k}: {g} GETs, {b} bytes, {n} LISTs, {h} HEADs" for k, (g, b, n, h) in counts.items()))


def test_a_job_array_on_s3_is_the_union_of_its_parts(s3, loose, tiny_model_dir, tmp_path, monkeypatch):  # noqa: F811
    """Parts of a job array writing to one s3:// OUT: status names the part not yet run (--missing:
    its index), then every command and a pull take the root as the union of the parts (before: a
    pull of the root returned without error and pulled nothing)."""
    from mimi_extract.store.mirror import pull

    monkeypatch.setenv("MIMI_EXTRACT_STAGING", str(tmp_path / "staging"))
    url = f"s3://{BUCKET}/array"
    run = lambda part: extract(loose, url, settings(tiny_model_dir), shard_size=2, part=part)  # noqa: E731
    from mimi_extract.config.settings import parse_part

    first = run(parse_part("0/2")).ok
    missing = cli("status", url, "--missing")
    assert missing.exit_code == 1 and missing.stdout.strip() == "1", missing.output
    assert "part 1/2: not started" in cli("status", url).stdout
    # status pointed at the complete part's own folder: that part, complete (it said "whole run", "part 1/2:
    # not started", "incomplete"); --missing has nothing for it
    alone = cli("status", f"{url}/part-0-of-2")
    assert alone.exit_code == 0 and "not started" not in alone.stdout and "whole run" not in alone.stdout, alone.output
    assert alone.stdout.startswith(f"part-0-of-2: {first} ok") and "\ncomplete" in alone.stdout, alone.output
    part = ok_json("status", f"{url}/part-0-of-2", "--json")
    assert (part["complete"], part["missing_parts"], part["incomplete_parts"], part["parts"]) == (True, [], [], 2)
    done = cli("status", f"{url}/part-0-of-2", "--missing")
    assert done.exit_code == 0 and done.stdout.strip() == "", done.output
    assert first + run(parse_part("1/2")).ok == len(FILES) and 0 < first < len(FILES)
    status = ok_json("status", url, "--json")
    assert status["complete"] and set(status["runs"]) == {"part-0-of-2", "part-1-of-2"} and status["ok"] == len(FILES)
    assert ok_json("info", url, "--json")["ok"] == len(FILES)
    assert ok_json("report", url, "--json", "--workers", "1")["items"] == len(FILES)
    assert cli("verify", "--out", url, "--checksums").exit_code == 0
    local = str(tmp_path / "whole")
    assert extract(loose, local, settings(tiny_model_dir)).ok == len(FILES)
    assert_equal_arrays(dict(mimi_extract.open(url)), check_consistency(local))
    pulled = pull(url, str(tmp_path / "pulled"))
    assert [os.path.basename(p) for p in pulled] == ["part-0-of-2", "part-1-of-2"]
    assert_equal_arrays(check_consistency(str(tmp_path / "pulled")), check_consistency(local))


@pytest.mark.parametrize("fmt", FORMATS)
def test_cuts_of_a_remote_out_resolve_on_another_machine(fmt, made, s3, tmp_path):
    """The cuts a remote OUT holds point at its objects (before: at the writer's staging folder, on
    no other machine): read with lhotse in a second folder (the writer's staging gone), each cut
    loads the very array of the local copy; a Shar OUT's cuts and tars are read by lhotse straight
    from the bucket (its own URL reader); ``read_cuts(url)`` and ``cuts URL -o FILE`` likewise."""
    lhotse = pytest.importorskip("lhotse")
    from mimi_extract.formats.cuts import register_lhotse_readers

    local, url = made(fmt)
    want = check_consistency(local)
    field = "mimi_codes"
    register_lhotse_readers()
    if fmt != "shar":
        machine = tmp_path / "another-machine"
        machine.mkdir()
        s3.get(f"{url}/cuts.jsonl.gz", str(machine / "cuts.jsonl.gz"))
        cuts = lhotse.CutSet.from_file(str(machine / "cuts.jsonl.gz"))
        assert all(c.custom[field].array.storage_path.startswith(url + "/") for c in cuts)
        assert_equal_arrays({c.id: c.load_custom(field) for c in cuts}, want)
        written = cli("cuts", url, "-o", str(machine / "merged.jsonl.gz"))
        assert written.exit_code == 0, written.output
        assert_equal_arrays({c.id: c.load_custom(field) for c in lhotse.CutSet.from_file(str(machine / "merged.jsonl.gz"))},
                            want)
    shar_cuts = mimi_extract.read_cuts(url)  # Shar: lhotse's from_shar over the bucket's URLs
    assert_equal_arrays({c.id: c.load_custom(field) for c in shar_cuts}, want)
    pulled = str(tmp_path / "pulled")
    from mimi_extract.store.mirror import pull

    pull(url, pulled)
    assert_equal_arrays({c.id: c.load_custom(field) for c in mimi_extract.read_cuts(pulled)}, want)


def flip_inside_an_array(s3, url: str, row: dict) -> tuple[str, int]:
    """Flip one bit in the middle of the bytes that store ``row``'s array in its shard object (the
    HDF5 chunk, the Parquet column chunk of its row group, the Shar member's data); returns (shard
    name, offset)."""
    import io

    shard = row["shard"]
    data = bytearray(s3.cat(f"{url}/{shard}"))
    if shard.endswith(".h5"):
        import h5py

        with h5py.File(io.BytesIO(bytes(data)), "r") as f:
            chunk = f[row.get("dataset") or row["key"]].id.get_chunk_info(0)
            start, size = chunk.byte_offset, chunk.size
    elif shard.endswith(".parquet"):
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(io.BytesIO(bytes(data))).metadata
        column = next(meta.row_group(0).column(c) for c in range(meta.num_columns)
                      if meta.row_group(0).column(c).path_in_schema.startswith("codes"))
        start = column.dictionary_page_offset or column.data_page_offset
        size = column.total_compressed_size
    elif shard.endswith(".idx"):  # Megatron: the document's tokens are in the .bin the index points into
        from mimi_extract.formats.megatron import IndexFile

        index = IndexFile.parse(bytes(data))
        first = index.sequences(row["document"])[0]
        start, size = int(index.pointers[first]), int(index.lengths[first]) * index.dtype.itemsize
        shard = shard[: -len(".idx")] + ".bin"
        data = bytearray(s3.cat(f"{url}/{shard}"))
    else:
        start, size = row["offset"], row["nbytes"]
    offset = start + size // 2
    data[offset] ^= 0x10
    s3.pipe(f"{url}/{shard}", bytes(data))
    return shard, offset


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_byte_flipped_in_a_remote_array_is_found_and_reencoded(fmt, s3, loose, tiny_model_dir, tmp_path,  # noqa: F811
                                                                monkeypatch):
    """A bit flipped inside a stored array of a remote shard: ``verify --out URL --checksums`` names
    its items (exit 1); a resume with --reencode-damaged from another machine (empty staging)
    re-encodes that shard's items alone, bit for bit what they were, and leaves every other object
    of the OUT as it was (same ETag)."""
    if fmt == "shar":
        pytest.importorskip("lhotse")
    monkeypatch.setenv("MIMI_EXTRACT_STAGING", str(tmp_path / "staging"))
    url = f"s3://{BUCKET}/flip-{fmt}"
    run = lambda **kw: extract(loose, url, settings(tiny_model_dir, format=fmt), shard_size=2, **kw)  # noqa: E731
    assert run().ok == len(FILES)
    want = check_consistency(pulled(url, str(tmp_path / "before")))
    rows = [r for r in read_manifest(str(tmp_path / "before")) if r["status"] == "ok"]
    flipped, _ = flip_inside_an_array(s3, url, rows[len(rows) // 2])
    shard = rows[len(rows) // 2]["shard"]  # (the flipped object: the shard or a companion of it, a Megatron .bin)
    damaged_keys = {r["key"] for r in rows if r["shard"] == shard}
    found = cli("verify", "--out", url, "--checksums")
    assert found.exit_code == 1 and "FAIL" in found.output
    named = {k for k in damaged_keys if k in found.output}
    assert named and all(f" in {shard}" in line for line in found.output.splitlines() if line.split(" in ")[0] in named)
    etags = {n: s3.info(f"{url}/{n}")["ETag"] for n in listed(s3, url)}
    shutil.rmtree(tmp_path / "staging")  # another machine
    summary = run(reencode_damaged=True)
    assert summary.ok == len(damaged_keys) and summary.skipped == len(FILES) - len(damaged_keys), summary
    after = {n: s3.info(f"{url}/{n}")["ETag"] for n in listed(s3, url)}
    data_objects = [n for n in etags if SHARD_RE.search(n) or "/cuts." in n]
    untouched = [n for n in data_objects if n not in [shard, flipped, *format_of_path(shard).companions(shard)]]
    assert untouched and all(after[n] == etags[n] for n in untouched)  # nothing else rewritten
    assert shard not in after or after[shard] != etags[shard]
    assert any(n.startswith("quarantine/") for n in after)  # the damaged shard kept aside, as on disk
    assert cli("verify", "--out", url, "--checksums").exit_code == 0
    assert_equal_arrays(check_consistency(pulled(url, str(tmp_path / "after"))), want)


def test_a_byte_flipped_in_unused_bytes_of_a_remote_hdf5_shard_is_found(s3, loose, tiny_model_dir, tmp_path,  # noqa: F811
                                                                        monkeypatch):
    """The issue's case: a byte flipped where no reader reads (an HDF5 file image's free space; here
    its last byte): every item still reads back exactly, so no item checksum can see it (before:
    verify --checksums PASS); the shard's own checksum (crc32 of the file as committed) does, before
    h5py parses the file, and --reencode-damaged rewrites that shard alone."""
    monkeypatch.setenv("MIMI_EXTRACT_STAGING", str(tmp_path / "staging"))
    url = f"s3://{BUCKET}/unused-bytes"
    run = lambda **kw: extract(loose, url, settings(tiny_model_dir), shard_size=2, **kw)  # noqa: E731
    assert run().ok == len(FILES)
    want = dict(mimi_extract.open(url))
    shard = sorted(n for n in listed(s3, url) if n.endswith(".h5"))[1]
    data = bytearray(s3.cat(f"{url}/{shard}"))
    data[-1] ^= 0x10
    s3.pipe(f"{url}/{shard}", bytes(data))
    assert_equal_arrays(dict(mimi_extract.open(url)), want)  # unused bytes: every item reads back the same
    found = cli("verify", "--out", url, "--checksums")
    assert found.exit_code == 1 and "the shard file's bytes fail their checksum" in " ".join(found.output.split())
    shutil.rmtree(tmp_path / "staging")
    summary = run(reencode_damaged=True)
    assert summary.ok == 2 and summary.skipped == len(FILES) - 2, summary
    assert cli("verify", "--out", url, "--checksums").exit_code == 0
    assert_equal_arrays(dict(mimi_extract.open(url)), want)


def listed(s3, url: str) -> list[str]:
    s3.invalidate_cache()
    root = url.removeprefix("s3://")
    return sorted(p.removeprefix(root + "/") for p in s3.find(root))


def pulled(url: str, where: str) -> str:
    from mimi_extract.store.mirror import pull

    pull(url, where)
    return where


def test_gzip_cuts_file_of_remote_out_is_valid_jsonl(made, s3, tmp_path):
    """(The bucket's cuts.jsonl.gz is whole lhotse JSONL: one cut per ok item.)"""
    _, url = made("hdf5")
    lines = gzip.decompress(s3.cat(f"{url}/cuts.jsonl.gz")).decode().splitlines()
    assert len(lines) == len(FILES) and all(json.loads(line)["type"] in ("MonoCut", "MultiCut") for line in lines)


def test_status_names_a_run_starting_on_a_remote_out(s3):
    """A lock object whose lease runs, no run.json yet: a run is starting there (finding inputs,
    loading the model), as status says of a local OUT's live lock; one whose lease ran out is not."""
    import time

    url = f"s3://{BUCKET}/starting"
    s3.pipe(f"{url}/lock", json.dumps({"pid": 7, "host": "elsewhere", "expires": time.time() + 600}).encode())
    result = cli("status", url)
    assert result.exit_code == 0 and "whole run: starting (pid 7 on elsewhere" in " ".join(result.output.split())
    assert "is starting in it" in " ".join(cli("info", url).output.split())
    s3.pipe(f"{url}/lock", json.dumps({"pid": 7, "host": "elsewhere", "expires": time.time() - 1}).encode())
    stopped = " ".join(cli("status", url).output.split())  # killed while starting: only its lock is left
    assert "holds no mimi-extract run yet: only the lock of a run that stopped" in stopped and "again" in stopped


@pytest.mark.parametrize("fmt", [pytest.param("parquet", marks=pytest.mark.slow), "megatron"])
def test_the_files_about_a_remote_job_array_cover_every_part(fmt, s3, loose, tiny_model_dir, tmp_path,  # noqa: F811
                                                              monkeypatch):
    """Parts of a job array on s3, each from its own staging (its own machine): OUT's root in the
    bucket gets the files about OUT as a whole -- Parquet's dataset card, Megatron's data-args
    list -- covering every part, equal to a local job array's (before: they stayed in each part's
    local staging, listing that part alone); a card the user wrote is kept."""
    from mimi_extract.config.settings import parse_part
    from mimi_extract.formats.megatron import DATA_ARGS

    url, local = f"s3://{BUCKET}/array-{fmt}", str(tmp_path / f"array-{fmt}")  # (the card's title: OUT's name)
    name = "README.md" if fmt == "parquet" else DATA_ARGS
    for i in (0, 1):
        monkeypatch.setenv("MIMI_EXTRACT_STAGING", str(tmp_path / f"machine-{i}"))
        for out in (url, local):
            assert extract(loose, out, settings(tiny_model_dir, format=fmt), shard_size=2, part=parse_part(f"{i}/2")).ok
    fs = s3
    remote_text = fs.cat_file(f"{BUCKET}/array-{fmt}/{name}").decode()
    assert remote_text == open(os.path.join(local, name)).read()
    assert "part-0-of-2" in remote_text or "part-*-of-*" in remote_text
    if fmt == "megatron":
        assert {line.split()[1].split("/")[0] for line in remote_text.splitlines()} == {"part-0-of-2", "part-1-of-2"}
        prefixes, weights = mimi_extract.megatron_blend(url)
        assert prefixes[0].startswith(f"s3://{BUCKET}/array-{fmt}/part-0-of-2/") and len(prefixes) == len(weights)
    else:  # report --card writes its section into the card in the bucket
        from mimi_extract.audit.report import CARD_BEGIN

        assert cli("report", url, "--card", "--workers", "1").exit_code == 0
        carded = fs.cat_file(f"{BUCKET}/array-{fmt}/README.md").decode()
        assert carded.startswith(remote_text.rstrip("\n")) and CARD_BEGIN in carded
        # the user's own card: a part's end leaves it as it is
        fs.pipe_file(f"{BUCKET}/array-{fmt}/README.md", b"# our dataset\n")
        monkeypatch.setenv("MIMI_EXTRACT_STAGING", str(tmp_path / "machine-0"))
        extract(loose, url, settings(tiny_model_dir, format=fmt), shard_size=2, part=parse_part("0/2"))
        assert fs.cat_file(f"{BUCKET}/array-{fmt}/README.md") == b"# our dataset\n"


def test_a_part_waits_its_turn_for_the_files_about_a_remote_out(s3, loose, tiny_model_dir, tmp_path,  # noqa: F811
                                                                 monkeypatch):
    """The files about a remote job array are written under the lock object at OUT's root: a part
    whose turn does not come says so (an OutputError naming the lock, never a traceback), one whose
    turn comes writes them; the staging root other parts share on this machine is not touched."""
    import threading

    from mimi_extract.config.settings import parse_part
    from mimi_extract.formats.megatron import DATA_ARGS
    from mimi_extract.store.files import OutputError
    from mimi_extract.store.mirror import RemoteLock, publish_out_files, staging_dir

    monkeypatch.setenv("MIMI_EXTRACT_STAGING", str(tmp_path / "machine"))
    url = f"s3://{BUCKET}/turns"
    assert extract(loose, url, settings(tiny_model_dir, format="megatron"), shard_size=2, part=parse_part("0/2")).ok
    s3.rm_file(f"{BUCKET}/turns/{DATA_ARGS}")
    staging = staging_dir(url)
    before = sorted(os.listdir(staging))
    other = RemoteLock(url)  # another part, writing them now
    other.acquire()
    try:
        with pytest.raises(OutputError, match="cannot take OUT's lock"):
            publish_out_files(url, staging, "part-0-of-2", wait=1.0)
        threading.Timer(1.0, other.release).start()
        assert publish_out_files(url, staging, "part-0-of-2", wait=30.0) == [DATA_ARGS]
    finally:
        other.release()
    assert s3.cat_file(f"{BUCKET}/turns/{DATA_ARGS}").decode().split()[1].startswith("part-0-of-2/")
    assert sorted(os.listdir(staging)) == before


def test_a_staging_folder_of_an_earlier_version_is_adopted(tmp_path, monkeypatch):
    """The staging OUT is named as OUT is (0.3.1; ``<hash>/out`` before): an existing one is moved,
    not left behind with every shard downloaded again."""
    from mimi_extract.store.mirror import staging_dir

    monkeypatch.setenv("MIMI_EXTRACT_STAGING", str(tmp_path))
    url = f"s3://{BUCKET}/some-codes"
    old = os.path.join(os.path.dirname(staging_dir(url)), "out")
    os.makedirs(old)
    open(os.path.join(old, "shard-00000.h5"), "w").close()
    path = staging_dir(url)
    assert os.path.basename(path) == "some-codes" and os.listdir(path) == ["shard-00000.h5"]
    assert not os.path.exists(old)


@pytest.mark.parametrize("damage,needle", [
    ("row", "edited or damaged"),
    ("run.json", "run.json is not JSON"),
    ("plan.json", "plan.json is not JSON"),
])
def test_a_malformed_remote_out_is_one_line_naming_the_object(damage, needle, made, s3, tmp_path):
    """As for a local OUT (tests/store/test_malformed_out.py): a manifest segment's row of the wrong
    types, or garbage run.json / plan.json objects, make status, info, cuts and report on the URL
    say so in one line with exit status 2, never a traceback."""
    _, url = made("hdf5")
    copy = f"s3://{BUCKET}/malformed-{damage}"
    s3.copy(url.removeprefix("s3://"), copy.removeprefix("s3://"), recursive=True)
    if damage == "row":
        segment = sorted(p for p in s3.find(copy.removeprefix("s3://")) if "/manifest.d/" in p)[0]
        s3.pipe(segment, s3.cat(segment) + b'{"key": 5, "shard": 7, "status": "ok"}\n')
        needles = [needle, f"{os.path.basename(segment)} line "]
    else:
        s3.pipe(f"{copy}/{damage}", b"{not json")
        needles = [needle]
    commands = [["info"], ["status"], ["status", "--json"]]
    if damage != "plan.json":  # (plan.json is what the last run planned: only info and status read it)
        commands += [["cuts", "-o", str(tmp_path / "c.jsonl.gz")], ["report", "--manifest-only"]]
    for args in commands:
        result = cli(args[0], copy, *args[1:])
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (args, result.output)
        assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exception)
        assert all(n in " ".join(result.output.split()) for n in needles), (args, needles, result.output)
