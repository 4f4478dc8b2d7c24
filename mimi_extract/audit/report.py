"""A corpus report of OUT (``mimi-extract report``): what a run of 100+ GPUs produced, in numbers.

Per subset (input shard, top-level folder, or a manifest field): items, errors, hours, frames and
tokens; per codebook: the usage histogram, its entropy and perplexity, and the codes never used;
the duration histogram; error reasons; the model's weight hash and precision (from ``run.json``).
Optionally a PNG figure (matplotlib, the ``report`` extra) and the numbers in a Parquet OUT's
dataset card.

One pass over the arrays through the readers' own code: the committed rows of every part (as
:class:`~mimi_extract.readers.reader.Reader` reads them: the rows resume trusts, the last ok row of a key
counts), each shard opened once and its items loaded with
:func:`~mimi_extract.store.read.load_row` (checksums verified, so a damaged item is reported,
not counted).  The code histograms are one ``numpy.bincount`` per shard over the shard's
concatenated codes, computed in worker processes a few shards at a time; the manifests are
streamed (twice: a key index first, then the rows shard by shard), so memory is a few shards and
the keys, not OUT.  Features (latent / encoder taps) have no codebooks: frames and dims only.

Imports neither torch nor transformers (as ``info``/``status``); matplotlib only for ``--png``.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import numpy as np

from ..common import remote
from ..config.taps import frame_rate
from ..store.files import DamagedError, write_atomic
from ..formats.records import RunInfo, StoredRow
from ..store.identity import read_run, read_run_info
from ..store.lock import RunLock
from ..store.manifest import RunFiles, iter_committed, out_files
from ..store.read import close_shard, load_row, open_shard
from .outputs import error_reason, require_runs, fidelity_lines, fidelity_summary

SCHEMA = 1  # bump when a key of the JSON report changes meaning or goes away
# duration bins (seconds): left-closed, the last one open-ended; fixed, so reports compare across OUTs
DURATION_EDGES = (0, 1, 2, 3, 5, 10, 15, 20, 30, 60, 120, 300, 600, 1800, 3600)
MIMI_CODEBOOK_SIZE = 2048  # kyutai/mimi's codebooks (every released Mimi checkpoint)
NO_VALUE = "(none)"  # the subset of rows without the --by field
CARD_BEGIN = "<!-- mimi-extract report: begin (rewritten by `mimi-extract report OUT --card`) -->"
CARD_END = "<!-- mimi-extract report: end -->"
CARD_ROWS = 50  # subsets listed in the card (all of them in --json)


def codebook_size(info: RunInfo) -> tuple[int | None, str]:
    """(codebook size, where it came from) for the model OUT was made with: its ``config.json`` (a
    local folder, or the Hugging Face cache: no network), else Mimi's 2048 for ``kyutai/mimi``,
    else unknown (the report then uses the largest code seen + 1 and says so)."""
    model = info.model or ""
    path = os.path.join(model, "config.json") if os.path.isdir(model) else None
    if path is None and model:
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(model, "config.json")
            path = found if isinstance(found, str) else None
        except Exception:  # noqa: BLE001 -- a malformed repo id, an unreadable cache: not known then
            path = None
    if path and os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                size = json.load(f).get("codebook_size")
            if isinstance(size, int) and size > 0:
                return size, "model config"
        except (OSError, ValueError):
            pass
    if model.rstrip("/").endswith("kyutai/mimi"):
        return MIMI_CODEBOOK_SIZE, "kyutai/mimi"
    return None, "observed"


def _field(row: StoredRow, name: str):
    """A manifest row's field as its JSON says, ``a.b`` for a nested one (``source.kind``)."""
    value = row.to_dict()
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _flat_fields(row: dict, prefix: str = "") -> list[str]:
    """A row's field names, ``a.b`` for nested ones (what ``--by`` takes)."""
    names = []
    for k, v in row.items():
        names += _flat_fields(v, f"{prefix}{k}.") if isinstance(v, dict) else [prefix + k]
    return names


