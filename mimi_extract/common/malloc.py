"""glibc's large blocks kept in a feeding process's heap instead of mapped and unmapped each time.

A process that feeds an encoder (:class:`~mimi_extract.engines.device.DeviceRunner`, wherever it
runs: the run's own process, a forked or spawned device worker, a Ray actor) allocates and frees the
same few large blocks over and over: each decoded block (65,536 samples), each chunk, each step's
buffers (tens of MB; on the CPU device also the step's 24 kHz samples and the resampling's
tensors).  glibc maps a block above its mmap threshold afresh and unmaps it when freed, and returns
the free top of a heap to the kernel above its trim threshold (its dynamic threshold rises with the
blocks freed, to 32 MiB at most, the trim threshold to twice that): the next block of that size is
fresh memory, each page faulted in by its first write, and each unmap costs the freeing thread.

So a feeding process keeps blocks up to :data:`MMAP_THRESHOLD` in its heaps, at most
:data:`TRIM_THRESHOLD` free at a heap's top, and asks the kernel for :data:`TOP_PAD` more than a
request (:func:`keep_large_blocks`, ``mallopt``).  The pad matters for the threads' arenas: glibc
deletes a thread's 64 MiB heap once it is all free unless the pad would be left.  Measured in the
feed benchmark (docs/performance.md, "Large blocks kept in the heap", 2026-12-07): page faults
11-32 % fewer, the encoder thread's host share 3-35 µs per audio second less (on the CPU device:
its own step tensors); without the pad, that half the time; the decode pool, the
feeder and the writer within the noise.  Memory stays bounded (peak RSS measured the same): what
is kept is what the process used at its peak and will use again (a heap keeps only its free
*top*; a thread's arena grows in heaps of 64 MiB at most); blocks above the mmap threshold (a
300 MB Parquet cell) are still mapped and unmapped as before.  The pad is address space, not
memory, until touched: 64 MiB more of it for the main heap under ``ulimit -v``
(``cli/limits.py`` counts 72 MiB a thread for the threads' own).  What is kept is kept for the
process's life: with a trim threshold above a thread heap's size, a thread's arena holds its peak
(a run's threads keep the same work, so their peak recurs); and a thread heap is committed whole,
which counts against a host's commit limit under strict overcommit (``vm.overcommit_memory=2``: not
measured here).

The mmap threshold is set first: every ``mallopt`` of these three turns glibc's dynamic threshold
off, so a trim or pad setting accepted and the threshold then refused would leave every block over
128 KiB mapped afresh, worse than glibc's default.  glibc up to 2.34 refuses a threshold above half
its largest thread heap (32 MiB); then 32 MiB is set, and if that too is refused nothing is changed.

A user's own choice is kept: with one of glibc's malloc tunables in the environment
(:data:`USER_ENV`, or ``GLIBC_TUNABLES`` naming ``glibc.malloc``) nothing is changed.  Elsewhere than glibc (musl,
macOS) nothing is changed either: :func:`keep_large_blocks` says why.  Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass

MIB = 1 << 20
MMAP_THRESHOLD = 64 * MIB  # blocks up to this size come from the heap (a step's buffer: up to ~60 MB of int16)
TRIM_THRESHOLD = 256 * MIB  # a heap's free top kept up to this much
TOP_PAD = 64 * MIB  # asked of the kernel beyond a request; a thread's free heap is kept
OLD_GLIBC_MMAP_MAX = 32 * MIB  # the largest threshold glibc <= 2.34 accepts (half its largest thread heap)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # malloc.h
USER_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
            "MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST")


@dataclass(frozen=True)
class MallocSetting:
    """What :func:`keep_large_blocks` did in this process: ``applied`` or not, and ``reason``: the
    settings made (and any glibc refused), or why none was."""

    applied: bool
    reason: str


_lock = threading.Lock()
_done: MallocSetting | None = None


def users_own(environ=None) -> str | None:
    """The environment variable by which the user chose glibc's malloc settings, if any."""
    environ = os.environ if environ is None else environ
    for name in USER_ENV:
        if name in environ:
            return name
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    return None


def _glibc():
    """The C library when it is glibc (it has ``gnu_get_libc_version`` and ``mallopt``), else None."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None


def keep_large_blocks() -> MallocSetting:
    """Keep large blocks in this process's heaps (see the module docstring), once per process
    (later calls return the first's outcome; a forked child inherits the setting with its memory)."""
    global _done
    with _lock:
        if _done is None:
            _done = apply_to()
        return _done


def apply_to(libc=None) -> MallocSetting:
    """The settings, through ``libc`` (glibc's, found when not given); what was done, or why not."""
    own = users_own()
    if own is not None:
        return MallocSetting(False, f"{own} is set: the user's malloc settings are kept")
    libc = libc or _glibc()
    if libc is None:
        return MallocSetting(False, "not glibc: its allocator is left as it is")
    # the threshold first (see the module docstring): refused twice, nothing has changed
    threshold = next((t for t in (MMAP_THRESHOLD, OLD_GLIBC_MMAP_MAX) if libc.mallopt(M_MMAP_THRESHOLD, t)), None)
    if threshold is None:
        return MallocSetting(False, "glibc refused the mmap threshold: its allocator is left as it is")
    refused = [name for name, param, value in (("trim threshold", M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                                               ("top pad", M_TOP_PAD, TOP_PAD)) if not libc.mallopt(param, value)]
    return MallocSetting(True, f"blocks up to {threshold // MIB} MiB from the heap, up to "
                               f"{TRIM_THRESHOLD // MIB} MiB of a heap's free top kept, {TOP_PAD // MIB} MiB pad"
                               + (f" (glibc refused the {' and the '.join(refused)})" if refused else ""))
