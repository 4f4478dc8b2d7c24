"""Reading what a run produced: ``status`` (per-part progress) and ``info`` (contents, failing items,
settings).  Neither imports torch nor transformers (they answer in well under a second: a contract
of scripts/test.sh); ``decode`` (codes back to audio) is ``decode.py``."""

from __future__ import annotations

import os
import re
from collections import Counter


from ..common import remote
from ..store.files import LOCK, PART_RE, PLAN_INFO, RUN_INFO
from ..formats.records import RunInfo, StoredRow
from ..store.identity import read_run, read_run_info
from ..store.lock import live_holder
from ..store.mirror import remote_holder
from ..store.plan_info import read_plan
from ..store.manifest import (RunFiles, committed_rows, format_of_path, out_exists, out_files, out_rows,
                              read_ahead)


def require_runs(out_dir: str, files: list[RunFiles] | None = None) -> list[RunFiles]:
    """The run directories of OUT that hold a run (their run.json), as :class:`RunFiles`; a clear
    FileNotFoundError when none does (OUT local or on object storage: ``files`` listed once)."""
    files = out_files(out_dir) if files is None else files
    dirs = [f for f in files if f.exists(RUN_INFO)]
    if not dirs:
        if not out_exists(out_dir, files):
            raise FileNotFoundError(f"{out_dir} does not exist")
        starting = starting_runs(out_dir, files)
        if starting:
            name, who = next(iter(starting.items()))
            raise FileNotFoundError(f"{out_dir}: a run is starting in it ({name}: {who}) and has not written run.json "
                                    "yet; try again in a moment")
        if files and all(remote.names(f.path) == [LOCK] for f in files):
            raise FileNotFoundError(f"{out_dir} holds no mimi-extract run yet: only the lock of a run that stopped "
                                    "before writing run.json (killed while starting?); run its command again")
        raise FileNotFoundError(f"{out_dir} holds no mimi-extract run (no run.json)")
    return dirs


def _name(run_dir: str, out_dir: str) -> str:
    """A run directory as ``status`` names it: ``whole run``, or its part's folder (also when OUT
    is that folder itself: ``status OUT/part-0-of-16``)."""
    name = remote.relpath(run_dir, out_dir)
    if name == "." and (m := PART_RE.search(run_dir.rstrip("/"))):
        return m.group(0)
    return "whole run" if name == "." else name


def starting_runs(out_dir: str, files: list[RunFiles] | None = None) -> dict[str, str]:
    """{run directory (as ``status`` names it): who} for each run directory of OUT whose lock a live
    process holds before run.json exists: a run starting (finding inputs, loading the model).  A lock
    left by a run stopped before it wrote run.json names a process that is gone: not starting.  The
    lock file is only read (taking it, even for a moment, could make the starting run fail).  On
    object storage the lock is an object whose lease (``expires``) runs while its holder lives."""
    found = {}
    if not remote.is_url(out_dir) and not os.path.isdir(out_dir):
        return found
    files = out_files(out_dir) if files is None else files
    if files[0].path != out_dir and not remote.is_url(out_dir):  # a job array's root: a whole run may be starting
        files = [RunFiles(out_dir)] + files
    for f in files:
        if f.exists(RUN_INFO) or not f.exists(LOCK):
            continue
        lock = remote.join(f.path, LOCK)
        who = remote_holder(lock) if remote.is_url(lock) else live_holder(lock)
        if who is not None:
            found[_name(f.path, out_dir)] = who
    return found


def status_report(out_dir: str) -> dict:
    """Per run directory (part): planned inputs, ok and error rows; parts not started; totals."""
    runs = {}
    counts = set()
    files = out_files(out_dir)
    starting = starting_runs(out_dir, files)
    for name in starting:
        if (m := PART_RE.search(name)):
            counts.add((int(m.group(1)), int(m.group(2))))
    dirs = [f for f in files if f.exists(RUN_INFO)] if starting else require_runs(out_dir, files)
    read_ahead(dirs, (PLAN_INFO, RUN_INFO))
    alone = None  # OUT is one part's own folder (status OUT/part-3-of-16): that part, not its array
    for f in dirs:
        d = f.path
        plan = read_plan(f)
        rows = committed_rows(d, f)
        name = _name(d, out_dir)
        ok = {r.key for r in rows if r.ok}
        errors = len({r.key for r in rows if r.status == "error"} - ok)
        inputs = plan.get("inputs")  # (never fewer than the items stored: see info_report's "unplanned")
        runs[name] = {"inputs": None if inputs is None else max(inputs, len(ok) + errors), "ok": len(ok),
                      "errors": errors, "updated": plan.get("updated")}
        if (m := PART_RE.search(d.rstrip("/"))):
            if remote.relpath(d, out_dir) == ".":
                alone = (int(m.group(1)), int(m.group(2)))
            else:
                counts.add((int(m.group(1)), int(m.group(2))))
    missing = []
    if counts:
        n = next(iter(counts))[1]
        have = {i for i, _ in counts}
        missing = [f"{i}/{n}" for i in range(n) if i not in have]
    remaining = sum(max(0, (p["inputs"] or 0) - p["ok"] - p["errors"]) for p in runs.values())
    ok = sum(p["ok"] for p in runs.values())
    errors = sum(p["errors"] for p in runs.values())
    complete = not starting and not missing and remaining == 0 and all(p["inputs"] is not None for p in runs.values())
    count = next(iter(counts))[1] if counts else alone[1] if alone else 1
    names = {int(m.group(1)) if (m := PART_RE.search(name)) else 0: name for name in runs}
    todo = [i for i in ([alone[0]] if alone else range(count)) if i not in names or not _run_done(runs[names[i]])]
    # parts of whole input shards: part I took shards I, I+N, I+2N... of the list every part records
    shards = next((info.part_shards for f in dirs
                   if (info := read_run(f.path, f.read)) is not None and info.part_shards is not None), None)
    return {"runs": runs, "starting": starting, "missing_parts": missing, "ok": ok, "errors": errors, "remaining": remaining,
            "complete": complete, "parts": count, "incomplete_parts": todo, "array": array_spec(todo),
            "incomplete_shards": None if shards is None else [s for n, s in enumerate(shards) if n % count in todo]}


