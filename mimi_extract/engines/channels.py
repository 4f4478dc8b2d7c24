"""Each device worker's messages to the runner, on a pipe of its own.

Why not one ``multiprocessing.Queue`` shared by the workers: a worker killed in the middle of a
message (kill -9, the OOM killer) dies holding that queue's write lock, and leaves a torn message
in the pipe every worker shares.  The other workers then wait forever for the lock, or the runner
for the rest of the message, and the run hangs with one worker dead (seen in about 1 run in 7 of
tests/store/test_integrity.py's dead-worker test).  One pipe per worker confines a death to the dead
worker's own pipe: no lock is shared between processes, and the runner holds no copy of a worker's
write end, so a torn message ends in end-of-file, which the runner reads as that worker's end."""

from __future__ import annotations

import queue
import threading
from multiprocessing.connection import Connection, wait

GONE = "gone"  # the message a worker's pipe gives at its end: (GONE, wid, None)


class WorkerPipe:
    """A worker's end: ``put`` from any of its threads (the encoder's, the feeder's, the shard
    writer's), one message at a time.  It blocks while the pipe is full: the runner reads as fast
    as it commits, and a worker should not run further ahead of the commits than that."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.lock = threading.Lock()

    def put(self, message: tuple) -> None:
        with self.lock:
            self.conn.send(message)

    def __reduce__(self):  # (to a spawned worker: the pipe's end, with a lock of its own there)
        return WorkerPipe, (self.conn,)


class WorkerPipes:
    """The runner's ends, one per worker, read as messages arrive on any of them."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.readers: dict[int, Connection] = {}
        self.writers: dict[int, Connection] = {}
        self.last = -1  # the worker read last: the next read starts after it (none starves the others)

    def open(self, wid: int) -> WorkerPipe:
        """A new pipe for worker ``wid``; its write end, to hand to that worker's process.  Call
        :meth:`started` once the process has started, so that the runner keeps no copy of it."""
        self.readers[wid], self.writers[wid] = self.ctx.Pipe(duplex=False)
        return WorkerPipe(self.writers[wid])

    def started(self, wid: int) -> None:
        """Close this process's copy of ``wid``'s write end (its process has its own): the pipe then
        ends when the worker does, and a process forked later does not inherit it."""
        self.writers.pop(wid).close()

    def get(self, timeout: float) -> tuple:
        """The next message from any worker, ``(GONE, wid, None)`` once a worker's pipe has ended
        (its process ended, whatever it sent last), or :class:`queue.Empty` after ``timeout``."""
        ready = wait(list(self.readers.values()), timeout)
        if not ready:
            raise queue.Empty
        ready_wids = sorted(w for w, conn in self.readers.items() if conn in ready)
        wid = next((w for w in ready_wids if w > self.last), ready_wids[0])
        self.last = wid
        try:
            return self.readers[wid].recv()
        except (EOFError, OSError):  # (ended, perhaps mid-message: what it held is handed out again)
            self.readers.pop(wid).close()
            return (GONE, wid, None)

    def close(self) -> None:
        for conn in [*self.readers.values(), *self.writers.values()]:
            conn.close()
        self.readers, self.writers = {}, {}
