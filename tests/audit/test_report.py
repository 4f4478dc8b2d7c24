"""``mimi-extract report`` (issue 24, item 5): every number equals an independent computation from the
arrays ``mimi_extract.open(OUT)`` returns, for HDF5, Parquet and Shar OUTs made by the CLI; subsets
by input shard, folder or field; error reasons; damaged items reported, not counted; the PNG, the
JSON schema, and the Parquet dataset card (still loadable by ``datasets.load_dataset``)."""

import json
import math
import os
import shutil
from collections import Counter

import numpy as np
import pytest

import mimi_extract
from support import ONE_WORKER, cli, cli_process
from support.registered import format_cases
from support.waits import HANG_S
from mimi_extract import read_manifest
from mimi_extract.audit.report import (CARD_BEGIN, CARD_END, DURATION_EDGES, PNG_ERROR_REASONS, PNG_ERROR_SUBSETS,
                                       SCHEMA, corpus_report, error_panel, write_png)
from mimi_extract.codec.demo import tiny_config

# the module's tests in one pytest-xdist process: its OUTs (five CLI runs) are then made once, not once
# in each process that runs one of them (scripts/test.sh: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("report")

CODEBOOK = tiny_config().codebook_size  # the tiny model's codebooks (64), read back from its config.json


@pytest.fixture(scope="module")
def outs(corpus, tiny_model_dir, tmp_path_factory):
    """The corpus (7 readable files, 3 unreadable) as codes in each registered format, and as latent features."""
    root, _ = corpus
    made = {}
    for name, args in {**{fmt: ["codes", "--format", fmt] for fmt in format_cases("report")},
                       "latent": ["features"]}.items():
        made[name] = str(tmp_path_factory.mktemp(name) / "out")
        result = cli(args[0], root, made[name], "--model", tiny_model_dir, *ONE_WORKER, "--shard-size", 3, *args[1:])
        assert result.exit_code == 0, result.output
    return made


def independent(out: str) -> dict:
    """The numbers, from the reader's arrays and the manifest, with plain Python (no bincount)."""
    rows = [r for r in read_manifest(out)]
    with mimi_extract.open(out) as reader:
        arrays = {key: data for key, data in reader}
    ok = {r["key"]: r for r in rows if r["status"] == "ok"}
    assert set(ok) == set(arrays)
    books = [Counter() for _ in range(8)]
    for data in (a for a in arrays.values() if a.dtype == np.int16):  # codes only
        for q in range(data.shape[1]):
            books[q].update(int(c) for c in data[:, q])
    entropy = []
    for c in books:
        total = sum(c.values()) or 1
        entropy.append(-sum(n / total * math.log2(n / total) for n in c.values()))
    subsets = Counter(k.split("/")[0] if "/" in k else "." for k in arrays)
    return {"items": len(arrays), "frames": sum(a.shape[0] for a in arrays.values()),
            "seconds": sum(r["duration"] for r in ok.values()), "books": books, "entropy": entropy,
            "errors": [r for r in rows if r["status"] == "error"], "subsets": subsets, "arrays": arrays}