def _run_done(run: dict) -> bool:
    """A run directory is done when its last run planned (``plan.json``) and every planned input
    has its committed row (ok or error); a run killed before planning has no ``inputs``: not done."""
    return run["inputs"] is not None and run["ok"] + run["errors"] >= run["inputs"]


def array_spec(indices: list[int]) -> str:
    """Part indices as ``sbatch --array=`` takes them: ``[0, 3, 5, 6, 7]`` -> ``0,3,5-7``."""
    spans: list[list[int]] = []
    for i in sorted(indices):
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def error_reason(message: str, row: StoredRow | None = None) -> str:
    """An error message with its specifics (quoted names, numbers in parentheses) folded, for grouping,
    and without the location the sources put before it (``row``'s own: ``shard:key: `` of a tar or
    .tar.gz sample, ``file:row N: `` of a Parquet row, ``line N: `` of a list), which differs per item."""
    text = message or "unknown"
    head, sep, rest = text.partition(": ")
    tail = str(row.key if row is not None else "").rpartition("/")[2]
    if sep and (re.fullmatch(r"line \d+", head) or (tail and head.endswith((f":{tail}", f":row {tail}")))):
        text = rest
    return re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text).strip()


# A reason shared by at least this many error rows, and this share of the inputs, is called out (at
# the end of a run and first in ``info``): a systematic rejection (every tagged MP3 of a corpus, a
# wrong --audio-ext) must not pass as a clean run's few bad files.
COMMON_AT_LEAST, COMMON_SHARE, COMMON_KEYS = 3, 0.02, 3


def common_failures(errors: list[StoredRow], inputs: int) -> list[dict]:
    """The error reasons (folded as ``info`` groups them) shared by many rows: ``{"reason", "count",
    "share" (of ``inputs``), "first_keys"}``, most frequent first."""
    groups: dict[str, list[str]] = {}
    for row in errors:
        groups.setdefault(error_reason(row.error, row), []).append(row.key)
    found = [{"reason": reason, "count": len(keys), "share": len(keys) / max(1, inputs), "first_keys": keys[:COMMON_KEYS]}
             for reason, keys in groups.items()
             if len(keys) >= COMMON_AT_LEAST and len(keys) >= COMMON_SHARE * inputs]
    return sorted(found, key=lambda f: -f["count"])


def run_failures(run_dir: str) -> list[dict]:
    """:func:`common_failures` of one run directory's manifest (what a run just wrote)."""
    rows = committed_rows(run_dir)
    ok = {r.key for r in rows if r.ok}
    errors = list({r.key: r for r in rows if r.status == "error" and r.key not in ok}.values())
    return common_failures(errors, len(ok) + len(errors))


