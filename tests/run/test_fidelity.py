"""``codes --fidelity``: the stored SI-SDR and log-mel distance equal those recomputed independently,
from MimiModel.decode of the stored codes and the 24 kHz audio itself."""

import math

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio

from support import extract
from support.registered import format_cases
from mimi_extract import read, read_manifest
from mimi_extract.config.settings import Settings


def si_sdr(r: np.ndarray, d: np.ndarray) -> float:
    r, d = r - r.mean(), d - d.mean()
    target = (np.dot(d, r) / np.dot(r, r)) * r
    return 10 * math.log10(np.sum(target ** 2) / np.sum((d - target) ** 2))


def mel_distance(r: torch.Tensor, d: torch.Tensor) -> float:
    n = len(r)
    size = (1 + max(0, math.ceil((n - 1024) / 256)) - 1) * 256 + 1024
    spec = torchaudio.transforms.Spectrogram(n_fft=1024, hop_length=256, center=False, power=1.0).double()
    fb = torchaudio.functional.melscale_fbanks(513, 0.0, 12000.0, 80, 24000, norm=None, mel_scale="htk").double()
    logmel = lambda x: torch.log((spec(torch.nn.functional.pad(x.double(), (0, size - n))).T @ fb).clamp(min=1e-5))  # noqa: E731
    return float((logmel(r) - logmel(d)).abs().mean())


def input_24k(path: str) -> torch.Tensor:
    """What the encoder saw: the file at 24 kHz (torchaudio's resampler, which extraction reproduces)."""
    audio, rate = sf.read(path, dtype="float32")
    audio = torch.from_numpy(audio)
    return audio if rate == 24_000 else torchaudio.functional.resample(audio, rate, 24_000)


@pytest.mark.parametrize("chunk_seconds,rows", [(None, None), (0.48, 2)])
def test_stored_fidelity_equals_an_independent_recomputation(corpus, tiny_model, tiny_model_dir, tmp_path,
                                                             chunk_seconds, rows):
    """Whole items in padded batches, and (0.48 s chunks, 2 rows) every item streamed, streams
    joining rows that others left (the decoder's state must start afresh there)."""
    root, _ = corpus
    out = str(tmp_path / "out")
    extract(root, out, Settings(model=tiny_model_dir, tap="codes", num_quantizers=5, fidelity=True,
                                chunk_seconds=chunk_seconds, batch_size=rows, num_workers=0))
    rows = [r for r in read_manifest(out) if r["status"] == "ok"]
    assert len(rows) == 7
    checked = 0
    for row in rows:
        assert isinstance(row["mel_distance"], float) and isinstance(row["si_sdr"], float), row
        if row["key"] == "stereo.wav":
            continue  # (its input is the channels' mix)
        codes = torch.from_numpy(read(out, row["key"])).long()
        assert codes.shape[1] == 5
        reference = input_24k(f"{root}/{row['key']}")
        with torch.no_grad():
            decoded = tiny_model.decode(codes.T[None]).audio_values[0, 0][: len(reference)]
        assert abs(row["si_sdr"] - si_sdr(reference.double().numpy(), decoded.double().numpy())) < 1e-3, row["key"]
        # relative: in bands where the input has next to no energy (a sine's, above a resampled item's
        # Nyquist) the log's 1e-5 floor magnifies the decoders' float rounding (measured: 5e-5 relative)
        assert abs(row["mel_distance"] - mel_distance(reference, decoded)) < 1e-4 * row["mel_distance"], row["key"]
        checked += 1
    assert checked == 6


def test_off_by_default(corpus, tiny_model_dir, tmp_path):
    root, _ = corpus
    out = str(tmp_path / "out")
    extract(root, out, Settings(model=tiny_model_dir, tap="codes", num_workers=0))
    assert not any("si_sdr" in r or "mel_distance" in r for r in read_manifest(out))


