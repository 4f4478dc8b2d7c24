"""``--engine ray``: the same work units on a Ray cluster, one actor per GPU (or N CPU actors).

The driver (this process) owns everything that matters for integrity: it hands units out
dynamically (``ray.wait``: an actor that finishes takes the next unit, so fast and slow devices
both stay busy), it alone writes OUT (with the usual crash-safe commit), and it retries the unit
of an actor that died on another actor -- Ray's own restarts and task retries are off, because a
retried task could deliver a unit twice.  The writer ignores an item it already stored anyway.
Each actor decodes and encodes its unit with the same :class:`~mimi_extract.engines.device.DeviceRunner`
as a local device (decoding inside the actor, next to its device).

A unit's frame chunks come back as one list per unit (each item whole); the outputs of a long file are held by its actor
until the file is done (codes: 200 bytes per audio second; features: 25.6 KB).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from dataclasses import replace

from .plan import WorkUnit
from ..config.settings import Settings
from .assembly import Assembler
from .base import Engine, FrameChunk, Stats
from .device import DeviceRunner

# read by Ray at import: keep a CLI's terminal clean (the user's environment wins)
os.environ.setdefault("RAY_DEDUP_LOGS_SKIP_REGEX", ".")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_SCHEDULER_EVENTS", "0")

MAX_ATTEMPTS = 3


class RayEncoder:
    """A Ray actor: one device's model and runner; ``encode(unit)`` returns the unit's items, whole."""

    def __init__(self, settings: Settings, device: str, threads: int | None):
        import torch

        if threads:
            torch.set_num_threads(threads)
        self.settings = settings
        self.runner = DeviceRunner(self.settings, device)

    def pid(self) -> int:
        return os.getpid()

    def encode(self, unit: WorkUnit) -> tuple[list[FrameChunk], Stats]:
        assembler = Assembler(join_pieces=False)  # whole pieces back: a split recording's others are elsewhere
        wholes: list[FrameChunk] = []
        todo = iter([unit])
        self.runner.stats = Stats()

        def collect(chunk: FrameChunk):
            if (whole := assembler.add(chunk)) is not None:
                wholes.append(whole)

        self.runner.run(lambda block=True: next(todo, None), collect, threading.Event())
        return wholes, self.runner.stats


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

    def run(self, units: list[WorkUnit], stop: threading.Event, model=None, shards=None):  # (the caller writes)
        ray = self.ray
        from ray.exceptions import RayActorError, RayTaskError

        remote = ray.remote(max_restarts=0, max_task_retries=0, **self.options)(RayEncoder)
        settings = self.plan_settings
        queue = collections.deque(units)
        attempts: collections.Counter = collections.Counter()
        pending: dict = {}  # ref -> (slot, generation, unit)
        actors: dict[int, object] = {}
        generation: collections.Counter = collections.Counter()
        replacements = 0

        def submit(slot: int) -> None:
            busy = sum(1 for s, g, _ in pending.values() if s == slot and g == generation[slot])
            while queue and slot in actors and busy < 2 and not stop.is_set():  # one running, one queued
                unit = queue.popleft()
                attempts[unit.index] += 1
                pending[actors[slot].encode.remote(unit)] = (slot, generation[slot], unit)
                busy += 1

        def start(slot: int) -> None:
            generation[slot] += 1
            actors[slot] = remote.remote(settings, self.device, self.threads)
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
                    wholes, stats = ray.get(ready[0])
                except RayActorError as e:
                    if getattr(e, "actor_init_failed", False):
                        raise RuntimeError(f"a Ray actor failed to start: {str(e).splitlines()[0]}") from e
                    if attempts[unit.index] >= MAX_ATTEMPTS:
                        for item in unit.items:
                            yield FrameChunk(item, None, True, True, item.samples / 24_000,
                                        f"the Ray actor died {MAX_ATTEMPTS} times encoding this item's work unit")
                    else:
                        queue.appendleft(unit)  # the driver retries: nothing of it was written
                    if gen == generation[slot] and slot in actors:
                        ray.kill(actors.pop(slot), no_restart=True)
                        self.notes.append(f"Ray actor {slot} died ({type(e).__name__}); its work unit was handed "
                                          "to another actor")
                        if replacements < 2 * self.actors:
                            replacements += 1
                            start(slot)
                    for s in list(actors):
                        submit(s)
                    if not actors and queue:
                        raise RuntimeError("every Ray actor died and no more replacements are started")
                    continue
                except RayTaskError as e:
                    raise RuntimeError(f"a Ray actor failed:\n{e}") from e
                self.stats.add(stats)
                yield from wholes
                submit(slot)
        finally:  # killing the actors ends their tasks in flight (ray.cancel(force=True) refuses actor tasks)
            for actor in actors.values():
                ray.kill(actor, no_restart=True)
            self.close()
