"""Property-based fuzzing of every row parser the tool owns: list lines (JSONL, NeMo manifests, CSV,
TSV), tar sidecars, lhotse manifest rows, Parquet metadata columns.  Whatever a row holds (numbers
out of any range, NaN, 400-digit integers, deep nesting, huge strings, NULs, wrong types, garbage
bytes), reading the input never raises: every row is an item or an error row that names its line,
member or row, and a good row beside it is always an item.  (The tar header index has its own
tests/sources/test_fuzz_tar.py; the long run: HYPOTHESIS_PROFILE=long, see docs/inputs.md.)"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import soundfile as sf
from hypothesis import HealthCheck, example, given, settings, strategies as st

from mimi_extract.config.input_options import Options
from mimi_extract.sources import discover

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                          HealthCheck.too_slow, HealthCheck.data_too_large])

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10 ** 300, max_value=10 ** 400),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40), st.just("x" * 200_000),
    st.sampled_from(["", " ", "0", "1.5", "-3", "nan", "inf", "1e400", "../../etc/passwd", "a\x00b", "\udc80"]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                              max_size=3), max_leaves=8)
FIELDS = ["path", "audio_filepath", "id", "start", "end", "duration", "offset", "channel", "text", "speaker", "x"]
ROWS = st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=6)
DEEP = st.integers(60, 100_000).map(lambda n: '{"path": "a.wav", "x": ' + "[" * n + "]" * n + "}")
LINES = st.one_of(ROWS.map(lambda r: json.dumps(r, default=str)), DEEP, st.text(max_size=60),
                  st.binary(max_size=60).map(lambda b: b.decode("latin-1")))


def good_wav(path) -> None:
    sf.write(str(path), np.zeros(2400, np.float32), 24_000)


def written_line(line: str) -> str:
    return " ".join(line.splitlines()) or "{}"


def check_rows(found, lines: int, good_key: str, prefix: str = "line ") -> None:
    """Every row is an item or an error row naming where it came from; the good row is an item."""
    assert good_key in {i.key for i in found.items}
    assert len(found.items) + len(found.bad) >= lines
    for bad in found.bad:
        assert bad.error and (bad.where or "").startswith(prefix) or bad.error.startswith(prefix), bad


@SETTINGS
@given(lines=st.lists(LINES, min_size=1, max_size=6), nemo=st.booleans())
@example(lines=['{"audio_filepath": "good.wav", "offset": 1' + "0" * 400 + ', "duration": 1}'], nemo=True)  # the issue's
@example(lines=['{"path": "good.wav", "start": [1, 2], "end": {"a": 1}, "channel": "9999999999"}'], nemo=False)
@example(lines=['{"path": "good.wav", "id": ' + "7" * 5000 + "}"], nemo=False)
def test_list_and_nemo_lines(tmp_path, lines, nemo):
    good_wav(tmp_path / "good.wav")
    good = {"audio_filepath": "good.wav", "duration": 0.1, "id": "good-row"} if nemo else \
        {"path": "good.wav", "id": "good-row"}
    text = "".join(written_line(line) + "\n" for line in lines) + json.dumps(good) + "\n"
    manifest = tmp_path / ("manifest.json" if nemo else "list.jsonl")
    manifest.write_text(text, encoding="utf-8", errors="surrogatepass")
    found = discover(str(manifest), input_format="list")
    check_rows(found, sum(1 for line in lines if written_line(line).strip()) + 1, "good-row")  # (blank lines: none)


@SETTINGS
@given(rows=st.lists(st.lists(st.text(max_size=30) | st.just("9" * 500) | st.just("y" * 200_000), min_size=1,
                              max_size=5), min_size=1, max_size=5), tsv=st.booleans())
@example(rows=[["y" * 200_000, "\r"]], tsv=False)  # found by the suite: a field over csv's 128 KiB swallowed the next row
def test_csv_and_tsv_rows(tmp_path, rows, tsv):
    import csv

    good_wav(tmp_path / "good.wav")
    path = tmp_path / ("list.tsv" if tsv else "list.csv")
    with open(path, "w", newline="", encoding="utf-8", errors="surrogatepass") as f:
        writer = csv.writer(f, delimiter="\t" if tsv else ",")
        writer.writerow(["path", "id", "start", "duration", "channel"])
        writer.writerows(rows)
        writer.writerow(["good.wav", "good-row", "", "", ""])
    found = discover(str(path), input_format="list")
    check_rows(found, len(rows) + 1, "good-row")


@SETTINGS
@given(sidecars=st.lists(LINES | st.binary(max_size=80).map(lambda b: b.decode("latin-1")), min_size=1, max_size=4),
       id_field=st.booleans())
@example(sidecars=['{"id": "x", "a": ' + "[" * 100_000 + "]" * 100_000 + "}"], id_field=True)  # the issue's: 100,000 deep
def test_tar_sidecars(tmp_path, sidecars, id_field):
    wav = io.BytesIO()
    sf.write(wav, np.zeros(2400, np.float32), 24_000, format="WAV")
    shard = tmp_path / "s-000000.tar"
    with tarfile.open(shard, "w") as tf:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for i, sidecar in enumerate(sidecars):
            add(f"bad{i}.wav", wav.getvalue())
            add(f"bad{i}.json", sidecar.encode("utf-8", "surrogatepass"))
        add("good.wav", wav.getvalue())
        add("good.json", json.dumps({"id": "good-row"}).encode())
    found = discover(str(shard), options=Options(id_field="id" if id_field else None))
    check_rows(found, len(sidecars) + 1, "good-row" if id_field else "s-000000.tar/good", "s-000000.tar")


@SETTINGS
@given(changes=st.lists(st.tuples(st.sampled_from(["id", "start", "duration", "channel", "recording", "supervisions",
                                                     "custom", "sampling_rate", "type"]), VALUES), max_size=4))
@example(changes=[("channel", [])])  # found by the long run: a cut of no channel vanished without a row
def test_lhotse_cut_rows(tmp_path, changes):
    good_wav(tmp_path / "a.wav")
    recording = {"id": "rec", "sources": [{"type": "file", "channels": [0], "source": str(tmp_path / "a.wav")}],
                 "sampling_rate": 24_000, "num_samples": 2400, "duration": 0.1, "channel_ids": [0]}
    good = {"id": "good-row", "start": 0.0, "duration": 0.1, "channel": 0, "recording": recording, "type": "MonoCut"}
    bad = dict(good, id="bad-row")
    for name, value in changes:
        bad[name] = value
    path = tmp_path / "cuts.jsonl"
    path.write_text(json.dumps(bad, default=str) + "\n" + json.dumps(good) + "\n")
    found = discover(str(path))
    check_rows(found, 2, "good-row")


@SETTINGS
@given(values=st.lists(VALUES, min_size=1, max_size=4))
def test_parquet_metadata_columns(tmp_path, values):
    import pyarrow as pa
    import pyarrow.parquet as pq

    wav = io.BytesIO()
    sf.write(wav, np.zeros(2400, np.float32), 24_000, format="WAV")
    texts = [json.dumps(v, default=str)[:300_000] for v in values] + ["good"]
    audio = [{"bytes": wav.getvalue(), "path": f"{i}.wav"} for i in range(len(texts))]
    table = pa.table({"audio": audio, "text": texts, "id": [f"row{i}" for i in range(len(values))] + ["good-row"]})
    pq.write_table(table, tmp_path / "d.parquet")
    found = discover(str(tmp_path / "d.parquet"), options=Options(id_column="id"))
    assert "good-row" in {i.key for i in found.items}
    assert len(found.items) + len(found.bad) == len(texts)


def test_the_reported_rows_are_named_error_rows(tmp_path):
    """The rows that ended a run (a 401-digit NeMo ``offset``: OverflowError) or refused a whole tar
    shard (a sidecar nested 100,000 deep: RecursionError) are each one error row saying why, and
    their neighbours are items."""
    good_wav(tmp_path / "a.wav")
    manifest = tmp_path / "manifest.json"
    rows = ['{"audio_filepath": "a.wav", "offset": 1' + "0" * 400 + ', "duration": 1}',
            '{"audio_filepath": "a.wav", "offset": 1e999, "duration": 1}',
            '{"audio_filepath": "a.wav", "start": [0.5], "end": 1, "id": "listed"}',
            '{"audio_filepath": "a.wav", "duration": 0.1, "id": "fine"}']
    manifest.write_text("\n".join(rows) + "\n")
    found = discover(str(manifest))
    errors = {b.where: b.error for b in found.bad}
    assert errors["line 1"] == "line 1: offset 1" + "0" * 58 + "… is out of range (over 1e+08 s)", errors
    assert errors["line 2"] == "line 2: offset inf is not a finite number", errors  # (JSON's 1e999 is infinity)
    assert errors["line 3"] == "line 3: segment 0-1 s is past the end of the file (0.1 s)", errors
    assert [i.key for i in found.items] == ["fine"]
    wav = io.BytesIO()
    sf.write(wav, np.zeros(2400, np.float32), 24_000, format="WAV")
    shard = tmp_path / "s-000000.tar"
    with tarfile.open(shard, "w") as tf:
        for name, data in [("a.wav", wav.getvalue()), ("a.json", b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
                           ("b.wav", wav.getvalue()), ("b.json", b'{"text": "fine"}')]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    found = discover(str(shard))
    assert [i.key for i in found.items] == ["s-000000.tar/b"]
    assert [(b.key, b.error) for b in found.bad] == [
        ("s-000000.tar/a", "s-000000.tar:a: sidecar 'a.json' is nested too deeply to parse (over 64 levels)")]


@SETTINGS
@given(rows=st.lists(ROWS, max_size=4), lines=st.lists(LINES, max_size=3), kind=st.sampled_from(["jsonl", "csv", "tsv"]),
       cells=st.lists(st.lists(st.text(max_size=30) | st.just("9" * 500) | st.just("y" * 200_000), min_size=1,
                               max_size=4), max_size=3))
@example(rows=[{"x": "y" * 2_000_000}], lines=[], kind="jsonl", cells=[])  # one field over a kept field's bound
@example(rows=[{"x": [[[[1]]]], "text": 10 ** 400}], lines=['{"id": ' + "7" * 5000 + "}"], kind="jsonl", cells=[])
def test_metadata_join(tmp_path, rows, lines, kind, cells):
    """``--metadata FILE`` (JSONL, CSV or TSV) joined to a folder's items by file stem: rows of any
    values keyed to items, arbitrary lines and CSV records beside them.  Reading never raises, every
    item is an item or an error row naming the metadata file's row, each warning is one bounded line,
    and the good row still reaches its item."""
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))  # a folder of this example's files only (tmp_path is shared)
    good_wav(tmp_path / "good.wav")
    for i in range(len(rows)):
        good_wav(tmp_path / f"bad{i}.wav")
    keyed = [{**row, "id": f"bad{i}"} for i, row in enumerate(rows)]
    good = {"id": "good", "text": "hello"}
    meta = tmp_path / f"meta.{kind}"
    if kind == "jsonl":
        text = "".join(json.dumps(r, default=str) + "\n" for r in keyed)
        text += "".join(written_line(line) + "\n" for line in lines) + json.dumps(good) + "\n"
        meta.write_text(text, encoding="utf-8", errors="surrogatepass")
    else:
        import csv

        with open(meta, "w", newline="", encoding="utf-8", errors="surrogatepass") as f:
            writer = csv.writer(f, delimiter="," if kind == "csv" else "\t")
            writer.writerow(["id", "text", "x"])
            writer.writerows([[r["id"], json.dumps(r.get("text"), default=str)[:300_000], str(r.get("x"))[:300_000]]
                              for r in keyed])
            writer.writerows(cells)
            writer.writerow([good["id"], good["text"], ""])
    found = discover(str(tmp_path), options=Options(metadata=str(meta)))
    items = {i.rel: i for i in found.items}
    assert items["good.wav"].meta == {"text": "hello"}, items["good.wav"].meta
    assert len(found.items) + len(found.bad) == len(rows) + 1
    for bad in found.bad:
        assert bad.error.startswith(f"--metadata {meta.name} row "), bad.error
    assert all("\n" not in w and len(w) < 2_000 for w in found.warnings), found.warnings


def test_a_list_or_metadata_file_in_latin_1_gives_error_rows_for_its_rows_not_a_decode_error(tmp_path):
    """Found by the fuzzing above: one byte that is not UTF-8 in a metadata file or a list (a Latin-1
    export, older corpora ship them) ended the run with a UnicodeDecodeError; now the rows that hold
    such bytes are error rows naming the line or row, and the others are read."""
    good_wav(tmp_path / "good.wav")
    good_wav(tmp_path / "cafe.wav")
    (tmp_path / "meta.tsv").write_bytes(b"id\ttext\ngood\thello\ncafe\tcaf\xe9 cr\xe8me\n")
    found = discover(str(tmp_path), options=Options(metadata=str(tmp_path / "meta.tsv")))
    assert [(i.rel, i.meta) for i in found.items] == [("good.wav", {"text": "hello"})]
    (bad,) = found.bad
    assert bad.rel == "cafe.wav" and bad.error.startswith("--metadata meta.tsv row 'cafe': field 'text' is not valid "
                                                          "UTF-8 text"), bad.error
    (tmp_path / "list.jsonl").write_bytes(b'{"path": "good.wav", "id": "g"}\n{"path": "cafe.wav", "id": "caf\xe9"}\n'
                                          b'{"path": "cafe.wav", "id": "c", "text": "cr\xe8me"}\n')
    found = discover(str(tmp_path / "list.jsonl"))
    assert [i.key for i in found.items] == ["g"]
    assert sorted(b.error.split(":")[0] for b in found.bad) == ["line 2", "line 3"], [b.error for b in found.bad]
