"""The run directory's lock (``flock``, released by the OS however the process ends), the holder it
names (written by :class:`RunLock`, read by :func:`live_holder` without taking the lock), and the
decision, under OUT's lock, between one whole run and the parts of a job array."""

from __future__ import annotations

import errno
import fcntl
import glob
import json
import os
import socket
import sys
import time
import weakref

from . import files as store_files  # (store_files.write_all: the one byte writer, as it is when called)
from .files import LOCK, RUN_INFO, LockedError, OutputError, ensure_dir, write_error


_HELD: "weakref.WeakSet[RunLock]" = weakref.WeakSet()  # the locks this process holds


def _let_go_in_child() -> None:
    """In a forked child (a CPU worker): close its copy of every held lock's file, leaving the lock
    to the parent.  ``flock`` belongs to the open file, which a fork shares, so a worker outliving a
    killed runner (it exits once it notices) held OUT for that while, and an immediate resume was
    refused, naming the dead runner (seen under load).  Closing a copy does not unlock: the parent's
    file still holds it."""
    for lock in list(_HELD):
        try:
            lock.file.close()
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_let_go_in_child)


class RunLock:
    """Exclusive lock on a run directory for the life of the process (``flock``: released by the
    OS however the process ends).  A second run fails at once, naming the holder.

    ``wait``: seconds to keep trying while another process holds it only briefly (a part run
    deciding the layout of OUT); ``refuse`` (a function of the holder's text) says when not to wait."""

    def __init__(self, run_dir: str, wait: float = 0.0, what: str = "run", refuse=None):
        self.path = os.path.join(run_dir, LOCK)
        try:
            self.file = open(self.path, "a+", encoding="utf-8")
        except OSError as e:
            raise _lock_error(e, self.path, "create") from e
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                self.file.seek(0)
                holder = self.file.read().strip()
                try:
                    h = json.loads(holder)
                except ValueError:
                    h = None
                if time.monotonic() < deadline and not (refuse and isinstance(h, dict) and refuse(h)):
                    time.sleep(0.02)
                    continue
                self.file.close()
                try:
                    who = f"pid {h['pid']} on {h['host']}, started {h['started']} ({h['command']})"
                except (KeyError, TypeError):
                    who = "another process"
                raise LockedError(f"{run_dir} is in use by {who}; wait for it to finish or use another OUT") from None
            except OSError as e:
                self.file.close()
                raise OutputError(f"cannot lock {self.path}: {e.strerror or e} (does this file system support "
                                  "locks? use a local OUT or one --part per machine)") from e
        _HELD.add(self)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "what": what,
                "started": time.strftime("%Y-%m-%d %H:%M:%S %z"), "command": " ".join(sys.argv)}
        try:  # unbuffered: a failed write leaves nothing pending that close() would try (and fail) again
            fd = self.file.fileno()
            os.ftruncate(fd, 0)
            store_files.write_all(fd, (json.dumps(info) + "\n").encode("utf-8"))
        except OSError as e:
            self.release()
            raise write_error(e, self.path) from e

    def release(self) -> None:
        _HELD.discard(self)
        if not self.file.closed:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()


# -- the holder, read without taking the lock (status: a run starting) --------------------------------
def live_holder(lock: str) -> str | None:
    """Who holds ``lock`` (its holder line: pid, host, start), if that process is alive; None if it is gone."""
    try:
        with open(lock, encoding="utf-8") as f:
            holder = json.loads(f.read() or "null")
    except (OSError, ValueError):
        holder = None
    if not isinstance(holder, dict) or not isinstance(holder.get("pid"), int):
        return "a process that is taking the lock"  # created, its holder line not written yet
    who = f"pid {holder['pid']} on {holder.get('host')}, started {holder.get('started')}"
    if holder.get("host") != socket.gethostname():
        return who + " (another host)"
    held = _flock_held(lock)
    if held is not None:
        return who if held else None
    try:  # no /proc/locks: is the holder alive?
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return who


