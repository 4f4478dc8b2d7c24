"""How the processes that run torch wait for work between parallel regions.

torch's CPU kernels run on GNU OpenMP (libgomp), whose idle threads by default spin on a core
before they sleep.  A device worker (or ``--cpu-workers 1``) runs torch with 2 or more intra-op
threads beside the decode pool's threads: while torch's threads spin, the decoders wait for a core.
Measured side by side on a busy 2-core host (scripts/bench_omp_wait.py, full-size encoder, one
decoding thread beside it, 2026-12-07): two spinning threads spent 924 ms of CPU per audio second
where one thread spent 180 (0.19x the efficiency), two passive ones 196 (0.89x), and the decoding
thread beside them got 214x real time against 270x.  libgomp reads ``OMP_WAIT_POLICY`` once,
when it is loaded (with torch), so the setting must be in the environment before torch is
imported: the console entry point sets it first, and a spawned worker before its imports (it also
inherits the parent's environment)."""

from __future__ import annotations

import os

WAIT_POLICY = "OMP_WAIT_POLICY"
PASSIVE = "PASSIVE"


def passive_openmp(environ=None) -> str:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` in ``environ`` (the process's environment by default) unless
    it is set already (a user's own choice, ``ACTIVE`` included, is kept); the policy in effect.
    Too late once torch is imported: libgomp has read its environment then."""
    environ = os.environ if environ is None else environ
    return environ.setdefault(WAIT_POLICY, PASSIVE)
