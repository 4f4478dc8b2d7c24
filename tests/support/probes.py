"""Functions a spawned worker runs by name (``_boot.worker_main``'s ``"module:function"``) to report
what it sees: importable in the child, as the tests' helper package is on the path it inherits."""

import os


def report_environment(settings, queue) -> None:
    """Put the OpenMP wait policy this process's torch starts with (this module's package imports
    torch: the worker set the policy before importing it, see ``_boot.worker_main``)."""
    queue.put({"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY")})


def report_malloc(settings, queue) -> None:
    """Build a device runner (the tiny model of ``settings``, on the CPU) as a device worker does,
    then put whether glibc maps a 48 MiB block afresh (``mallinfo2``'s count of mapped blocks rises)
    and what the runner's malloc setting says."""
    from mimi_extract.engines.device import DeviceRunner
    from support.glibc_malloc import large_block

    def mapped() -> bool:
        return large_block()["mapped"]

    seen = {"before": mapped()}
    runner = DeviceRunner(settings, "cpu")
    queue.put({**seen, "after": mapped(), "applied": runner.malloc.applied})
