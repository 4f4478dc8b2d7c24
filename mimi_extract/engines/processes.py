"""``ProcessEngine``: one process per device (GPUs, or single-threaded CPU workers), units handed
out on request (an idle worker takes the next one), a dead worker's units handed to the others,
workers that exit when their parent dies (:mod:`mimi_extract._boot` ties them first).

CPU workers are forked from this process once it holds the model (the runner loads it anyway, to
hash its weights): they inherit torch, transformers and the weights, so a CPU run pays the imports
(~3.5 CPU seconds) and the weight load once instead of once per worker -- on two cores that was
most of a short job's start-up.  GPU workers are spawned (CUDA cannot cross a fork) and load their
own copy, overlapped with the runner's discovery and planning."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import threading
import time
import traceback
from collections import deque
from dataclasses import replace

import torch

from .._boot import die_with_parent, ignore_stop_signals, worker_main
from .plan import WorkUnit
from ..config.settings import Settings, threads_per_worker
from ..store.files import OutputError
from ..store.manifest import item_attrs
from ..store.writer import ShardSpec, WorkerShards
from .assembly import Assembler
from .base import Engine, FrameChunk, Progress, Stats
from .channels import GONE, WorkerPipe, WorkerPipes
from .device import IDLE, LATER, DeviceRunner

WORKER_MAIN = "mimi_extract.engines.processes:_process_main"  # what _boot.worker_main runs, by name
# to a worker that asked for work when there is none to hand out but items are still held uncommitted:
# write your open shard once you are idle (the run waits for those items: a dead worker's are handed again)
FLUSH = "flush"


def _process_main(settings: Settings, device: str, wid: int, inbox, out_q: WorkerPipe, stop, model=None) -> None:
    """A device worker (started by ``_boot.worker_main``, which ties it to its parent first, and
    finds this function by its name, ``WORKER_MAIN``; or forked by :func:`_forked_main` with the
    parent's ``model``).  Its first message is where it writes (:class:`ShardSpec`: it builds and
    writes its own shards, and sends the runner their rows) or None (it sends every frame chunk)."""
    torch.set_num_threads(threads_per_worker(settings))
    try:
        runner = DeviceRunner(settings, device, model)
        del model
        spec = inbox.get()
        asked, flush = [False], [False]

        def next_unit(block=True):
            if not asked[0]:
                out_q.put(("want", wid, None))
                asked[0] = True
            while True:
                if block and flush[0]:  # (only once idle: every item it holds is then in its open shard)
                    flush[0] = False
                    return IDLE
                try:
                    unit = inbox.get(timeout=None if block else 0.01)
                except queue_mod.Empty:
                    return LATER
                if isinstance(unit, str) and unit == FLUSH:
                    flush[0] = True
                    continue
                asked[0] = False
                return unit

        if spec is None:
            runner.run(next_unit, lambda p: out_q.put(("chunk", wid, p)), stop)
        else:
            with WorkerShards(spec, wid) as shards:
                sink = _OwnShards(shards, wid, out_q)
                try:
                    runner.run(next_unit, sink.emit, stop, idle=sink.flush)
                finally:
                    sink.close()
        out_q.put(("done", wid, runner.stats))
    except OutputError as e:  # (a full disk: the run's clear message, not a traceback)
        out_q.put(("output", wid, str(e)))
    except BaseException:
        out_q.put(("fail", wid, f"{device}: {traceback.format_exc()}"))


class _OwnShards:
    """A worker's frame chunks into its own shards (:class:`WorkerShards`): each whole item stored
    there, each shard written by this worker and its rows sent to the runner to commit.  Pieces of
    a split recording (stitched from several workers) and errors go to the runner as chunks;
    progress goes as seconds, at most twice a second.  All of it in a thread of its own (``emit``
    only queues), so that the encoder, and the device, never wait for a shard's build or fsync."""

    _FLUSH, _END = object(), object()

    def __init__(self, shards: WorkerShards, wid: int, out_q):
        self.shards, self.wid, self.out_q = shards, wid, out_q
        self.assembler = Assembler()
        self.seconds, self.sent = 0.0, time.monotonic()
        self.todo: queue_mod.Queue = queue_mod.Queue(maxsize=64)
        self.error: list[BaseException] = []
        self.thread = threading.Thread(target=self._work, name="shard writer", daemon=True)
        self.thread.start()

    def emit(self, chunk: FrameChunk) -> None:
        self._put(chunk)

    def flush(self) -> None:
        """Write the open shard (once idle after the runner said FLUSH: it waits for its items before
        it hands out the end)."""
        self._put(self._FLUSH)

    def close(self) -> None:
        """Write the open shard and end the thread (this worker's end); raise what it raised."""
        self._put(self._END)
        self.thread.join()
        if self.error:
            raise self.error[0]

    def _put(self, what) -> None:
        while self.thread.is_alive():
            try:
                self.todo.put(what, timeout=0.5)
                return
            except queue_mod.Full:
                continue
        raise self.error[0] if self.error else RuntimeError("the shard writer thread ended")

    def _work(self) -> None:
        try:
            while True:
                what = self.todo.get()
                if what is self._END:
                    self._send(self.shards.flush())
                    return
                if what is self._FLUSH:
                    self._send(self.shards.flush())
                else:
                    self._store(what)
        except BaseException as e:  # (raised in the encoder's thread at its next emit, or at close)
            self.error.append(e)

    def _store(self, chunk: FrameChunk) -> None:
        if chunk.item.piece is not None:
            self.out_q.put(("chunk", self.wid, chunk))
            return
        whole = self.assembler.add(chunk)
        if whole is not None and whole.error is not None:
            self.out_q.put(("chunk", self.wid, whole))
        elif whole is not None:
            item = whole.item
            self._send(self.shards.add(item.uid, item.key, whole.data, whole.row(), item_attrs(item), chunk.seconds))
        else:
            self.seconds += chunk.seconds
            if time.monotonic() - self.sent > 0.5:
                self.out_q.put(("progress", self.wid, self.seconds))
                self.seconds, self.sent = 0.0, time.monotonic()

    def _send(self, ready) -> None:
        for shard in ready:
            self.out_q.put(("shard", self.wid, shard))


