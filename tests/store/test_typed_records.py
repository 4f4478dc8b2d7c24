"""The typed records of what an OUT holds (``formats/records.py``): a manifest row read back
(``StoredRow``) and ``run.json`` (``RunInfo``).  Each survives its own JSON both ways, the rows and
run.json a real run writes (through ``RunDirectory``) read back typed with nothing lost, and the
package reads them as records: its dict-style access to rows and run.json stays pinned (issue 42
item 1)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import fields, replace
from pathlib import Path

import pytest

import mimi_extract
from mimi_extract.formats.records import RowSource, RunInfo, StoredRow
from mimi_extract.store.identity import read_run, read_run_info
from mimi_extract.store.manifest import ManifestRow, committed_rows, read_manifest
from support import extract
from support.corpora import FILES, settings

SOURCE = {"path": "/corpus/a.flac", "frames": 48_000, "channels": 2}
ROWS = [  # the JSON of rows as each format's writer makes them, and of an error row
    {"path": "a.flac", "key": "a.flac", "dataset": "a.flac", "channel": None, "sample_rate": 16_000, "duration": 3.0,
     "source": SOURCE, "frames": 38, "dims": 8, "shard": "shard-00000.h5", "status": "ok", "error": None,
     "checksum": "crc32:0000abcd", "shard_checksum": "crc32:1234abcd"},
    {"path": "seg.wav", "key": "seg.wav#1", "dataset": "seg.wav%231", "channel": 1, "sample_rate": 24_000,
     "duration": 1.5, "start": 0.5, "end": 2.0, "source": {**SOURCE, "kind": "tar", "loc": ["x.tar", 512, 100]},
     "meta": {"text": "hi", "supervisions": [{"id": "s", "start": 0.0}]}, "frames": 19, "dims": 512,
     "si_sdr": 4.25, "mel_distance": 0.5, "index": 3, "shard": "shard-00001.parquet", "status": "ok",
     "error": None, "checksum": "crc32:00000001"},
    {"path": "b.wav", "key": "b.wav", "dataset": "b.wav", "channel": None, "sample_rate": 24_000, "duration": 1.0,
     "source": SOURCE, "frames": 13, "dims": 8, "offset": 1024, "nbytes": 336, "meta_checksum": "crc32:1",
     "cut_checksum": "crc32:2", "shard": "shar/mimi_codes.000000.tar", "status": "ok", "error": None},
    {"path": "c.wav", "key": "c.wav", "dataset": "c.wav", "channel": None, "sample_rate": 24_000, "duration": 1.0,
     "source": SOURCE, "frames": 13, "dims": 8, "document": 0, "shard": "megatron/shard-00000.bin",
     "status": "ok", "error": None},
    {"path": "bad.wav", "key": "bad.wav", "dataset": "bad.wav", "channel": None, "sample_rate": None,
     "duration": 0.0, "shard": None, "status": "error", "error": "cannot decode: ..."},
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["key"])
def test_a_stored_row_survives_its_json_both_ways(row):
    stored = StoredRow.from_dict(row)
    assert stored.to_dict() == row and list(stored.to_dict()) == list(row)  # (the writer's key order too)
    assert StoredRow.from_dict(stored.to_dict()) == stored
    assert stored.extra is None and (stored.source is None or isinstance(stored.source, RowSource))


def test_a_row_keeps_the_keys_a_newer_version_writes():
    row = {**ROWS[0], "made_by": {"tool": "0.9"}}
    stored = StoredRow.from_dict(row)
    assert stored.extra == {"made_by": {"tool": "0.9"}} and stored.to_dict() == row


def test_the_writer_s_row_reads_back_as_the_same_row():
    written = ManifestRow("k.wav", path="k.wav", dataset="k.wav", sample_rate=16_000, duration=1.0,
                          source=SOURCE, frames=13, dims=8, stored={"index": 0}, shard="shard-00000.parquet",
                          status="ok", checksum="crc32:0000abcd")
    stored = StoredRow.from_dict(written.as_dict())
    assert stored.to_dict() == written.as_dict() and stored.index == 0 and stored.source == RowSource(**SOURCE)


def test_a_writer_s_row_copy_is_dataclasses_replace():
    """``ManifestRow.changed`` (the writer's copy, issue 40) makes what ``dataclasses.replace`` makes:
    an equal row, its fields in the same order (``as_stored`` reads them from ``__dict__``), the
    original unchanged, frozen; and it refuses a name that is not a field, as ``replace`` does."""
    row = ManifestRow("k.wav", path="k.wav", dataset="k.wav", sample_rate=16_000, duration=1.0, source=SOURCE,
                      meta={"text": "hi"})
    changes = {"frames": 13, "dims": 8, "shard": "shard-00000.h5", "status": "ok", "checksum": "crc32:0000abcd"}
    copy, reference = row.changed(**changes), replace(row, **changes)
    assert copy == reference and list(vars(copy)) == list(vars(reference)) == [f.name for f in fields(ManifestRow)]
    assert copy.as_dict() == reference.as_dict() and list(copy.as_dict()) == list(reference.as_dict())
    assert copy.as_stored() == reference.as_stored() and row.frames is None
    with pytest.raises(AttributeError):
        copy.frames = 1
    with pytest.raises(TypeError, match="nframes"):
        row.changed(nframes=1)


def test_an_item_s_row_is_the_dataclass_s_own():
    """``ManifestRow.for_item`` (built from its fields' dict, issue 40) makes what the frozen
    dataclass's ``__init__`` makes: an equal row, every field in field order, frozen; for a whole
    file and for a channel of a tar member's segment, with its metadata, warnings and fidelity."""
    from mimi_extract.codec.fidelity import Fidelity
    from mimi_extract.sources import Item, dataset_name
    from mimi_extract.sources.tar import MemberLoc

    whole = Item("/corpus/a.flac", "a.flac", "a.flac", sample_rate=16_000, frames=24_000, samples=36_000,
                 file_frames=24_000, file_channels=1)
    member = Item("/corpus/x.tar", "x.tar/b.wav", "b.wav#ch1@0.5", channel=1, sample_rate=8_000, frames=12_000,
                  segment=(0.5, 2.0), file_frames=48_000, file_channels=2, kind="tar",
                  loc=MemberLoc(512, 100, "b.wav"), meta={"text": "hi"})
    for item, warnings, fidelity in ((whole, None, None), (member, "clipped", Fidelity(11.5, 0.25))):
        row = ManifestRow.for_item(item, warnings, fidelity)
        source = {"path": item.path, "frames": item.file_frames, "channels": item.file_channels}
        if item.loc is not None:
            source.update(kind=item.kind, loc=item.loc.values())
        reference = ManifestRow(
            key=item.key, path=item.rel, dataset=dataset_name(item.key), channel=item.channel if item.channel != "mix"
            else None, sample_rate=item.sample_rate, duration=round(item.duration, 4),
            start=item.segment[0] if item.segment else None, end=item.segment[1] if item.segment else None,
            source=source, meta=item.meta, decoder_warnings=warnings, si_sdr=fidelity and fidelity.si_sdr,
            mel_distance=fidelity and fidelity.mel_distance)
        assert row == reference and list(vars(row)) == list(vars(reference)) == [f.name for f in fields(ManifestRow)]
        assert row.as_dict() == reference.as_dict() and list(row.as_dict()) == list(reference.as_dict())
        with pytest.raises(AttributeError):
            row.frames = 1


def test_every_field_the_row_check_types_is_a_field_of_the_record():
    """A field a format stores (``ShardBuilder.add``) is checked when a row is read (``row_problem``)
    and typed after: one list cannot gain a field the other lacks."""
    from mimi_extract.store.manifest import _ROW_TYPES

    assert set(_ROW_TYPES) <= {f.name for f in fields(StoredRow)}


def test_the_row_check_s_fast_path_is_its_rule():
    """``row_problem`` passes a row whose fields all have JSON's exact types at a set lookup each;
    any row, fuzzed, gets the answer of the field-by-field rule (``_typed``) it stands for."""
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import given, settings as hsettings, strategies as st

    from mimi_extract.store import manifest

    def by_the_rule(row):
        for field, kinds in manifest._ROW_TYPES.items():
            if field in row and not manifest._typed(row[field], kinds):
                return f"has {field} {manifest._type_name(row[field])} ({manifest._shown(row[field])})"
        return manifest._row_rules(row)

    # (a value of each JSON type at the rule's edges: a bool where an int is meant, a float count, null)
    values = st.one_of(st.sampled_from([None, True, False, 0, -1, 7, 1.5, "s", "shard-00000.h5", [], [1], {}]),
                       st.dictionaries(st.sampled_from(["path", "frames", "channels", "kind"]),
                                       st.sampled_from([None, True, 3, "x"]), max_size=4))
    rows = st.builds(lambda row, changes: {**row, **changes}, st.sampled_from(ROWS),
                     st.dictionaries(st.sampled_from(sorted(manifest._ROW_TYPES)), values, max_size=3))

    @hsettings(max_examples=500, deadline=None, derandomize=True)
    @given(rows)
    def check(row):
        assert manifest.row_problem(row) == by_the_rule(row), row

    assert hypothesis.__version__
    check()


def test_run_info_survives_its_json_both_ways():
    info = RunInfo(model="kyutai/mimi", tap="codes", format="megatron", num_quantizers=8, fidelity=True,
                   decoders={"libsndfile": "1.2"}, items={"--key": "path"}, extra={"token_layout": "flat"})
    assert RunInfo.from_dict(info.to_dict()) == info and info.setting("token_layout") == "flat"
    old = RunInfo.from_dict({"tap": "latent", "model": "m"})  # before formats, framings, the 0.3 length rule
    assert (old.format, old.framing, old.causal_16k, old.frames_per_call, old.resampled_length) == (
        "hdf5", "transformers", True, 1, "exact")


@pytest.fixture(scope="module")
def written(loose, tiny_model_dir, tmp_path_factory):
    """An OUT written by a real run (RunDirectory writes its run.json and manifest)."""
    out = str(tmp_path_factory.mktemp("typed") / "out")
    assert extract(loose, out, settings(tiny_model_dir), shard_size=2).ok == len(FILES)
    return out


def test_a_run_json_written_by_a_run_reads_back_typed_with_nothing_lost(written):
    with open(os.path.join(written, "run.json"), encoding="utf-8") as f:
        recorded = json.load(f)
    info = read_run(written)
    assert info == RunInfo.from_dict(read_run_info(written)) == RunInfo.from_dict(recorded)
    assert (info.model, info.format, info.tap, info.num_quantizers, info.decoders, info.resample_on, info.items) == (
        recorded["model"], recorded["format"], recorded["tap"], recorded.get("num_quantizers"), recorded["decoders"],
        recorded["resample_on"], recorded["items"])
    assert info.to_dict().items() >= recorded.items()  # every key recorded is a field or in extra, as written
    assert RunInfo.from_dict(info.to_dict()) == info


def test_the_rows_a_run_writes_read_back_typed_with_nothing_lost(written):
    rows = committed_rows(written)
    assert len(rows) == len(FILES) and all(isinstance(r, StoredRow) for r in rows)
    assert [r.to_dict() for r in rows] == read_manifest(written)  # the users' dicts: each row's own JSON
    assert all(r.ok and r.shard and r.checksum and r.source is not None for r in rows)


# The counting rule: in the package (sources/, common/ and config/ left out: their ``row`` and ``info``
# are an input's own rows and fsspec's file infos), each ``NAME["...`` / ``NAME['...`` / ``NAME.get(``
# whose NAME is one the package gives a row, a row's source or run.json (row, r, src, source, info, old).
# What remains: the checks of a row's and run.json's JSON before they are typed (manifest.row_problem,
# identity), the write side building JSON, the resume comparisons of run.json key by key, the
# dataset card that lists run.json as written, and object stores' file infos (mirror.py, named
# ``info``).  Before the records (0.4.0 as of issue 42): 384; with them: 67.
COUNTED = re.compile(r"\b(row|r|info|old|src|source)(\[[\"']|\.get\()")
LEFT_OUT = ("sources", "common", "config")
MOST = 75


def dict_style_accesses() -> dict[str, int]:
    package = Path(mimi_extract.__file__).parent
    found = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] in LEFT_OUT:
            continue
        n = len(COUNTED.findall(path.read_text(encoding="utf-8")))
        if n:
            found[str(rel)] = n
    return found


def test_the_package_reads_rows_and_run_json_as_records():
    found = dict_style_accesses()
    assert found, "the counting rule finds nothing: it no longer matches the package's names"
    assert sum(found.values()) <= MOST, sorted(found.items(), key=lambda kv: -kv[1])
