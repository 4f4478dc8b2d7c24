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
from mimi_extract.sources import discover
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
