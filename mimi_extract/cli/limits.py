"""An address-space limit (``ulimit -v``, RLIMIT_AS) too small for torch: one clear line, not a crash.

A CUDA build of torch maps its CUDA libraries at import whether or not a GPU is used: measured
with torch 2.9.1+cu128, the CLI's imports reach a peak of 4.66 GiB of address space, 3.79 GiB of
it CUDA libraries (the rest, 0.87 GiB, is what a CPU build maps).  Each compute thread then maps a
stack (RLIMIT_STACK, 8 MiB by default) and may get its own 64 MiB malloc arena.  Below that the
start-up fails in ways that say nothing about the cause: ``ImportError: libcublasLt.so.12: failed
to map segment``, ``MemoryError``, ``can't start new thread`` (reported as damaged weights), or
``libgomp: Thread creation failed: Resource temporarily unavailable``, which ends the process
from C.  So the commands that import torch check the limit first (:func:`check`, before the
import), and the failures above are recognised when they happen anyway (:func:`explain`).

Measured on this 2-core machine (tiny model, ``codes --cpu-workers 1``): 4,700,000 KiB: MemoryError;
4,800,000: the libgomp abort; 4,900,000: "can't start new thread"; 5,000,000: runs.

Standard library only: this runs before torch is imported.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import resource

EXIT_ADDRESS_SPACE = 5
NO_CHECK_ENV = "MIMI_EXTRACT_NO_LIMIT_CHECK"  # 1: skip the check (the failures are still explained)
GIB = 1 << 30
MIB = 1 << 20
BASE = {"cuda": 5 * GIB, "cpu": 5 * GIB // 4}  # imports (4.66 / 0.87 GiB measured) + the model and the work
PER_THREAD = 72 * MIB  # a thread's stack and malloc arena


def torch_build() -> str:
    """'cuda' when the installed torch carries CUDA libraries (found without importing torch)."""
    spec = importlib.util.find_spec("torch")
    for where in (spec.submodule_search_locations or []) if spec else []:
        if any(n.startswith("libtorch_cuda") for n in _listdir(os.path.join(where, "lib"))):
            return "cuda"
    return "cpu"


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def threads() -> int:
    """How many compute threads torch's OpenMP pool starts by default."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return os.cpu_count() or 1


def address_space_limit() -> int | None:
    """The soft RLIMIT_AS in bytes, None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def needed() -> int:
    return BASE[torch_build()] + PER_THREAD * threads()


def message(limit: int, need: int | None = None) -> str:
    build = torch_build()
    need = needed() if need is None else need
    return (f"the address-space limit (ulimit -v / RLIMIT_AS) is {limit / GIB:.2f} GiB ({limit // 1024} KiB), and "
            f"this {'CUDA' if build == 'cuda' else 'CPU'} build of torch needs about {need / GIB:.1f} GiB of "
            f"address space ({threads()} thread{'s' if threads() != 1 else ''}): raise it (`ulimit -v unlimited`, or at least "
            f"{-(-need // 1024)}), or limit memory with a cgroup instead (Slurm --mem, systemd-run -p MemoryMax=, "
            "docker --memory), which counts memory used, not address space mapped")


def check() -> str | None:
    """The message when RLIMIT_AS is below what a run needs, else None."""
    limit = address_space_limit()
    if limit is None or os.environ.get(NO_CHECK_ENV) == "1":
        return None
    need = needed()
    return message(limit, need) if limit < need else None


_SIGNS = ("failed to map segment", "cannot allocate memory", "can't start new thread", "thread creation failed",
          "cannot create thread")  # not EAGAIN as such: a lock held by another run says "temporarily unavailable" too


def explain(error: BaseException) -> str | None:
    """The limit's message when RLIMIT_AS is set and ``error`` (or what caused it) is the kind of
    failure a too-small address space gives, else None."""
    limit = address_space_limit()
    if limit is None:
        return None
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if (isinstance(error, MemoryError) or getattr(error, "errno", None) == errno.ENOMEM
                or any(s in str(error).lower() for s in _SIGNS)):
            return message(limit)
        error = error.__cause__ or error.__context__
    return None