@pytest.mark.parametrize("fmt", format_cases("report"))
def test_numbers_equal_an_independent_count(outs, fmt):
    out = outs[fmt]
    want = independent(out)
    got = corpus_report(out)
    assert got["items"] == want["items"] == 7 and got["frames"] == want["frames"]
    assert got["tokens"] == want["frames"] * 8
    assert got["hours"] == pytest.approx(want["seconds"] / 3600, rel=1e-12)
    cb = got["codebooks"]
    assert cb["size"] == CODEBOOK and cb["size_from"] == "model config" and len(cb["per_codebook"]) == 8
    for q, book in enumerate(cb["per_codebook"]):
        counts = want["books"][q]
        assert book["counts"] == [counts.get(c, 0) for c in range(CODEBOOK)], q
        assert book["used"] == len(counts) and book["unused"] == CODEBOOK - len(counts) > 0
        assert book["tokens"] == want["frames"]
        assert book["entropy_bits"] == pytest.approx(want["entropy"][q], abs=1e-12)
        assert book["perplexity"] == pytest.approx(2 ** want["entropy"][q], rel=1e-12)
    # subsets: a directory input is grouped by the key's top-level folder
    assert got["subsets_by"] == "top-level folder"
    assert {k: v["items"] for k, v in got["subsets"].items() if v["items"]} == dict(want["subsets"])
    assert sum(s["frames"] for s in got["subsets"].values()) == got["frames"]
    assert sum(s["tokens"] for s in got["subsets"].values()) == got["tokens"]
    # errors: the three unreadable files, by reason, in their subsets
    assert got["errors"] == len(want["errors"]) == 3 == sum(s["errors"] for s in got["subsets"].values())
    assert sum(got["errors_by_reason"].values()) == 3
    from mimi_extract.audit.outputs import info_report

    assert got["errors_by_reason"] == info_report(out)["errors_by_reason"]
    # durations: every item in its bin
    edges = np.asarray(DURATION_EDGES, float)
    seconds = [r["duration"] for r in read_manifest(out) if r["status"] == "ok"]
    assert got["durations"]["counts"] == [sum(1 for s in seconds if edges[i] <= s < (edges[i + 1] if i + 1 < len(edges)
                                                                                   else math.inf))
                                          for i in range(len(edges))]
    assert got["durations"]["max"] == max(seconds) and got["damaged"] == []
    # the model: weight hash and precision, from run.json
    info = json.load(open(os.path.join(out, "run.json")))
    assert got["model"]["weights"] == info["weights"] and len(info["weights"]) == 24
    assert got["model"]["precision"] == info["dtype"] == "fp32"


def test_features_have_frames_and_dims_no_codebooks(outs):
    out = outs["latent"]
    want = independent(out)
    got = corpus_report(out)
    assert got["codebooks"] is None and got["tokens"] is None
    assert got["items"] == 7 and got["frames"] == want["frames"]
    assert got["dims"] == sorted({a.shape[1] for a in want["arrays"].values()}) == [tiny_config().hidden_size]
    assert got["model"]["feature_dtype"] == "float32"
    assert cli("report", out).exit_code == 0


def test_by_field_groups_by_a_manifest_field(outs):
    got = corpus_report(outs["hdf5"], by="sample_rate")
    rows = read_manifest(outs["hdf5"])
    want = Counter(json.dumps(r["sample_rate"]) if r["sample_rate"] is not None else "(none)"
                   for r in rows if r["status"] == "ok")
    assert {k: v["items"] for k, v in got["subsets"].items() if v["items"]} == dict(want)
    assert got["subsets_by"] == "field sample_rate" and got["subsets"]["(none)"]["errors"] == 3
    nested = corpus_report(outs["hdf5"], by="source.channels")
    assert sum(v["items"] for v in nested["subsets"].values()) == 7 and "2" in nested["subsets"]
    with pytest.raises(ValueError, match="no row of .* has a field 'speaker'; rows have: .*sample_rate.*source.path"):
        corpus_report(outs["hdf5"], by="speaker")


def test_tar_input_subsets_are_the_input_shards(tiny_model_dir, tmp_path):
    """A tar input: one subset per input shard; an error row (a sample without audio) in its shard."""
    from support.corpora import write_tar

    from support import write_noise

    loose = tmp_path / "loose"
    loose.mkdir()
    for i, seconds in enumerate((0.5, 0.9, 0.3, 1.2, 0.7)):
        write_noise(loose / f"u{i}.wav", int(seconds * 24_000), rng=np.random.default_rng(i))
    (tmp_path / "in").mkdir()
    write_tar(tmp_path / "in" / "en-000000.tar", str(loose), ["u0.wav", "u1.wav"])
    write_tar(tmp_path / "in" / "en-000001.tar", str(loose), ["u2.wav", "u3.wav", "u4.wav"],
              extra=[("lonely.json", b"{}")])
    out = str(tmp_path / "out")
    assert cli("codes", tmp_path / "in", out, "--model", tiny_model_dir, *ONE_WORKER).exit_code == 0
    got = corpus_report(out)
    assert got["subsets_by"] == "input shard"
    assert {k: (v["items"], v["errors"]) for k, v in got["subsets"].items()} == {
        "en-000000.tar": (2, 0), "en-000001.tar": (3, 1)}
    want = independent(out)
    frames = {}
    for r in read_manifest(out):
        if r["status"] == "ok":
            shard = os.path.basename(r["source"]["path"])
            frames[shard] = frames.get(shard, 0) + want["arrays"][r["key"]].shape[0]
    assert {k: v["frames"] for k, v in got["subsets"].items()} == frames


