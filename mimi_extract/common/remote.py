"""Object storage (``s3://``, ``gs://``, ``hf://``... any fsspec URL) behind the few file calls the
sources and the output store make: is it a file, a folder, what does it hold, how big is it, open
it, read a range of it, expand a pattern, and what identifies its current version.

A local path takes the ``os`` call it always took (same results, same errors), so only a URL pays
for fsspec, which is imported the first time a URL is met (``pip install 'mimi-extract[s3]'`` for
``s3://``; other protocols need their own fsspec implementation: gcsfs, huggingface_hub...).
Paths stay strings everywhere (items are pickled to workers, recorded in run.json and the
manifest): a URL is kept whole, protocol included, and each process opens it through its own
cached fsspec filesystem.  See docs/object-storage.md for the design.
"""

from __future__ import annotations

import asyncio
import glob as _glob
import gzip
import io
import os
import posixpath
import re
import threading
from collections import OrderedDict

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# an object's shared handle (:func:`read_range`) caches the last READ_BLOCKS blocks of READ_BLOCK
# bytes it read (an LRU, block-aligned): the members or row groups a process reads near each other
# -- in order, or out of order by planning's 16 probing threads -- come from one ranged GET per
# block, not one per item (a GET costs a round trip: tens of ms on a cloud store); never s3fs's
# 50 MiB default.  At most 8 x 4 MiB per object, _HANDLES_KEPT objects per process.
READ_BLOCK = 4 << 20
READ_BLOCKS = 8


def is_url(path: str) -> bool:
    """Whether ``path`` names an object store (any ``proto://`` but ``file://``)."""
    return isinstance(path, str) and bool(_URL.match(path)) and not path.startswith("file://")


def filesystem(path: str):
    """(fsspec filesystem, path without protocol) of a URL; one clear error when fsspec is missing."""
    try:
        import fsspec
    except ImportError:
        raise ValueError(f"{path}: object storage needs fsspec and its protocol's package "
                         "(s3://: pip install 'mimi-extract[s3]')") from None
    try:
        return fsspec.core.url_to_fs(path)
    except (ImportError, ValueError) as e:
        raise ValueError(f"{path}: cannot open this URL ({e})") from None


def _url(fs, stripped: str) -> str:
    return fs.unstrip_protocol(stripped)


def absolute(path: str) -> str:
    """What run.json and the manifest record: a URL as given (no trailing '/'), else the absolute path."""
    return path.rstrip("/") if is_url(path) else os.path.abspath(path)


def real(path: str) -> str:
    """The input root run.json records: a URL as given, else the real path (links resolved)."""
    return path.rstrip("/") if is_url(path) else os.path.realpath(path)


def join(folder: str, *names: str) -> str:
    return posixpath.join(folder, *names) if is_url(folder) else os.path.join(folder, *names)


def basename(path: str) -> str:
    return posixpath.basename(path.rstrip("/")) if is_url(path) else os.path.basename(path)


def dirname(path: str) -> str:
    return posixpath.dirname(path.rstrip("/")) if is_url(path) else os.path.dirname(path)


def relpath(path: str, folder: str) -> str:
    """``path`` relative to ``folder``, '/'-separated (a key's shard name)."""
    if is_url(path):  # (posixpath folds the URL's '//' alike in both)
        return posixpath.relpath(path.rstrip("/"), folder.rstrip("/"))
    return os.path.relpath(path, folder).replace(os.sep, "/")


def isfile(path: str) -> bool:
    if not is_url(path):
        return os.path.isfile(path)
    fs, p = filesystem(path)
    return fs.isfile(p)


def isdir(path: str) -> bool:
    if not is_url(path):
        return os.path.isdir(path)
    fs, p = filesystem(path)
    return fs.isdir(p)


def exists(path: str) -> bool:
    if not is_url(path):
        return os.path.exists(path)
    fs, p = filesystem(path)
    return fs.exists(p)


def listdir(path: str) -> list[str]:
    """The names in a folder (a prefix, on an object store), as ``os.listdir`` gives them."""
    if not is_url(path):
        return os.listdir(path)
    fs, p = filesystem(path)
    return [posixpath.basename(n.rstrip("/")) for n in fs.ls(p, detail=False) if n.rstrip("/") != p.rstrip("/")]


def walk_files(path: str) -> list[str]:
    """Every file under a folder (recursive, sorted by path): ``os.walk``'s order for a local one."""
    if not is_url(path):
        found = []
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames.sort()
            found += [os.path.join(dirpath, f) for f in sorted(filenames)]
        return found
    fs, p = filesystem(path)
    return [_url(fs, f) for f in sorted(fs.find(p))]


