"""First code a spawned device worker runs: tie its life to the parent *before* the seconds of
torch imports, so a parent killed during start-up cannot leave a worker behind.  Imports nothing
heavy: the ``Settings`` it is handed are torch-free to unpickle."""

import ctypes
import os
import signal
import threading
import time


def die_with_parent(parent: int) -> None:
    """Exit when the parent (pid ``parent``, passed in: by the time a spawned child runs, the
    parent may already be gone) dies, however it dies: Linux's PR_SET_PDEATHSIG, and as a backstop
    a thread that watches the parent pid."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)

    def watch():
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def ignore_stop_signals() -> None:
    """The parent decides what an interrupt means (Ctrl-C, and Slurm's or systemd's SIGTERM reach
    the whole process group): it commits what was encoded, then stops us; dying with it is
    PDEATHSIG's job."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def worker_main(parent: int, settings, main: str, *args) -> None:
    """Tie this process to ``parent``, then run ``main`` (``"module:function"``, named rather than
    imported here: this module imports nothing heavy of the package) with the settings and ``args``.
    OpenMP's wait policy is set before those imports (a parent that is not the console entry
    point, e.g. a library caller, may not have set it: see :mod:`.common.threads`)."""
    from .common.threads import passive_openmp

    passive_openmp()
    die_with_parent(parent)
    ignore_stop_signals()
    import importlib

    module, name = main.split(":")
    getattr(importlib.import_module(module), name)(settings, *args)
