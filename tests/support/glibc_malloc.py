"""glibc's malloc read back from glibc itself (``mallinfo2``), for the tests of
``mimi_extract.common.malloc``: standard library only, so that a fresh interpreter can load it by
its file's directory before anything else (``sys.path``), without the ``support`` package (which
imports torch)."""

import ctypes

SIZE = 48 << 20  # above glibc's default mmap threshold (32 MiB at most), below the tool's


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def large_block() -> dict:
    """A ``SIZE`` block malloc'ed, touched and freed: whether glibc mapped it (mallinfo2's count of
    mapped blocks rose) and whether the heaps still hold its memory once freed (their free bytes)."""
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    mapped = libc.mallinfo2().hblks
    p = libc.malloc(SIZE)
    ctypes.memset(p, 1, SIZE)
    mapped = libc.mallinfo2().hblks > mapped
    libc.free(ctypes.c_void_p(p))
    return {"mapped": mapped, "kept_free": libc.mallinfo2().fordblks >= SIZE}
