"""Tar members as GNU tar writes them that the WebDataset layout does not expect (issue 41): sparse
members (``tar -S``: GNU ``S`` headers, PAX sparse 0.0, 0.1 and 1.0).  Fixtures are built by GNU
tar itself; the index is held to ``tarfile`` on the same shapes in tests/sources/test_fuzz_tar.py."""

from __future__ import annotations

import gzip
import os
import shutil
import struct
import subprocess

import pytest

from support import check_consistency, extract
from support.corpora import FILES, assert_equal_arrays, settings
from mimi_extract.sources import Options, discover
from mimi_extract.store.manifest import read_manifest

GNU_TAR = shutil.which("tar")
pytestmark = pytest.mark.skipif(GNU_TAR is None or b"GNU tar" not in subprocess.run(
    [GNU_TAR or "tar", "--version"], capture_output=True).stdout, reason="needs GNU tar to build the fixtures")
SPARSE_FORMATS = {"gnu": ["--format=gnu"], "pax-0.0": ["--format=pax", "--sparse-version=0.0"],
                  "pax-0.1": ["--format=pax", "--sparse-version=0.1"], "pax-1.0": ["--format=pax", "--sparse-version=1.0"]}


def sparse_wav(path, data_bytes: int) -> None:
    """A 16-bit 24 kHz WAV of ``data_bytes`` of samples, stored sparse: its header and 4 KiB at each
    end written, the rest a hole (what ``tar -S`` packs as a sparse member)."""
    header = b"RIFF" + struct.pack("<I", 36 + data_bytes) + b"WAVEfmt " + struct.pack(
        "<IHHIIHH", 16, 1, 1, 24_000, 48_000, 2, 16) + b"data" + struct.pack("<I", data_bytes)
    with open(path, "wb") as f:
        f.write(header + b"\x01\x02" * 2048)
        f.seek(len(header) + data_bytes - 4096)
        f.write(b"\x03\x04" * 2048)


@pytest.mark.parametrize("fmt", list(SPARSE_FORMATS))
def test_a_sparse_member_is_one_error_row_naming_it_and_its_neighbours_are_read(loose, loose_run, tiny_model_dir,
                                                                                 tmp_path, fmt):
    """A sparse member over the spill size (100 MiB with its holes, 8 KiB stored) between six
    ordinary samples: in a ``.tar.gz`` the run ended with a traceback (``ValueError: read length
    must be non-negative``) and exit 2, losing the good samples; in a ``.tar`` it got no row at all;
    a PAX sparse member was indexed under ``GNUSparseFile.NNNN/``.  Now it is one error row naming
    it, in both, and every other sample equals the loose file's array."""
    folder = tmp_path / "files"
    shutil.copytree(loose, folder)
    sparse_wav(folder / "big.wav", 100 << 20)
    names = sorted(os.listdir(folder))
    plain = tmp_path / "x.tar"
    subprocess.run([GNU_TAR, "-S", *SPARSE_FORMATS[fmt], "-cf", str(plain), "-C", str(folder), *names], check=True)
    assert os.path.getsize(plain) < 1 << 20  # (the holes are not stored: a sparse member indeed)
    packed = tmp_path / "x.tar.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes(), 1))
    for shard in (packed, plain):
        found = discover(str(shard))
        stems = {name.partition(".")[0]: name for name in FILES}
        assert sorted(it.key for it in found.items) == sorted(f"{shard.name}/{s}" for s in stems)
        (bad,) = found.bad
        assert bad.key == f"{shard.name}/big" and bad.error == (
            f"{shard.name}:big: member 'big.wav' is a sparse file (tar -S / --sparse): its holes are not stored, so "
            "it is not read; pack the shard without -S"), bad.error
        out = tmp_path / f"out-{shard.name}"
        summary = extract(str(shard), str(out), settings(tiny_model_dir))
        assert (summary.ok, summary.errors) == (len(FILES), 1)
        assert [r["key"] for r in read_manifest(str(out)) if r["status"] == "error"] == [f"{shard.name}/big"]
        assert_equal_arrays(check_consistency(str(out)), loose_run, lambda k: stems[k.rpartition("/")[2]])


