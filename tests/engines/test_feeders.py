"""Feeding processes per GPU by default (issue 34): one process's GIL caps what it feeds a GPU, so
each GPU gets enough processes for its target and no more than the cores allow; each process writes
its own shards (issue 40), so no single writer caps the machine.  FFmpeg's decodes take turns in a
process (MP3, Opus, AAC: one core's decoding per process), so the count follows the corpus's codecs:
the run sizes it once it has found its items.  The rule is tested here; its figures are measured by
scripts/bench_ceilings.py feed and procs (null encoder, CPU time)."""

import numpy as np
import pytest
import soundfile as sf
import torch

from mimi_extract.audio.decoders import PYAV_EXTENSIONS, SOUNDFILE_EXTENSIONS
from mimi_extract.cli.request import run_settings
from mimi_extract.config import rates
from mimi_extract.config.request import RunRequest
from mimi_extract.config.settings import Settings, feeders_per_gpu, feeding
from mimi_extract.engines.device import resolve_devices
from mimi_extract.run.runner import run_request



def mix(name: str):
    """A corpus of 100 s of one file ``name`` at 48 kHz."""
    return rates.CodecMix.of([(name, 48_000, 100.0)])


@pytest.fixture
def measured(monkeypatch):
    """Round figures in place of the measured ones: one process feeds 7,000x, or decodes MP3 at 48 kHz at
    1,000x (one core's FFmpeg), for 20,000x per GPU."""
    monkeypatch.setattr(rates, "TARGET_X", 20_000)
    monkeypatch.setattr(rates, "PROCESS_X", 7_000)
    monkeypatch.setattr(rates, "FEED", {**rates.FEED, "mp3": (rates.FeedCost(48_000, 1_000.0, 200.0, 1_600.0),)})
    monkeypatch.setattr(rates, "WRITER_X", {"hdf5": 12_000})  # (a Ray driver's, for actors that do not see OUT): not the local engine's cap


def test_feeders_per_gpu_from_cores_and_gpus(measured):
    assert feeders_per_gpu(1, cores=16) == 3  # 20,000x / 7,000x per process
    assert feeders_per_gpu(1, cores=4) == 2  # half the cores at most: 2 each
    assert feeders_per_gpu(1, cores=2) == 1
    assert feeders_per_gpu(8, cores=112) == 3  # every GPU at 20,000x: 8 x 3 processes, each its own writer
    assert feeders_per_gpu(8, cores=32) == 2


def test_an_ffmpeg_corpus_gets_more_feeders(measured):
    """One process decodes MP3 at one core's FFmpeg speed (1,000x here): 20 processes for 20,000x, at most
    half the cores per GPU; FLAC and WAV decode in parallel threads, the GIL's 7,000x caps a process."""
    assert rates.process_x("mp3", 48_000) == 1_000 and rates.process_x("mp3", 16_000) == 3_000  # (per sample)
    assert rates.process_x("flac", 48_000) == rates.process_x("pcm", 16_000) == 7_000
    assert feeders_per_gpu(1, cores=64, mix=mix("a.mp3")) == 20 and feeders_per_gpu(1, cores=64, mix=mix("a.flac")) == 3
    assert feeders_per_gpu(1, cores=16, mix=mix("a.mp3")) == 8 > feeders_per_gpu(1, cores=16, mix=mix("a.flac")) == 3
    assert feeders_per_gpu(8, cores=112, mix=mix("a.mp3")) == 7 and feeders_per_gpu(8, cores=112, mix=mix("a.flac")) == 3
    assert feeders_per_gpu(1, cores=2, mix=mix("a.mp3")) == 1  # half the cores: never fewer than one
    half = rates.CodecMix.of([("a.mp3", 48_000, 50.0), ("b.flac", 48_000, 30.0), ("c.FLAC", 48_000, 20.0)])
    assert half.process_x() == pytest.approx(1 / (0.5 / 1_000 + 0.5 / 7_000))  # 1,750x: 12 processes
    assert feeders_per_gpu(1, cores=64, mix=half) == 12
    told = feeding(1, cores=16, mix=mix("a.mp3"))
    assert (told.count, told.wanted, told.cap, told.bound_by_cores) == (8, 20, 8, True)
    assert not feeding(1, cores=16, mix=mix("a.flac")).bound_by_cores


