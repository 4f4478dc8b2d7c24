"""``mimi-extract plan INPUT`` (issue 34): a dry run that loads no model and reads only what indexing
reads; its frames and tokens are what a run then stores, its costs come from the measured rates."""

import json
import math

import numpy as np
import pytest
import soundfile as sf
import torch

from support import ONE_WORKER, cli
from mimi_extract.config import rates
from mimi_extract.audit.dry_run import frames

# name -> (sample rate, frames): 16 kHz FLAC, 48 kHz WAV, 44.1 kHz FLAC
FILES = {"a.flac": (16_000, 16_000 * 3 + 5), "b.wav": (48_000, 48_000 // 2 + 1), "sub/c.flac": (44_100, 44_100 * 7),
         "d.flac": (16_000, 700)}


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "in"
    rng = np.random.default_rng(0)
    for name, (rate, n) in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        sf.write(root / name, (0.2 * rng.standard_normal(n)).astype(np.float32), rate, subtype="PCM_16")
    (root / "broken.wav").write_bytes(b"RIFF not audio")
    return root


def plan_json(*args):
    result = cli("plan", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_plan_counts_what_a_run_then_stores(corpus, tiny_model_dir, tmp_path):
    """Items, hours, frames and tokens as predicted are what `codes` stores (info says), and the
    arrays' bytes are frames x codebooks x 2; the unreadable file is counted with its reason."""
    report = plan_json(corpus, "-q", 4)
    expected_samples = [math.ceil(n * 24_000 / rate) for rate, n in FILES.values()]
    assert report["items"] == 4 and report["unreadable"] == 1 and list(report["errors_by_reason"].values()) == [1]
    assert report["hours"] == pytest.approx(sum(n / rate for rate, n in FILES.values()) / 3600)
    latent = sum(-(-s // 1920) for s in expected_samples)
    assert report["frames"] == {"12.5 Hz (latent, codes)": latent, "25 Hz (encoder)": sum(-(-s // 960) for s in expected_samples)}
    assert report["tokens"] == latent * 4 and report["bytes"]["codes"]["arrays"] == latent * 4 * 2
    assert report["bytes"]["latent"]["arrays"] == latent * 512 * 4
    # every format's size, Megatron's for codes only (token ids)
    assert set(report["bytes"]["codes"]) == {"arrays", "hdf5", "parquet", "shar", "megatron"}
    assert "megatron" not in report["bytes"]["latent"] and "hdf5" in report["bytes"]["latent"]
    assert sum(report["durations"]["counts"]) == 4
    run = cli("codes", corpus, tmp_path / "out", "--model", tiny_model_dir, "-q", 4, *ONE_WORKER)
    assert run.exit_code == 0, run.output
    info = json.loads(cli("info", tmp_path / "out", "--json").stdout)
    assert (info["ok"], info["errors"], info["frames"], info["tokens"]) == (4, 1, latent, latent * 4)
    assert info["hours"] == pytest.approx(report["hours"], rel=1e-4)  # (the manifest rounds durations to ms)


def test_short_clips_cost_more_host_cpu_per_audio_second():
    """Each item's own costs (opening it, its bookkeeping, its dataset: ``FeedCost``'s per-item
    figures, measured on corpora of 1-4 s against 2-20 s utterances) are spread over its seconds: the
    measured rows hold for the measured corpora's mean length, a corpus of 2 s clips costs more per
    audio second, one of long recordings less, and one process decodes fewer seconds of short MP3s."""
    for codec, rate in (("flac", 16_000), ("pcm", 16_000), ("mp3", 48_000), ("opus", 48_000)):
        cost = rates.feed_cost(codec, rate)
        plain = cost.decode_us + cost.fixed_us
        assert cost.us_per_audio_second(rate, True, rates.FEED_ITEM_SECONDS) == pytest.approx(plain)
        assert cost.us_per_audio_second(rate) == pytest.approx(plain)
        short, long = cost.us_per_audio_second(rate, True, 2.0), cost.us_per_audio_second(rate, True, 100.0)
        assert short > plain > long > 0, (codec, short, plain, long)
    clips = rates.CodecMix.of([("a.mp3", 48_000, 2.0)] * 50)
    talks = rates.CodecMix.of([("a.mp3", 48_000, 50.0)] * 2)
    assert clips.total == talks.total == 100.0 and clips.parts[0].item_seconds == 2.0
    assert clips.process_x() < rates.process_x("mp3", 48_000) < talks.process_x()
    assert rates.CodecMix.of([("a.mp3", 48_000, 0.0)]).process_x() == rates.PROCESS_X  # (no audio: nothing to size)


def test_feeding_costs_stay_positive_at_every_rate_and_length():
    """The decode pool's cost scales with the sample rate only in its per-sample part: each item's own
    cost (opening it, its bookkeeping) is the same at 8 kHz as at 16 kHz.  Scaled with the rate, an
    8 kHz WAV corpus of 60 s items cost -4 µs per audio second; at the measured rate nothing changes."""
    for codec, rows in rates.FEED.items():
        for cost in rows:
            for rate in (8_000, 16_000, 22_050, 44_100, 48_000):
                for seconds in (None, 0.5, 2.0, rates.FEED_ITEM_SECONDS, 60.0, 3_600.0):
                    for on_device in (True, False):
                        assert cost.pool_us(rate, on_device, seconds) > 0, (codec, cost.rate, rate, seconds, on_device)
            plain = cost.pool_us(cost.rate, True, rates.FEED_ITEM_SECONDS)
            assert plain == pytest.approx(cost.decode_us) == cost.pool_us(cost.rate)
            # per item the same at any rate: a corpus of 2 s items at half the rate costs the same more per item
            half = cost.rate // 2
            extra = cost.decode_item_us * (1 / 2.0 - 1 / rates.FEED_ITEM_SECONDS)
            assert cost.pool_us(half, True, 2.0) - cost.pool_us(half) == pytest.approx(extra)


def test_plan_costs_follow_the_codecs_and_the_machine(corpus):
    """Host cores per GPU from the corpus's codec mix (measured per-codec costs, weighted by hours);
    the GPU estimate is bound by the host's cores when they are too few; parts of --part-hours."""
    report = plan_json(corpus, "--cores", 4, "--gpus", 1, "--gpu-rate", 20_000, "--part-hours", 0.001)
    shares = {(m["codec"], m["sample_rate"]): m["share"] for m in report["codecs"]}
    total = sum(n / rate for rate, n in FILES.values())
    assert shares[("flac", 16_000)] == pytest.approx((3 + 5 / 16_000 + 700 / 16_000) / total)
    parts = {(m["codec"], m["sample_rate"]): m for m in report["codecs"]}
    assert parts[("flac", 16_000)]["items"] == 2 and parts[("flac", 16_000)]["mean_item_s"] == pytest.approx(
        shares[("flac", 16_000)] * total / 2)
    us = sum(m["share"] * rates.feed_cost(c, r).us_per_audio_second(r, True, m["mean_item_s"])
             for (c, r), m in parts.items())
    assert rates.feed_cost("flac", 44_100).rate == 48_000 and rates.feed_cost("flac", 22_050).rate == 16_000
    assert report["host"]["cores_per_gpu"] == pytest.approx(20_000 * us / 1e6)
    assert report["host"]["cores_per_gpu_host_resampling"] > report["host"]["cores_per_gpu"]
    gpu = report["estimates"]["gpu"]
    assert gpu["bound"] == "host cores" and gpu["x_real_time"] == pytest.approx(4 * 1e6 / us)
    assert report["estimates"]["cpu"]["x_real_time"] == 4 * rates.CPU_X_PER_CORE
    assert report["parts"]["count"] == math.ceil(report["hours"] / 0.001)
    fast = plan_json(corpus, "--cores", 400, "--gpus", 8, "--gpu-rate", 20_000)["estimates"]["gpu"]
    # every device worker writes its own shards: the machine is GPUs x the per-GPU rate, no writer's cap;
    # Ray actors on machines that do not see OUT hand their items to the driver: its cap is said beside
    assert fast["bound"] == "GPU" and fast["x_real_time"] == 8 * 20_000
    assert fast["ray_x_real_time"] == rates.WRITER_X["hdf5"] < fast["x_real_time"]
    assert "Ray actors on machines that do not see OUT's folder" in cli("plan", corpus, "--cores", 400, "--gpus", 8, "--gpu-rate", 20_000).text
    assert plan_json(corpus)["estimates"]["H100"] == {"x_real_time": None, "measured": False, "hours": None}
    text = cli("plan", corpus).text
    assert "4 items, 1 unreadable" in text and "unmeasured" in text and "cores for this corpus" in text


def test_frames_are_the_encoders_arithmetic(tiny_model, full_model):
    from mimi_extract.codec.encoder import PaddedMimiEncoder

    n = torch.arange(1, 12_000)
    for model in (tiny_model, full_model):
        got = PaddedMimiEncoder(model).output_lengths(n)
        for tap in ("encoder", "latent", "codes"):
            assert np.array_equal(got[tap].numpy(), frames(n.numpy(), tap)), tap


def test_plan_errors_are_one_line(tmp_path):
    result = cli("plan", tmp_path / "nothing-here")
    assert result.exit_code == 2 and "does not exist" in result.text and "Traceback" not in result.output


def test_plan_sizes_megatron_ids_as_the_run_writes_them(corpus, tiny_model_dir, full_model, tmp_path):
    """``--token-offset`` past uint16 (128256, after Llama 3's vocabulary): the ids are int32, as the
    run then records and writes them, so the .bin holds 4 bytes a token and the Megatron estimate
    grows by 2 bytes a token (it stayed at the uint16 size, 41 % under, before); a flat offset that
    keeps 8 x 2048 ids under 65,500 stays uint16.  Mimi's codebook size is the model's."""
    assert rates.CODEBOOK_SIZE == full_model.config.codebook_size
    base = plan_json(corpus, "-q", 4)
    wide = plan_json(corpus, "-q", 4, "--token-offset", 128256)
    assert base["token_ids"]["dtype"] == "uint16" and wide["token_ids"]["dtype"] == "int32"
    assert wide["bytes"]["codes"]["megatron"] == base["bytes"]["codes"]["megatron"] + 2 * base["tokens"]
    assert plan_json(corpus, "--token-offset", 65_500 - 8 * 2048 - 1)["token_ids"]["dtype"] == "uint16"
    assert plan_json(corpus, "--token-offset", 65_500 - 2048, "--token-layout", "per-codebook")["token_ids"]["dtype"] == "int32"
    assert "int32" in cli("plan", corpus, "--token-offset", 128256).text  # (the table header: megatron (int32 ids))
    pytest.importorskip("megatron.core")
    out = tmp_path / "out"
    run = cli("codes", corpus, out, "--model", tiny_model_dir, "-q", 4, "--format", "megatron",
              "--token-offset", 128256, *ONE_WORKER)
    assert run.exit_code == 0, run.output
    assert json.loads((out / "run.json").read_text())["token_dtype"] == "int32"
    assert sum(p.stat().st_size for p in out.glob("*.bin")) == 4 * wide["tokens"]


def test_plan_suggests_feeders_per_gpu_for_the_codecs(corpus, tmp_path, monkeypatch):
    """The feeding processes per GPU the run would start (one rule, settings.feeding): an MP3 corpus
    (FFmpeg decodes at one core's speed in a process, 1,000x here) more than a FLAC one (7,000x a
    process); at most half the cores per GPU, said when they bound it; for --gpu-rate, its suggestion
    beside the run's default; the GPU estimate bound by those processes when they feed less."""
    monkeypatch.setattr(rates, "TARGET_X", 20_000)
    monkeypatch.setattr(rates, "PROCESS_X", 7_000)
    monkeypatch.setattr(rates, "FEED", {**rates.FEED, "mp3": (rates.FeedCost(48_000, 1_000.0, 200.0, 1_600.0),)})
    mp3 = tmp_path / "mp3"
    mp3.mkdir()
    for i in range(2):
        sf.write(mp3 / f"u{i}.mp3", 0.1 * np.random.default_rng(i).standard_normal(48_000).astype(np.float32), 48_000,
                 format="MP3", subtype="MPEG_LAYER_III")
    flac = plan_json(corpus, "--cores", 64)["feeders"]
    assert (flac["per_gpu"], flac["bound_by_cores"]) == (3, False) and flac["one_process_x"] == pytest.approx(7_000)
    assert plan_json(mp3, "--cores", 64)["feeders"]["per_gpu"] == 20
    report = plan_json(mp3, "--cores", 16, "--gpu-rate", 20_000)
    assert report["codecs"][0]["one_process_x"] == pytest.approx(1_000)
    assert {k: report["feeders"][k] for k in ("per_gpu", "wanted", "half_cores_per_gpu", "bound_by_cores")} == \
        {"per_gpu": 8, "wanted": 20, "half_cores_per_gpu": 8, "bound_by_cores": True}
    gpu = report["estimates"]["gpu"]  # the cores would feed 16 x 1e6 / 1,200 us = 13,333x; 8 processes 8,000x
    assert gpu["bound"] == "feeding processes" and gpu["x_real_time"] == pytest.approx(8 * 1_000)
    text = cli("plan", mp3, "--cores", 16).text
    assert "--feeders-per-gpu 8 (one process feeds ~1,000x" in text and "bound by the host's cores" in text
    slower = plan_json(mp3, "--cores", 64, "--gpu-rate", 10_000)["feeders"]
    assert (slower["per_gpu"], slower["default_per_gpu"]) == (10, 20)
    assert "the run's default here: 20" in cli("plan", mp3, "--cores", 64, "--gpu-rate", 10_000).text
