"""What every benchmark reports beside its figures, so that figures from different hosts can be
compared: the CPU (model, logical cores, its widest vector ISA: AMX, AVX-512, AVX2), the load it
ran under, the OpenMP wait policy, and the script's own wall and CPU time (this process and its
children).  One helper for all ``scripts/bench_*.py``: they print :func:`header` first and
:func:`footer` last, and put :func:`report` in their JSON under ``"host"``.

A CPU figure measured on an AVX2 core and one from an AVX-512/AMX core differ by up to several
times for the same code (torch's convolutions, libsndfile's float conversion), and wall time on a
shared host says little without its load: the ratios in docs/performance.md are measured side by
side in one run for that reason, and these facts say which host a run's absolute numbers belong to.
"""

from __future__ import annotations

import os
import platform
import sys
import time

# widest first: what a CPU's flags (Linux's /proc/cpuinfo) say it can run
_ISA_LEVELS = (("AMX", ("amx_tile",)), ("AVX-512", ("avx512f",)), ("AVX2", ("avx2",)), ("AVX", ("avx",)),
               ("SSE4.2", ("sse4_2",)))
_KEPT_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
               "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")


def isa_from_flags(flags: set[str]) -> str:
    """The widest vector ISA named in ``flags`` (a CPU's /proc/cpuinfo flags), or "unknown"."""
    for name, needed in _ISA_LEVELS:
        if all(f in flags for f in needed):
            return name
    return "unknown"


def _cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str, set[str]]:
    """(model name, flags) of the first CPU listed; ("", empty) where there is no /proc/cpuinfo."""
    model, flags = "", set()
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    return model, flags


def cpu_facts() -> dict:
    """The host's CPU: model, logical cores (and those this process may use), widest ISA by its
    flags, and torch's own choice of kernels where torch is already imported (importing it here
    would cost a script that does not use it seconds)."""
    model, flags = _cpuinfo()
    facts = {"cpu_model": model or platform.processor() or platform.machine(),
             "logical_cpus": os.cpu_count(),
             "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
             "isa": isa_from_flags(flags), "isa_flags": sorted(flags.intersection(_KEPT_FLAGS))}
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            facts["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        except AttributeError:  # torch older than 2.1
            pass
        facts["torch"] = torch.__version__
        facts["torch_threads"] = torch.get_num_threads()
    facts["omp_wait_policy"] = os.environ.get("OMP_WAIT_POLICY", "(not set)")
    return facts


class Clock:
    """Wall time and CPU time (this process's threads, and its waited-for children) since it was made."""

    def __init__(self):
        self.wall, self.cpu, self.children = time.perf_counter(), time.process_time(), self._children()

    @staticmethod
    def _children() -> float:
        t = os.times()
        return t.children_user + t.children_system

    def elapsed(self) -> dict:
        wall = time.perf_counter() - self.wall
        cpu = time.process_time() - self.cpu
        children = self._children() - self.children
        return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "children_cpu_s": round(children, 3),
                "cpu_over_wall": round((cpu + children) / wall, 3) if wall > 0 else None}


_started = Clock()  # from this module's import: the script's start, near enough


def report() -> dict:
    """The facts a benchmark's JSON carries under "host": the CPU, the load average at the end, and
    the script's wall and CPU time so far."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {**cpu_facts(), "load_average_1_5_15": [round(x, 2) for x in load] if load else None,
            "script": _started.elapsed()}


def header() -> str:
    """One line printed first: which host the figures below belong to."""
    f = cpu_facts()
    load = os.getloadavg() if hasattr(os, "getloadavg") else ()
    torch = f" torch {f['torch']} ({f.get('torch_cpu_capability', '?')} kernels, {f['torch_threads']} threads)," \
        if "torch" in f else ""
    return (f"# host: {f['cpu_model']}, {f['usable_cpus']} of {f['logical_cpus']} logical CPUs, {f['isa']} "
            f"({' '.join(f['isa_flags']) or 'no vector flags read'}),{torch} OMP_WAIT_POLICY={f['omp_wait_policy']}, "
            f"load {' '.join(f'{x:.1f}' for x in load)}")


def footer() -> str:
    """One line printed last: the script's wall time beside its CPU time (a ratio far below the
    cores it used means it waited: on I/O, or on a loaded machine)."""
    e = _started.elapsed()
    return (f"# script: wall {e['wall_s']:.1f} s, CPU {e['cpu_s']:.1f} s (children {e['children_cpu_s']:.1f} s), "
            f"CPU/wall {e['cpu_over_wall']}")
