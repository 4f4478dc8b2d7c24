"""moshi and MuVAP framing (inside padded batches), decode and info."""

import json
import os

import numpy as np
import pytest
import soundfile as sf
import torch

from support import cli, tolerance
from mimi_extract import read, read_manifest
from mimi_extract.store.manifest import shard_attrs
from mimi_extract.codec.reference import reference_single
from support import extract
from support.outs import check_decode
from mimi_extract.config.settings import Settings

FRAME = 1920


def corpus_at(root, rate, lengths, seed=0):
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    data = {}
    for i, n in enumerate(lengths):
        x = (0.2 * rng.standard_normal(n)).astype(np.float32)
        sf.write(os.path.join(root, f"f{i}.wav"), x, rate, subtype="FLOAT")
        data[f"f{i}.wav"] = x
    return data


def test_moshi_framing_equals_encode_of_zero_padded_input(tmp_path, tiny_model, tiny_model_dir):
    data = corpus_at(str(tmp_path / "c"), 24_000, [FRAME * 5 + 1, FRAME * 3, FRAME * 7 - 100, 333, FRAME * 2 + 960])
    out = str(tmp_path / "out")
    extract(str(tmp_path / "c"), out, Settings(model=tiny_model_dir, tap="codes", batch_size=8, max_batch_seconds=60,
                                                framing="moshi", num_workers=0))
    for key, x in data.items():
        padded = torch.nn.functional.pad(torch.from_numpy(x), (0, -len(x) % FRAME))
        with torch.no_grad():
            expected = tiny_model.encode(padded.reshape(1, 1, -1), num_quantizers=8).audio_codes[0].T.numpy()
        assert np.array_equal(read(out, key), expected), key
    assert json.load(open(os.path.join(out, "run.json")))["framing"] == "moshi"
    assert shard_attrs(out, read_manifest(out)[0]["shard"])["framing"] == "moshi"


def test_muvap_framing_is_the_recipe(tmp_path, tiny_model, tiny_model_dir):
    import torchaudio.functional as taf

    data = corpus_at(str(tmp_path / "c"), 16_000, [16_000 * 2 + 1, 16_000 * 3 + 3, 1000, 16_000 + 640])
    out = str(tmp_path / "out")
    extract(str(tmp_path / "c"), out, Settings(model=tiny_model_dir, tap="encoder", batch_size=8, max_batch_seconds=60,
                                                framing="muvap", num_workers=0))
    refs = {}
    for key, x in data.items():
        n = len(x)
        y = taf.resample(torch.nn.functional.pad(torch.from_numpy(x), (16, 0)), 16_000, 24_000)[: round(n * 1.5)]
        y = torch.nn.functional.pad(y, (0, -len(y) % 960))
        ref = refs[key] = reference_single(tiny_model, y, 8)["encoder"]
        got = torch.from_numpy(read(out, key))
        assert got.shape == ref.shape and (got - ref).abs().max() <= tolerance(ref), key
    # the command line's default for MuVAP is its 25 Hz encoder tap
    cli_out = tmp_path / "cli"
    result = cli("features", tmp_path / "c", cli_out, "--framing", "muvap", "--model", tiny_model_dir,
                 "--device", "cpu", "--cpu-workers", 1)
    assert result.exit_code == 0, result.output
    assert json.load(open(cli_out / "run.json"))["tap"] == "encoder"
    assert shard_attrs(str(cli_out), read_manifest(str(cli_out))[0]["shard"])["frame_rate"] == 25.0
    for key, ref in refs.items():
        got = torch.from_numpy(read(str(cli_out), key))
        assert got.shape == ref.shape and (got - ref).abs().max() <= tolerance(ref), key


def test_decode_all_mirrors_the_keys_folders_and_never_leaves_its_own(tmp_path):
    """``decode --all``'s paths: a key's folders become folders; no part of a key leaves the folder
    or hides a file ('..', '.', a leading '.', a leading '/', an empty part), no two keys share a
    path ('%' escaped); keys whose paths would collide are refused before anything is written."""
    from mimi_extract.audit.decode import mirrored_paths

    keys = ["sub/deeper/chirp.flac", "x.wav", "../../etc/passwd", "./a/../.hidden.wav", "/abs/path.mp3", "a//b",
            "a/b", "p%2Fq", "p/q", "a.wav#ch0", ".."]
    paths = mirrored_paths(str(tmp_path / "o"), keys)
    rel = {k: os.path.relpath(p, tmp_path / "o") for k, p in paths.items()}
    assert rel["sub/deeper/chirp.flac"] == os.path.join("sub", "deeper", "chirp.flac.wav") and rel["x.wav"] == "x.wav"
    assert rel["p/q"] == os.path.join("p", "q.wav") and rel["p%2Fq"] == "p%252Fq.wav"
    assert len(set(rel.values())) == len(keys), rel
    for path in rel.values():
        assert not any(part in ("", ".", "..") or part.startswith(".") for part in path.split(os.sep)), path
    with pytest.raises(ValueError, match="'x' and 'x.wav' would both be"):
        mirrored_paths(str(tmp_path), ["x", "x.wav"])
    with pytest.raises(ValueError, match="'a.wav' and 'a.wav/b'"):
        mirrored_paths(str(tmp_path), ["a.wav", "a.wav/b"])


