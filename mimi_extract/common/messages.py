"""The one bound on what a message shows of its input: a line of a message, printed or stored in
an error row, holds at most :data:`MESSAGE_LIMIT` characters.

A message quotes what it refuses (a header name, a path, a value), and the input may be any size:
a CSV list refused for a 2 MB header name printed a 2,000,067-character line (issue 41).  The sites
that quote a value cut it themselves (``sources.text.shown_value``); this bound is the floor under
every message whatever a site forgot, applied where messages leave the program (the CLI's ``say``,
a manifest row's ``error``)."""

from __future__ import annotations

# far above any message the program writes about its own state (a path is at most 4,096 bytes on
# Linux), far below a line that floods a terminal or a log
MESSAGE_LIMIT = 4_000


def bounded(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` with every line over ``limit`` characters cut in its middle (its head and tail kept:
    a path's start, an error's end), saying how many characters were left out."""
    if len(text) <= limit:
        return text
    return "\n".join(_line(line, limit) for line in text.split("\n"))


def _line(line: str, limit: int) -> str:
    if len(line) <= limit:
        return line
    keep = max(limit - 40, 2)
    head, tail = line[: keep * 3 // 4], line[len(line) - keep // 4:]
    return f"{head} …[{len(line) - len(head) - len(tail)} characters left out]… {tail}"
