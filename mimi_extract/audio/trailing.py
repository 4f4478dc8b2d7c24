"""Where an MPEG audio file's frames end: before the tags appended to it (APEv2, an ID3v2.4 tag with
its footer, ID3v1 after either).

FFmpeg's MP3 demuxer skips an ID3v1 tag at the end, but reads an APEv2 tag's binary item (cover
art, as foobar2000 writes it) or an appended ID3v2.4 tag as MPEG data: its bytes hold false frame
headers, and each such "frame" either decodes to noise or is refused (issue 41: +2,304 samples for
a 3 KB cover; +1.58 s on a 3.7 s file for a 300 KB appended picture).  libmpg123 and FFmpeg's
command line give the true length.  The decoder is handed only the bytes before these tags
(:func:`audio_end`), so the stream ends where the audio does.

The tags are found by their footers at the very end, as their specifications place them (APEv2:
``APETAGEX`` in the last 32 bytes, or the 32 before an ID3v1 tag; ID3v2.4: ``3DI`` in the last 10),
and a footer is believed only when what it names is there: an APEv2 tag's items fill its size
exactly (and its header is where the footer says, when it has one); an ID3v2 tag's header (``ID3``,
the same version, flags and size).  This is a parser we own (mutagen reads APEv2 tags
but no appended ID3v2 tag, and says nothing of where the audio ends): tests/audio/test_trailing_tags.py
holds it to mutagen's tags and to FFmpeg's decode of the audio alone, property-tested."""

from __future__ import annotations

ID3V1_SIZE = 128
APE_FOOTER_SIZE = 32
ID3V2_FOOTER_SIZE = 10


def audio_end(read_at, size: int) -> int:
    """The offset where the trailing APEv2 and ID3v2 tags begin (with any ID3v1 tag between or after
    them), or ``size`` when the file ends with neither (an ID3v1 tag alone stays: FFmpeg skips it).
    ``read_at(offset, n)``: ``n`` bytes of the file from ``offset``."""
    end = size
    while True:
        tag = _tag_before(read_at, end)
        if tag is None and end >= ID3V1_SIZE and read_at(end - ID3V1_SIZE, 3) == b"TAG":
            tag = _tag_before(read_at, end - ID3V1_SIZE)
        if tag is None:
            return end
        end = tag


def _tag_before(read_at, end: int) -> int | None:
    """Where an APEv2 or ID3v2.4 tag ending at ``end`` begins, or None."""
    if end >= APE_FOOTER_SIZE:
        footer = read_at(end - APE_FOOTER_SIZE, APE_FOOTER_SIZE)
        if footer[:8] == b"APETAGEX":
            version = int.from_bytes(footer[8:12], "little")
            length = int.from_bytes(footer[12:16], "little")  # the items and this footer
            count = int.from_bytes(footer[16:20], "little")
            flags = int.from_bytes(footer[20:24], "little")
            header = APE_FOOTER_SIZE if flags & 0x80000000 else 0
            start = end - length - header
            if (version in (1000, 2000) and APE_FOOTER_SIZE <= length and start >= 0
                    and (not header or read_at(start, 8) == b"APETAGEX")
                    and _ape_items_fill(read_at(start + header, length - APE_FOOTER_SIZE), count)):
                return start
    if end >= ID3V2_FOOTER_SIZE:
        footer = read_at(end - ID3V2_FOOTER_SIZE, ID3V2_FOOTER_SIZE)
        if footer[:3] == b"3DI" and footer[3] == 4 and all(b < 0x80 for b in footer[6:10]):
            body = sum(b << (7 * (3 - i)) for i, b in enumerate(footer[6:10]))  # syncsafe: 7 bits a byte
            total = body + 2 * ID3V2_FOOTER_SIZE
            if total <= end and read_at(end - total, ID3V2_FOOTER_SIZE) == b"ID3" + footer[3:]:
                return end - total
    return None


def _ape_items_fill(items: bytes, count: int) -> bool:
    """Whether ``count`` APEv2 items (value size, flags, a NUL-terminated ASCII key, the value) fill
    ``items`` exactly: a footer whose size or count was damaged, or bytes that only look like a
    footer, never cut the audio before them."""
    at = 0
    for _ in range(count):
        if at + 8 > len(items):
            return False
        size = int.from_bytes(items[at:at + 4], "little")
        nul = items.find(b"\x00", at + 8, at + 8 + 256)
        if nul < at + 10 or not all(0x20 <= b < 0x7F for b in items[at + 8:nul]):  # (keys: 2-255 ASCII)
            return False
        at = nul + 1 + size
    return at == len(items)


class Window:
    """The first ``end`` bytes of a seekable binary file object, as a file object (``read``,
    ``seek``, ``tell``): what FFmpeg reads of a member with trailing tags (a path is cut by FFmpeg's
    own ``subfile`` protocol instead)."""

    def __init__(self, raw, end: int):
        self.raw, self.end, self.pos = raw, end, 0
        self.name = getattr(raw, "name", "")

    def read(self, n: int = -1) -> bytes:
        n = self.end - self.pos if n is None or n < 0 else min(n, self.end - self.pos)
        if n <= 0:
            return b""
        self.raw.seek(self.pos)
        data = self.raw.read(n)
        self.pos += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self.pos, self.end)[whence]
        self.pos = max(0, min(self.end, base + offset))
        return self.pos

    def tell(self) -> int:
        return self.pos

    def seekable(self) -> bool:
        return True
