"""summary.md and results.json from what scripts/gpu_check.sh left in OUT (any part may be missing).

    python scripts/gpu_summary.py OUT [SCALE_JSON]
"""

import json
import os
import sys

out = sys.argv[1]


def load(name):
    try:
        return json.load(open(name if os.path.isabs(name) else os.path.join(out, name)))
    except (OSError, ValueError):
        return None


phases = open(os.path.join(out, "phases.txt")).read().split("\n") if os.path.exists(os.path.join(out, "phases.txt")) else []
bench, precision, compiled = load("bench.json"), load("precision.json"), load("compile.json")
resample = load("resample.json")
lines = ["# GPU check summary", "", "phases: " + "; ".join(p for p in phases if p), ""]
if bench:
    s = bench["speeds"]
    st = bench["stats"]
    util = bench.get("gpu_util") or {}
    lines += [f"## bench.py: {bench.get('files')} files, {bench['audio_seconds']:.0f} s of audio, "
              f"{bench.get('gpu') or bench.get('device')}", "",
              "| path | x real time | vs loop | GPU util % |", "|---|---|---|---|"]
    for label, speed in s.items():
        u = util.get("loop") if "loop" in label and "script" not in label else util.get("tool") if "end to end" in label and "mimi" in label else None
        lines.append(f"| {label} | {speed:.1f} | {speed / s['per-item MimiModel.encode loop']:.2f}x | "
                     f"{'' if u is None else f'{u:.0f}'} |")
    lines += ["", f"encoder idle {100 * st['idle_fraction']:.1f} % of {st['wall']:.1f} s (input wait {st['wait_input']:.1f} s, "
              f"output wait {st['wait_output']:.1f} s), padding {100 * st['padding']:.1f} %, start-up and planning "
              f"{bench['tool_seconds'] - st['elapsed']:.1f} s; code mismatches vs the loop {bench['mismatch']}; "
              f"sgemm {bench['gflops']:.0f} GFLOPS, {bench['flops_per_second'] / 1e9:.2f} GFLOP/audio-s, "
              f"bound {bench['bound']:.0f} x", ""]
if resample:
    lines += [f"## resampling on the device ({resample.get('device_name')}, torch {resample.get('torch')})", ""]
    ex = resample.get("exact")
    if ex:
        t = ex["totals"]
        lines += ["| file | rate | input max abs diff | latent max rel diff | codes equal | tie flips | real |",
                  "|---|---|---|---|---|---|---|"]
        for key, f in ex["files"].items():
            lines.append(f"| {key} | {f['rate']} | {f['input_max_abs_diff']:.1e} | {f.get('latent_max_rel_diff', 0):.1e} | "
                         f"{f.get('codes_equal')}/{f.get('codes')} | {f.get('tie_flips')} + {f.get('cascades')} cascade | "
                         f"{f.get('real')} |")
        lines += ["", f"codes agree {100 * t['agreement']:.4f} % over {ex['q']} codebooks; real mismatches {t['real']}", ""]
    sp = resample.get("speed")
    if sp:
        lines += ["| step | device x real time | ms per step | host path us CPU per audio s | H2D B per audio s |",
                  "|---|---|---|---|---|"]
        for label, r in sp["shapes"].items():
            lines.append(f"| {label} | {r['x_real_time_device']:.0f} | {r['device_ms_per_step']:.2f} | "
                         f"{r['host_us_per_audio_s']:.0f} | {r['h2d_bytes_per_audio_s']} (host path "
                         f"{r['h2d_bytes_per_audio_s_host_path']}) |")
        lines.append("")
scale = load(sys.argv[2]) if len(sys.argv) > 2 else None  # (outside OUT: 8 files at most come back)
if scale:
    s = scale["speeds"]
    lines += [f"## scale: {scale.get('files')} files, {scale['audio_seconds']:.0f} s of audio, "
              f"{scale.get('gpu') or scale.get('device')}", "",
              "(default: the default feeding processes per GPU, each writing its own shards, resampling on the device; "
              "--single-writer: the runner writes every shard, as before 0.4.0)", "",
              "| run | x real time | vs default end to end |", "|---|---|---|"]
    for label, speed in s.items():
        lines.append(f"| {label} | {speed:.1f} | {speed / s['mimi-extract codes, end to end']:.2f}x |")
    lines += ["", f"code mismatches vs the loop (every row): {scale['mismatch']}", ""]
rows = []
for src in (precision, compiled):
    if not src:
        continue
    for mode, shapes in src["modes"].items():
        if mode == "fp32" and src is compiled:
            continue
        if "error" in shapes:
            rows.append(f"| {mode} | failed: {shapes['error'][:120]} | | | | |")
        for label, r in shapes.items():
            if not isinstance(r, dict):
                continue
            agree = r.get("agreement")
            per_cb = r.get("agreement_per_codebook")
            rows.append(f"| {mode} | {label} | {r['x_real_time']:.0f} | "
                        + (f"{100 * agree:.3f} % (min cb {100 * min(per_cb):.2f} %) | {r['tie_flips']} + {r['cascades']} cascade | "
                           f"{r['real']} |" if agree is not None else "reference | | |")
                        + (f" kept: {r['kept']}" if "kept" in r else ""))
if rows:
    dev = (precision or compiled)["device"]
    lines += [f"## precision ({dev}, torch {(precision or compiled)['torch']})", "",
              "| mode | step | x real time | codes equal to strict fp32 | tie flips | real |", "|---|---|---|---|---|---|",
              *rows, ""]
json.dump({"phases": phases, "bench": bench, "resample": resample, "precision": precision, "compile": compiled,
           "scale": scale},
          open(os.path.join(out, "results.json"), "w"), indent=1)
open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
