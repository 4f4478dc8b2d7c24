"""The private local Ray cluster goes with the driver, however the driver dies.

``ray.init(address="local")`` starts the GCS server and a raylet as the driver's children, and the
raylet starts the dashboard agent, the runtime-env agent and the workers.  When the driver is
killed (kill -9, the OOM killer) Ray 2.60 takes the GCS, the raylet and the workers down with it,
but its two agents stay alive for good (measured: still there after 60 s).  So a driver that
starts a private cluster first starts this reaper: a tiny process (standard library only, its own
session, so that a Ctrl-C or a hang-up meant for the driver's terminal does not reach it) that

* every ``POLL`` seconds records the driver's Ray children (a command line naming ray) and all
  their descendants (pid and start time, from ``/proc``);
* waits on a pipe whose only write end the driver holds: end of file means the driver is gone
  (or closed the cluster and let go of the pipe);
* then kills every recorded process that is still the same process (same start time: a reused pid
  is left alone), with whatever each of them started meanwhile.

Linux only (``/proc``); elsewhere it records nothing and kills nothing.

Run as a script by path (``python _reaper.py DRIVER_PID``) so that it imports nothing of the package.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

POLL = 0.5


def _processes() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, start time in clock ticks)} of every process, from /proc."""
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # the name may hold spaces and parentheses
        if fields and fields[0] != b"Z":  # a zombie is already dead
            table[int(name)] = (int(fields[1]), int(fields[19]))
    return table


def _descendants(roots: set[int], table: dict[int, tuple[int, int]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _is_ray(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            line = f.read()
    except OSError:
        return False
    return b"/ray/" in line or line.startswith(b"ray::")  # .../site-packages/ray/...: gcs_server, raylet, scripts


def reap(driver: int, pipe: int, poll: float = POLL) -> int:
    """Record the Ray processes the driver started, and all they start, until ``pipe`` reads end
    of file (or the driver's pid is gone); then kill those still running.  Returns how many."""
    me = os.getpid()
    recorded: dict[int, int] = {}  # pid -> start time
    while True:
        table = _processes()
        for pid, (parent, start) in table.items():  # looked at again each time: a child between fork and exec
            if parent == driver and pid != me and pid not in recorded and _is_ray(pid):  # still runs our code
                recorded[pid] = start
        roots = {pid for pid, start in recorded.items() if table.get(pid, (0, None))[1] == start}
        for pid in _descendants(roots, table):
            recorded.setdefault(pid, table[pid][1])
        if driver not in table:
            break
        ready, _, _ = select.select([pipe], [], [], poll)
        if ready and not os.read(pipe, 4096):
            break
    table = _processes()
    alive = {pid for pid, start in recorded.items() if pid in table and table[pid][1] == start}
    doomed = alive | _descendants(alive, table)  # with what they started since the last look
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(doomed)


def start(driver: int | None = None) -> subprocess.Popen | None:
    """Start a reaper for ``driver`` (this process by default); close its ``stdin`` (or die) to
    set it off.  None where there is no /proc to watch."""
    if not os.path.isdir("/proc/self"):
        return None
    return subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), str(driver or os.getpid())],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)


def stop(reaper: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """The cluster was shut down: let the reaper sweep what is left of it, and wait for it."""
    if reaper is None:
        return
    try:
        reaper.stdin.close()
        reaper.wait(timeout)
    except (OSError, subprocess.TimeoutExpired):
        pass


if __name__ == "__main__":
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    reap(int(sys.argv[1]), sys.stdin.fileno())