# -- a lock's holder process, told apart from any other (the lock object of an OUT on object storage) --
def start_ticks(pid: int | str = "self") -> int:
    """When process ``pid`` started, in clock ticks since boot (/proc's ``stat`` field 22,
    ``starttime``; its name, field 2, may hold spaces and parentheses: fields are counted after the
    last ')').  OSError, ValueError or IndexError where it cannot be read."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def process_identity(pid: int | None = None) -> dict:
    """What tells process ``pid`` (default: this one) apart on this machine, for a lock's holder
    record: its host, the kernel's boot id and PID namespace (the same host name can be a container
    sharing it, with PIDs of its own), and its start time in clock ticks since boot (a PID reused by
    a later process starts later).  Fields that cannot be read (no /proc) are left out."""
    pid = os.getpid() if pid is None else pid
    found: dict = {"pid": pid, "host": socket.gethostname()}
    for key, read in (("boot", lambda: open("/proc/sys/kernel/random/boot_id").read().strip()),
                      ("pidns", lambda: os.readlink(f"/proc/{pid}/ns/pid")),
                      ("start", lambda: start_ticks(pid))):
        try:
            found[key] = read()
        except (OSError, ValueError, IndexError):
            pass
    return found


def holder_gone(holder: dict) -> bool:
    """Whether the process a holder record names (:func:`process_identity`, written when it took a
    lock) is certainly gone: it ran on this host, since this boot, in this PID namespace, and no
    process of its PID runs now, or the one that does started at another time.  False whenever that
    cannot be told (another host or container, a record without these fields): then only the lock's
    own expiry says the holder is gone."""
    if not isinstance(holder, dict) or not isinstance(holder.get("pid"), int) or isinstance(holder["pid"], bool):
        return False
    mine = process_identity()
    if any(holder.get(k) is None or holder.get(k) != mine.get(k) for k in ("host", "boot", "pidns")):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError, ValueError):
        return False
    now = process_identity(holder["pid"])  # alive: the same process, or a later one given its PID?
    return "start" in now and holder.get("start") is not None and now["start"] != holder["start"] \
        and now.get("pidns") == holder["pidns"]


def _flock_held(path: str) -> bool | None:
    """Whether some process of this machine holds a ``flock`` on ``path`` (Linux's /proc/locks lists
    them by device and inode; read-only, unlike a probing lock); None where that cannot be told."""
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            locks = f.read()
    except OSError:
        return None
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any(len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == inode
               for fields in (line.split() for line in locks.splitlines()))


def _lock_error(e: OSError, path: str, doing: str) -> OutputError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return write_error(e, path)
    return OutputError(f"cannot {doing} the lock file {path}: {e.strerror or e}")


def lock_run_dir(out_dir: str, part_dirname: str | None = None, part_count: int | None = None):
    """Decide OUT's layout and lock the run directory; returns (run_dir, lock).

    OUT holds either one whole run (its files in OUT itself) or the parts of one job array
    (``part-I-of-N`` folders), never both: their union would hold keys twice.  The decision is made
    under ``OUT/lock``, taken by both kinds of run before either writes anything:

    * a whole run takes ``OUT/lock`` exclusively and keeps it for its whole life, so it checks that
      no part folder exists, and nothing can create one until it ends;
    * a part run takes ``OUT/lock`` just long enough to check that no whole run holds or has used
      OUT (``run.json``) and that no part of another N exists, creates its part folder, lets
      ``OUT/lock`` go and takes its own folder's lock for its life.  Parts of one array starting
      together wait for each other (milliseconds each); a whole run holding OUT is refused at once.

    A whole run that was killed before writing ``run.json`` leaves nothing that claims the layout."""
    ensure_dir(out_dir)
    if part_dirname is None:
        lock = RunLock(out_dir, what="whole run")
        parts = [d for d in glob.glob(os.path.join(out_dir, "part-*-of-*")) if os.path.isdir(d)]
        if parts:
            lock.release()
            raise OutputError(f"{out_dir} holds parts of a job array ({os.path.basename(sorted(parts)[0])}, ...); "
                              "run with the same --part I/N, or use another OUT")
        return out_dir, lock
    layout = RunLock(out_dir, wait=30.0, what=f"layout check of {part_dirname}",
                     refuse=lambda h: h.get("what", "whole run") == "whole run")
    try:
        if os.path.exists(os.path.join(out_dir, RUN_INFO)):
            raise OutputError(f"{out_dir} holds a whole run (not split into parts); use another OUT for --part")
        parts = [d for d in glob.glob(os.path.join(out_dir, "part-*-of-*")) if os.path.isdir(d)]
        other = sorted({d.rsplit("-of-", 1)[1] for d in parts} - {str(part_count)})
        if other:
            raise OutputError(f"{out_dir} holds parts of N={other[0]}, not N={part_count}; use the same N or another OUT")
        run_dir = os.path.join(out_dir, part_dirname)
        ensure_dir(run_dir)
        lock = RunLock(run_dir, what=part_dirname)
    finally:
        layout.release()
    return run_dir, lock