def _top_folder(key: str) -> str:
    key = key.lstrip("/")
    return key.split("/", 1)[0] if "/" in key else "."


class _Subsets:
    """Which subset a row belongs to.  Default: the input shard for members of a container (tar,
    tgz, Parquet, Shar input: the file, relative to the input), else the key's top-level folder
    (a directory's sub-corpora, speakers...); ``by``: a manifest row field."""

    def __init__(self, info: RunInfo, by: str | None):
        self.by = by
        root = info.input or ""
        self.root = root if os.path.isdir(root) else os.path.dirname(root)
        self.kind = f"field {by}" if by else None

    def of_ok(self, row: StoredRow) -> str:
        if self.by:
            return self._by(row)
        source = row.source
        if source is not None and source.kind and source.path:
            self.kind = self.kind or "input shard"
            path = source.path
            rel = os.path.relpath(path, self.root) if self.root else path
            return os.path.basename(path) if rel.startswith("..") else rel.replace(os.sep, "/")
        self.kind = self.kind or "top-level folder"
        return _top_folder(row.key)

    def of_error(self, row: StoredRow, shards: list[str]) -> str:
        """An error row has no ``source``: its ``path`` starts with the input shard's shown name."""
        if self.by:
            return self._by(row)
        path = row.path or row.key
        for shard in shards:
            if path == shard or path.startswith(shard + "/") or path.startswith(shard + ":"):
                return shard
        if self.kind == "input shard":
            return path.split(":", 1)[0] if ":" in path else path.split("/", 1)[0]
        return _top_folder(row.key)

    def _by(self, row: StoredRow) -> str:
        value = _field(row, self.by)
        return NO_VALUE if value is None else value if isinstance(value, str) else json.dumps(value)


def _entropy_bits(counts: np.ndarray) -> float:
    total = counts.sum()
    if total == 0:
        return 0.0
    p = counts[counts > 0] / total
    return float(-(p * np.log2(p)).sum())


def duration_histogram(seconds: np.ndarray) -> dict:
    edges = np.asarray(DURATION_EDGES, dtype=np.float64)
    counts = np.bincount(np.searchsorted(edges, seconds, side="right") - 1, minlength=len(edges)) if len(seconds) \
        else np.zeros(len(edges), np.int64)
    stats = ({"min": float(seconds.min()), "mean": float(seconds.mean()), "median": float(np.median(seconds)),
              "p95": float(np.percentile(seconds, 95)), "max": float(seconds.max())} if len(seconds)
             else {k: None for k in ("min", "mean", "median", "p95", "max")})
    return {"edges": list(DURATION_EDGES), "counts": [int(c) for c in counts], **stats}


def _shard_stats(out_dir: str, shard: str, rows: list[StoredRow], tap: str, size: int | None) -> dict:
    """What one shard's arrays say: ``counts`` [codebooks, codes] (codes only, one ``bincount``),
    ``dims`` seen, ``damaged`` items (unreadable, or failing their checksum: not counted).  Runs in a
    worker process for big OUTs, so it takes and returns plain values."""
    damaged, dims, arrays = [], set(), []
    try:
        handle = open_shard(out_dir, shard)
    except Exception as e:  # noqa: BLE001 -- every item of it is unreadable: reported, the rest goes on
        return {"counts": None, "dims": [], "damaged": [{"key": r.key, "shard": shard,
                                                         "problem": f"shard unreadable: {e}"} for r in rows]}
    try:
        for row in rows:
            try:
                data = load_row(out_dir, row, handle)
            except DamagedError as e:
                damaged.append({"key": row.key, "shard": shard, "problem": str(e.__cause__ or "checksum mismatch")})
                continue
            if data.ndim == 2:
                dims.add(int(data.shape[1]))
            if tap == "codes" and data.size:
                arrays.append(data)
    finally:
        close_shard(shard, handle)
    counts = _add_codes(None, size, arrays)[0] if arrays else None
    return {"counts": counts, "dims": sorted(dims), "damaged": damaged}


