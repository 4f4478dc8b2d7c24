"""Waiting in tests without depending on the machine's speed (issue 44).

A test waits for a *state* (a line printed, rows committed, a process gone), never for an amount
of time.  Every wait still has a limit, so that a real hang fails the test instead of stalling the
suite until CI's own limit ends it silently; but that limit is a hang guard, not a time budget:
:data:`HANG_S` is far above what the slowest wait takes on a busy machine (a fresh clone's suite ran
with load average 2-24 on 2 cores, about 10x its quiet times: the slowest wait, a Ray cluster or a
kill trial's start-up, takes ~10 s quiet, so ~100 s there), and it is the same for every wait, so
no test picks a number that a loaded machine could reach."""

from __future__ import annotations

import time

HANG_S = 1200.0  # seconds without the awaited state: a hang, not a slow machine (see the module docstring)
# the tests whose point is to catch a hang (tests/engines/test_hangs.py, the HDF5 flip loop): a failure
# there costs the whole limit, several times over, so it is lower, yet still 30x the slowest such wait
# on a quiet machine (~10 s) and 3x a busy machine's
HANG_QUICK_S = 300.0


def wait_for(predicate, what: str, poll: float = 0.01, limit: float = HANG_S):
    """Call ``predicate()`` until it returns something true, and return that; after ``limit``
    seconds without it, fail naming ``what`` was awaited."""
    deadline = time.monotonic() + limit
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {limit:.0f} s (a hang: the limit is far above a busy machine's time)")
        time.sleep(poll)


def read_until(stream, marker: str, what: str) -> list[str]:
    """Lines of a subprocess's ``stream`` up to and including the first that holds ``marker``
    (a blocking read: the subprocess's own output is the state awaited); fails if the stream ends first."""
    lines = []
    for line in iter(stream.readline, ""):
        lines.append(line)
        if marker in line:
            return lines
    raise AssertionError(f"{what}: the output ended without {marker!r}:\n" + "".join(lines)[-3000:])
