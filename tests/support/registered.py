"""The tests' side of the two registries (``mimi_extract.formats``' output formats, ``mimi_extract.sources``'
input kinds): for each registered name, what the registry-driven tests need of it (its fixture), and,
declared once with the reason, which of those tests it does not take part in.

The round-trip, damage and kill -9 tests draw their cases from the registries through ``format_cases`` /
``kind_cases`` (never from a list of names of their own), so a new format or input kind is in every one
of them by default; the guard tests (``test_formats.py``, ``test_sources.py``) fail, naming it, when a
registered name has no entry here or an entry names nothing registered.  So a new format cannot pass
the suite with no test of its own: it brings its fixture here, or says here why a test cannot take it."""

from __future__ import annotations

import os
import tarfile
from dataclasses import dataclass, field
from typing import Callable, Mapping

from mimi_extract.formats import names
from mimi_extract.sources import REGISTRY
from support.kill_trials import checked_arrays
from support.outs import check_shar, flip_byte, flip_hdf5_byte

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/

@dataclass(frozen=True)
class RegistryTest:
    """One registry-driven test: its file (under tests/) and function, and the field of a name's case it
    calls (``needs``; "": the name alone)."""

    path: str
    function: str
    needs: str = ""


# the registry-driven tests, by the short name a Skip is declared under
_FORMATS_PY, _INTEGRITY_PY, _WORKERS_PY, _TRAINING_PY = ("formats/test_formats.py", "store/test_integrity.py",
                                                       "store/test_worker_shards.py", "readers/test_training.py")
FORMAT_TESTS = {
    "round_trip": RegistryTest(_FORMATS_PY, "test_a_format_reads_back_equal_to_hdf5_and_the_single_item_reference"),
    "flipped_byte": RegistryTest(_FORMATS_PY, "test_a_flipped_byte_is_found_read_refuses_and_resume_repairs",
                                 "flip_item"),
    "unopenable": RegistryTest(_FORMATS_PY,
                               "test_a_damaged_footer_or_superblock_is_a_damaged_error_naming_out_shard_and_key",
                               "break_open"),
    "kill_9": RegistryTest(_INTEGRITY_PY, "test_kill_9_at_random_points_then_resume", "kill_check"),
    "worker_shards": RegistryTest(_WORKERS_PY, "test_two_workers_shards_and_the_runners_own_commit_into_one_out"),
    "worker_tmp_files": RegistryTest(_WORKERS_PY, "test_resume_removes_what_a_killed_worker_wrote"),
    "training_batches": RegistryTest(_TRAINING_PY, "test_out_dataset_and_pad_collate_in_workers"),
    "training_cuts": RegistryTest(_TRAINING_PY, "test_the_lhotse_recipe_codes_with_the_supervisions_text"),
    "report": RegistryTest("audit/test_report.py", "test_numbers_equal_an_independent_count"),
    "fidelity": RegistryTest("run/test_fidelity.py", "test_every_format_carries_the_rows_fidelity"),
}
KIND_TESTS = {
    "kill_9": RegistryTest("engines/test_packed_faults.py", "test_an_input_kind_kill_9_then_resume_equals_uninterrupted",
                           "build"),
    "parts": RegistryTest("engines/test_packed_faults.py", "test_packed_parts_union_equals_a_whole_run", "build"),
}


@dataclass(frozen=True)
class Skip:
    """Why a registered name is not a case of one registry-driven test."""

    why: str


@dataclass(frozen=True)
class FormatCase:
    """What the format tests need of one output format.  ``flip_item(out, row)`` flips a byte of one ok
    row's stored array (the shard's structure intact) and returns the keys it damages; ``break_open(path)``
    damages the shard file at ``path`` so that its library cannot open it at all; ``kill_check(out,
    killed=...)`` asserts OUT's invariants after a kill -9 (and at the end), returning its arrays."""

    flip_item: Callable[[str, dict], list[str]] | None = None
    break_open: Callable[[str], None] | None = None
    kill_check: Callable[..., dict] = checked_arrays
    skip: Mapping[str, Skip] = field(default_factory=dict)  # FORMAT_TESTS name -> why not