def test_decode_and_info(corpus, tiny_model, tiny_model_dir, tmp_path):
    root, _ = corpus
    out = str(tmp_path / "out")
    extract(root, out, Settings(model=tiny_model_dir, tap="codes", num_workers=0))
    assert len(check_decode(out, tiny_model, str(tmp_path / "sine.wav"))) == 48_123  # the item's length at 24 kHz
    folder = str(tmp_path / "all")
    assert cli("decode", out, "--all", "-o", folder, "--device", "cpu").exit_code == 0
    # the keys' folders mirrored (they were escaped into one flat folder: sub%2Fdeeper%2Fchirp.flac.wav)
    written = sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)
    ok_keys = [r["key"] for r in read_manifest(out) if r["status"] == "ok"]
    assert written == sorted(os.path.join(*k.removesuffix(".wav").split("/")) + ".wav" for k in ok_keys), written
    assert os.path.join("sub", "deeper", "chirp.flac.wav") in written and len(written) == 7, written
    assert "no ok item" in cli("decode", out, "nope.wav", "--device", "cpu").text
    # no file is written over another: the default name of one key is the source's own (decoding in the
    # corpus's folder replaced the source); --all names its folder
    before = open(os.path.join(root, "sine_440.wav"), "rb").read()
    here = os.getcwd()
    os.chdir(root)
    try:
        refused = cli("decode", out, "sine_440.wav", "--device", "cpu")
    finally:
        os.chdir(here)
    assert refused.exit_code == 2 and "sine_440.wav exists" in refused.text and "--overwrite" in refused.text
    assert open(os.path.join(root, "sine_440.wav"), "rb").read() == before
    again = cli("decode", out, "--all", "-o", folder, "--device", "cpu")
    assert again.exit_code == 2 and "exists (and 6 more)" in again.text, again.output
    assert cli("decode", out, "--all", "-o", folder, "--device", "cpu", "--overwrite").exit_code == 0
    no_folder = cli("decode", out, "--all", "--device", "cpu")
    assert no_folder.exit_code == 2 and "name a folder" in no_folder.text

    report = json.loads(cli("info", out, "--json").output)
    ok = [r for r in read_manifest(out) if r["status"] == "ok"]
    assert report["inputs"] == 10 and report["ok"] == 7 and report["errors"] == 3
    assert report["frames"] == sum(r["frames"] for r in ok) and report["tokens"] == 8 * report["frames"]
    assert abs(report["hours"] * 3600 - sum(r["duration"] for r in ok)) < 1e-6
    assert report["settings"]["tap"] == "codes"
    reasons = report["errors_by_reason"]
    assert sorted(reasons.values()) == [1, 1, 1] and "empty file (0 bytes)" in reasons, reasons
    assert any(r.startswith("unreadable or corrupt audio header") for r in reasons), reasons
    assert report["bytes"] == sum(os.path.getsize(os.path.join(out, s)) for s in report["shards"])
    text = cli("info", out)
    assert text.exit_code == 0 and "7 ok, 3 errors" in text.text


def test_decode_features(corpus, tiny_model, tiny_model_dir, tmp_path):
    """Features decode through the quantizer (every codebook) and the decoder: equal to decoding the
    single-item reference latent's codes (the encoder tap goes through the downsample first)."""
    from mimi_extract.audio.reader import load

    root, _ = corpus
    latent = reference_single(tiny_model, load(os.path.join(root, "sine_440.wav")), 8)["latent"]
    with torch.no_grad():
        codes = tiny_model.quantizer.encode(latent.T[None], tiny_model.config.num_quantizers).transpose(0, 1)
        expected = tiny_model.decode(codes).audio_values[0, 0, :48_123].numpy()
    for tap in ("latent", "encoder"):
        out = str(tmp_path / tap)
        extract(root, out, Settings(model=tiny_model_dir, tap=tap, num_workers=0))
        wav = str(tmp_path / f"{tap}.wav")
        assert cli("decode", out, "sine_440.wav", "-o", wav, "--device", "cpu").exit_code == 0
        audio = sf.read(wav, dtype="float32")[0]
        assert len(audio) == 48_123 and np.allclose(audio, expected, atol=1e-4), tap