def test_members_repeated_under_one_name_are_not_held_in_a_tgz_group(loose, loose_run, tiny_model_dir, tmp_path,
                                                                      monkeypatch):
    """A sample made of many consecutive members of one name (``tar -r`` of the same file, again and
    again) in a ``.tar.gz``: only the first is its audio, and the group its sample sits in ends with
    that member (issue 41, item 2: 2,000 x 1 MiB ``dup.wav`` members made one 2 GiB group, read whole
    into memory by the encoder, 2.47 GiB of peak RSS; scripts/bench_memory.py measures it).  With a
    40 kB ``--sort-buffer-mb`` (the repeated members, 6 MB, are over it, as 2 GiB is over 256 MiB),
    every group read holds only the audio members it serves; the arrays equal the loose files'."""
    import io
    import tarfile

    from mimi_extract.sources import tgz

    def add(tf, name, data):
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))

    first, again, last = (open(os.path.join(loose, n), "rb").read() for n in ("b.wav", "d.wav", "c.flac"))
    shard = tmp_path / "dup.tar.gz"
    with tarfile.open(shard, "w:gz") as tf:
        add(tf, "a.flac", open(os.path.join(loose, "a.flac"), "rb").read())
        add(tf, "dup.wav", first)
        for _ in range(60):
            add(tf, "dup.wav", again)
        add(tf, "z.flac", last)
    read = []
    real = tgz.group_bytes
    monkeypatch.setattr(tgz, "group_bytes", lambda *a: read.append(a[3] - a[2]) or real(*a))
    out = tmp_path / "out"
    summary = extract(str(shard), str(out), settings(tiny_model_dir), options=Options(sort_buffer_mb=0.04))
    assert (summary.ok, summary.errors) == (3, 0)
    names = {"dup.tar.gz/a": "a.flac", "dup.tar.gz/dup": "b.wav", "dup.tar.gz/z": "c.flac"}
    got = check_consistency(str(out))
    for key, name in names.items():
        assert (got[key] == loose_run[name]).all(), key
    audio = len(first) + len(last) + os.path.getsize(os.path.join(loose, "a.flac"))
    assert read and sum(read) <= audio + 3 * 1536, (read, audio)  # (headers and padding: 1,536 bytes a member)


def test_a_sparse_member_of_a_shar_recording_tar_is_its_cuts_error_row(shar, tmp_path):
    """A Shar's recording tar repacked by GNU tar with one member sparse: that cut is an error row
    naming the member (the offsets of a sparse member are no range of the shard to decode), the
    other cuts are read."""
    import tarfile

    copy = tmp_path / "shar"
    shutil.copytree(shar, copy)
    with tarfile.open(copy / "recording.000000.tar") as tf:
        names = tf.getnames()
        tf.extractall(tmp_path / "members", filter="data")
    audio = [n for n in names if not n.endswith(".json")]
    sparse_wav(tmp_path / "members" / audio[1], 100 << 20)
    subprocess.run([GNU_TAR, "-S", "--format=gnu", "-cf", str(copy / "recording.000000.tar"), "-C",
                    str(tmp_path / "members"), *names], check=True)
    found = discover(str(copy))
    (bad,) = found.bad
    cut = audio[1].partition(".")[0]
    assert bad.key == cut and bad.error == (f"cuts.000000.jsonl.gz:line 2: member '{audio[1]}' is a sparse file (tar "
                                            "-S / --sparse): its holes are not stored, so it is not read; pack the "
                                            "shard without -S"), bad.error
    assert sorted(it.key for it in found.items) == sorted(n.partition(".")[0] for n in FILES if n.partition(".")[0] != cut)
