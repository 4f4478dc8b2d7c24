"""A malformed OUT (a manifest row of the wrong types, a line that is not an object, a manifest that
is a folder, garbage run.json or plan.json) makes every operations command say so in one line
naming the file (and line), with exit status 2 -- never a traceback; a fuzz test over manifest rows
(hypothesis) holds every command to that."""

from __future__ import annotations

import json
import os
import random
import shutil

import pytest

from support import cli
from support import extract
from support.corpora import FILES, settings


COMMANDS = [["info"], ["status"], ["status", "--missing"], ["status", "--json"], ["cuts", "-o", "{tmp}/c.jsonl.gz"],
            ["report", "--workers", "1"], ["report", "--manifest-only"]]


@pytest.fixture(scope="module")
def good(loose, tiny_model_dir, tmp_path_factory):  # noqa: F811
    """A complete HDF5 OUT of the loose files (two items a shard), never modified: tests copy it."""
    out = str(tmp_path_factory.mktemp("good") / "out")
    assert extract(loose, out, settings(tiny_model_dir), shard_size=2).ok == len(FILES)
    return out


def run_all(out: str, tmp: str) -> list:
    return [(args, cli(*(a.replace("{tmp}", tmp) for a in args[:1] + [out] + args[1:]))) for args in COMMANDS]


def assert_one_line_error(results, *needles: str) -> None:
    """Each command failed with exit 2 and one ``error:`` line (no traceback) holding ``needles``."""
    for args, result in results:
        assert result.exit_code == 2, (args, result.output)
        assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exception)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.output)
        text = " ".join(result.output.split())  # (the console wraps long lines)
        for needle in needles:
            assert needle in text, (args, needle, result.output)


def copy(good: str, tmp_path) -> str:
    out = str(tmp_path / "out")
    shutil.copytree(good, out)
    return out


def append(out: str, line: str) -> int:
    """Append a line to the manifest; returns its line number."""
    path = os.path.join(out, "manifest.jsonl")
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


@pytest.mark.parametrize("line", ['{"key": 5, "shard": 7, "status": "ok"}', "[1, 2]", '"a string"', "5",
                                  '{"key": "x", "status": "ok", "shard": "shard-00000.h5", "frames": "many"}',
                                  '{"key": "x", "status": "maybe"}', '{"path": "no key"}',
                                  '{"key": "x", "status": "ok", "shard": "../../etc/passwd", "frames": 1}'])
def test_a_malformed_row_is_one_line_naming_the_file_and_line(good, tmp_path, line):
    """(Before: a traceback in all seven commands for the first.)  A torn last line (not JSON) stays
    what a kill leaves, ignored."""
    out = copy(good, tmp_path)
    n = append(out, line)
    assert_one_line_error(run_all(out, str(tmp_path)), f"manifest.jsonl line {n}", "edited or damaged")


def test_a_torn_last_line_is_ignored(good, tmp_path):
    out = copy(good, tmp_path)
    append(out, '{"key": "half-written", "sta')
    for args, result in run_all(out, str(tmp_path)):
        assert result.exit_code == 0, (args, result.output)


@pytest.mark.parametrize("damage,needle", [
    ("manifest-folder", "manifest.jsonl is not a file"),
    ("run.json-garbage", "run.json is not JSON"),
    ("run.json-list", "run.json holds JSON list, not an object"),
    ("run.json-folder", "run.json is a folder"),
    ("run.json-tap", "run.json has tap 5"),
    ("run.json-missing", "holds no mimi-extract run (no run.json)"),
    ("plan.json-garbage", "plan.json is not JSON"),
    ("plan.json-inputs", "plan.json has inputs \"many\""),
])
def test_a_malformed_file_of_out_is_one_line_naming_it(good, tmp_path, damage, needle):
    """(Before: tracebacks in info and status for a manifest that is a folder.)"""
    out = copy(good, tmp_path)
    name, _, kind = damage.partition("-")
    path = os.path.join(out, "manifest.jsonl" if name == "manifest" else name)
    with open(path, encoding="utf-8") as f:
        was = f.read()
    os.remove(path)
    if kind == "folder":
        os.makedirs(path)
    elif kind != "missing":
        content = {"garbage": "{not json", "list": "[]",
                   "tap": lambda: json.dumps({**json.loads(was), "tap": 5}),
                   "inputs": lambda: json.dumps({**json.loads(was), "inputs": "many"})}[kind]
        with open(path, "w", encoding="utf-8") as f:
            f.write(content if isinstance(content, str) else content())
    results = run_all(out, str(tmp_path))
    if name == "plan.json":  # what the last run planned: only info and status read it
        assert all(r.exit_code == 0 for args, r in results if args[0] in ("cuts", "report")), results
        results = [(args, r) for args, r in results if args[0] in ("info", "status")]
    assert_one_line_error(results, needle)