def listing(folder: str) -> dict[str, int]:
    """Every file under ``folder`` (recursively): its '/'-separated name relative to ``folder`` ->
    its size.  A URL is listed afresh (LIST requests of up to 1,000 objects each, whatever the
    filesystem cached before): what a reader of an OUT that a run may be writing must see."""
    if not is_url(folder):
        found = {}
        for path in walk_files(folder):
            found[os.path.relpath(path, folder).replace(os.sep, "/")] = os.path.getsize(path)
        return found
    fs, p = filesystem(folder)
    p = p.rstrip("/")
    fs.invalidate_cache(p)
    try:
        infos = fs.find(p, detail=True)
    except FileNotFoundError:
        return {}
    return {posixpath.relpath(name, p): int(info.get("size") or 0) for name, info in infos.items()
            if info.get("type") != "directory" and name.rstrip("/") != p}


def names(folder: str) -> list[str]:
    """The names directly in a folder (files and sub-folders; a URL listed afresh, one LIST); [] if
    there is no such folder."""
    if not is_url(folder):
        return sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    fs, p = filesystem(folder)
    p = p.rstrip("/")
    fs.invalidate_cache(p)
    try:
        return sorted({posixpath.basename(n.rstrip("/")) for n in fs.ls(p, detail=False) if n.rstrip("/") != p})
    except FileNotFoundError:
        return []


def read_bytes(path: str) -> bytes:
    """A whole (small) file: run.json, a manifest segment.  FileNotFoundError if there is none."""
    if not is_url(path):
        with open(path, "rb") as f:
            return f.read()
    fs, p = filesystem(path)
    return fs.cat_file(p)


READ_MANY = 32  # GETs in flight at once when many small objects are read (run.json and segments of each part)


def read_many(paths: list[str]) -> list[bytes]:
    """The contents of ``paths`` (small files), in order: on object storage up to
    :data:`READ_MANY` GETs at a time (one round trip for a batch, not one per object)."""
    if not paths or not is_url(paths[0]):
        return [read_bytes(p) for p in paths]
    fs, _ = filesystem(paths[0])
    stripped = [filesystem(p)[1] for p in paths]
    if not getattr(fs, "async_impl", False):
        return [fs.cat_file(p) for p in stripped]
    from fsspec.asyn import sync

    async def gather():
        limit = asyncio.Semaphore(READ_MANY)

        async def one(p):
            async with limit:
                return await fs._cat_file(p)

        return await asyncio.gather(*(one(p) for p in stripped))

    return sync(fs.loop, gather)


def open_object(path: str, size: int | None = None):
    """A fresh, seekable binary reader of one file, closed by its caller: the local file, or an
    fsspec file with its own read-ahead (``READ_BLOCKS`` blocks of ``READ_BLOCK`` bytes, ranged
    GETs: never the object whole).  Unlike :func:`open_input` it shares no handle or cached
    version with the rest of the process, so what it reads is the object as it is now (an output
    a run rewrites, or a test damages).  ``size``: the object's size when known (no HEAD)."""
    if not is_url(path):
        return open(path, "rb")
    fs, p = filesystem(path)
    return fs.open(p, "rb", block_size=READ_BLOCK, cache_type="blockcache", cache_options={"maxblocks": READ_BLOCKS},
                   **({"size": size} if size is not None else {}))


def pread(handle, offset: int, size: int) -> bytes:
    """``size`` bytes from ``offset`` of a handle :func:`open_object` gave: ``os.pread`` on a local
    file (no shared file position), a seek and a read on an object's."""
    if isinstance(handle, (io.FileIO, io.BufferedReader)):
        return os.pread(handle.fileno(), size, offset)
    handle.seek(offset)
    return handle.read(size)


def glob(pattern: str) -> list[str]:
    """A glob pattern's matches, sorted (braces are expanded before: fsspec's glob knows none)."""
    if not is_url(pattern):
        return sorted(_glob.glob(pattern))
    fs, p = filesystem(pattern)
    return sorted(_url(fs, f) for f in fs.glob(p))


def escape(path: str) -> str:
    """``path`` as a literal in a glob pattern."""
    return _glob.escape(path)


def getsize(path: str) -> int:
    if not is_url(path):
        return os.path.getsize(path)
    return int(_info(path)["size"])


# what identifies an object's version, by protocol: the first of these its info has (S3's ETag,
# GCS's md5/generation, the Hub's blob id...); the modification time when none does
_VERSION_FIELDS = ("ETag", "etag", "md5Hash", "generation", "blob_id", "sha256", "LastModified", "last_modified",
                   "mtime", "updated", "modified", "created")
