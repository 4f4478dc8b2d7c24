"""The text rules every kind applies to names from its input (keys, ids, paths, member names): what
cannot be a name in the outputs (:func:`text_problem`), a name made safe for an error row
(:func:`printable`), and values quoted in messages (:func:`shown_value`, :func:`non_utf8_shown`)."""

from __future__ import annotations

from ..config.input_options import is_utf8

MAX_NAME_BYTES = 4096  # a key, id or path (Linux's PATH_MAX)


def shown_value(value, limit: int = 60) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters (a 401-digit number, a 1 MB
    string), never raising (Python refuses str() of an int over 4,300 digits)."""
    try:
        text = repr(value)
    except ValueError:
        return f"<a number of {value.bit_length()} bits>" if isinstance(value, int) else f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def non_utf8_shown(name: str) -> str | None:
    """None if ``name`` is valid UTF-8, else a readable rendering of its bytes."""
    try:
        name.encode("utf-8")
        return None
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be a key or a name in the outputs (HDF5 names and attributes, JSON
    rows), or None: an embedded NUL, or a lone surrogate (not encodable as UTF-8)."""
    if "\x00" in text:
        return "contains a NUL character"
    if len(text) > MAX_NAME_BYTES // 4 and len(text.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"is longer than {MAX_NAME_BYTES} bytes"
    if not is_utf8(text):
        return "is not valid Unicode (a lone surrogate)"
    return None


def printable(text: str) -> str:
    """``text`` with NULs and lone surrogates escaped: safe as an error row's key."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
