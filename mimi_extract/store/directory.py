""":class:`RunDirectory`: what one run does with its run directory, in order -- open it (the
layout decision and the lock), check its identity, recover it, plan, write, finish -- so that the
runner asks for each step instead of driving the files itself."""

from __future__ import annotations

import gzip
import json
import os
import time

from ..formats.base import Format
from ..formats.cuts import FIELDS, cut_dict
from .files import CUTS, LOCK, PLAN_INFO, STATS, write_atomic, write_file
from .identity import check_run_info, read_run_info, write_run_info
from .lock import RunLock, lock_run_dir
from .manifest import committed_rows, out_rows, run_dirs
from .read import scan_checksums
from .recover import recover
from .shar_extend import SharExtendWriter
from .writer import ShardWriter


class RunDirectory:
    """One run directory of OUT (OUT itself, or ``OUT/part-I-of-N``), locked from :meth:`open` to
    :meth:`close`."""

    def __init__(self, path: str, out_dir: str, lock: RunLock):
        self.path, self.out_dir, self.lock = path, out_dir, lock

    @classmethod
    def open(cls, out_dir: str, part_dirname: str | None = None, part_count: int | None = None) -> RunDirectory:
        """Lock OUT itself for a whole run, ``OUT/part_dirname`` for a part of a job array of
        ``part_count``; the layout is decided under OUT's lock (``lock.lock_run_dir``), so the two
        layouts never mix."""
        path, lock = lock_run_dir(out_dir, part_dirname, part_count)
        return cls(path, out_dir, lock)

    @property
    def whole(self) -> bool:
        return os.path.abspath(self.path) == os.path.abspath(self.out_dir)

    def siblings(self) -> list[str]:
        """The other parts' run directories (a job array's parts must agree on what they were made with)."""
        return [] if self.whole else [d for d in run_dirs(self.out_dir) if d != self.path]

    def info(self) -> dict | None:
        return read_run_info(self.path)

    def check_identity(self, info: dict, attrs: dict, fmt: Format, rewritten: list[str] = ()) -> list[str]:
        """Refuse to resume with other settings, weights or input (``identity.check_run_info``); a
        new directory records ``info``.  ``rewritten``: input shards rewritten in place that the
        run re-encodes (``--reencode-changed``): everything else is checked against the identity
        recorded, then the output shards holding their items are quarantined (their items, and the
        others they hold, are encoded again) and ``run.json`` takes the new identity -- in that
        order, so a kill between the two leaves the change still to be seen.  Returns notes."""
        if not rewritten:
            check_run_info(self.path, info, self.siblings(), attrs)
            return []
        check_run_info(self.path, {**info, "input_identity": self.info()["input_identity"]}, self.siblings(), attrs)
        stale = {row["shard"]: f"holds items of the rewritten input shard {os.path.basename(row['source']['path'])}"
                 for row in committed_rows(self.path) if row.get("status") == "ok" and row.get("shard")
                 and (row.get("source") or {}).get("path") in rewritten}
        _, notes = recover(self.path, attrs, stale, fmt=fmt)
        write_run_info(self.path, {**self.info(), "input_identity": info["input_identity"]})
        return [f"--reencode-changed: {len(rewritten)} rewritten input shard(s) ("
                + ", ".join(os.path.basename(p) for p in rewritten[:5]) + (", ..." if len(rewritten) > 5 else "")
                + "): their items are encoded again"] + notes

    def damaged_shards(self) -> dict[str, str]:
        """{shard: why} for the shards holding an item that fails its checksums (read them all)."""
        found: dict[str, list[str]] = {}
        for d in scan_checksums(self.path, self.path)["damaged"]:
            found.setdefault(d["shard"], []).append(d["key"])
        return {shard: f"{len(keys)} items fail their checksums: {keys[0]!r}" + (", ..." if len(keys) > 1 else "")
                for shard, keys in found.items()}

    def recover(self, attrs: dict, fmt: Format, damaged: dict[str, str] | None = None) -> tuple[dict[str, dict], list[str]]:
        """(committed ok rows by key, notes): see ``recover.recover``."""
        return recover(self.path, attrs, damaged, fmt=fmt)

    def write_plan(self, inputs: int, seconds: float, part: str) -> None:
        """``plan.json``: what this run planned (``status`` and ``info`` read it)."""
        write_atomic(os.path.join(self.path, PLAN_INFO), json.dumps(
            {"inputs": inputs, "seconds": seconds, "updated": time.strftime("%Y-%m-%d %H:%M:%S %z"), "part": part}))

    def writer(self, fmt: Format, attrs: dict, max_items: int, max_bytes: int, on_commit=None) -> ShardWriter:
        """``on_commit()``: called after each commit (an OUT on object storage uploads it: ``mirror.py``)."""
        return ShardWriter(self.path, fmt, attrs, max_items, max_bytes, on_commit)

    def extend_writer(self, fmt: Format, attrs: dict, layout: dict[str, list[str]]) -> SharExtendWriter:
        """``--shar-extend``: one tar per input Shar shard of ``layout`` (``shar_extend.plan_extend``)."""
        return SharExtendWriter(self.path, fmt, attrs, layout)

    def finish(self, fmt: Format, stats: dict) -> None:
        """The end of every run, an interrupted one too: ``stats.json`` (this run's timing), the
        cuts of what is committed, and the files the format writes about OUT as a whole
        (``Format.out_files``: Parquet's dataset card), under OUT's lock when parts share OUT."""
        write_atomic(os.path.join(self.path, STATS), json.dumps(stats, indent=2))
        write_cuts(self.path)
        info = self.info()
        rows = lambda: out_rows(self.out_dir)  # noqa: E731  (read only by a format that asks)
        files = fmt.out_files(self.out_dir, info, not self.whole, rows)
        if files and not self.whole:
            # parts share OUT: one at a time, and asked again under the lock (what another part wrote counts)
            out_lock = RunLock(self.out_dir, wait=30.0, what="dataset card")
            try:
                self._write_out_files(fmt.out_files(self.out_dir, info, True, rows))
            finally:
                out_lock.release()
        else:
            self._write_out_files(files)

    def _write_out_files(self, files: dict[str, str]) -> None:
        for name, text in files.items():
            write_atomic(os.path.join(self.out_dir, name), text)

    def close(self, remove_if_unused: bool = False) -> None:
        """Let the lock go; ``remove_if_unused``: a run that never started leaves no OUT behind
        (when only its lock is there)."""
        self.lock.release()
        if not remove_if_unused:
            return
        try:
            if os.listdir(self.path) == [LOCK]:
                os.remove(os.path.join(self.path, LOCK))
                for d in dict.fromkeys((self.path, self.out_dir)):
                    if not os.listdir(d):
                        os.rmdir(d)
        except OSError:
            pass


