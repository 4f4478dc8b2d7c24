"""The tar header index the tool owns (sources/tar.py ``index_tar``: 3.4x faster than iterating with
``tarfile``, measured in scripts/bench_sources.py) against the standard ``tarfile`` module, on
archives hypothesis builds with ``tarfile`` itself (ustar, GNU and PAX formats, long and non-ASCII
names, directories, links, empty members) and then damages (truncated anywhere, a byte flipped
anywhere, garbage appended).

The rule both must agree on: the regular files whose headers ``tarfile`` reads before it stops, that
lie wholly inside the file, with their names, data offsets and sizes, and which are sparse;
``index_tar`` says why it stopped when the archive does not end with its end-of-archive marker.  It
never raises.

The same on archives GNU tar writes (issue 41): sparse members (``tar -S``) in GNU format and PAX
sparse formats 0.0, 0.1 and 1.0 (the index named a PAX one ``GNUSparseFile.NNNN/...`` and dropped a
GNU one), long names, and members appended again under the same name (``tar -r``)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mimi_extract.sources.tar import SPARSE, index_tar

NAME_CHARS = st.sampled_from(list("abcxyz019_-.") + ["é", "ü", "中", " "])
NAMES = st.lists(NAME_CHARS, min_size=1, max_size=12).map("".join).filter(lambda n: n.strip(".") and n.strip())
PATHS = st.lists(NAMES, min_size=1, max_size=14).map("/".join)  # up to ~180 characters: long-name headers
MEMBER = st.tuples(PATHS, st.sampled_from(["file", "file", "file", "dir", "symlink"]), st.integers(0, 1500))
FORMATS = st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])


def build(members, fmt) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tf:
        for i, (path, kind, size) in enumerate(members):
            info = tarfile.TarInfo(f"{path}{i}")
            if kind == "dir":
                info.type = tarfile.DIRTYPE
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, "x" * (size % 150 + 1)
            else:
                info.size = size
            try:
                info.tobuf(fmt, tf.encoding, tf.errors)
            except ValueError:  # a name or link too long for ustar: tarfile refuses it
                continue
            tf.addfile(info, io.BytesIO(bytes([i % 251]) * size) if kind == "file" else None)
    return buffer.getvalue()


def reference(data: bytes) -> list[tuple[str, int, int, bool]]:
    """``tarfile``'s regular files (before it stops), those whose data lies inside the file: (name,
    data offset, size, sparse); a sparse member's stored data is the blocks its map lists."""
    out = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
            for m in tf:
                if m.isfile():  # (regular, contiguous, and GNU sparse)
                    stored = m.size if m.sparse is None else sum(n for _, n in m.sparse)
                    out.append((m.name, m.offset_data, m.size, m.sparse is not None, stored))
    except (tarfile.ReadError, EOFError, UnicodeError, ValueError, OverflowError):
        pass
    complete = []
    for member in out:  # the index stops at the first member whose data the file does not hold
        if member[1] + member[4] > len(data):
            break
        complete.append(member[:4])
    return complete


def check(tmp_path, data: bytes, intact: bool) -> None:
    path = tmp_path / "s.tar"
    path.write_bytes(data)
    members, damage = index_tar(str(path))
    assert [(n, o, s, d is SPARSE) for n, o, s, d in members] == reference(data)
    if intact:
        assert damage is None
    elif damage is not None:
        assert isinstance(damage, str) and damage


SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(members=st.lists(MEMBER, max_size=8), fmt=FORMATS)
def test_index_equals_tarfile_on_intact_archives(tmp_path, members, fmt):
    check(tmp_path, build(members, fmt), intact=True)


@SETTINGS
@given(members=st.lists(MEMBER, min_size=1, max_size=6), fmt=FORMATS, cut=st.floats(0, 1))
def test_index_equals_tarfile_on_truncated_archives(tmp_path, members, fmt, cut):
    data = build(members, fmt)
    check(tmp_path, data[: int(cut * len(data))], intact=False)


