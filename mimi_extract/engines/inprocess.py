"""``InProcessEngine``: one device in this process; the encoder runs in a thread, the caller's
thread writes."""

from __future__ import annotations

import queue as queue_mod
import threading

import torch

from .plan import WorkUnit
from ..config.settings import threads_per_worker
from .base import DONE, Engine, AnyEvent, get_while
from .device import DeviceRunner


class InProcessEngine(Engine):
    """One device in this process: the encoder runs in a thread, the caller's thread writes."""

    def close(self) -> None:
        """Nothing to release: the encoder thread ends with its run."""

    def run(self, units: list[WorkUnit], stop: threading.Event, model=None, shards=None):  # (the caller writes)
        """``model``: the weights the caller already loaded, used rather than loading them again."""
        torch.set_num_threads(threads_per_worker(self.settings))
        given = [model]  # handed to the runner, not held here (on GPU the CPU copy is then freed)
        del model
        # a step's chunks in one put (``emit_step``): the writer takes a step at a time, the queue's
        # locks and the thread's wake-up once a step, not once an item (~12 µs an item in the run); one
        # step waiting at most, as the 64 chunks it held before (a step's outputs: up to ~100 MB of
        # encoder features for 64 streamed rows)
        out: queue_mod.Queue = queue_mod.Queue(maxsize=1)
        todo = iter(units)
        error: list[BaseException] = []
        abandoned = threading.Event()  # the consumer left (an error while writing): stop as well

        def work():
            try:
                runner = DeviceRunner(self.settings, self.settings.devices[0], given.pop())
                runner.run(lambda block=True: next(todo, None), out.put, AnyEvent(stop, abandoned), emit_step=out.put)
                self.stats.add(runner.stats)
            except BaseException as e:
                error.append(e)
            finally:
                out.put(DONE)

        thread = threading.Thread(target=work, name="encoder", daemon=True)
        thread.start()
        try:
            while True:
                got = get_while(out, thread)
                if got is DONE:
                    break
                if isinstance(got, RuntimeError):  # from get_while: chunks are never exceptions
                    raise got
                if type(got) is list:  # a step's chunks
                    yield from got
                else:
                    yield got
        finally:
            abandoned.set()
            while thread.is_alive():  # drain, so that a blocked put cannot keep the thread alive
                try:
                    out.get(timeout=0.1)
                except queue_mod.Empty:
                    pass
            thread.join()
        if error:
            raise error[0]