def test_ffmpeg_codecs_are_the_decoders(measured):
    """rates' FFmpeg codec classes are what audio.decoders sends through PyAV, by extension."""
    for ext, codec in rates.CODEC_OF_EXTENSION.items():
        if ext in PYAV_EXTENSIONS:
            assert codec in rates.FFMPEG_CODECS, ext
        elif ext in SOUNDFILE_EXTENSIONS:
            assert codec not in rates.FFMPEG_CODECS, ext


@pytest.fixture
def two_gpus(monkeypatch, measured):
    """A machine with 2 GPUs and 32 cores as the run sees it (nothing runs on the GPUs here)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr("mimi_extract.config.settings.cpu_cores", lambda: 32)


def test_each_gpu_named_once_gets_the_default_feeders(two_gpus):
    assert resolve_devices("auto") == ("cuda:0", "cuda:1")  # fed once the run knows its corpus
    auto = Settings(devices=resolve_devices("auto"), feeders_per_gpu=None)
    assert auto.fed().devices == ("cuda:0",) * 3 + ("cuda:1",) * 3  # 20,000x / 7,000x: 3 each (8 at most)
    assert auto.fed(mix("a.mp3")).devices == ("cuda:0",) * 8 + ("cuda:1",) * 8
    assert auto.fed(mix("a.mp3")).fed(mix("a.mp3")) == auto.fed(mix("a.mp3"))  # fed once
    assert Settings(devices=("cuda:1",), feeders_per_gpu=2).fed(mix("a.mp3")).devices == ("cuda:1", "cuda:1")
    assert Settings(devices=("cuda:1",)).fed(mix("a.mp3")).devices == ("cuda:1",)  # a Settings made by hand: as listed
    assert resolve_devices("cuda:0,cuda:0") == ("cuda:0", "cuda:0")  # said by hand: as given
    assert Settings(devices=("cuda:0", "cuda:0"), feeders_per_gpu=None).fed(mix("a.mp3")).devices == ("cuda:0", "cuda:0")
    with pytest.raises(ValueError, match="give one of them"):
        resolve_devices("cuda:0,cuda:0", feeders=2)
    assert resolve_devices("cpu", cpu_workers=2, feeders=4) == ("cpu", "cpu")  # CPU workers are encoders
    assert Settings(devices=("cpu", "cpu"), feeders_per_gpu=None).fed(mix("a.mp3")).devices == ("cpu", "cpu")


class _Started(Exception):
    """The run got as far as starting its workers (the test stops it there: no GPU here)."""


def _workers_started(source, out, settings: Settings) -> str:
    def on_phase(text):
        if text.startswith("starting"):
            raise _Started(text)

    with pytest.raises(_Started) as started:
        run_request(RunRequest(str(source), str(out), settings), on_phase=on_phase)
    return str(started.value)


def test_the_run_sizes_its_feeders_from_the_codecs_it_found(two_gpus, tiny_model_dir, tmp_path):
    """A GPU run on the command line's defaults starts more feeding processes for an MP3 corpus than
    for a FLAC one on the same machine (what the engine is given: the run's own phase line, before
    any worker starts); --feeders-per-gpu says the count whatever the codecs."""
    rng = np.random.default_rng(0)
    for ext, kw in ((".mp3", dict(format="MP3", subtype="MPEG_LAYER_III")), (".flac", dict(format="FLAC"))):
        (tmp_path / ext[1:]).mkdir()
        for i in range(2):
            sf.write(tmp_path / ext[1:] / f"u{i}{ext}", 0.1 * rng.standard_normal(48_000).astype(np.float32),
                     48_000, **kw)
    auto = run_settings({"model": tiny_model_dir, "device": "auto"})
    assert auto.devices == ("cuda:0", "cuda:1") and auto.feeders_per_gpu is None
    assert _workers_started(tmp_path / "mp3", tmp_path / "out-mp3", auto).startswith("starting 16 encoder worker(s)")
    assert _workers_started(tmp_path / "flac", tmp_path / "out-flac", auto).startswith("starting 6 encoder worker(s)")
    given = run_settings({"model": tiny_model_dir, "device": "auto", "feeders_per_gpu": 2})
    assert _workers_started(tmp_path / "mp3", tmp_path / "out-2", given).startswith("starting 4 encoder worker(s)")