def test_parts_and_damaged_items(tmp_path):
    """Every part of a job array; a damaged item is listed, not counted in the codebooks; a codebook
    size the model does not tell is the largest code seen + 1, said so."""
    from support.outs import flip_hdf5_byte
    from support.outs import make_out

    out = tmp_path / "out"
    arrays = make_out(out / "part-0-of-2", [f"a/{i}.wav" for i in range(7)], seed=0, part="0/2")
    arrays.update(make_out(out / "part-1-of-2", [f"b/{i}.wav" for i in range(5)], seed=1, part="1/2"))
    got = corpus_report(str(out))
    assert got["parts"] == 2 and got["items"] == 12 and got["errors"] == 2
    assert got["frames"] == sum(a.shape[0] for a in arrays.values())
    assert {k: v["items"] for k, v in got["subsets"].items() if v["items"]} == {"a": 7, "b": 5}
    top = max(int(a.max()) for a in arrays.values())
    assert got["codebooks"]["size"] == top + 1 and got["codebooks"]["size_from"] == "observed"
    assert got["errors_by_reason"] == {"cannot decode": 2}
    # the errors of each subset by reason: in the numbers and in the figure's error panel
    failing = [n for n, s in got["subsets"].items() if s["errors"]]
    assert all(s["errors_by_reason"] == ({"cannot decode": s["errors"]} if s["errors"] else {})
               for s in got["subsets"].values())
    names, bars = error_panel(got)
    assert sorted(names) == sorted(failing) and bars == {"cannot decode": [got["subsets"][n]["errors"] for n in names]}
    write_png(got, str(tmp_path / "errors.png"))
    assert (tmp_path / "errors.png").read_bytes().startswith(b"\x89PNG")

    victim = next(r for r in read_manifest(str(out)) if r["status"] == "ok" and r["key"] == "a/3.wav")
    flip_hdf5_byte(str(out), victim)
    hurt = corpus_report(str(out))
    assert [d["key"] for d in hurt["damaged"]] == ["a/3.wav"] and hurt["items"] == 12
    kept = np.concatenate([a for k, a in arrays.items() if k != "a/3.wav"])
    for q, book in enumerate(hurt["codebooks"]["per_codebook"]):
        assert sum(book["counts"]) == kept.shape[0]
        counts = Counter(kept[:, q].tolist())
        assert book["counts"] == [counts.get(c, 0) for c in range(hurt["codebooks"]["size"])]
    result = cli("report", out)
    assert result.exit_code == 0 and "damaged: a/3.wav" in result.text


def test_error_panel_shows_the_most_failing_subsets_and_reasons():
    """The figure's error panel: at most PNG_ERROR_SUBSETS subsets, the most failing first; the
    PNG_ERROR_REASONS most frequent reasons, each subset's other errors summed as "other"."""
    reasons = {f"r{j}": 100 - j for j in range(PNG_ERROR_REASONS + 2)}
    subsets = {f"s{i}": {"errors": i, "errors_by_reason": {f"r{j}": 1 for j in range(min(i, PNG_ERROR_REASONS + 2))}}
               for i in range(PNG_ERROR_SUBSETS + 5)}
    names, bars = error_panel({"subsets": subsets, "errors_by_reason": reasons})
    assert names == [f"s{i}" for i in range(PNG_ERROR_SUBSETS + 4, 4, -1)]  # s0 has none; the most failing first
    assert list(bars) == [f"r{j}" for j in range(PNG_ERROR_REASONS)] + ["other"]
    assert all(sum(bars[r][k] for r in bars) == subsets[n]["errors"] for k, n in enumerate(names))