@pytest.mark.parametrize("fmt", format_cases("fidelity"))
def test_every_format_carries_the_rows_fidelity(corpus, tiny_model_dir, tmp_path, fmt):
    """The manifest's values, as Parquet columns, lhotse cuts' custom fields (the HDF5 OUT's cuts and
    the Shar cuts) and Megatron documents' fields."""
    import glob
    import json

    if fmt == "megatron":
        pytest.importorskip("megatron.core.datasets.indexed_dataset")
    from mimi_extract import read_cuts

    root, _ = corpus
    out = str(tmp_path / "out")
    extract(root, out, Settings(model=tiny_model_dir, tap="codes", fidelity=True, num_workers=0, format=fmt))
    want = {r["key"]: (r["si_sdr"], r["mel_distance"]) for r in read_manifest(out) if r["status"] == "ok"}
    assert len(want) == 7
    if fmt == "parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(glob.glob(f"{out}/**/*.parquet", recursive=True), columns=["key", "si_sdr", "mel_distance"])
        got = {k: (s, m) for k, s, m in zip(*(table[c].to_pylist() for c in ("key", "si_sdr", "mel_distance")))}
    elif fmt == "megatron":
        docs = [d for f in glob.glob(f"{out}/**/shard-*.json", recursive=True) for d in json.load(open(f))["documents"]]
        got = {d["key"]: (d["si_sdr"], d["mel_distance"]) for d in docs}
    else:
        got = {c.id: (c.custom["si_sdr"], c.custom["mel_distance"]) for c in read_cuts(out)}
    assert got == want


@pytest.fixture(scope="module")
def fidelity_out(corpus, tiny_model_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("fid") / "out")
    extract(corpus[0], out, Settings(model=tiny_model_dir, tap="codes", fidelity=True, num_workers=0))
    return out


def test_info_report_and_readers_show_and_filter_it(fidelity_out, tmp_path):
    import json

    from support import cli
    from mimi_extract import open as open_out

    out = fidelity_out
    rows = [r for r in read_manifest(out) if r["status"] == "ok"]
    si = np.array([r["si_sdr"] for r in rows])
    worst = min(rows, key=lambda r: r["si_sdr"])
    info = json.loads(cli("info", out, "--json").output)["fidelity"]
    assert info["items"] == 7 and info["silent"] == 0 and info["worst"][0]["key"] == worst["key"]
    assert info["si_sdr"]["median"] == pytest.approx(np.median(si)) and sum(info["si_sdr"]["counts"]) == 7
    assert info["mel_distance"]["max"] == max(r["mel_distance"] for r in rows)
    assert f"worst SI-SDR (mimi-extract decode OUT KEY to listen): {worst['key']}" in cli("info", out).text

    png = tmp_path / "r.png"
    result = cli("report", out, "--json", "--by", "sample_rate", "--png", png, "--manifest-only")
    report = json.loads(result.output)
    assert report["fidelity"] == info and png.stat().st_size > 0
    by_rate = {}
    for r in rows:
        by_rate.setdefault(str(r["sample_rate"]), []).append(r["si_sdr"])
    for rate, values in by_rate.items():
        assert report["subsets"][rate]["si_sdr_median"] == pytest.approx(np.median(values))
    assert "fidelity of 7 items: SI-SDR median" in cli("report", out, "--manifest-only").text

    reader = open_out(out)
    threshold = float(np.median(si))
    kept = reader.keys(min_si_sdr=threshold)
    assert sorted(kept) == sorted(r["key"] for r in rows if r["si_sdr"] >= threshold) and 0 < len(kept) < 7
    assert reader.keys(max_mel_distance=-1.0) == [] and len(reader.keys()) == 7
    assert len(reader.dataset(kept)) == len(kept)


def test_filtering_an_out_without_fidelity_is_refused(corpus, tiny_model_dir, tmp_path):
    from mimi_extract import open as open_out

    out = str(tmp_path / "out")
    extract(corpus[0], out, Settings(model=tiny_model_dir, tap="codes", num_workers=0))
    with pytest.raises(ValueError, match="without codes --fidelity"):
        open_out(out).keys(min_si_sdr=0)
    assert json_fidelity(out) is None


def json_fidelity(out):
    import json

    from support import cli

    return json.loads(cli("info", out, "--json").output)["fidelity"]


def test_worker_processes_carry_it(corpus, tiny_model_dir, fidelity_out, tmp_path):
    """Two CPU worker processes (the numbers cross a process boundary with their chunks): the
    in-process run's numbers, to float noise (other batches)."""
    out = str(tmp_path / "out")
    extract(corpus[0], out, Settings(model=tiny_model_dir, tap="codes", fidelity=True, num_workers=0,
                                     devices=("cpu", "cpu")))
    want = {r["key"]: r for r in read_manifest(fidelity_out) if r["status"] == "ok"}
    got = {r["key"]: r for r in read_manifest(out) if r["status"] == "ok"}
    assert got.keys() == want.keys()
    for key, row in got.items():
        assert abs(row["si_sdr"] - want[key]["si_sdr"]) < 1e-3, key
        assert abs(row["mel_distance"] - want[key]["mel_distance"]) <= 1e-4 * want[key]["mel_distance"], key