_INFO: dict[str, dict] = {}
_INFO_LOCK = threading.Lock()


def _info(path: str, fresh: bool = False) -> dict:
    """An object's info (size, ETag...), asked once per process unless ``fresh``: what a worker
    reads items by is the version that planning recorded (a resume compares it again)."""
    with _INFO_LOCK:
        if not fresh and path in _INFO:
            return _INFO[path]
    fs, p = filesystem(path)
    try:
        info = fs.info(p)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist") from None
    with _INFO_LOCK:
        _INFO[path] = info
    return info


def forget() -> None:
    """Drop this process's object infos and handles: a new run (its discovery) sees the objects
    as they are now, not as an earlier run of the same process saw them."""
    with _INFO_LOCK:
        _INFO.clear()
    with _HANDLES_LOCK:
        while _HANDLES:
            _HANDLES.popitem()[1].close()


def _version(info: dict) -> str:
    value = next((info[f] for f in _VERSION_FIELDS if info.get(f) not in (None, "")), "")
    return str(value).strip('"')


def identity(path: str) -> list:
    """[path, size, version] of one input file, what run.json records so that a resume over a
    rewritten file is refused: a local file's modification time (ns), an object's ETag (or its
    protocol's equivalent: :data:`_VERSION_FIELDS`), which changes whenever the object is rewritten."""
    if not is_url(path):
        st = os.stat(path)
        return [os.path.abspath(path), st.st_size, st.st_mtime_ns]
    info = _info(path, fresh=True)
    return [absolute(path), int(info["size"]), _version(info)]


def version(path: str) -> tuple:
    """What a cache of a file's contents is keyed by (size and version): a rewritten file is read again."""
    if not is_url(path):
        st = os.stat(path)
        return st.st_size, st.st_mtime_ns
    info = _info(path)
    return int(info["size"]), _version(info)


def open_input(path: str):
    """A seekable binary file: the local file, or an :class:`ObjectFile` (ranged GETs: nothing is
    downloaded whole, nothing unpacked to disk)."""
    return open(path, "rb") if not is_url(path) else ObjectFile(path)


class ObjectFile(io.RawIOBase):
    """A read-only, seekable view of an object, read through :func:`read_range` (this process's
    one read-ahead handle on it): its size is the process's :func:`_info`, so opening one costs
    no request."""

    def __init__(self, path: str):
        super().__init__()
        self.path, self.pos, self.size = path, 0, getsize(path)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = read_range(self.path, self.pos, len(buffer))
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = max(0, {0: 0, 1: self.pos, 2: self.size}[whence] + pos)
        return self.pos

    def tell(self) -> int:
        return self.pos


_HANDLES: OrderedDict = OrderedDict()  # (pid, URL) -> an fsspec file with a read-ahead cache
_HANDLES_LOCK = threading.Lock()
_HANDLES_KEPT = 4


def _handle(path: str):
    """This process's read-ahead handle on an object (under ``_HANDLES_LOCK``; the few last used
    are kept; keyed by pid too: a forked worker opens its own)."""
    key = (os.getpid(), path)
    f = _HANDLES.pop(key, None)
    if f is None:
        fs, p = filesystem(path)
        f = fs.open(p, "rb", block_size=READ_BLOCK, cache_type="blockcache", cache_options={"maxblocks": READ_BLOCKS},
                    size=getsize(path))
    _HANDLES[key] = f
    while len(_HANDLES) > _HANDLES_KEPT:
        _HANDLES.popitem(last=False)[1].close()
    return f


def open_text(path: str):
    """A text reader of a (possibly gzipped, by its ``.gz`` name) UTF-8 file: a lhotse manifest."""
    if not is_url(path):
        opener = gzip.open if path.endswith(".gz") else open
        return opener(path, "rt", encoding="utf-8", errors="surrogateescape")
    raw = open_input(path)
    binary = gzip.GzipFile(fileobj=raw) if path.endswith(".gz") else raw
    return io.TextIOWrapper(binary, encoding="utf-8", errors="surrogateescape")


def read_range(path: str, offset: int, size: int) -> bytes:
    """``size`` bytes from ``offset`` (fewer where the file ends first): one ``pread``, or one ranged GET."""
    if not is_url(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.pread(fd, size, offset)
        finally:
            os.close(fd)
    if size <= 0 or offset >= getsize(path):
        return b""
    with _HANDLES_LOCK:  # (threads of one process take turns on the handle: most reads are read-ahead hits)
        f = _handle(path)
        f.seek(offset)
        return f.read(size)