def test_cli_json_schema_png_and_errors(outs, tmp_path):
    out = outs["hdf5"]
    png = tmp_path / "fig.png"
    result = cli("report", out, "--json", "--png", png)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    # the schema: keys a script may rely on (SCHEMA is bumped when one changes meaning)
    assert SCHEMA == 1 and report["schema"] == 1
    assert list(report) == ["schema", "out", "parts", "model", "items", "errors", "damaged", "hours", "frames", "tokens",
                            "frame_rate", "dims", "subsets_by", "subsets", "durations", "errors_by_reason", "codebooks",
                            "fidelity"]
    assert report["fidelity"] is None  # (codes --fidelity: tests/run/test_fidelity.py)
    assert list(report["model"]) == ["model", "weights", "config_hash", "dtype", "feature_dtype", "tap", "num_quantizers",
                                     "framing", "format", "tool_version", "precision"]
    assert all(list(s) == ["items", "errors", "hours", "frames", "tokens", "errors_by_reason"]
               for s in report["subsets"].values())
    assert list(report["durations"]) == ["edges", "counts", "min", "mean", "median", "p95", "max"]
    assert list(report["codebooks"]) == ["size", "size_from", "per_codebook"]
    assert list(report["codebooks"]["per_codebook"][0]) == ["index", "tokens", "used", "unused", "entropy_bits",
                                                            "perplexity", "counts"]
    assert report == json.loads(json.dumps(corpus_report(out)))
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
    assert not os.path.exists(str(png) + ".tmp")
    # the terminal: the numbers and the model's identity
    text = cli("report", out).text
    assert "7 items" in text and f"weights {report['model']['weights']}" in text and "precision fp32" in text
    # no OUT, and --card on an OUT that has no dataset card: one clear line, exit 2
    missing = cli("report", tmp_path / "nothing")
    assert missing.exit_code == 2 and "error:" in missing.text
    no_card = cli("report", out, "--card")
    assert no_card.exit_code == 2 and "only Parquet OUTs have a dataset card" in no_card.text
    assert "items" not in no_card.text  # refused before the report is computed and printed
    help_text = cli("report", "--help", env={"COLUMNS": "400"}).text  # bracketed text shown, not eaten as markup
    assert "Example" in help_text and "mimi-extract[report]" in help_text and "[default: the CPUs" in help_text


def test_card_has_the_numbers_and_still_loads(outs, tmp_path):
    from datasets import load_dataset

    out = str(tmp_path / "parquet")
    shutil.copytree(outs["parquet"], out)
    card_path = os.path.join(out, "README.md")
    before = open(card_path).read()
    for _ in range(2):  # a second report replaces its section
        result = cli("report", out, "--card")
        assert result.exit_code == 0, result.output
    card = open(card_path).read()
    assert card.startswith(before.rstrip("\n")) and card.count(CARD_BEGIN) == 1 == card.count(CARD_END)
    report = corpus_report(out)
    section = card[card.index(CARD_BEGIN):]
    assert f"{report['items']} items" in section and f"{report['tokens']} tokens" in section
    assert report["model"]["weights"] in section and "precision `fp32`" in section
    for book in report["codebooks"]["per_codebook"]:
        assert f"| {book['index']} | {book['entropy_bits']:.3f} | {book['perplexity']:.1f} | {book['used']} | " \
               f"{book['unused']} |" in section
    ds = load_dataset(out, split="train")
    assert ds.num_rows == 7 and sorted(ds["key"]) == sorted(independent(out)["arrays"])


def test_worker_processes_and_manifest_only_agree(outs):
    """Shards read in 2 spawned processes give the same report as one process; --manifest-only gives
    the same manifest numbers without the arrays."""
    out = outs["hdf5"]
    one = corpus_report(out, workers=1)
    assert len({r["shard"] for r in read_manifest(out) if r["status"] == "ok"}) == 3
    assert corpus_report(out, workers=2) == one
    light = corpus_report(out, arrays=False)
    assert light["codebooks"] is None and light["damaged"] == []
    assert {k: v for k, v in light.items() if k not in ("codebooks",)} == {k: v for k, v in one.items()
                                                                            if k not in ("codebooks",)}
    result = cli("report", out, "--manifest-only", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["codebooks"] is None


def test_cli_process_with_worker_processes(outs):
    """The real CLI (``python -m mimi_extract``) with spawned workers: same report as one process."""
    p = cli_process("report", outs["parquet"], "--json", "--workers", "2")
    stdout, _ = p.communicate(timeout=HANG_S)
    assert p.returncode == 0, stdout
    assert json.loads(stdout) == json.loads(json.dumps(corpus_report(outs["parquet"], workers=1)))
