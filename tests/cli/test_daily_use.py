"""Day-to-day use (issue 18): light commands without torch, plain progress in logs, exit codes,
failing items named, paths that travel, an offline first run, one resampler by default."""

import json
import math
from dataclasses import replace
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import soundfile as sf
import torch

from support import ROOT, cli, write_noise
from support.outs import make_out

FAST = ["--device", "cpu", "--cpu-workers", "1", "--num-workers", "1"]

HEAVY = ("torch", "transformers", "lhotse")  # what a light command must not import

# runs the real CLI in a fresh interpreter, then says which heavy modules it imported
PROBE = ("import atexit, sys, runpy\n"
         f"atexit.register(lambda: sys.stderr.write('HEAVY=' + ','.join(m for m in {HEAVY!r}"
         " if m in sys.modules) + '\\n'))\n"
         "sys.argv = ['mimi-extract'] + sys.argv[1:]\n"
         "runpy.run_module('mimi_extract', run_name='__main__')\n")


def run_light(*args, env=None):
    env = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    start = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], env=env, capture_output=True, text=True)
    return p, time.perf_counter() - start


# runs several commands in one fresh interpreter, one after the other, and says after each which heavy
# modules are imported by then (the first command that imports one is named, as a fresh process would)
SEQUENCE = ("import json, sys, runpy\n"
            "for argv in json.loads(sys.argv[1]):\n"
            "    sys.argv = ['mimi-extract'] + argv\n"
            "    try:\n"
            "        runpy.run_module('mimi_extract', run_name='__main__')\n"
            "        code = 0\n"
            "    except SystemExit as stop:\n"
            "        code = stop.code or 0\n"
            f"    heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
            "    sys.stderr.write('STEP=' + json.dumps([argv, code, heavy]) + '\\n')\n")


