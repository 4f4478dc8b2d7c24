"""Execution engines: how planned work units become encoded frame chunks, on one device or many.

Every engine runs its units through :class:`~.device.DeviceRunner`, the engine on one device
(continuous batching: a feeder thread composes steps ahead of the exact encoder), and shares the
small :class:`~.base.Engine` interface: ``plan(items, model=None)`` (its own work units),
``run(units, stop, model=None) -> iterator of FrameChunk`` and ``close()`` (a context manager):

* ``local``: :class:`~.inprocess.InProcessEngine` -- one device in this process (the caller's thread
  writes) -- or, with several devices, :class:`~.processes.ProcessEngine` -- one spawned process per
  device, units handed out on request, a dead worker's units handed to the others, workers that
  exit when their parent dies;
* ``ray``: :class:`~.ray.RayEngine` -- the same on a Ray cluster (imported only when chosen).

:func:`make_engine` picks one by ``settings.engine`` from :data:`ENGINES`.  The writer ignores a
chunk for an item it already stored, so a unit handed out twice (after a worker died) can never
store an item twice.
"""

from __future__ import annotations

from typing import Callable

from ..config.settings import Settings
from .base import Engine, FrameChunk, Stats, is_out_of_memory
from .device import LATER, DeviceRunner, build_encoder
from .inprocess import InProcessEngine
from .processes import ProcessEngine, forks_workers


def _local(settings: Settings) -> Engine:
    if len(settings.devices) == 1:
        return InProcessEngine(settings)
    engine = ProcessEngine(settings)
    if not forks_workers(settings):  # spawned GPU workers load their weights while the runner plans;
        engine.start()  # forked CPU workers are started by run(), from the model the runner loaded
    return engine


def _ray(settings: Settings) -> Engine:
    from .ray import RayEngine  # Ray is an optional extra

    return RayEngine(settings)


ENGINES: dict[str, Callable[[Settings], Engine]] = {"local": _local, "ray": _ray}  # --engine NAME


def make_engine(settings: Settings) -> Engine:
    """The engine for ``settings``, already starting (worker processes, a Ray cluster connection)."""
    try:
        make = ENGINES[settings.engine]
    except KeyError:
        raise ValueError(f"unknown engine {settings.engine!r}; one of {', '.join(ENGINES)}") from None
    return make(settings)


__all__ = ["ENGINES", "LATER", "DeviceRunner", "Engine", "FrameChunk", "InProcessEngine", "ProcessEngine", "Stats",
           "build_encoder", "is_out_of_memory", "make_engine"]