@dataclass(frozen=True)
class KindCase:
    """What the input-kind tests need of one kind: ``build(loose, names, root)`` writes the audio files
    ``names`` of folder ``loose`` as an input of this kind under ``root`` and returns what to run on."""

    build: Callable[[str, list[str], str], str] | None = None
    skip: Mapping[str, Skip] = field(default_factory=dict)  # KIND_TESTS name -> why not


# -- output formats ------------------------------------------------------------------------------

def _flip_hdf5(out: str, row: dict) -> list[str]:
    flip_hdf5_byte(out, row)
    return [row["key"]]


def _flip_parquet_page(out: str, row: dict) -> list[str]:
    """One byte inside the data pages of the array column of the first row group of ``row``'s shard;
    the keys of that row group (a page holds several items: all of them are damaged)."""
    import pyarrow.parquet as pq

    path = os.path.join(out, row["shard"])
    f = pq.ParquetFile(path)
    col = f.metadata.row_group(0).column(1)
    keys = f.read_row_group(0, columns=["key"])["key"].to_pylist()
    f.close()
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    flip_byte(path, start + col.total_compressed_size - 3)  # the chunk ends with its last data page
    return keys


def _flip_shar(out: str, row: dict) -> list[str]:
    flip_byte(os.path.join(out, row["shard"]), row["offset"] + row["nbytes"] - 1)  # the .npy member's last byte
    return [row["key"]]