def _forked_main(parent: int, settings: Settings, model, device: str, wid: int, inbox, out_q, stop) -> None:
    """A CPU worker forked from the runner's process: it already has torch and the ``model``."""
    die_with_parent(parent)
    ignore_stop_signals()
    _process_main(settings, device, wid, inbox, out_q, stop, model)


def forks_workers(settings: Settings) -> bool:
    """Whether CPU workers are forked from the process holding the model (see the module docstring)."""
    return not settings.on_gpu and "fork" in mp.get_all_start_methods()


class ProcessEngine(Engine):
    """One spawned process per device; units handed out as workers ask, re-handed if one dies."""

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.worker_stats: dict[int, Stats] = {}  # per worker: who did how much (dynamic hand-out)
        self.procs: list = []
        self.handed = False  # has any worker been given a unit (then it may hold results to deliver)
        self.start_method: str | None = None  # "fork" (CPU, from the runner's model) or "spawn", once started

    def start(self, model=None) -> None:
        """Start the workers.  Spawned ones (GPUs; ``make_engine`` starts them before the runner's
        own start-up) spend seconds importing torch and loading the weights, overlapped with the
        runner's identity check, discovery and planning.  Forked ones (CPU, given the ``model``
        :meth:`run` receives) start encoding at once."""
        if self.procs:
            return
        fork = model is not None and forks_workers(self.settings)
        self.start_method = "fork" if fork else "spawn"
        ctx = torch.multiprocessing.get_context(self.start_method)
        self.out_q = WorkerPipes(ctx)  # (one pipe per worker: see .channels)
        self.inboxes = [ctx.Queue() for _ in self.settings.devices]
        self.mp_stop = ctx.Event()
        if fork:
            target, given = _forked_main, (self.settings, model)
        else:
            target, given = worker_main, (self.settings, WORKER_MAIN)
        for wid, dev in enumerate(self.settings.devices):
            p = ctx.Process(target=target, args=(os.getpid(), *given, dev, wid, self.inboxes[wid],
                                                 self.out_q.open(wid), self.mp_stop), daemon=True)
            p.start()
            self.out_q.started(wid)
            self.procs.append(p)

    def close(self) -> None:
        """Stop the workers (idempotent).  Workers never given a unit (a run that failed or was
        refused during start-up) hold nothing: they are killed at once rather than waited for."""
        if not self.procs:
            return
        if not self.handed:
            for p in self.procs:
                p.kill()
        self.mp_stop.set()
        for inbox in self.inboxes:
            inbox.put(None)
        deadline = time.time() + 30
        while any(p.is_alive() for p in self.procs) and time.time() < deadline:
            try:  # drain: a worker blocked on a full pipe must see the stop
                self.out_q.get(timeout=0.1)
            except queue_mod.Empty:
                pass
        for p in self.procs:
            if p.is_alive():
                p.kill()  # (workers ignore SIGTERM: the parent decides what a stop means)
            p.join(5)
        self.out_q.close()
        self.procs = []

    def run(self, units: list[WorkUnit], stop: threading.Event, model=None, shards: ShardSpec | None = None):
        """``shards``: the workers write the run's shards themselves and this yields each as a
        :class:`~mimi_extract.store.writer.PreparedShard` for the caller to commit (and
        :class:`~.base.Progress`), besides the frame chunks of split recordings and errors."""
        self.start(model)  # (forked CPU workers inherit it)
        del model  # spawned workers load their own copy; this frame must not keep the caller's alive
        procs, out_q, mp_stop = self.procs, self.out_q, self.mp_stop
        for inbox in self.inboxes:
            inbox.put(shards)
        hand = _HandOut(self, units, stop, flush=shards is not None)
        finished: set[int] = set()
        try:
            while len(finished | hand.failed) < len(procs):
                if stop.is_set():
                    mp_stop.set()
                    hand.hand_out()
                try:
                    kind, wid, payload = out_q.get(timeout=0.5)
                except queue_mod.Empty:
                    for wid, p in enumerate(procs):  # (its pipe's end says so first; this, if it does not)
                        if wid not in finished and wid not in hand.failed and not p.is_alive():
                            hand.died(wid)
                    hand.hand_out()
                    continue
                if kind == GONE:
                    if wid not in finished and wid not in hand.failed:
                        hand.died(wid)
                elif kind == "want":
                    hand.want(wid)
                elif kind == "chunk":
                    if payload.final:
                        hand.stored([payload.item.uid])
                    yield payload
                elif kind == "shard":
                    if wid in hand.failed:  # its units are handed out again already
                        payload.discard()
                        continue
                    yield payload  # (committed by the caller, or refused, by the time it returns)
                    if payload.committed:
                        hand.stored(payload.uids)
                    else:
                        hand.hand_again(payload.uids)
                        hand.hand_out()
                elif kind == "progress":
                    yield Progress(payload)
                elif kind == "done":
                    finished.add(wid)
                    self.stats.add(payload)
                    self.worker_stats[wid] = payload
                elif kind == "output":
                    raise OutputError(payload)
                elif kind == "fail":
                    raise RuntimeError(f"device worker failed:\n{payload}")
        finally:
            self.close()


