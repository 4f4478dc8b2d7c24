"""A run's identity (issue 22 items 3, 7, 8; issue 23 item 7).

* Every option that shapes the items or their keys is recorded in run.json, and a resume that
  changes one is refused in one line naming it (old -> new, and what to do), OUT untouched: a
  resume without ``--id-column`` stored every item a second time under ``<file>/<row>`` keys.
* The input is found, and its options checked, before OUT is created or the model loaded: a run
  that finds nothing leaves no OUT (it pinned its settings, and the right run was then refused),
  a wrong column or sidecar field is one clear line, exit 2.
* ``status`` says that a run is starting while it holds OUT's lock before run.json exists.
"""

import hashlib
import io
import json
import os
import tarfile

import numpy as np
import pytest
import soundfile as sf

from mimi_extract.store.files import OutputError
from mimi_extract.store.lock import RunLock
from mimi_extract.config.settings import Part
from support import extract
from mimi_extract.config.settings import Settings
from mimi_extract.sources import Options
from support import check_consistency
from mimi_extract.audit.verify import verify_outputs
from support import ONE_WORKER, cli

NAMES = [f"u{i}.wav" for i in range(4)]
LOADING = "loading the model"  # the phase line a run prints before it loads the weights


def settings(model_dir, **kw):
    return Settings(model=model_dir, tap="codes", num_workers=1, **kw)


