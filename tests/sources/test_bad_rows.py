"""Row-level problems in list and lhotse inputs: each is an error row naming its row, and the run
goes on (issue 16, defect 2); OUT inside INPUT is never read back as input (defect 7)."""

import gzip
import json
import os

import numpy as np
import pytest

from support import write_noise
from support import extract
from mimi_extract.config.settings import Settings
from mimi_extract.sources import discover
from support import check_consistency
from mimi_extract.store.manifest import read_manifest


def _settings(model_dir):
    return Settings(model=model_dir, tap="codes", num_workers=0)


BAD_LIST = [
    '{"path": "a.wav", "id": "nul\\u0000id"}',  # 1: embedded NUL
    '{"path": "a.wav", "id": "lone\\udc80"}',  # 2: lone surrogate
    '{"path": "a16.wav", "start": 0.5, "duration": 0.00001}',  # 3: shorter than one sample
    '{"path": "a.wav", "duration": Infinity}',  # 4
    '{"path": "a.wav", "end": "inf"}',  # 5
    '{"path": "a.wav", "start": NaN}',  # 6
    '{"path": "a.wav", "channel": -1}',  # 7
    '{"path": "a.wav", "channel": 1.7}',  # 8
    '{"path": "missing.wav", "id": "shared"}',  # 9: a bad row ...
    '{"path": "a.wav", "id": "shared"}',  # 10: ... does not shadow the good one
    '{"path": "a.wav"}',  # 11
    '{"path": "a.wav", "start": 1.5}',  # 12: start, no end: to the end of the file
]


def _bad_list(tmp_path):
    rng = np.random.default_rng(1)
    write_noise(tmp_path / "a.wav", 24_000 * 3, rng=rng)
    write_noise(tmp_path / "a16.wav", 16_000, 16_000, rng=rng)
    lst = tmp_path / "list.jsonl"
    lst.write_text("\n".join(BAD_LIST) + "\n")
    return str(lst)


def test_bad_list_rows_are_error_rows_naming_the_line(tmp_path):
    found = discover(_bad_list(tmp_path))
    assert sorted(it.key for it in found.items) == ["a.wav", "a.wav@1.5-3", "shared"]
    errors = {it.error.split(":")[0]: it.error for it in found.bad}
    assert sorted(errors) == [f"line {n}" for n in sorted(range(1, 10), key=str)], errors
    assert "NUL" in errors["line 1"] and "surrogate" in errors["line 2"]
    assert "shorter than one sample" in errors["line 3"]
    assert "not a finite number" in errors["line 4"] and "not a finite number" in errors["line 5"]
    assert "not a finite number" in errors["line 6"]
    assert "channel" in errors["line 7"] and "channel" in errors["line 8"]
    assert "file not found" in errors["line 9"]
    seg = next(it for it in found.items if it.key == "a.wav@1.5-3")
    assert (seg.start, seg.frames, seg.segment) == (36_000, 36_000, (1.5, 3.0))
    for it in found.bad:  # every error row can be written: valid UTF-8, no NUL, unique keys
        assert "\x00" not in it.key
        it.key.encode("utf-8")
    assert len({it.key for it in found.items + found.bad}) == len(found.items) + len(found.bad)


def test_bad_list_rows_run_resume_and_verify(tmp_path, tiny_model_dir):
    from mimi_extract import read_cuts
    from mimi_extract.audit.verify import verify_outputs

    lst = _bad_list(tmp_path)
    out = str(tmp_path / "out")
    for _ in range(2):  # a resume meets the same rows again
        summary = extract(lst, out, _settings(tiny_model_dir))
        arrays = check_consistency(out, {"a.wav", "a.wav@1.5-3", "shared"})
    assert summary.errors == 9
    rows = {r["key"]: r for r in read_manifest(out)}
    assert sum(r["status"] == "error" for r in rows.values()) == 9
    seg = rows["a.wav@1.5-3"]
    assert (seg["start"], seg["end"]) == (1.5, 3.0)
    assert arrays["a.wav@1.5-3"].shape[0] == 19  # 1.5 s at 12.5 Hz, rounded up
    cut = next(c for c in read_cuts(out) if c.id == "a.wav@1.5-3")
    assert cut.start == 1.5
    checks, problems = verify_outputs(out, sample=None)
    assert not problems and all(c.error is None and c.real == 0 for c in checks), [(c.key, c.error) for c in checks]