class _HandOut:
    """A run's units among :class:`ProcessEngine`'s workers: handed to whoever asks, in order; the
    items of each unit not stored yet; a dead worker's, or a refused shard's, handed again."""

    def __init__(self, engine: ProcessEngine, units: list[WorkUnit], stop: threading.Event, flush: bool):
        self.engine, self.units, self.stop, self.flush = engine, units, stop, flush
        self.todo: deque[WorkUnit] = deque(units)
        self.keys_left = {u.index: {it.uid for it in u.items} for u in units}
        self.unit_of = {it.uid: u.index for u in units for it in u.items}
        self.taken: dict[int, set[int]] = {w: set() for w in range(len(engine.procs))}
        self.waiting: list[int] = []
        self.flushing: set[int] = set()  # waiting workers told FLUSH (once per wait)
        self.failed: set[int] = set()  # workers that died

    def want(self, wid: int) -> None:
        self.flushing.discard(wid)
        self.waiting.append(wid)
        self.hand_out()

    def hand_out(self) -> None:
        inboxes, todo, stop = self.engine.inboxes, self.todo, self.stop
        while self.waiting and (todo or not any(self.keys_left.values()) or stop.is_set()):
            wid = self.waiting.pop(0)
            if wid in self.failed:
                continue
            if todo and not stop.is_set():
                unit = todo.popleft()
                self.taken[wid].add(unit.index)
                inboxes[wid].put(unit)
                self.engine.handed = True
            else:
                inboxes[wid].put(None)
        if self.flush and not todo and not stop.is_set():
            for wid in self.waiting:  # nothing to hand out, items held: whoever is idle writes its shard
                if wid not in self.flushing:
                    self.flushing.add(wid)
                    inboxes[wid].put(FLUSH)

    def hand_again(self, uids) -> list[int]:
        """The units holding ``uids`` not yet stored, with only those items, back to the front of
        the queue (a delivered item has its row already); returns their indices."""
        keys_left, unit_of = self.keys_left, self.unit_of
        lost = {unit_of[u] for u in uids if u in keys_left.get(unit_of.get(u, -1), ())}
        self.todo.extendleft(replace(u, items=[it for it in u.items if it.uid in keys_left[u.index]])
                             for u in reversed(self.units) if u.index in lost)
        return sorted(lost)

    def stored(self, uids) -> None:
        for uid in uids:
            left = self.keys_left.get(self.unit_of.get(uid, -1))
            if left is not None:
                left.discard(uid)
        self.hand_out()

    def died(self, wid: int) -> None:
        engine, procs = self.engine, self.engine.procs
        self.failed.add(wid)  # (from now on, a shard it sent before it died is refused)
        if wid in self.waiting:
            self.waiting.remove(wid)
        lost = self.hand_again([it.uid for u in self.units if u.index in self.taken[wid] for it in u.items])
        procs[wid].join(5)  # (its pipe ended with it: the exit code is there or about to be)
        engine.notes.append(f"worker on {engine.settings.devices[wid]} died (exit code {procs[wid].exitcode}); "
                            f"its {len(lost)} unfinished work units were handed to the others")
        if len(self.failed) == len(procs) and not self.stop.is_set():
            raise RuntimeError("every device worker died (killed? out of host memory?)")
        self.hand_out()