def _array_stats(out_dir: str, jobs, tap: str, size: int | None, workers: int, on_shard=None):
    """:func:`_shard_stats` of each ``(shard, rows)`` of ``jobs`` (an iterator: the manifests are read
    as the shards are), in order, in ``workers`` processes; at most two shards per worker are in
    flight, so memory is bounded by a few shards whatever the size of OUT.  Yields the results."""
    from collections import deque

    if workers <= 1:
        for n, (shard, rows) in enumerate(jobs, 1):
            yield _shard_stats(out_dir, shard, rows, tap, size)
            if on_shard:
                on_shard(n)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn: a clean interpreter per worker (no inherited threads of pyarrow, or of a caller's torch)
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    pending: deque = deque()
    n = 0
    try:
        for shard, rows in jobs:
            pending.append(pool.submit(_shard_stats, out_dir, shard, rows, tap, size))
            while len(pending) >= 2 * workers:
                n += 1
                yield pending.popleft().result()
                if on_shard:
                    on_shard(n)
        while pending:
            n += 1
            yield pending.popleft().result()
            if on_shard:
                on_shard(n)
    finally:
        pool.shutdown(cancel_futures=True)


def _rows_of(files: RunFiles):
    """The committed rows of a run directory, streamed (memory: a row, not the manifest)."""
    return iter_committed(files.path, files)


def default_workers() -> int:
    """Processes that read shards: the CPUs this process may use, at most 8 (reading is I/O and
    h5py/pyarrow calls; more rarely helps)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


def _counted(runs: list[tuple[RunFiles, str]]) -> tuple[dict[str, tuple[int, int]], dict[str, StoredRow]]:
    """The manifests' first pass (memory: a key index, not every row): which row of a key counts
    ((run, row) of its last ok one, as for mimi_extract.open / read), and the error rows of the keys
    never encoded (a key encoded later, a retry, is not an error of OUT)."""
    winner: dict[str, tuple[int, int]] = {}
    error_rows: dict[str, StoredRow] = {}
    for r, (d, _) in enumerate(runs):
        for i, row in enumerate(_rows_of(d)):
            if row.ok and row.shard:
                winner[row.key] = (r, i)
            elif row.status == "error":
                error_rows[row.key] = row
    return winner, {key: row for key, row in error_rows.items() if key not in winner}


class _Tally:
    """The manifests' second pass: the counted rows' numbers, per subset and in all, added as
    :meth:`shards` streams the rows shard by shard; then the error rows' (:meth:`add_errors`)."""

    def __init__(self, subsets: _Subsets, winner: dict[str, tuple[int, int]], error_rows: dict[str, StoredRow]):
        self.subsets, self.by, self.winner, self.error_rows = subsets, subsets.by, winner, error_rows
        self.per: dict[str, dict] = {}
        self.durations = np.empty(len(winner), dtype=np.float64)
        self.items = self.frames = 0
        self.row_dims: set[int] = set()
        self.containers: set[str] = set()  # input shards seen (an error row's subset is one of them)
        # the arrays' (or, with the manifests only, the rows' dims)
        self.counts: np.ndarray | None = None  # [codebooks, codes] int64, codes only
        self.dims: set[int] = set()
        self.damaged: list[dict] = []

    def subset(self, name: str) -> dict:
        s = self.per.get(name)
        if s is None:
            s = self.per[name] = {"items": 0, "errors": 0, "seconds": 0.0, "frames": 0, "reasons": Counter(),
                                  "fidelity": []}
        return s

    def add(self, row: StoredRow) -> None:
        seconds, frames = float(row.duration or 0.0), int(row.frames or 0)
        self.durations[self.items] = seconds
        self.items += 1
        self.frames += frames
        name = self.subsets.of_ok(row)
        if self.subsets.kind == "input shard" and not self.by:
            self.containers.add(name)
        s = self.subset(name)
        s["items"] += 1
        s["seconds"] += seconds
        s["frames"] += frames
        if row.mel_distance is not None:  # --fidelity (kept slim: three fields a row)
            s["fidelity"].append(StoredRow(row.key, si_sdr=row.si_sdr, mel_distance=row.mel_distance))
        if isinstance(row.dims, int):
            self.row_dims.add(row.dims)

    def shards(self, runs: list[tuple[RunFiles, str]]):
        """(shard relative to OUT, its counted rows), in manifest order; numbers added on the way."""
        shard, rows = None, []
        for r, (d, prefix) in enumerate(runs):
            for i, row in enumerate(_rows_of(d)):
                if self.winner.get(row.key) != (r, i):
                    continue
                row = row.under(prefix)
                self.add(row)
                if row.shard != shard and rows:
                    yield shard, rows
                    rows = []
                shard = row.shard
                rows.append(row)
        if rows:
            yield shard, rows

    def read_arrays(self, out_dir: str, runs, tap: str, size: int | None, workers: int, on_shard) -> None:
        """The code histograms, dims and damaged items of every shard (:func:`_array_stats`), as the
        manifests are streamed."""
        for stats in _array_stats(out_dir, self.shards(runs), tap, size, workers, on_shard):
            self.damaged += stats["damaged"]
            self.dims.update(stats["dims"])
            if stats["counts"] is not None:
                self.counts = stats["counts"] if self.counts is None else _merge_counts(self.counts, stats["counts"])

    def read_rows(self, runs) -> None:
        """The manifests only: the dims the rows say."""
        for _ in self.shards(runs):
            pass
        self.dims = self.row_dims

    def add_errors(self) -> None:
        containers = sorted(self.containers, key=len, reverse=True)
        for row in self.error_rows.values():
            s = self.subset(self.subsets.of_error(row, containers))
            s["errors"] += 1
            s["reasons"][error_reason(row.error)] += 1


def _no_such_field(out_dir: str, by: str, runs, tally: _Tally) -> ValueError:
    sample = next(iter(tally.error_rows.values()), None) if not tally.winner else next(
        (row for d, _ in runs for row in _rows_of(d) if row.ok), None)
    fields = sorted(_flat_fields(sample.to_dict() if sample is not None else {}))
    return ValueError(f"no row of {out_dir} has a field {by!r}; rows have: {', '.join(fields)}")


def _codebooks(counts: np.ndarray, size_from: str | None) -> dict:
    """Per codebook: tokens, codes used and unused, entropy and perplexity, the usage histogram."""
    codebooks = {"size": int(counts.shape[1]), "size_from": size_from, "per_codebook": []}
    for q in range(counts.shape[0]):
        c = counts[q]
        h = _entropy_bits(c)
        used = int((c > 0).sum())
        codebooks["per_codebook"].append({
            "index": q, "tokens": int(c.sum()), "used": used, "unused": int(c.shape[0]) - used,
            "entropy_bits": h, "perplexity": 2.0 ** h, "counts": [int(x) for x in c]})
    return codebooks


def _subset_numbers(s: dict, num_q: int | None, tokens: bool) -> dict:
    fidelity = fidelity_summary(s["fidelity"])
    return {"items": s["items"], "errors": s["errors"], "hours": s["seconds"] / 3600, "frames": s["frames"],
            "tokens": s["frames"] * num_q if tokens else None, "errors_by_reason": dict(s["reasons"].most_common()),
            **({"si_sdr_median": fidelity["si_sdr"]["median"], "si_sdr_p5": fidelity["si_sdr"]["p5"],
                "mel_distance_median": fidelity["mel_distance"]["median"]} if fidelity else {})}


def corpus_report(out_dir: str, by: str | None = None, arrays: bool = True, workers: int | None = None,
                  on_shard=None) -> dict:
    """The report of OUT as a dict (the ``--json`` schema, ``SCHEMA``).  ``by``: a manifest row field
    (``a.b`` for a nested one) to group the subsets by; ``arrays=False``: the manifests only (no
    codebook statistics, no checksum check: seconds at any size); ``workers``: processes reading
    shards (default :func:`default_workers`); ``on_shard(done)`` after each shard, for progress."""
    out_dir = remote.absolute(out_dir)
    files = out_files(out_dir)
    dirs = [f.path for f in require_runs(out_dir, files)]
    info = read_run(dirs[0])
    tap = info.tap
    size, size_from = codebook_size(info) if tap == "codes" else (None, None)
    subsets = _Subsets(info, by)
    runs = [(f, remote.relpath(f.path, out_dir)) for f in files]
    # the manifests, streamed twice: which row of a key counts, then its numbers, shard by shard
    tally = _Tally(subsets, *_counted(runs))
    if arrays:
        tally.read_arrays(out_dir, runs, tap, size, workers or default_workers(), on_shard)
    else:
        tally.read_rows(runs)
    if by and list(tally.per) == [NO_VALUE]:
        raise _no_such_field(out_dir, by, runs, tally)
    tally.add_errors()
    return _summary(out_dir, info, len(dirs), tally, arrays, (size, size_from))


def _summary(out_dir: str, info: RunInfo, parts: int, tally: _Tally, arrays: bool,
             codebook: tuple[int | None, str | None]) -> dict:
    """What :func:`corpus_report` gathered, summarised (the ``--json`` schema); ``codebook``: (size,
    where it came from) as :func:`codebook_size` says."""
    tap, counts, dims = info.tap, tally.counts, tally.dims
    durations = tally.durations[:tally.items]  # a shard quarantined by a resume between the two passes: its rows are gone
    num_q = counts.shape[0] if counts is not None else (next(iter(dims)) if tap == "codes" and len(dims) == 1 else None)
    tokens = tally.frames * num_q if tap == "codes" and num_q else None
    codebooks = None
    if tap == "codes" and arrays:
        if counts is None:
            counts = np.zeros((num_q or info.num_quantizers or 0, codebook[0] or 0), np.int64)
        codebooks = _codebooks(counts, codebook[1])
    model = {k: getattr(info, k) for k in ("model", "weights", "config_hash", "dtype", "feature_dtype", "tap",
                                           "num_quantizers", "framing", "format", "tool_version")}
    model["precision"] = info.dtype  # the encoder's compute dtype (--dtype); features are stored as feature_dtype
    ordered = dict(sorted(tally.per.items()))
    return {
        "schema": SCHEMA,
        "out": out_dir,
        "parts": parts,
        "model": model,
        "items": tally.items,
        "errors": len(tally.error_rows),
        "damaged": tally.damaged,
        "hours": float(durations.sum()) / 3600,
        "frames": tally.frames,
        "tokens": tokens,
        "frame_rate": frame_rate(tap),
        "dims": sorted(dims),
        "subsets_by": tally.subsets.kind or ("field " + tally.by if tally.by else "top-level folder"),
        "subsets": {name: _subset_numbers(s, num_q, tokens is not None) for name, s in ordered.items()},
        "durations": duration_histogram(durations),
        "errors_by_reason": dict(Counter(error_reason(r.error) for r in tally.error_rows.values()).most_common()),
        "codebooks": codebooks,
        "fidelity": fidelity_summary([f for s in ordered.values() for f in s["fidelity"]]),  # --fidelity: None without it
    }


def _merge_counts(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"items with {a.shape[0]} and with {b.shape[0]} codebooks in one OUT")
    width = max(a.shape[1], b.shape[1])
    return np.pad(a, ((0, 0), (0, width - a.shape[1]))) + np.pad(b, ((0, 0), (0, width - b.shape[1])))


def _add_codes(counts: np.ndarray | None, size: int | None, arrays: list[np.ndarray]):
    """Add one shard's codes to ``counts`` [codebooks, codes] with one ``bincount``; grows the code
    axis when a code is beyond it (codebook size unknown, or not the model's)."""
    codes = np.concatenate(arrays).astype(np.int64, copy=False)  # [frames of the shard, codebooks]
    if codes.min() < 0:
        raise ValueError(f"negative codes in OUT ({int(codes.min())}): not Mimi codes")
    q = codes.shape[1]
    want = max(size or 0, int(codes.max()) + 1)
    if counts is None:
        counts = np.zeros((q, want), np.int64)
    elif counts.shape[0] != q:
        raise ValueError(f"items with {counts.shape[0]} and with {q} codebooks in one OUT")
    if want > counts.shape[1]:
        counts = np.pad(counts, ((0, 0), (0, want - counts.shape[1])))
    width = counts.shape[1]
    flat = (codes + np.arange(q, dtype=np.int64) * width).ravel()
    counts += np.bincount(flat, minlength=q * width).reshape(q, width)
    return counts, width


# -- the figure ------------------------------------------------------------------------------
# the figure's error panel: the subsets with the most errors, and the most frequent reasons (the rest: "other")
PNG_ERROR_SUBSETS, PNG_ERROR_REASONS = 12, 6


def error_panel(report: dict) -> tuple[list[str], dict[str, list[int]]]:
    """What the figure's error panel draws: the subsets with errors (most first, at most
    :data:`PNG_ERROR_SUBSETS`) and, per reason (the :data:`PNG_ERROR_REASONS` most frequent, the
    others summed as "other"), its count in each of those subsets."""
    failing = sorted((n for n, s in report["subsets"].items() if s["errors"]), key=lambda n: -report["subsets"][n]["errors"])
    names = failing[:PNG_ERROR_SUBSETS]
    top = list(report["errors_by_reason"])[:PNG_ERROR_REASONS]
    bars = {reason: [report["subsets"][n]["errors_by_reason"].get(reason, 0) for n in names] for reason in top}
    other = [report["subsets"][n]["errors"] - sum(bars[r][i] for r in top) for i, n in enumerate(names)]
    if any(other):
        bars["other"] = other
    return names, bars


def write_png(report: dict, path: str) -> None:
    """The duration histogram; for codes, each codebook's rank-frequency curve (how evenly its codes
    are used) with its perplexity; and where items failed, the errors of each subset by reason
    (:func:`error_panel`)."""
    from ..common.optional import need

    matplotlib = need("matplotlib", "report figures (--png)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    books = (report.get("codebooks") or {}).get("per_codebook") or []
    names, bars = error_panel(report)
    fid = report.get("fidelity")
    panels = 1 + bool(books) + bool(fid) + bool(names)
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.5), squeeze=False)
    d = report["durations"]
    labels = [f"{a:g}-{b:g}" for a, b in zip(d["edges"], d["edges"][1:])] + [f">={d['edges'][-1]:g}"]
    ax = axes[0][0]
    ax.bar(range(len(labels)), d["counts"], color="#4c72b0")
    ax.set_xticks(range(len(labels)), labels, rotation=60, fontsize=8)
    ax.set_xlabel("duration (s)")
    ax.set_ylabel("items")
    ax.set_title(f"{report['items']} items, {report['hours']:.2f} h, {report['errors']} errors")
    if books:
        ax = axes[0][1]
        for b in books:
            c = np.sort(np.asarray(b["counts"], dtype=np.float64))[::-1]
            c = c[c > 0]  # the unused codes are in the label (a log axis has no zero)
            if len(c):
                ax.plot(np.arange(1, len(c) + 1), c / c.sum(), label=f"q{b['index']}: ppl {b['perplexity']:.0f}, "
                        f"{b['unused']} unused")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"code rank (of {report['codebooks']['size']})")
        ax.set_ylabel("frequency")
        ax.set_title("codebook usage")
        ax.legend(fontsize=7)
    if fid:
        ax = axes[0][1 + bool(books)]
        h = fid["si_sdr"]
        e = h["edges"]
        labels = [f"<{e[0]:g}"] + [f"{a:g}-{b:g}" for a, b in zip(e, e[1:])] + [f">={e[-1]:g}"]
        ax.bar(range(len(labels)), h["counts"], color="#55a868")
        ax.set_xticks(range(len(labels)), labels, rotation=60, fontsize=8)
        ax.set_xlabel("SI-SDR of the decoded codes (dB)")
        ax.set_ylabel("items")
        worst = fid["worst"][0] if fid["worst"] else None
        ax.set_title(f"fidelity: median {h['median']:.1f} dB, 5th pct {h['p5']:.1f} dB"
                     + (f"; log-mel median {fid['mel_distance']['median']:.3f}" if fid["mel_distance"]["median"] is not None
                        else "") if h["items"] else "fidelity: every input silent", fontsize=9)
        if worst is not None:
            ax.text(0.02, 0.95, f"worst: {worst['key'][-40:]} ({worst['si_sdr']:.1f} dB)", transform=ax.transAxes,
                    fontsize=7, va="top")
    if names:
        ax = axes[0][-1]
        left = np.zeros(len(names))
        for reason, counts in bars.items():
            label = reason if len(reason) <= 60 else reason[:59] + "…"
            ax.barh(range(len(names)), counts, left=left, label=label)
            left += counts
        ax.set_yticks(range(len(names)), [n if len(n) <= 30 else "…" + n[-29:] for n in names], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("error rows")
        shown = len(names) < sum(1 for s in report["subsets"].values() if s["errors"])
        ax.set_title(f"errors by subset ({report['subsets_by']}) and reason" + (", the most failing" if shown else ""))
        ax.legend(fontsize=6, loc="lower right")
    fig.suptitle(f"{os.path.basename(report['out'])}: {report['model'].get('model')} "
                 f"(weights {report['model'].get('weights')}, {report['model'].get('precision')})", fontsize=9)
    fig.tight_layout()
    tmp = path + ".tmp"
    fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


# -- the dataset card ---------------------------------------------------------------------------
def card_section(report: dict) -> str:
    """The report as Markdown for a dataset card, between ``CARD_BEGIN`` and ``CARD_END``."""
    m = report["model"]
    lines = [CARD_BEGIN, "", "## Corpus report", "",
             f"{report['items']} items, {report['hours']:.3f} h, {report['frames']} frames"
             + (f", {report['tokens']} tokens" if report["tokens"] is not None else "")
             + f"; {report['errors']} errors" + (f", {len(report['damaged'])} damaged" if report["damaged"] else "")
             + f". Model `{m.get('model')}`, weights `{m.get('weights')}`, precision `{m.get('precision')}`.", "",
             f"| subset ({report['subsets_by']}) | items | errors | hours | frames | tokens |", "|---|---|---|---|---|---|"]
    for name, s in list(report["subsets"].items())[:CARD_ROWS]:
        lines.append(f"| `{name}` | {s['items']} | {s['errors']} | {s['hours']:.3f} | {s['frames']} | "
                     f"{s['tokens'] if s['tokens'] is not None else ''} |")
    if len(report["subsets"]) > CARD_ROWS:
        lines.append(f"| ... {len(report['subsets']) - CARD_ROWS} more (`mimi-extract report OUT --json`) | | | | | |")
    d = report["durations"]
    lines += ["", "| duration (s) | items |", "|---|---|"]
    for i, c in enumerate(d["counts"]):
        lo = d["edges"][i]
        label = f"{lo:g}-{d['edges'][i + 1]:g}" if i + 1 < len(d["edges"]) else f">= {lo:g}"
        lines.append(f"| {label} | {c} |")
    if report["codebooks"]:
        cb = report["codebooks"]
        lines += ["", f"Codebooks ({cb['size']} codes each):", "",
                  "| codebook | entropy (bits) | perplexity | used | unused |", "|---|---|---|---|---|"]
        for b in cb["per_codebook"]:
            lines.append(f"| {b['index']} | {b['entropy_bits']:.3f} | {b['perplexity']:.1f} | {b['used']} | {b['unused']} |")
    if report["errors_by_reason"]:
        lines += ["", "| error | items |", "|---|---|"]
        lines += [f"| {reason.replace('|', '/')} | {n} |" for reason, n in report["errors_by_reason"].items()]
    return "\n".join(lines + ["", CARD_END]) + "\n"


def write_card(out_dir: str, report: dict) -> str:
    """Put the report into a Parquet OUT's dataset card (``OUT/README.md``), replacing the section an
    earlier report wrote; the rest of the card (its YAML ``configs``, a user's own text) is kept.
    A run rewrites its card at the end (without the section): report again after a run.  An OUT on
    object storage gets it in the bucket, under OUT's lock object (not while a run writes OUT).
    Returns the card's path or URL."""
    from ..formats.parquet import dataset_card

    on_store = remote.is_url(out_dir)
    out_dir, dirs, info = card_out(out_dir)
    path = remote.join(out_dir, "README.md")
    if on_store:
        from ..store.mirror import RemoteLock

        lock = RemoteLock(out_dir)
        lock.acquire(wait=30.0)
    else:
        lock = RunLock(out_dir, wait=30.0, what="dataset card")  # not while a run (or its card) writes OUT
    try:
        text = read_text(path)
        if text is None:
            text = dataset_card(out_dir, info, parts=dirs[0] != out_dir)
        section = card_section(report)
        start, end = text.find(CARD_BEGIN), text.find(CARD_END)
        if start >= 0 and end > start:
            text = text[:start] + section + text[end + len(CARD_END):].lstrip("\n")
        else:
            text = text.rstrip("\n") + "\n\n" + section
        if on_store:
            fs, name = remote.filesystem(path)
            fs.pipe_file(name, text.encode("utf-8"))
        else:
            write_atomic(path, text)
    finally:
        lock.release()
    return path


def card_out(out_dir: str) -> tuple[str, list[str], dict]:
    """OUT (absolute, or its URL), its run directories and run.json (its JSON: the card lists it), if
    it has a dataset card (Parquet); else ValueError -- asked before a report is computed, so a
    refusal costs nothing."""
    out_dir = out_dir.rstrip("/") if remote.is_url(out_dir) else os.path.abspath(out_dir)
    dirs = [f.path for f in require_runs(out_dir)]
    info = read_run_info(dirs[0])
    fmt = RunInfo.from_dict(info).format
    if fmt != "parquet":
        raise ValueError(f"{out_dir} is a {fmt} OUT: only Parquet OUTs have a dataset card (use --json or --png)")
    return out_dir, dirs, info


def read_text(path: str) -> str | None:
    """A text file or object (UTF-8, undecodable bytes replaced); None when there is none."""
    try:
        return remote.read_bytes(path).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None


def summary_lines(report: dict) -> list[str]:
    """Plain one-line facts for the terminal (the CLI adds the tables)."""
    m = report["model"]
    return [f"{report['items']} items, {report['hours']:.3f} h, {report['frames']} frames"
            + (f", {report['tokens']} tokens" if report["tokens"] is not None else "")
            + f"; {report['errors']} errors" + (f", {len(report['damaged'])} damaged" if report["damaged"] else ""),
            f"model {m.get('model')}, weights {m.get('weights')}, precision {m.get('precision')}"
            + (f", stored as {m.get('feature_dtype')}" if m.get("tap") != "codes" else "")
            + f", tap {m.get('tap')}" + (f", {report['parts']} parts" if report["parts"] > 1 else "")] \
        + fidelity_lines(report.get("fidelity"))


__all__ = ["corpus_report", "write_png", "write_card", "card_out", "card_section", "codebook_size", "SCHEMA"]
