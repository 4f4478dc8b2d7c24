"""The workers' pipes to the runner (``engines.channels``): a worker killed in the middle of a
message must not stop the runner hearing the others, nor leave it waiting for the rest of the
message.  With one ``multiprocessing.Queue`` shared by the workers it did both (the dead worker's
torn message and held write lock): tests/store/test_integrity.py's dead-worker run hung."""

import os
import queue
import signal
import threading
import time

import torch.multiprocessing as tmp

from mimi_extract.engines.channels import GONE, WorkerPipes
from support.waits import HANG_QUICK_S, wait_for

BIG = 16 * 1024 * 1024  # far above a pipe's capacity (64 KiB by default, at most /proc/sys/fs/pipe-max-size)


def _send(pipe, wid, size, go):
    go.wait()
    pipe.put(("chunk", wid, b"x" * size))
    time.sleep(3600)  # (killed by the test)


def _read(pipes, count) -> list:
    """``count`` messages, read in a thread: a hang fails the test instead of stalling the suite."""
    got: list = []

    def read():
        while len(got) < count:
            try:
                got.append(pipes.get(timeout=0.1))
            except queue.Empty:
                pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(HANG_QUICK_S)
    assert not reader.is_alive(), f"the runner's reads hung; got {[(k, w) for k, w, _ in got]}"
    return got


def test_a_worker_killed_mid_message_does_not_stop_the_others():
    ctx = tmp.get_context("fork")
    pipes = WorkerPipes(ctx)
    go = [ctx.Event(), ctx.Event()]
    procs = []
    for wid, size in enumerate([BIG, 100]):
        procs.append(ctx.Process(target=_send, args=(pipes.open(wid), wid, size, go[wid]), daemon=True))
        procs[-1].start()
        pipes.started(wid)
    try:
        go[0].set()
        # its first bytes are readable while the rest cannot fit: it is blocked mid-message
        wait_for(lambda: pipes.readers[0].poll(0), "worker 0's message begun", limit=HANG_QUICK_S)
        os.kill(procs[0].pid, signal.SIGKILL)
        procs[0].join()
        go[1].set()
        got = _read(pipes, 2)
        assert sorted((kind, wid) for kind, wid, _ in got) == [("chunk", 1), (GONE, 0)]
        assert [payload for kind, _, payload in got if kind == "chunk"] == [b"x" * 100]
    finally:
        for p in procs:
            p.kill()
            p.join()
        pipes.close()


def test_a_worker_that_ends_is_gone_after_its_last_message():
    ctx = tmp.get_context("fork")
    pipes = WorkerPipes(ctx)
    pipe = pipes.open(0)
    proc = ctx.Process(target=pipe.put, args=(("done", 0, "stats"),))
    proc.start()
    pipes.started(0)
    try:
        got = _read(pipes, 2)
        assert got == [("done", 0, "stats"), (GONE, 0, None)]
        proc.join()
        try:
            pipes.get(timeout=0)
            raise AssertionError("a message after the end")
        except queue.Empty:
            pass
    finally:
        pipes.close()
