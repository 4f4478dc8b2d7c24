"""scripts/gpu_check.sh, the one-shot GPU check, in its CPU dry run (tiny model, small corpus, the
smallest sizes that run each path): every phase runs and writes its results, so that on the GPU
machine (15 minutes, no package registry) nothing fails for a reason this machine could have shown.
The dry run has no phase limits (they guard the GPU's budget, not the CPU's: on a busy machine they
failed a run whose every number was right)."""

import json
import os
import subprocess
import sys

import pytest

from support import ROOT
from support.waits import HANG_S


@pytest.mark.slow
def test_gpu_check_dry_run(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "SITE": str(tmp_path / "site"),
           "PYTHONPATH": ""}
    run = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_check.sh"), "--device", "cpu", "--no-compile"],
                         env=env, capture_output=True, text=True, timeout=HANG_S)
    log = (out / "log.txt").read_text() if (out / "log.txt").exists() else ""
    assert run.returncode == 0, run.stdout + run.stderr + log[-4000:]
    phases = (out / "phases.txt").read_text().split("\n")
    assert [p.split()[0] for p in phases if p][-7:] == ["env", "tests", "bench", "resample", "precision", "scale",
                                                         "summary"]
    assert all(" rc=0 " in p for p in phases if p), phases
    assert "TIMEOUT" not in "\n".join(phases)
    starts = [line for line in log.split("\n") if line.startswith("=== ")]  # each phase's command and limit
    assert len(starts) >= 7 and all("(limit none)" in line for line in starts), starts
    results = json.loads((out / "results.json").read_text())
    assert results["bench"]["mismatch"] == 0 and results["bench"]["stats"]["ok"] == 12
    assert any("--feeders-per-gpu 1" in label for label in results["bench"]["speeds"])
    # the rows that decide scale: 1 (bench's row) vs 4 feeders, one writer vs each its own, resampling;
    # on a CPU the dry run leaves out --feeders-per-gpu 4 alone (the default row's run there: feeders are
    # per GPU), its option run in the other two
    scale = results["scale"]
    assert scale["mismatch"] == 0 and {v.strip() for v in scale["variants"]} == {
        "--feeders-per-gpu 4 --single-writer", "--feeders-per-gpu 4 --resample-on host"}
    exact = results["resample"]["exact"]  # resampling on the device: the 24 kHz input, latents and codes vs the host path
    assert len(exact["files"]) == 4 and exact["totals"]["real"] == 0
    assert all(f["input_max_abs_diff"] < 1e-6 and f["latent_max_rel_diff"] < 1e-4 for f in exact["files"].values())
    assert len(results["resample"]["speed"]["shapes"]) == 6
    modes = results["precision"]["modes"]
    assert set(modes) == {"fp32", "tf32", "bf16"} and not any("error" in m for m in modes.values())
    assert modes["tf32"]["2x1s"]["agreement"] == 1.0  # TF32 is a no-op on CPU: identical codes
    assert {"agreement_per_codebook", "tie_flips", "real"} <= set(modes["bf16"]["2x1s"])
    summary = (out / "summary.md").read_text()
    assert "| bf16 | 2x1s |" in summary and "## resampling on the device" in summary and run.stdout.rstrip().endswith(summary.rstrip().split("\n")[-1])
