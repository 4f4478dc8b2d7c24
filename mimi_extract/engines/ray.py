"""``--engine ray``: the same work units on a Ray cluster, one actor per GPU (or N CPU actors).

The driver (this process) owns everything that matters for integrity: it hands units out
dynamically (``ray.wait``: an actor that finishes takes the next unit, so fast and slow devices
both stay busy), it alone commits to OUT (holding its lock: the usual crash-safe commit), and it
retries the unit of an actor that died on another actor -- Ray's own restarts and task retries are
off, because a retried task could deliver a unit twice.  The writer refuses an item it already
stored anyway.  Each actor decodes and encodes its unit with the same
:class:`~mimi_extract.engines.device.DeviceRunner` as a local device (decoding inside the actor,
next to its device).

An actor that sees OUT's run directory (the same machine, or a shared file system: its
:class:`~mimi_extract.store.writer.ShardSpec` probe) builds and writes the shards of its unit's
items itself, as a local device worker does (:class:`~mimi_extract.store.writer.WorkerShards`),
and returns their rows for the driver to commit: the bytes of a run no longer pass through the
driver.  An actor on a machine that does not see it returns its unit's outputs, each item whole,
and the driver writes them.  Pieces of a split recording (stitched from several actors) and error
rows always go to the driver.  The outputs of a long file are held by its actor until the file is
done (codes: 200 bytes per audio second; features: 25.6 KB).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import itertools
import threading
from dataclasses import dataclass, field, replace

from .plan import WorkUnit
from ..config.settings import Settings
from ..store.files import OutputError
from ..store.manifest import item_attrs
from ..store.writer import PreparedShard, ShardSpec, WorkerShards
from .assembly import Assembler
from .base import Engine, FrameChunk, Stats
from .device import DeviceRunner

# read by Ray at import: keep a CLI's terminal clean (the user's environment wins)
os.environ.setdefault("RAY_DEDUP_LOGS_SKIP_REGEX", ".")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_SCHEDULER_EVENTS", "0")

MAX_ATTEMPTS = 3


@dataclass
class RayResult:
    """What an actor returns for a unit: ``shards`` it wrote itself (rows and names only, for the
    driver to commit), ``chunks`` for the driver to store (every whole item when the actor does not
    write, else the pieces of split recordings and the errors), its ``stats``; ``output``: the
    message of an :class:`OutputError` (a full disk) writing its shards; ``writes``: whether it
    writes shards itself."""

    chunks: list[FrameChunk]
    stats: Stats
    shards: list[PreparedShard] = field(default_factory=list)
    output: str | None = None
    writes: bool = False
    held: list[str] = field(default_factory=list)  # uids in its open shard (written at a later unit or ``flush``)
    pid: int = field(default_factory=os.getpid)  # the actor's process


class RayEncoder:
    """A Ray actor: one device's model and runner; ``encode(unit)`` returns a :class:`RayResult`.
    ``spec``: where it writes its units' shards itself, if it sees the run directory (``worker``:
    its number, unique in the run, which keeps its provisional shard names its own)."""

    def __init__(self, settings: Settings, device: str, threads: int | None, spec: ShardSpec | None = None,
                 worker: int = 0):
        import torch

        if threads:
            torch.set_num_threads(threads)
        self.settings = settings
        self.runner = DeviceRunner(self.settings, device)
        self.shards = WorkerShards(spec, worker) if spec is not None and spec.reachable() else None

    def encode(self, unit: WorkUnit) -> RayResult:
        assembler = Assembler(join_pieces=False)  # whole pieces back: a split recording's others are elsewhere
        wholes: list[FrameChunk] = []
        todo = iter([unit])
        self.runner.stats = Stats()

        def collect(chunk: FrameChunk):
            if (whole := assembler.add(chunk)) is not None:
                wholes.append(whole)

        self.runner.run(lambda block=True: next(todo, None), collect, threading.Event())
        if self.shards is None:
            return RayResult(wholes, self.runner.stats)
        try:
            return self._store(wholes)
        except OutputError as e:
            self.shards.abort()
            return RayResult([], self.runner.stats, output=str(e), writes=True)

    def flush(self) -> RayResult:
        """Write the open shard (the driver asks an idle actor once no unit is left to hand out)."""
        try:
            return RayResult([], Stats(), self.shards.flush() if self.shards is not None else [], writes=True)
        except OutputError as e:
            self.shards.abort()
            return RayResult([], Stats(), output=str(e), writes=True)

    def _store(self, wholes: list[FrameChunk]) -> RayResult:
        """The unit's whole items into this actor's shards; the shards they closed, written, and the
        items its open shard holds (as a local device worker, its shards fill across units)."""
        chunks, ready = [], []
        for whole in wholes:
            item = whole.item
            if item.piece is not None or whole.error is not None:
                chunks.append(whole)
            else:
                ready += self.shards.add(item.uid, item.key, whole.data,
                                         whole.row(), item_attrs(item), whole.seconds)
        return RayResult(chunks, self.runner.stats, ready, writes=True, held=self.shards.held)


@contextlib.contextmanager
def _own_niceness():
    """Around ``ray.init`` of a private cluster: its workers start at this process's niceness,
    where Ray adds 15 by default (``RAY_worker_niceness``, an increment over the raylet's, which is
    this process's: measured, a driver at 5 with 0 gives actors at 5).  The actors are this run's
    own work, and beside other processes a nice-15 actor gets about 3 % of a core (docs/performance.md,
    "On a busy machine, Ray's niceness").  Through the environment the raylet inherits, not a
    ``_system_config`` (Ray's testing-only option, where an unknown key stops the cluster from
    starting); a user's own ``RAY_worker_niceness`` is kept."""
    if "RAY_worker_niceness" in os.environ:
        yield
        return
    os.environ["RAY_worker_niceness"] = "0"
    try:
        yield
    finally:
        os.environ.pop("RAY_worker_niceness", None)


class RayEngine(Engine):
    """Work units on a Ray cluster; see the module docstring."""

    def __init__(self, settings: Settings):
        try:
            import ray
        except ImportError as e:
            raise RuntimeError(f"--engine ray needs Ray: pip install 'mimi-extract[ray]' ({e})") from None
        super().__init__(settings)
        self.ray = ray
        self.started_here = not ray.is_initialized()
        self.reaper = None
        if self.started_here:
            quiet = dict(log_to_driver=False, logging_level=logging.ERROR)
            address = settings.ray_address
            if address in (None, "", "local", "none"):  # a private local cluster: never attach to a stray one
                from . import _reaper

                self.reaper = _reaper.start()  # the cluster goes with this process, however it dies
                try:
                    with _own_niceness():
                        ray.init(address="local", include_dashboard=False, **quiet)
                except BaseException:
                    _reaper.stop(self.reaper)
                    raise
            else:
                ray.init(address=address, **quiet)
        resources = ray.cluster_resources()
        self.gpus = int(resources.get("GPU", 0))
        cpus = int(resources.get("CPU", 1))
        if settings.dtype != "fp32" and not self.gpus:
            raise RuntimeError(f"--dtype {settings.dtype} needs GPUs; the Ray cluster has none")
        if self.gpus:  # one actor per GPU (GPU actors that cannot be placed would wait forever)
            self.actors, self.device, self.threads = self.gpus, "cuda", None
            self.options = dict(num_gpus=1, num_cpus=1)
        else:
            self.actors = settings.ray_cpu_actors or max(1, cpus // 2)
            if self.actors > cpus:  # an actor needs a CPU: the ones that cannot be placed would wait forever
                self.notes.append(f"--ray-cpu-actors {self.actors} > the cluster's {cpus} CPUs: using {cpus} actors")
                self.actors = cpus
            self.threads = max(1, cpus // self.actors)
            self.device = "cpu"
            self.options = dict(num_cpus=self.threads)
        self.plan_settings = replace(settings, devices=(self.device,) * self.actors)
        self.driver_writes = False  # (noted once: an actor that cannot write OUT's shards itself)

    def long_group(self) -> int:
        """A step's rows of long items per unit: each actor streams a unit's items side by side."""
        return self.plan_settings.rows

    def describe(self) -> str:
        return f"{self.actors} Ray actors on {'GPU' if self.gpus else f'CPU ({self.threads} threads each)'}"

    def close(self) -> None:
        if self.started_here and self.ray.is_initialized():
            self.ray.shutdown()
        if self.reaper is not None:  # it sweeps what the shutdown left (Ray's agents), then exits
            from . import _reaper

            _reaper.stop(self.reaper)
            self.reaper = None

    def run(self, units: list[WorkUnit], stop: threading.Event, model=None, shards: ShardSpec | None = None):
        """``shards``: actors that see the run directory write the shards of their items themselves
        and this yields each as a :class:`~mimi_extract.store.writer.PreparedShard` for the caller to
        commit; everything else as frame chunks (the caller writes)."""
        ray = self.ray
        from ray.exceptions import RayActorError, RayTaskError

        remote = ray.remote(max_restarts=0, max_task_retries=0, **self.options)(RayEncoder)
        settings = self.plan_settings
        spec = shards.with_probe() if shards is not None else None
        book = _Book(units)
        pending: dict = {}  # ref -> (slot, generation, unit; None: a flush)
        actors: dict[int, object] = {}
        generation: collections.Counter = collections.Counter()
        workers = itertools.count()  # each actor started its own number: its provisional shard names its own
        replacements = 0

        def submit(slot: int) -> None:
            busy = sum(1 for s, g, _ in pending.values() if s == slot and g == generation[slot])
            while book.queue and slot in actors and busy < 2 and not stop.is_set():  # one running, one queued
                unit = book.take()
                pending[actors[slot].encode.remote(unit)] = (slot, generation[slot], unit)
                busy += 1
            if not book.queue and not busy and book.held.get(slot) and not stop.is_set():  # idle: write its shard
                pending[actors[slot].flush.remote()] = (slot, generation[slot], None)

        def start(slot: int) -> None:
            generation[slot] += 1
            actors[slot] = remote.remote(settings, self.device, self.threads, spec, next(workers))
            submit(slot)

        try:
            for slot in range(self.actors):
                start(slot)
            while pending and not stop.is_set():
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                if not ready:
                    continue
                slot, gen, unit = pending.pop(ready[0])
                try:
                    result = ray.get(ready[0])
                except RayActorError as e:
                    if getattr(e, "actor_init_failed", False):
                        raise RuntimeError(f"a Ray actor failed to start: {str(e).splitlines()[0]}") from e
                    if gen == generation[slot] and slot in actors:
                        ray.kill(actors.pop(slot), no_restart=True)
                        self.notes.append(f"Ray actor {slot} died ({type(e).__name__}); its work unit was handed "
                                          "to another actor")
                        yield from book.again(book.held.pop(slot, ()), f"the Ray actor died {MAX_ATTEMPTS} times "
                                              "encoding this item's work unit")  # (its open shard: never committed)
                        if replacements < 2 * self.actors:
                            replacements += 1
                            start(slot)
                    if unit is not None:
                        yield from book.again([it.uid for it in unit.items], f"the Ray actor died {MAX_ATTEMPTS} "
                                              "times encoding this item's work unit")  # (nothing of it committed)
                    for s in list(actors):
                        submit(s)
                    if not actors and book.queue:
                        raise RuntimeError("every Ray actor died and no more replacements are started")
                    continue
                except RayTaskError as e:
                    raise RuntimeError(f"a Ray actor failed:\n{e}") from e
                book.held[slot] = set(result.held)
                yield from self._delivered(result, spec, book)
                for s in list(actors):
                    submit(s)
        finally:  # killing the actors ends their tasks in flight (ray.cancel(force=True) refuses actor tasks)
            for actor in actors.values():
                ray.kill(actor, no_restart=True)
            self.close()

    def _delivered(self, result: RayResult, spec: ShardSpec | None, book: _Book):
        """A result: its shards to commit (one the writer refuses, for an item stored already, has
        its other items encoded again), then its chunks."""
        self.stats.add(result.stats)
        if result.output is not None:
            raise OutputError(result.output)
        if spec is not None and not result.writes and not self.driver_writes:
            self.driver_writes = True
            self.notes.append("a Ray actor does not see OUT's run directory (another machine, no shared file "
                              "system): the driver writes its items")
        for shard in result.shards:
            yield shard  # (committed by the caller, or refused, by the time it returns)
            if shard.committed:
                book.stored.update(shard.uids)
            else:  # (never seen: a unit is delivered once; as the local engine does, its items not stored again)
                yield from book.again(shard.uids, f"the driver refused this item's shard {MAX_ATTEMPTS} times")
        for chunk in result.chunks:
            if chunk.error is None and chunk.item.piece is None:
                book.stored.add(chunk.item.uid)
            yield chunk


class _Book:
    """A Ray run's units: the queue, each unit's attempts, the items stored (delivered to the
    caller), and the items each actor holds in its open shard (``held``, by slot: a dead actor's go
    again)."""

    def __init__(self, units: list[WorkUnit]):
        self.units = units
        self.queue: collections.deque[WorkUnit] = collections.deque(units)
        self.attempts: collections.Counter = collections.Counter()
        self.unit_of = {it.uid: u for u in units for it in u.items}
        self.stored: set[str] = set()
        self.held: dict[int, set[str]] = {}

    def take(self) -> WorkUnit:
        unit = self.queue.popleft()
        self.attempts[unit.index] += 1
        return unit

    def again(self, uids, error: str):
        """The items ``uids`` not stored yet, as their units (those items only) to the front of the
        queue; a unit tried ``MAX_ATTEMPTS`` times gives its items as error rows instead."""
        lost: dict[int, set[str]] = collections.defaultdict(set)
        for uid in uids:
            if uid not in self.stored and uid in self.unit_of:
                lost[self.unit_of[uid].index].add(uid)
        for unit in reversed([u for u in self.units if u.index in lost]):
            items = [it for it in unit.items if it.uid in lost[unit.index]]
            if self.attempts[unit.index] < MAX_ATTEMPTS:
                self.queue.appendleft(replace(unit, items=items))
                continue
            for item in items:
                yield FrameChunk(item, None, True, True, item.samples / 24_000, error)