def _gz_lines(path, lines):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def test_malformed_lhotse_rows_are_error_rows(tmp_path, tiny_model_dir):
    lhotse = pytest.importorskip("lhotse")
    write_noise(tmp_path / "r.wav", 24_000 * 2)
    rec = lhotse.Recording.from_file(str(tmp_path / "r.wav"))
    good = lhotse.MonoCut("good", 0.5, 1.0, 0, recording=rec).to_dict()
    cuts = tmp_path / "cuts.jsonl.gz"
    _gz_lines(cuts, [json.dumps(good), json.dumps({"id": "broken", "type": "MonoCut"}), "[1, 2]",
                     json.dumps({**good, "id": "good"})])
    out = str(tmp_path / "out")
    summary = extract(str(cuts), out, _settings(tiny_model_dir))
    check_consistency(out, {"good"})
    errors = sorted(r["error"] for r in read_manifest(out) if r["status"] == "error")
    assert summary.errors == 3 and [e.split(":")[0] for e in errors] == ["line 2", "line 3", "line 4"], errors
    assert "duplicate key 'good'" in errors[2]

    sups = tmp_path / "sups.jsonl.gz"
    recs = tmp_path / "recs.jsonl.gz"
    _gz_lines(recs, [json.dumps(rec.to_dict())])
    _gz_lines(sups, [json.dumps({"id": "s1", "recording_id": rec.id, "start": 0.0, "duration": 1.0, "channel": 0}),
                     json.dumps({"id": "s2", "start": 0.0, "duration": 1.0})])
    found = discover(str(sups), recordings=str(recs))
    assert [it.key for it in found.items] == ["s1"]
    (bad,) = found.bad
    assert bad.key == "s2" and bad.error.startswith("line 2:"), bad.error


def test_out_inside_input_is_not_an_input(tmp_path, tiny_model_dir):
    root = tmp_path / "in"
    root.mkdir()
    write_noise(root / "a.wav", 12_000)
    out = root / "out"
    extract(str(root), str(out), _settings(tiny_model_dir))
    os.makedirs(out / "decoded")
    write_noise(out / "decoded" / "a.wav", 12_000)  # what `decode` writes, inside OUT
    summary = extract(str(root), str(out), _settings(tiny_model_dir))
    assert summary.inputs == 1 and summary.skipped == 1
    assert any("output directory" in w and str(out) in w for w in summary.warnings), summary.warnings
    check_consistency(str(out), {"a.wav"})


@pytest.mark.parametrize("bad_line", [1, 2])
def test_a_nemo_manifest_line_that_is_not_utf8_is_that_rows_error(tmp_path, bad_line):
    """One Latin-1 byte on one line of a NeMo ``manifest.json`` (issue 41, item 4): that line is an
    error row, as the same byte in a ``.jsonl`` list is; the manifest was refused whole ("not a
    list") when the byte lay in the first block its detection decoded strictly."""
    for name in ("a0.wav", "a1.wav", "a2.wav"):
        write_noise(tmp_path / name, 12_000)
    lines = [b'{"audio_filepath": "a%d.wav", "duration": 0.5, "text": "%s"}' % (n, b"caf\xe9" if n + 1 == bad_line
                                                                                 else b"plain") for n in range(3)]
    (tmp_path / "manifest.json").write_bytes(b"\n".join(lines) + b"\n")
    found = discover(str(tmp_path / "manifest.json"))
    assert sorted(it.key for it in found.items) == sorted({"a0.wav", "a1.wav", "a2.wav"} - {f"a{bad_line - 1}.wav"})
    (bad,) = found.bad
    assert bad.error.startswith(f"line {bad_line}:") and "not valid UTF-8" in bad.error, bad.error
    assert {it.meta["text"] for it in found.items} == {"plain"}


def test_messages_are_bounded(tmp_path, tiny_model_dir):
    """A CSV list refused for a 2 MB header name (issue 41, item 5) printed the whole name, in a
    2,000,067-character line: the refusal quotes it cut, and every line the CLI prints or an error
    row stores is bounded whatever a site quotes (``common.messages``)."""
    from rich.console import Console

    from support import cli
    from mimi_extract.cli import common
    from mimi_extract.common.messages import MESSAGE_LIMIT
    from mimi_extract.store.manifest import ManifestRow

    write_noise(tmp_path / "a.wav", 12_000)
    (tmp_path / "list.csv").write_text("x" * 2_000_000 + ",id\na.wav,a\n")
    result = cli("codes", tmp_path / "list.csv", tmp_path / "out", "--model", tiny_model_dir, "--device", "cpu")
    assert result.exit_code == 2 and "needs a 'path' column" in result.output, result.output[:500]
    assert max(map(len, result.output.splitlines())) < 500, len(result.output)

    console = Console(record=True, width=80, force_terminal=False)
    common.say(("error: ", "red"), "why: " + "y" * 10**6 + " end", out=console)
    common.say(("z" * 10**6, "red"), out=console)
    lines = console.export_text().splitlines()
    assert len(lines) == 2 and all(len(line) <= MESSAGE_LIMIT + 60 for line in lines), [len(x) for x in lines]
    assert lines[0].startswith("error: why: yyy") and lines[0].endswith("yyy end") and "characters left out" in lines[0]
    row = ManifestRow(path="a.wav", key="a").failed("first line\n" + "q" * 10**6)
    assert row.error.startswith("first line\nqqq") and len(row.error) <= MESSAGE_LIMIT + 60