def test_light_commands_do_not_import_torch(tmp_path):
    out = tmp_path / "out"
    make_out(out, [f"{i}.wav" for i in range(3)])
    audio = tmp_path / "audio"
    audio.mkdir()
    write_noise(audio / "a.flac", 4000, 16_000)
    commands = [["--version"], ["--help"], ["info", out], ["info", out, "--json"], ["status", out],
                ["cuts", out, "-o", tmp_path / "c.jsonl.gz"], ["report", out], ["report", out, "--json"],
                ["report", out, "--png", tmp_path / "r.png"], ["plan", audio], ["plan", audio, "--json"]]
    commands = [[str(a) for a in c] for c in commands]
    p = subprocess.run([sys.executable, "-c", SEQUENCE, json.dumps(commands)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": ROOT})
    steps = [json.loads(line[5:]) for line in p.stderr.splitlines() if line.startswith("STEP=")]
    assert [s[0] for s in steps] == commands, p.stderr  # every command ran
    for argv, code, heavy in steps:
        assert code == 0, (argv, p.stderr)
        assert heavy == [], f"{argv}: imported {heavy}"
    assert (tmp_path / "c.jsonl.gz").exists() and (tmp_path / "r.png").exists()


def test_request_and_settings_import_without_torch():
    """What a run is asked (the request, its settings and input options, the choices the CLI offers) is
    plain data: the CLI builds it, and a spawned worker unpickles it, before torch is imported."""
    code = ("import sys, pickle; import mimi_extract.config.request as r, mimi_extract.config.settings, mimi_extract.config.choices; "
            "import mimi_extract.cli.request; pickle.loads(pickle.dumps(r.RunRequest('in', 'out', options=r.Options(keep_fields='a')))); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


def test_log_gets_phase_lines_and_plain_progress(corpus, tiny_model_dir, tmp_path):
    root, _ = corpus
    result = cli("codes", root, tmp_path / "out", "--model", tiny_model_dir, *FAST, "--progress-seconds", 0)
    assert result.exit_code == 0, result.output
    text = result.text
    for phase in ("starting 1 encoder worker(s) on cpu", "loading the model", "finding inputs in",
                  "planning 7 readable inputs (3 unreadable)"):
        assert phase in text, text
    lines = [l for l in result.output.splitlines() if "x real time, ETA" in l]
    assert len(lines) >= 2, result.output  # every piece (0 s interval) and the final line
    assert "(100%), 10 files" in lines[-1] and "3 errors" in lines[-1], lines[-1]
    assert "━" not in result.output  # no bar drawn into a log
    # where a short job's time goes: the process's age when encoding began and at its first result
    startup = json.load(open(tmp_path / "out" / "stats.json"))["startup"]
    assert 0 < startup["to_encoding"] <= startup["to_first_result"], startup
    assert f"first result {startup['to_first_result']:.1f} s after start" in text, text


def test_process_age_is_the_age_ps_reports():
    from mimi_extract.run.runner import process_age

    etimes = int(subprocess.run(["ps", "-o", "etimes=", "-p", str(os.getpid())], capture_output=True,
                                text=True, check=True).stdout)
    assert abs(process_age() - etimes) <= 1.5, (process_age(), etimes)


def test_exit_codes(tmp_path, tiny_model_dir):
    (tmp_path / "docs").mkdir()  # (a folder of .tar files is an input now: tar shards)
    (tmp_path / "docs" / "readme.txt").write_bytes(b"not looked into")
    result = cli("codes", tmp_path / "docs", tmp_path / "o1", "--model", tiny_model_dir, *FAST)
    assert result.exit_code == 3 and "no input found" in result.text, result.output
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.wav").write_bytes(b"RIFF garbage")
    (bad / "b.flac").write_bytes(b"fLaC garbage")
    result = cli("codes", bad, tmp_path / "o2", "--model", tiny_model_dir, *FAST)
    assert result.exit_code == 4 and "every input failed (2 of 2)" in result.text, result.output
    write_noise(bad / "good.wav", 4000)
    assert cli("codes", bad, tmp_path / "o3", "--model", tiny_model_dir, *FAST).exit_code == 0
    assert cli("codes", bad, tmp_path / "o4", "--model", tiny_model_dir, *FAST, "--strict").exit_code == 1
    help_text = cli("--help", env={"COLUMNS": "300"}).text
    assert "Exit codes: 0 done" in help_text and "3 no input found" in help_text and "4 every input failed" in help_text


@pytest.mark.slow
def test_failing_items_named_with_true_decoder_errors(tmp_path, tiny_model_dir):
    """The decoder's words are in the failed item's row and in ``info``, which names the file.  (Not in
    the run's log: FFmpeg writes to the process's stderr, which an in-process run cannot see; a real
    run of the same file is test_decoding.py's test_decoder_warnings_go_into_the_manifest_row.)"""
    from support import garbage_mp3

    corpus = tmp_path / "in"
    corpus.mkdir()
    garbage_mp3(corpus / "broken.mp3")
    write_noise(corpus / "good.wav", 4000)
    out = tmp_path / "out"
    result = cli("codes", corpus, out, "--model", tiny_model_dir, *FAST)
    assert result.exit_code == 0, result.output
    row = next(json.loads(l) for l in open(out / "manifest.jsonl") if "broken" in l)
    assert row["error"] == ("unreadable or corrupt audio header: Error opening 'broken.mp3': "
                            "Invalid data found when processing input (FFmpeg)"), row  # ... they are in the error row
    text = cli("info", out).text
    assert f"broken.mp3 {corpus / 'broken.mp3'}: unreadable or corrupt audio header: Error opening" in text, text
    report = json.loads(cli("info", out, "--json").output)
    assert report["failed"] == [{"key": "broken.mp3", "path": str(corpus / "broken.mp3"), "reason": row["error"]}]


def test_paths_travel_to_another_directory(tmp_path, tiny_model_dir, monkeypatch):
    import shutil

    from lhotse import CutSet

    work = tmp_path / "work"
    (work / "corpus").mkdir(parents=True)
    write_noise(work / "corpus" / "a.wav", 30_000)
    shutil.copytree(tiny_model_dir, work / "tiny")
    monkeypatch.chdir(work)
    result = cli("codes", "corpus", "out", "--model", "tiny", *FAST)  # relative everything
    assert result.exit_code == 0, result.output
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    out = work / "out"
    assert json.load(open(out / "run.json"))["model"] == str((work / "tiny").resolve())
    assert json.loads(open(out / "manifest.jsonl").readline())["source"]["path"] == str(work / "corpus" / "a.wav")
    cut = next(iter(CutSet.from_jsonl_lazy(out / "cuts.jsonl.gz")))
    audio = cut.load_audio()[0]  # was: ../corpus/a.wav, relative to where the run started: FileNotFoundError
    assert np.array_equal(audio[:30_000], sf.read(work / "corpus" / "a.wav", dtype="float32")[0])
    result = cli("verify", "--out", out, "--device", "cpu")  # the model from run.json, not the Hub
    assert result.exit_code == 0 and "PASS" in result.text, result.output
    result = cli("decode", out, "a.wav", "-o", elsewhere / "a.wav", "--device", "cpu")
    assert result.exit_code == 0 and (elsewhere / "a.wav").exists(), result.output


def test_offline_first_run_fails_fast_and_leaves_nothing(tmp_path, corpus, monkeypatch):
    root, _ = corpus
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-empty"))  # nothing cached
    out = tmp_path / "out"
    called = []  # fails fast: no request to the Hub, no model load (was: a wall-time bound, load-dependent)
    import mimi_extract.codec.hub
    import mimi_extract.codec.model

    monkeypatch.setattr(mimi_extract.codec.hub, "hub_reachable", lambda *a, **k: called.append("hub") or None)
    monkeypatch.setattr(mimi_extract.codec.model, "load_model", lambda *a, **k: called.append("load_model"))
    result = cli("codes", root, out, "--device", "cpu", env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-empty")})
    assert called == []
    assert result.exit_code == 2, result.output
    assert "HF_HUB_OFFLINE is set" in result.text and "--model DIR" in result.text
    assert "make_demo.py demo --random-model tiny" in result.text
    assert not out.exists()  # was: OUT/lock in an otherwise empty OUT


def test_offline_first_run_fails_before_torch_is_imported(tmp_path, corpus):
    root, _ = corpus
    out = tmp_path / "out"
    p, _ = run_light("codes", root, out, "--model", "some/uncached-model",
                     env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-empty")})
    assert p.returncode == 2, p.stderr
    assert "cannot load 'some/uncached-model'" in p.stderr and "HF_HUB_OFFLINE is set" in p.stderr, p.stderr
    heavy = p.stderr.rsplit("HEAVY=", 1)[1].strip()
    assert heavy == "", f"imported {heavy} before failing"
    assert not out.exists()


def test_a_run_that_cannot_load_its_model_leaves_no_out(tmp_path, corpus):
    root, _ = corpus
    (tmp_path / "not-a-model").mkdir()  # a directory: passes the offline check, fails to load
    out = tmp_path / "out"
    result = cli("codes", root, out, "--model", tmp_path / "not-a-model", *FAST)
    assert result.exit_code == 2 and "could not load Mimi" in result.text, result.output
    assert not out.exists()


def test_too_many_codebooks_is_refused_before_out_is_touched(tmp_path, corpus, tiny_model_dir, monkeypatch):
    """``-q`` past the model's codebooks (the tiny model has 8) is refused from its config.json,
    before OUT is created or locked and before the weights load or an engine starts: an empty OUT
    made beforehand (a job script's ``mkdir -p``) stays empty (it kept a lock file), a new one is
    not created.  The same with an OUT on object storage is refused before its lock object."""
    from mimi_extract.run import runner

    def never(*args, **kwargs):
        raise AssertionError("the weights were loaded or an engine started")

    monkeypatch.setattr(runner, "load_identity", never)
    monkeypatch.setattr(runner, "make_engine", never)
    monkeypatch.setattr(runner, "mirrored", never)
    root, _ = corpus
    made = tmp_path / "made"
    made.mkdir()
    for out in (made, tmp_path / "new", "s3://no-such-bucket/out"):
        result = cli("codes", root, out, "--model", tiny_model_dir, "-q", 9, *FAST)
        assert result.exit_code == 2 and "--num-quantizers must be in 1..8 for this model" in result.text, result.output
    assert os.listdir(made) == [] and not (tmp_path / "new").exists()


def test_441k_long_item_is_what_torchaudio_plus_mimimodel_gives(tmp_path, tiny_model, tiny_model_dir):
    """Issue 31 item 7: past 131,072 output samples torchaudio's resample can give one sample fewer than
    the exact ceil(n * 24000 / rate) (it rounds the quotient to float32): 240,854 samples at 44.1 kHz
    (5.5 s) resample to 131,077, not 131,078.  The tool encodes what a user's torchaudio + MimiModel loop
    encodes: the same samples, so the same last frame (the 131,078th sample made it differ)."""
    import torchaudio.functional as taf

    from mimi_extract import read
    from mimi_extract.codec.reference import reference_single

    from support import tolerance

    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / "a44k.wav"
    write_noise(path, 240_854, rate=44_100, subtype="FLOAT")
    wav = torch.from_numpy(sf.read(path, dtype="float32")[0])
    resampled = taf.resample(wav, 44_100, 24_000)
    assert len(resampled) == 131_077 == math.ceil(240_854 * 24_000 / 44_100) - 1
    out = tmp_path / "out"
    assert cli("features", tmp_path / "in", out, "--model", tiny_model_dir, "--tap", "latent", *FAST).exit_code == 0
    user = reference_single(tiny_model, resampled, 8)["latent"]  # the item alone through transformers' Mimi
    got = torch.from_numpy(read(out, "a44k.wav"))
    assert got.shape == user.shape and (got - user).abs().max() <= tolerance(user), float((got - user).abs().max())


def test_an_out_made_with_the_exact_length_resumes_and_audits_with_it(tmp_path, tiny_model, tiny_model_dir):
    """An OUT made before the length rule was recorded cut items to the exact ceil(n * 24000 / rate):
    a resume goes on with that rule (one OUT never mixes two), and ``verify --out`` audits with it."""
    from mimi_extract import read
    from support import extract
    from mimi_extract.config.settings import Settings
    from mimi_extract.store.identity import read_run_info, write_run_info

    from support import tolerance

    (tmp_path / "in").mkdir()
    for i, name in enumerate(["a44k.wav", "b44k.wav"]):
        write_noise(tmp_path / "in" / name, 240_854, rate=44_100, subtype="FLOAT", rng=np.random.default_rng(i))
    settings = Settings(model=tiny_model_dir, tap="latent", num_workers=0)
    old = str(tmp_path / "old")
    assert extract(str(tmp_path / "in"), old, replace(settings, resampled_length="exact"), limit=1).ok == 1
    info = read_run_info(old)
    assert info.pop("resampled_length") == "exact"
    write_run_info(old, info)  # as an OUT of 0.2 has it
    assert extract(str(tmp_path / "in"), old, settings).ok == 1
    exact, fresh = str(tmp_path / "exact"), str(tmp_path / "fresh")
    extract(str(tmp_path / "in"), exact, replace(settings, resampled_length="exact"))
    extract(str(tmp_path / "in"), fresh, settings)
    got, want, other = (torch.from_numpy(read(o, "b44k.wav")) for o in (old, exact, fresh))
    assert (got - want).abs().max() <= tolerance(want) < (got - other).abs().max()  # the last frame tells them apart
    result = cli("verify", "--out", old, "--model", tiny_model_dir, "--device", "cpu")
    assert result.exit_code == 0 and "2 files compared, 0 errors" in result.text and "PASS" in result.text, result.text


def test_16k_default_is_what_torchaudio_plus_mimimodel_gives(tmp_path, tiny_model, tiny_model_dir):
    import torchaudio.functional as taf

    from mimi_extract import read
    from mimi_extract.audio.resample import causal_lookahead
    from mimi_extract.codec.reference import reference_single

    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / "a16k.wav"
    write_noise(path, 16_000 + 77, rate=16_000, subtype="FLOAT")
    wav = torch.from_numpy(sf.read(path, dtype="float32")[0])
    out = tmp_path / "out"
    assert cli("codes", tmp_path / "in", out, "--model", tiny_model_dir, *FAST).exit_code == 0
    assert json.load(open(out / "run.json"))["causal_16k"] is False
    assert json.load(open(out / "run.json"))["resample_on"] == "host"  # (auto on a CPU)
    with torch.no_grad():  # the user's own loop: torchaudio's resample, MimiModel on the item alone
        user = tiny_model.encode(taf.resample(wav, 16_000, 24_000)[None, None], num_quantizers=8).audio_codes[0].T
        delayed = taf.resample(torch.nn.functional.pad(wav, (causal_lookahead(16_000, 24_000), 0)), 16_000, 24_000)
        causal = reference_single(tiny_model, delayed[: math.ceil(len(wav) * 1.5)], 8)["codes"]
    got = torch.from_numpy(read(out, "a16k.wav").astype(np.int64))
    assert got.shape == user.shape and torch.equal(got, user)
    # the causal resampler stays available, and is recorded
    out2 = tmp_path / "out2"
    assert cli("codes", tmp_path / "in", out2, "--model", tiny_model_dir, *FAST, "--resampler", "causal").exit_code == 0
    assert json.load(open(out2 / "run.json"))["causal_16k"] is True
    # where it resampled is recorded, as provenance: the same OUT resumed resampling on the device
    out3 = tmp_path / "out3"
    assert cli("codes", tmp_path / "in", out3, "--model", tiny_model_dir, *FAST, "--resample-on", "device").exit_code == 0
    assert json.load(open(out3 / "run.json"))["resample_on"] == "device"
    resumed = cli("codes", tmp_path / "in", out3, "--model", tiny_model_dir, *FAST, "--resample-on", "host")
    assert resumed.exit_code == 0, resumed.output
    got2 = torch.from_numpy(read(out2, "a16k.wav").astype(np.int64))
    assert torch.equal(got2, causal) and not torch.equal(got2[0], user[0])


def test_a_systematic_rejection_is_called_out(tmp_path, tiny_model_dir):
    """Many error rows sharing one reason (every file of a format refused, a wrong option): the end of
    the run and ``info`` say so in one prominent line (count, share, reason, first keys), ``info
    --json`` lists it; the exit status stays 0 (error rows) unless ``--strict``.  A lone bad file is
    not called out."""
    corpus = tmp_path / "in"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"bad{i}.flac").write_bytes(b"fLaC garbage" * (10 + i))
    (corpus / "odd.wav").write_bytes(b"RIFF garbage" * 3)
    for i in range(3):
        write_noise(corpus / f"good{i}.wav", 2400)
    out = tmp_path / "out"
    result = cli("codes", corpus, out, "--model", tiny_model_dir, *FAST)
    assert result.exit_code == 0, result.output
    line = ("warning: 4 of 8 inputs (50%) failed for one reason: unreadable or corrupt audio header: Error opening '…': "
            "Error : unknown error in flac decoder. (first: bad0.flac, bad1.flac, bad2.flac)")
    assert line in result.text and "odd.wav" not in result.text.split("warning:")[1].split("\n")[0], result.text
    assert line in cli("info", out).text
    common = json.loads(cli("info", out, "--json").output)["common_failures"]
    assert [(f["count"], f["first_keys"]) for f in common] == [(4, ["bad0.flac", "bad1.flac", "bad2.flac"])]
    assert cli("codes", corpus, tmp_path / "strict", "--model", tiny_model_dir, *FAST, "--strict").exit_code == 1


def test_help_written_to_a_file_is_not_cut(tmp_path):
    """--help into a file or a pipe (not a terminal): rich lays it out 80 columns wide there, which cut
    option names and their help short ("--max-batch-secon…"); every word is there whole instead."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH")}
    for command in ("codes", "features", "verify", "plan", "report", "status"):
        with open(tmp_path / "help.txt", "w") as f:
            subprocess.run([sys.executable, "-m", "mimi_extract", command, "--help"], stdout=f, check=True,
                           env={**env, "PYTHONPATH": ROOT})
        text = (tmp_path / "help.txt").read_text()
        assert "…" not in text, (command, [line for line in text.splitlines() if "…" in line][:3])
        if command == "codes":
            assert "--max-batch-seconds" in text and "--reencode-changed" in text