def cut_dicts(run_dir: str, base: str | None = None) -> list[dict]:
    """One cut per committed ok row of a run directory (lhotse's serialisation of a MonoCut/MultiCut);
    ``base``: where the run directory's shards are read from (the URL a staged run directory is
    mirrored to), when not from ``run_dir`` itself."""
    info = read_run_info(run_dir)
    if info is None:
        return []
    tap = info["tap"]
    frame_shift = 0.04 if tap == "encoder" else 0.08
    cuts = (cut_dict(r, base or run_dir, FIELDS[tap], frame_shift)
            for r in committed_rows(run_dir) if r.get("status") == "ok" and r.get("source"))
    return [c for c in cuts if c is not None]


def write_cuts(run_dir: str, base: str | None = None) -> str | None:
    """(Re)write ``run_dir/cuts.jsonl.gz`` from the manifest's committed ok rows, atomically.  Every
    run ends with it, an interrupted one too; after a kill -9 it lags the manifest until the next
    run of that directory (``read_cuts`` never does: it reads the manifest).  ``base``: see
    :func:`cut_dicts` (the cuts of an OUT on object storage point at its objects: ``mirror.py``)."""
    info = read_run_info(run_dir)
    if info is None or info.get("format") == "shar":  # Shar's cuts are its shar/cuts.* files
        return None
    lines = [json.dumps(c, ensure_ascii=False) for c in cut_dicts(run_dir, base)]
    path = os.path.join(run_dir, CUTS)
    write_file(path + ".tmp", gzip.compress(("\n".join(lines) + ("\n" if lines else "")).encode("utf-8"), 6))
    os.replace(path + ".tmp", path)
    return path
