""":class:`RunDirectory`: the one door through which a run goes into its run directory, in order --
the checks made before OUT is locked (:meth:`RunDirectory.refuse_other_run`), open it (the layout
decision and the lock: a context manager), begin (:meth:`RunDirectory.begin`: identity, damaged
shards, recovery, changed inputs, the plan), write (its writers, context managers too), finish --
so that the runner asks for each step instead of driving the files itself."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..config.request import RunRequest
from ..config.settings import Part
from ..formats import get_format
from ..formats.base import Format
from ..formats.records import StoredRow
from ..sources import Discovered, Item
from . import run_info
from .cuts import write_cuts
from .files import LOCK, STATS, write_atomic
from .identity import check_run_info, read_run_info, write_run_info
from .lock import RunLock, lock_run_dir
from .manifest import committed_rows, out_rows, run_dirs
from .plan_info import write_plan
from .read import scan_checksums
from .recover import recover
from .shar_extend import SharExtendWriter
from .writer import ShardWriter


@dataclass
class Begun:
    """What a run begins with on its run directory (:meth:`RunDirectory.begin`)."""

    attrs: dict  # what every shard this run writes stores about how it was made (run_info.file_attrs)
    done: dict[str, StoredRow]  # the committed ok rows, by key: their items are not encoded again
    notes: list[str]  # what was repaired: quarantined shards, rewritten input shards encoded again


class RunDirectory:
    """One run directory of OUT (OUT itself, or ``OUT/part-I-of-N``), locked from :meth:`open` to
    :meth:`close` (``with RunDirectory.open(...) as run``: closed when the block ends, and a run that
    never got further than the lock leaves no OUT behind)."""

    # before OUT is locked: a resume of an OUT made before 0.3 goes on by its rules; whether the
    # parts of this job array divide their items by key; a resume of another run refused
    as_before = staticmethod(run_info.as_before)
    divided_by_key = staticmethod(run_info.divided_by_key)
    refuse_other_run = staticmethod(run_info.refuse_other_run)

    def __init__(self, path: str, out_dir: str, lock: RunLock, fresh: bool = False):
        self.path, self.out_dir, self.lock = path, out_dir, lock
        self.fresh = fresh  # OUT did not exist before this run opened it

    @classmethod
    def open(cls, out_dir: str, part: Part = Part()) -> RunDirectory:
        """Lock OUT itself for a whole run, ``OUT/part-I-of-N`` for a part of a job array; the layout
        is decided under OUT's lock (``lock.lock_run_dir``), so the two layouts never mix."""
        fresh = not os.path.exists(out_dir)
        path, lock = lock_run_dir(out_dir, *((None, None) if part.whole else (part.dirname, part.count)))
        return cls(path, out_dir, lock, fresh)

    def __enter__(self) -> RunDirectory:
        return self

    def __exit__(self, *exc) -> None:
        self.close(remove_if_unused=self.fresh)

    def begin(self, found: Discovered, request: RunRequest, identity, items: list[Item], bad: list[Item],
              on_phase=None) -> Begun:
        """Begin the run ``request`` asks on this directory, for ``items`` (and the unreadable ``bad``)
        of the input ``found``, with the loaded model's ``identity``
        (:class:`~mimi_extract.codec.model.ModelIdentity`): refuse another run's settings, weights or
        input (:meth:`check_identity`; ``--reencode-changed``: input shards rewritten in place are
        encoded again), find the damaged shards (``--reencode-damaged``: every stored item read
        against its checksums), recover (:meth:`recover`), refuse inputs changed since they were
        encoded, and record the plan (``plan.json``)."""
        on_phase = on_phase or (lambda text: None)
        fmt = get_format(request.settings.format)
        attrs = run_info.file_attrs(request.settings, identity, found.metadata)
        info = run_info.run_info(request, found, identity)
        rewritten = run_info.rewritten_since(self.path, info, request.part) if request.reencode_changed else []
        requeued = self.check_identity(info, attrs, fmt, rewritten)
        damaged = None
        if request.reencode_damaged:
            on_phase("reading every stored item to check its checksums (--reencode-damaged)")
            damaged = self.damaged_shards()
        done, notes = self.recover(attrs, fmt, damaged)
        run_info.refuse_changed_inputs(items, done)
        self.write_plan(len(items) + len(bad), sum(it.duration for it in items), str(request.part))
        return Begun(attrs, done, requeued + notes)

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
        stale = {row.shard: f"holds items of the rewritten input shard {os.path.basename(row.source.path)}"
                 for row in committed_rows(self.path) if row.ok and row.shard
                 and row.source is not None and row.source.path in rewritten}
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

    def recover(self, attrs: dict, fmt: Format, damaged: dict[str, str] | None = None
                ) -> tuple[dict[str, StoredRow], list[str]]:
        """(committed ok rows by key, notes): see ``recover.recover``."""
        return recover(self.path, attrs, damaged, fmt=fmt)

    def write_plan(self, inputs: int, seconds: float, part: str) -> None:
        """``plan.json``: what this run planned (``status`` and ``info`` read it: ``plan_info``)."""
        write_plan(self.path, inputs, seconds, part)

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
