"""``cuts.jsonl.gz``: the lhotse cuts of what a run directory has committed (one per ok row), rewritten
at the end of every run (``RunDirectory.finish``) and by the mirror of an OUT on object storage."""

from __future__ import annotations

import gzip
import json
import os

from ..config.taps import frame_shift
from ..formats.cuts import FIELDS, cut_dict
from . import files as store_files
from .files import CUTS, write_file
from .identity import read_run
from .manifest import committed_rows


def cut_dicts(run_dir: str, base: str | None = None) -> list[dict]:
    """One cut per committed ok row of a run directory (lhotse's serialisation of a MonoCut/MultiCut);
    ``base``: where the run directory's shards are read from (the URL a staged run directory is
    mirrored to), when not from ``run_dir`` itself."""
    info = read_run(run_dir)
    if info is None:
        return []
    tap = info.tap
    cuts = (cut_dict(r, base or run_dir, FIELDS[tap], frame_shift(tap))
            for r in committed_rows(run_dir) if r.ok and r.source)
    return [c for c in cuts if c is not None]


def write_cuts(run_dir: str, base: str | None = None) -> str | None:
    """(Re)write ``run_dir/cuts.jsonl.gz`` from the manifest's committed ok rows, atomically.  Every
    run ends with it, an interrupted one too; after a kill -9 it lags the manifest until the next
    run of that directory (``read_cuts`` never does: it reads the manifest).  ``base``: see
    :func:`cut_dicts` (the cuts of an OUT on object storage point at its objects: ``mirror.py``)."""
    info = read_run(run_dir)
    if info is None or info.format == "shar":  # Shar's cuts are its shar/cuts.* files
        return None
    lines = [json.dumps(c, ensure_ascii=False) for c in cut_dicts(run_dir, base)]
    path = os.path.join(run_dir, CUTS)
    write_file(path + ".tmp", gzip.compress(("\n".join(lines) + ("\n" if lines else "")).encode("utf-8"), 6))
    store_files.rename(path + ".tmp", path)
    return path