def info_report(out_dir: str) -> dict:
    files = out_files(out_dir)
    dirs = require_runs(out_dir, files)
    read_ahead(files, (PLAN_INFO,))
    rows = out_rows(out_dir, files)
    ok = list({r.key: r for r in rows if r.ok}.values())  # each key once, whatever the rows
    ok_keys = {r.key for r in ok}
    errors = list({r.key: r for r in rows if r.status == "error" and r.key not in ok_keys}.values())
    recorded = read_run_info(dirs[0].path, dirs[0].read)  # (its JSON: ``settings`` shows every key)
    info = RunInfo.from_dict(recorded)
    shards = sorted({r.shard for r in ok})
    size_of = {remote.relpath(remote.join(f.path, name), out_dir): size
               for f in files for name, size in (f.listing or {}).items()}

    def size(name: str) -> int | None:  # (the listing's, on object storage: no request per shard)
        if remote.is_url(out_dir):
            return size_of.get(name)
        path = os.path.join(out_dir, name)
        return os.path.getsize(path) if os.path.isfile(path) else None

    sizes = {s: sum(size(f) or 0 for f in [s] + format_of_path(s).companions(s))  # a Shar tar with its cuts file
             for s in shards if size(s) is not None}
    frames = sum(r.frames or 0 for r in ok)
    nq = info.num_quantizers if info.tap == "codes" else None
    settings = {k: recorded[k] for k in sorted(recorded) if k not in ("part",)}
    if len(dirs) > 1:
        settings["parts"] = len(dirs)
    planned = [read_plan(f).get("inputs") for f in dirs]
    stored = len(ok) + len(errors)
    inputs = sum(planned) if None not in planned else stored  # the runs' planned inputs, once known
    # more items stored than the last runs found inputs: some are not (or no longer) among them (a larger
    # --limit before, or items keyed by other input options, stored by a version that did not refuse that)
    unplanned = max(0, stored - inputs)
    return {
        "inputs": inputs + unplanned, "unplanned": unplanned, "ok": len(ok), "errors": len(errors),
        "pending": max(0, inputs - stored),
        "errors_by_reason": dict(Counter(error_reason(r.error, r) for r in errors).most_common()),
        "common_failures": common_failures(errors, inputs + unplanned),
        "failed": [{"key": r.key, "path": (r.source.path if r.source else None) or _source_path(info, r),
                    "reason": r.error or "unknown"} for r in errors],
        "hours": sum(r.duration or 0.0 for r in ok) / 3600, "frames": frames,
        "tokens": frames * nq if nq else None, "shards": {s: sizes.get(s, 0) for s in shards},
        "bytes": sum(sizes.values()), "settings": settings, "fidelity": fidelity_summary(ok),
    }


SI_SDR_EDGES = tuple(range(-20, 41, 5))  # dB: the report's histogram bins (the first and last open-ended)
WORST_SHOWN = 20  # the worst items a summary lists


def fidelity_summary(rows) -> dict | None:
    """``--fidelity``'s numbers over ok ``rows`` (None when none has them): for ``si_sdr`` (dB) and
    ``mel_distance`` the items, min, 5th percentile, median, mean, 95th percentile and max; the SI-SDR
    histogram (``edges``: bins [e_i, e_i+1), below the first and from the last open-ended); ``silent``:
    items whose input had no energy (no SI-SDR); ``worst``: the ``WORST_SHOWN`` lowest SI-SDR items
    (key, si_sdr, mel_distance), to listen to (``mimi-extract decode OUT KEY``)."""
    import numpy as np

    measured = [r for r in rows if r.mel_distance is not None]
    if not measured:
        return None
    scored = [r for r in measured if r.si_sdr is not None]

    def stats(values):
        v = np.asarray(values, dtype=np.float64)
        if not len(v):
            return {k: None for k in ("items", "min", "p5", "median", "mean", "p95", "max")}
        return {"items": int(len(v)), "min": float(v.min()), "p5": float(np.percentile(v, 5)),
                "median": float(np.median(v)), "mean": float(v.mean()), "p95": float(np.percentile(v, 95)),
                "max": float(v.max())}

    si = np.asarray([r.si_sdr for r in scored], dtype=np.float64)
    edges = np.asarray(SI_SDR_EDGES, dtype=np.float64)
    bins = np.clip(np.searchsorted(edges, si, side="right"), 0, len(edges))  # 0: below the first edge
    worst = sorted(scored, key=lambda r: r.si_sdr)[:WORST_SHOWN]
    return {"items": len(measured), "silent": len(measured) - len(scored),
            "si_sdr": {**stats(si), "edges": list(SI_SDR_EDGES),
                       "counts": [int(c) for c in np.bincount(bins, minlength=len(edges) + 1)]},
            "mel_distance": stats([r.mel_distance for r in measured]),
            "worst": [{"key": r.key, "si_sdr": r.si_sdr, "mel_distance": r.mel_distance} for r in worst]}


def fidelity_lines(fid: dict | None, shown: int = 5) -> list[str]:
    """``--fidelity``'s summary in a few lines (report, info): the distributions and the worst items."""
    if not fid:
        return []
    s, m = fid["si_sdr"], fid["mel_distance"]
    lines = [f"fidelity of {fid['items']} items: SI-SDR median {s['median']:.2f} dB (5th pct {s['p5']:.2f}, min "
             f"{s['min']:.2f}); log-mel distance median {m['median']:.4f} (95th pct {m['p95']:.4f})"
             + (f"; {fid['silent']} silent inputs (no SI-SDR)" if fid["silent"] else "")
             if s["items"] else f"fidelity of {fid['items']} items: every input silent (no SI-SDR)"]
    if fid["worst"]:
        lines.append("worst SI-SDR (mimi-extract decode OUT KEY to listen): " + ", ".join(
            f"{w['key']} {w['si_sdr']:.2f} dB" for w in fid["worst"][:shown]))
    return lines


def _source_path(info: RunInfo, row: StoredRow) -> str:
    """An error row's file: its path is relative to the run's input (a directory, or a list's folder)."""
    path = row.path or ""
    root = info.input or ""
    if os.path.isabs(path) or not root:
        return path
    return os.path.join(root if os.path.isdir(root) else os.path.dirname(root), path)