@SETTINGS
@given(members=st.lists(MEMBER, min_size=1, max_size=6), fmt=FORMATS, at=st.floats(0, 1), xor=st.integers(1, 255))
def test_index_equals_tarfile_with_a_byte_flipped(tmp_path, members, fmt, at, xor):
    data = bytearray(build(members, fmt))
    data[min(len(data) - 1, int(at * len(data)))] ^= xor
    check(tmp_path, bytes(data), intact=False)


@SETTINGS
@given(members=st.lists(MEMBER, max_size=4), fmt=FORMATS, junk=st.binary(min_size=1, max_size=2000))
def test_index_equals_tarfile_with_garbage_around(tmp_path, members, fmt, junk):
    data = build(members, fmt)
    check(tmp_path, data + junk, intact=False)
    check(tmp_path, junk + data, intact=False)


# -- archives GNU tar writes: sparse members, long names, members appended again -----------------
GNU_TAR = shutil.which("tar")
HAVE_GNU_TAR = GNU_TAR is not None and b"GNU tar" in subprocess.run([GNU_TAR, "--version"], capture_output=True).stdout
GNU_FORMATS = st.sampled_from([("--format=gnu",), ("--format=pax", "--sparse-version=0.0"),
                               ("--format=pax", "--sparse-version=0.1"), ("--format=pax", "--sparse-version=1.0")])
# (path, sparse: its hole in KiB (whole file-system blocks) or 0 for a plain file, appended again with tar -r)
GNU_MEMBER = st.tuples(PATHS, st.sampled_from([0, 0, 16, 64, 1024]), st.booleans())


def gnu_tar(members, fmt) -> bytes:
    """An archive GNU tar writes with -S from files made here (a sparse one: data, a hole, data);
    the members marked are appended again (``tar -r``), as a second member of the same name."""
    with tempfile.TemporaryDirectory() as folder:
        names = []
        for i, (path, hole, _) in enumerate(members):
            parts = path.split("/")
            name = "/".join(p + "~" for p in parts[:-1]) + ("/" if len(parts) > 1 else "") + f"{i}{parts[-1]}"
            full = os.path.join(folder, name)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as f:
                f.write(bytes([i % 251 + 1]) * (700 + 37 * i))
                if hole:
                    f.seek(hole << 10, 1)
                    f.write(b"\x05" * 900)
            names.append(name)
        archive = os.path.join(folder, "x.tar")
        subprocess.run([GNU_TAR, "-S", *fmt, "-cf", archive, "-C", folder, "--", *names], check=True)
        again = [n for n, m in zip(names, members) if m[2]]
        if again:
            subprocess.run([GNU_TAR, "-S", *fmt, "-rf", archive, "-C", folder, "--", *again], check=True)
        with open(archive, "rb") as f:
            return f.read()


@pytest.mark.skipif(not HAVE_GNU_TAR, reason="needs GNU tar to build the archives")
@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(members=st.lists(GNU_MEMBER, min_size=1, max_size=5), fmt=GNU_FORMATS)
def test_index_equals_tarfile_on_gnu_tar_archives(tmp_path, members, fmt):
    data = gnu_tar(members, fmt)
    check(tmp_path, data, intact=True)
    sparse = [m for m in reference(data) if m[3]]
    assert len(sparse) == sum(1 + again for _, hole, again in members if hole), (sparse, members)


@pytest.mark.skipif(not HAVE_GNU_TAR, reason="needs GNU tar to build the archives")
@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(members=st.lists(GNU_MEMBER, min_size=1, max_size=4), fmt=GNU_FORMATS, at=st.floats(0, 1),
       xor=st.integers(1, 255), cut=st.booleans())
def test_index_equals_tarfile_on_damaged_gnu_tar_archives(tmp_path, members, fmt, at, xor, cut):
    data = bytearray(gnu_tar(members, fmt))
    if cut:
        data = data[: int(at * len(data))]
    else:
        data[min(len(data) - 1, int(at * len(data)))] ^= xor
    check(tmp_path, bytes(data), intact=False)