def wav_bytes(seconds: float, seed: int, channels: int = 1) -> bytes:
    rng = np.random.default_rng(seed)
    n = int(seconds * 24_000)
    buffer = io.BytesIO()
    sf.write(buffer, (0.2 * rng.standard_normal(n if channels == 1 else (n, channels))).astype(np.float32),
             24_000, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def flac_bytes(seconds: float, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    sf.write(buffer, (0.2 * rng.standard_normal(int(seconds * 16_000))).astype(np.float32), 16_000, format="FLAC")
    return buffer.getvalue()


def add_bytes(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """The same kind of corpus as Parquet (two audio columns and an id), tar and .tar.gz shards (each
    sample a .wav, a .flac of other audio, and a .json sidecar with its id) and loose files (one stereo)."""
    datasets = pytest.importorskip("datasets")
    root = tmp_path_factory.mktemp("identity-inputs")
    first = [wav_bytes(0.3 + 0.1 * i, i) for i in range(len(NAMES))]
    other = [flac_bytes(0.5, 10 + i) for i in range(len(NAMES))]
    ds = datasets.Dataset.from_dict({
        "audio": [{"bytes": b, "path": n} for b, n in zip(first, NAMES)],
        "other": [{"bytes": b, "path": n.replace(".wav", ".flac")} for b, n in zip(other, NAMES)],
        "id": NAMES}).cast_column("audio", datasets.Audio()).cast_column("other", datasets.Audio())
    (root / "pq").mkdir()
    ds.to_parquet(str(root / "pq" / "train.parquet"), batch_size=2)
    for name, mode in (("tar/s-000.tar", "w"), ("tgz/s-000.tar.gz", "w:gz")):
        (root / name).parent.mkdir()
        with tarfile.open(root / name, mode) as tf:
            for n, a, b in zip(NAMES, first, other):
                stem = n.split(".")[0]
                add_bytes(tf, f"{stem}.wav", a)
                add_bytes(tf, f"{stem}.flac", b)
                add_bytes(tf, f"{stem}.json", json.dumps({"id": n, "text": "hi"}).encode())
    (root / "loose").mkdir()
    for i, n in enumerate(NAMES):
        (root / "loose" / n).write_bytes(wav_bytes(0.3, 20 + i, channels=2 if i == 0 else 1))
    (root / "empty").mkdir()
    return {k: str(root / k) for k in ("pq", "tar", "tgz", "loose", "empty")}


def snapshot(out: str) -> dict:
    """Every file of OUT with its bytes' hash and mtime: what "OUT untouched" means."""
    files = {}
    for dirpath, _, names in os.walk(out):
        for n in names:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as f:
                files[os.path.relpath(p, out)] = (hashlib.sha256(f.read()).hexdigest(), os.stat(p).st_mtime_ns)
    return files


def error_lines(result) -> list[str]:
    """The lines a refused run printed, its start-up phase lines (HH:MM:SS ...) left out."""
    return [line for line in result.output.splitlines() if line.strip() and not line[:2].isdigit()]


# (input, the options of the run that made OUT, the options of the resume, the flag named)
CHANGES = {
    "parquet: --id-column dropped": ("pq", ["--id-column", "id"], [], "--id-column"),
    "parquet: --id-column added": ("pq", [], ["--id-column", "id"], "--id-column"),
    "parquet: --audio-column other": ("pq", [], ["--audio-column", "other"], "--audio-column"),
    "tar: --id-field dropped": ("tar", ["--id-field", "id"], [], "--id-field"),
    "tar: --id-field added": ("tar", [], ["--id-field", "id"], "--id-field"),
    "tar: --audio-ext flac": ("tar", ["--id-field", "id"], ["--id-field", "id", "--audio-ext", "flac"], "--audio-ext"),
    "tgz: --id-field dropped": ("tgz", ["--id-field", "id"], [], "--id-field"),
    "files: --channel each": ("loose", [], ["--channel", "each"], "--channel"),
}


@pytest.mark.parametrize("case", sorted(CHANGES))
def test_resume_with_a_key_shaping_option_changed_is_refused(case, inputs, tiny_model_dir, tmp_path):
    """Issue 22 item 3: reproduced first -- a Parquet OUT made with --id-column and resumed without it
    held 8 ok items for 4 inputs, each utterance twice.  Now: refused in one line naming the option,
    old -> new and the options to resume with; OUT untouched; no model loaded."""
    kind, made, resumed, flag = CHANGES[case]
    out = str(tmp_path / "out")
    first = cli("codes", inputs[kind], out, "--model", tiny_model_dir, *ONE_WORKER, *made)
    assert first.exit_code == 0, first.output
    before = snapshot(out)
    result = cli("codes", inputs[kind], out, "--model", tiny_model_dir, *ONE_WORKER, *resumed)
    assert result.exit_code == 2, result.output
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert f"{flag}: " in lines[0] and "->" in lines[0] and "use a new OUT directory" in lines[0], lines[0]
    if made:  # what to resume with: the options that made OUT
        assert " ".join(made) in lines[0], lines[0]
    assert LOADING not in result.output
    assert snapshot(out) == before


def edit_run_json(out: str, edit) -> None:
    path = os.path.join(out, "run.json")
    with open(path) as f:
        info = json.load(f)
    with open(path, "w") as f:
        json.dump(edit(info), f)


def test_input_kind_change_names_input_format(inputs, tiny_model_dir, tmp_path):
    """The kind INPUT is read as (--input-format, or detected) is part of the identity, named as such."""
    out = str(tmp_path / "out")
    extract(inputs["tar"], out, settings(tiny_model_dir), options=Options(id_field="id"))
    edit_run_json(out, lambda info: {**info, "input_kind": "tgz"})
    before = snapshot(out)
    result = cli("codes", inputs["tar"], out, "--model", tiny_model_dir, *ONE_WORKER, "--id-field", "id")
    assert result.exit_code == 2 and "input_kind: 'tgz' -> 'tar'" in result.text and "--input-format" in result.text
    assert snapshot(out) == before


@pytest.mark.parametrize("kind, options", [("pq", ["--id-column", "id", "--format", "parquet"]),
                                           ("tar", ["--id-field", "id", "--format", "parquet"])])
def test_resume_with_the_same_options_stores_each_item_once(kind, options, inputs, tiny_model_dir, tmp_path):
    """A resume with the same options encodes what is left and nothing twice: load_dataset on the
    Parquet output gives each utterance once, and every item equals MimiModel's single-item encode."""
    datasets = pytest.importorskip("datasets")
    out = str(tmp_path / "out")
    assert cli("codes", inputs[kind], out, "--model", tiny_model_dir, *ONE_WORKER, *options, "--limit", 2).exit_code == 0
    result = cli("codes", inputs[kind], out, "--model", tiny_model_dir, *ONE_WORKER, *options)
    assert result.exit_code == 0, result.output
    assert "2 ok, 0 errors, 2 skipped" in result.text, result.text
    assert sorted(check_consistency(out)) == NAMES
    ds = datasets.load_dataset(out, split="train", cache_dir=str(tmp_path / "hf-cache"))
    assert sorted(ds["key"]) == NAMES
    info = cli("info", out)
    assert info.exit_code == 0 and info.text.startswith(f"{len(NAMES)} inputs: {len(NAMES)} ok, 0 errors"), info.text
    checks, problems = verify_outputs(out, sample=None)  # each item re-encoded alone, compared with what OUT holds
    assert not problems and len(checks) == len(NAMES)
    assert all(c.error is None and not [m for m in c.mismatches if not m.tie] for c in checks), checks


def test_older_run_json_without_items_refuses_disjoint_keys_then_pins(inputs, tiny_model_dir, tmp_path):
    """An OUT whose run.json predates ``items`` cannot say which options made it: a resume whose keys
    are none of the stored ones is refused (the reported double storage); one that matches them goes
    on and records its options, compared from then on."""
    out = str(tmp_path / "out")
    extract(inputs["pq"], out, settings(tiny_model_dir), options=Options(id_column="id"), limit=2)
    edit_run_json(out, lambda info: {k: v for k, v in info.items() if k != "items"})
    before = snapshot(out)
    with pytest.raises(Exception, match="none of them is among this run's 4 inputs"):
        # (--keep-fields none: without --id-column the id column would also be a new metadata column,
        # refused as such before the keys are compared)
        extract(inputs["pq"], out, settings(tiny_model_dir), options=Options(keep_fields="none"))
    assert snapshot(out) == before
    assert extract(inputs["pq"], out, settings(tiny_model_dir), options=Options(id_column="id")).ok == 2
    with open(os.path.join(out, "run.json")) as f:
        assert json.load(f)["items"] == {"--id-column": "id"}
    result = cli("codes", inputs["pq"], out, "--model", tiny_model_dir, *ONE_WORKER)
    assert result.exit_code == 2 and "--id-column: 'id' -> not given" in result.text


def test_run_json_schema_version_missing_resumes_newer_is_refused(inputs, tiny_model_dir, tmp_path):
    """run.json records its layout (``schema_version``).  One written before the key existed is layout
    1: it is read and resumed; a layout newer than this version reads is refused in one clear line
    (a resume, info), OUT untouched."""
    out = str(tmp_path / "out")
    extract(inputs["loose"], out, settings(tiny_model_dir), limit=2)
    with open(os.path.join(out, "run.json")) as f:
        assert json.load(f)["schema_version"] == 1
    edit_run_json(out, lambda info: {k: v for k, v in info.items() if k != "schema_version"})  # an older OUT
    assert json.loads(cli("info", out, "--json").stdout)["ok"] == 2
    summary = extract(inputs["loose"], out, settings(tiny_model_dir))
    assert (summary.skipped, summary.ok, summary.errors) == (2, len(NAMES) - 2, 0)
    check_consistency(out)
    edit_run_json(out, lambda info: {**info, "schema_version": 2})  # a newer mimi-extract's
    before = snapshot(out)
    with pytest.raises(OutputError, match="schema_version 2; this mimi-extract reads up to 1: it was written by a newer"):
        extract(inputs["loose"], out, settings(tiny_model_dir))
    assert snapshot(out) == before
    for result in (cli("codes", inputs["loose"], out, "--model", tiny_model_dir, *ONE_WORKER), cli("info", out)):
        assert result.exit_code != 0 and "written by a newer mimi-extract" in result.text
    assert snapshot(out) == before


def test_info_counts_each_key_once_and_never_more_ok_than_inputs(inputs, tiny_model_dir, tmp_path):
    """An OUT that already holds each utterance twice (made before such resumes were refused: here a
    second manifest row per key, and rows of a second key scheme) is counted honestly."""
    out = str(tmp_path / "out")
    extract(inputs["pq"], out, settings(tiny_model_dir), options=Options(id_column="id"))
    manifest = os.path.join(out, "manifest.jsonl")
    with open(manifest) as f:
        rows = [json.loads(line) for line in f]
    with open(manifest, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")  # the same key twice
            f.write(json.dumps({**r, "key": "train.parquet/" + r["key"]}) + "\n")  # another key scheme
    result = cli("info", out, "--json")
    report = json.loads(result.stdout)
    assert report["ok"] == 2 * len(NAMES) and report["inputs"] >= report["ok"] and report["unplanned"] == len(NAMES)
    text = cli("info", out).text
    assert text.startswith(f"{2 * len(NAMES)} inputs: {2 * len(NAMES)} ok") and f"{len(NAMES)} of these items" in text
    status = json.loads(cli("status", out, "--json").stdout)
    assert status["runs"]["whole run"]["ok"] == 2 * len(NAMES) <= status["runs"]["whole run"]["inputs"]


@pytest.mark.parametrize("what", ["empty folder", "an OUT"])
def test_no_input_leaves_no_out_and_the_right_run_goes_on(what, inputs, tiny_model_dir, tmp_path):
    """Issue 22 item 7: a run that found no input created OUT and pinned its settings (run.json), so
    the right run into it was refused.  Now: exit 3 before OUT is created, and the right run works."""
    source = inputs["empty"]
    if what == "an OUT":
        source = str(tmp_path / "made")
        extract(inputs["loose"], source, settings(tiny_model_dir))
    out = tmp_path / "out"
    result = cli("codes", source, out, "--model", tiny_model_dir, *ONE_WORKER)
    assert result.exit_code == 3 and "no input found" in result.text, result.output
    assert LOADING not in result.output
    assert not out.exists()
    if what == "an OUT":
        assert "it is a mimi-extract OUT" in result.text
    right = cli("codes", inputs["loose"], out, "--model", tiny_model_dir, *ONE_WORKER, "--channel", "each")
    assert right.exit_code == 0, right.output
    assert len(check_consistency(str(out))) == len(NAMES) + 1  # the stereo file: one item per channel


def test_no_input_leaves_an_existing_out_untouched(inputs, tiny_model_dir, tmp_path):
    out = str(tmp_path / "out")
    extract(inputs["loose"], out, settings(tiny_model_dir))
    before = snapshot(out)
    result = cli("codes", inputs["empty"], out, "--model", tiny_model_dir, *ONE_WORKER)
    assert result.exit_code == 3 and snapshot(out) == before


# (input, options, what the one line names)
WRONG = {
    "--audio-column": ("pq", ["--audio-column", "aduio"], ["'aduio'", "columns: audio, other, id"]),
    "--id-column": ("pq", ["--id-column", "uid"], ["'uid'", "columns: audio, other, id"]),
    "--id-field tar": ("tar", ["--id-field", "uid"], ["'uid'", "fields: id, text"]),
    "--id-field tgz": ("tgz", ["--id-field", "uid"], ["'uid'", "fields: id, text"]),
    "--audio-ext": ("tar", ["--audio-ext", "mp3"], ["mp3", "members: wav, flac, json"]),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_wrong_input_option_fails_before_anything_is_loaded(case, inputs, tiny_model_dir, tmp_path):
    """Issue 22 item 8: option errors came after the workers started and the model loaded (13 s), and
    a wrong --id-field became an error row per sample, exit 4.  Now: one line naming the option and
    what the input has, exit 2, no OUT, and the run never reached its model-loading phase."""
    kind, options, named = WRONG[case]
    out = tmp_path / "out"
    result = cli("codes", inputs[kind], out, "--model", tiny_model_dir, *ONE_WORKER, *options)
    assert result.exit_code == 2, result.output
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith(f"error: {options[0]} "), result.output
    assert all(n in lines[0] for n in named), lines[0]
    assert LOADING not in result.output and "encoder worker" not in result.output
    assert not out.exists()


def test_wrong_input_option_never_loads_the_model(inputs, tmp_path, monkeypatch):
    """The API too: the model is never loaded (the engine and the weights' loader would fail loudly)."""
    from mimi_extract.run import runner

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(runner, "load_identity", never)
    monkeypatch.setattr(runner, "make_engine", never)
    with pytest.raises(ValueError, match="--id-field 'uid'"):
        extract(inputs["tar"], str(tmp_path / "out"), settings("/nonexistent/model"), options=Options(id_field="uid"))
    assert not (tmp_path / "out").exists()


def test_some_samples_without_the_id_field_are_error_rows(inputs, tmp_path):
    """The check is on the option, not the data: when some sidecars have the field, the others stay
    error rows naming their sample."""
    from mimi_extract.sources import discover

    path = tmp_path / "mixed.tar"
    with tarfile.open(path, "w") as tf:
        for i, n in enumerate(NAMES):
            add_bytes(tf, f"s{i}.wav", wav_bytes(0.2, i))
            add_bytes(tf, f"s{i}.json", json.dumps({"id": n} if i else {"text": "no id"}).encode())
    found = discover(str(path), options=Options(id_field="id"))
    assert sorted(it.key for it in found.items) == NAMES[1:]
    assert len(found.bad) == 1 and "has no 'id'" in found.bad[0].error


def test_status_says_a_run_is_starting(inputs, tiny_model_dir, tmp_path):
    """Issue 23 item 7: while a run holds OUT's lock before writing run.json (finding inputs, loading
    the model), status said "holds no mimi-extract run"; now it says that a run is starting.  A lock
    that nobody holds any more (a run stopped before run.json) is not a starting run."""
    out = tmp_path / "out"
    out.mkdir()
    lock = RunLock(str(out))
    try:
        result = cli("status", out)
        assert result.exit_code == 0 and "whole run: starting" in result.text and f"pid {os.getpid()}" in result.text
        assert json.loads(cli("status", out, "--json").stdout)["starting"]["whole run"].startswith("pid ")
        info = cli("info", out)
        assert info.exit_code == 2 and "a run is starting" in info.text
    finally:
        lock.release()
    result = cli("status", out)
    assert result.exit_code == 2 and "holds no mimi-extract run" in result.text
    part = out / "part-1-of-2"  # a part starting, beside a part with a run
    extract(inputs["loose"], str(out), settings(tiny_model_dir), part=Part(0, 2))
    part.mkdir()
    lock = RunLock(str(part), what=part.name)
    try:
        text = cli("status", out).text
        assert "part-1-of-2: starting" in text and "not started" not in text and "incomplete" in text, text
    finally:
        lock.release()


def test_run_json_records_library_versions_and_a_resume_with_others_goes_on(inputs, tiny_model_dir, tmp_path,
                                                                             monkeypatch):
    """Issue 31 item 7: run.json records the torch, transformers and torchaudio versions that made OUT
    (transformers' Mimi gained its sliding window in 5.3.0: the version says which reference made the
    codes).  They are provenance, not identity: a resume, or another part, with other versions goes on,
    and run.json keeps the versions of the run that made it."""
    from importlib import metadata

    import torch
    import transformers

    from mimi_extract.codec import model as codec_model
    from mimi_extract.store.identity import check_run_info, read_run_info

    out = str(tmp_path / "out")
    extract(inputs["loose"], out, settings(tiny_model_dir), limit=2)
    made = {"torch": torch.__version__, "transformers": transformers.__version__,
            "torchaudio": metadata.version("torchaudio")}
    assert read_run_info(out)["versions"] == made
    other = {"torch": "2.4.0", "transformers": "5.3.0", "torchaudio": None}
    monkeypatch.setattr(codec_model, "library_versions", lambda: other)
    summary = extract(inputs["loose"], out, settings(tiny_model_dir))
    assert (summary.skipped, summary.ok, summary.errors) == (2, len(NAMES) - 2, 0)
    assert read_run_info(out)["versions"] == made
    part = tmp_path / "parts" / "part-2-of-2"  # another part of one job array, made with other versions
    part.mkdir(parents=True)
    theirs = {**read_run_info(out), "part": "1/2"}
    check_run_info(str(part), {**theirs, "part": "2/2", "versions": other}, siblings=[out])
    assert read_run_info(str(part))["versions"] == other
