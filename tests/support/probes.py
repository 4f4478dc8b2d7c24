"""Functions a spawned worker runs by name (``_boot.worker_main``'s ``"module:function"``) to report
what it sees: importable in the child, as the tests' helper package is on the path it inherits."""

import os


def report_environment(settings, queue) -> None:
    """Put the OpenMP wait policy this process's torch starts with (this module's package imports
    torch: the worker set the policy before importing it, see ``_boot.worker_main``)."""
    queue.put({"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY")})