@pytest.mark.parametrize("damage,needle", [
    ("random", "run.json is not JSON"), ("list", "run.json holds JSON list, not an object"),
    ("folder", "run.json is a folder"), ("tap", "run.json has tap 5"),
    ("newer", "run.json has schema_version 99"), ("missing", None)])
def test_the_checksum_audit_fails_a_run_json_every_other_command_refuses(good, tmp_path, damage, needle):
    """``verify --out --checksums`` reads run.json too: 300 random bytes there (and the other damage
    every other command refuses) FAIL it, exit 1, naming the file, while every item is still read and
    checked (it passed them, PASS, before).  A missing run.json is no damage here: the checksums need
    no settings (verify --out's message for a missing one sends users to this very audit)."""
    out = copy(good, tmp_path)
    path = os.path.join(out, "run.json")
    was = json.load(open(path))
    os.remove(path)
    if damage == "folder":
        os.makedirs(path)
    elif damage != "missing":
        content = {"random": random.Random(0).randbytes(300), "list": b"[]", "tap": json.dumps({**was, "tap": 5}).encode(),
                   "newer": json.dumps({**was, "schema_version": 99}).encode()}[damage]
        with open(path, "wb") as f:
            f.write(content)
    result = cli("verify", "--out", out, "--checksums")
    text = " ".join(result.output.split())
    assert f"{len(FILES)} stored items read, {len(FILES)} against their checksums; 0 damaged" in text, result.output
    if needle is None:
        assert result.exit_code == 0 and "PASS" in text, result.output
        return
    assert result.exit_code == 1 and needle in text and "1 unreadable run.json; FAIL" in text, result.output
    assert "--reencode-damaged" not in text and "Traceback" not in result.output


def test_a_garbage_stats_json_is_no_reader_s_business(good, tmp_path):
    """stats.json is the last run's timing: no operations command reads it, so garbage there changes nothing."""
    out = copy(good, tmp_path)
    with open(os.path.join(out, "stats.json"), "w") as f:
        f.write("{garbage")
    for args, result in run_all(out, str(tmp_path)):
        assert result.exit_code == 0, (args, result.output)


# -- the fuzz test ----------------------------------------------------------------------------------
def test_fuzzed_manifest_rows_never_give_a_traceback(good, tmp_path):
    """Rows made by mutating real rows (fields replaced by any JSON value, removed, added) and any
    JSON line: every operations command either accepts the manifest (exit 0 or status --missing's
    1) or says in one ``error:`` line which file and line is wrong (exit 2); never a traceback."""
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

    out = copy(good, tmp_path)
    manifest = os.path.join(out, "manifest.jsonl")
    with open(manifest, encoding="utf-8") as f:
        original = f.read()
    rows = [json.loads(line) for line in original.splitlines()]
    fields = sorted({k for r in rows for k in r} | {"source", "meta", "index", "offset", "nbytes", "x"})
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6), st.floats(allow_nan=False, allow_infinity=False),
                        st.text(max_size=12), st.sampled_from(["ok", "error", "shard-00000.h5", "shard-00001.h5",
                                                               "../x", "shard-99999.h5"]))
    values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                           st.dictionaries(st.sampled_from(["path", "frames", "channels",
                                                                                            "kind", "supervisions", "y"]),
                                                                           inner, max_size=4)), max_leaves=6)
    mutated = st.builds(lambda row, changes, drop: {**{k: v for k, v in row.items() if k not in drop}, **changes},
                        st.sampled_from(rows), st.dictionaries(st.sampled_from(fields), values, max_size=3),
                        st.sets(st.sampled_from(fields), max_size=2))
    lines = st.lists(st.one_of(mutated.map(json.dumps), values.map(json.dumps)), min_size=1, max_size=3)

    @hsettings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(lines)
    def check(extra):
        with open(manifest, "w", encoding="utf-8") as f:
            f.write(original + "".join(line + "\n" for line in extra))
        for args, result in run_all(out, str(tmp_path)):
            assert result.exception is None or isinstance(result.exception, SystemExit), (
                args, extra, repr(result.exception))
            assert result.exit_code in (0, 1, 2), (args, extra, result.output)
            if result.exit_code == 2:
                text = " ".join(result.output.split())
                assert text.startswith("error: ") and "manifest.jsonl line" in text, (args, extra, result.output)
            elif result.exit_code == 1:
                assert args == ["status", "--missing"], (args, extra, result.output)

    assert hypothesis.__version__
    check()