def _flip_megatron(out: str, row: dict) -> list[str]:
    """A low bit of one of the item's tokens in the ``.bin``: still an id of the layout, only the checksum sees it."""
    from mimi_extract.formats.megatron import IndexFile

    index = IndexFile.parse(open(os.path.join(out, row["shard"]), "rb").read())
    at = int(index.pointers[index.documents[row["document"]]]) + 3
    with open(os.path.join(out, row["shard"].removesuffix(".idx") + ".bin"), "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))
    return [row["key"]]


FORMATS: dict[str, FormatCase] = {
    "hdf5": FormatCase(flip_item=_flip_hdf5, break_open=lambda path: flip_byte(path, 1)),  # the superblock's signature
    # (break_open: the footer's magic)
    "parquet": FormatCase(flip_item=_flip_parquet_page, break_open=lambda path: flip_byte(path, os.path.getsize(path) - 2)),
    "shar": FormatCase(flip_item=_flip_shar, kill_check=check_shar, skip={
        "unopenable": Skip("an item is read at its row's offset in the tar, which is never opened as a whole: no "
                           "byte of it stops one item's read but not another's (every byte of a shard is found: "
                           "test_shar.py's test_a_flipped_byte_anywhere_in_a_shar_shard_is_found_or_harmless_to_lhotse)"),
    }),
    "megatron": FormatCase(flip_item=_flip_megatron, break_open=lambda path: flip_byte(path, 1)),  # the index's magic
}


# -- input kinds ---------------------------------------------------------------------------------

def _tar(loose: str, names: list[str], root: str) -> str:
    """WebDataset shards of 40 members each."""
    os.makedirs(os.path.join(root, "shards"))
    count = -(-len(names) // 40)
    for s in range(count):
        with tarfile.open(os.path.join(root, "shards", f"part-{s:06d}.tar"), "w") as tf:
            for n in names[s * 40: s * 40 + 40]:
                tf.add(os.path.join(loose, n), arcname=n)
    return os.path.join(root, "shards", f"part-{{000000..{count - 1:06d}}}.tar")


def _tgz(loose: str, names: list[str], root: str) -> str:
    path = os.path.join(root, "all.tar.gz")
    with tarfile.open(path, "w:gz") as tf:
        for n in names:
            tf.add(os.path.join(loose, n), arcname=n)
    return path


def _parquet(loose: str, names: list[str], root: str) -> str:
    """datasets' Audio struct, 30-row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(root, "all.parquet")
    audio = pa.array([{"bytes": open(os.path.join(loose, n), "rb").read(), "path": n} for n in names],
                     pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    pq.write_table(pa.table({"id": [n.split(".")[0] for n in names], "audio": audio}), path, row_group_size=30)
    return path


def _shar(loose: str, names: list[str], root: str) -> str:
    """A lhotse Shar written by lhotse itself, 40 cuts a shard."""
    import lhotse

    recs = [lhotse.Recording.from_file(os.path.join(loose, n), recording_id=n.split(".")[0]) for n in names]
    cuts = lhotse.CutSet.from_manifests(recordings=lhotse.RecordingSet.from_recordings(recs))
    path = os.path.join(root, "shar")
    os.makedirs(path)
    lhotse.CutSet.from_cuts(c.with_id(c.recording_id) for c in cuts).to_shar(path, fields={"recording": "flac"},
                                                                            shard_size=40)
    return path


# plain files (a directory, a list, a lhotse manifest): what a packaged input adds is not there
_FILES = {
    "kill_9": Skip("its items are plain files, opened as a directory's are (Source.open): nothing of its own for a "
                   "kill to interrupt (a directory's kill -9 tests: test_integrity.py, once per output format)"),
    "parts": Skip("its items are plain files, divided among parts by key whatever lists them (a directory's parts: "
                  "tests/store/test_parts.py)"),
}

KINDS: dict[str, KindCase] = {
    "tar": KindCase(build=_tar, skip={
        "parts": Skip("its parts take whole shards, tested on shards of its own (members with sidecars, a "
                      "rewritten shard): test_packed_sources.py's test_tar_parts_take_whole_shards and "
                      "test_tar_parts_union_resume_identity_and_cli"),
    }),
    "tgz": KindCase(build=_tgz),
    "parquet": KindCase(build=_parquet),
    "shar": KindCase(build=_shar),
    "directory": KindCase(skip=_FILES),
    "list": KindCase(skip=_FILES),
    "lhotse": KindCase(skip=_FILES),
}


# -- the cases, drawn from the registries ----------------------------------------------------------

def format_cases(test: str) -> list[str]:
    """The registered formats that ``test`` (a FORMAT_TESTS name) runs on, in the registry's order: every
    one but those with a declared Skip (a format with no FormatCase is a case: it fails, naming what is
    missing, as the guard test does)."""
    assert test in FORMAT_TESTS, test
    return [name for name in names() if test not in (FORMATS[name].skip if name in FORMATS else {})]


def kind_cases(test: str) -> list[str]:
    """The registered input kinds that ``test`` (a KIND_TESTS name) runs on (as ``format_cases``)."""
    assert test in KIND_TESTS, test
    return [kind for kind in REGISTRY if test not in (KINDS[kind].skip if kind in KINDS else {})]


def format_case(name: str) -> FormatCase:
    assert name in FORMATS, f"output format {name!r} is registered but has no FormatCase in tests/support/registered.py"
    return FORMATS[name]


def kind_case(kind: str) -> KindCase:
    assert kind in KINDS, f"input kind {kind!r} is registered but has no KindCase in tests/support/registered.py"
    return KINDS[kind]


def table_problems(what: str, registered: list[str], table: Mapping, tests: Mapping[str, RegistryTest]) -> list[str]:
    """What is wrong between a registry and its test table, one line each: a registered name with no
    entry, an entry naming nothing registered, a Skip under no registry-driven test, a test that is not
    where ``tests`` says, a name that a test takes with no fixture for it (its case's ``needs`` is None)."""
    problems = [f"{what} {n!r} is registered but has no entry in tests/support/registered.py" for n in registered
                if n not in table]
    problems += [f"{what} {n!r} has an entry in tests/support/registered.py but is not registered" for n in table
                 if n not in registered]
    for test, spec in tests.items():
        if f"\ndef {spec.function}(" not in open(os.path.join(ROOT, spec.path)).read():
            problems.append(f"{test!r}: tests/{spec.path} has no {spec.function}")
    for name, case in table.items():
        problems += [f"{what} {name!r}: a Skip for {t!r}, which is no registry-driven test" for t in case.skip
                     if t not in tests]
        problems += [f"{what} {name!r}: its Skip for {t!r} gives no reason" for t, skip in case.skip.items()
                     if not skip.why.strip()]
        problems += [f"{what} {name!r} has no {spec.needs} for {test!r} (give one, or a Skip saying why not)"
                     for test, spec in tests.items() if spec.needs and test not in case.skip
                     and getattr(case, spec.needs) is None]
    return problems
