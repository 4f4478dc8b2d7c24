"""The trailing-tag finder the tool owns (audio/trailing.py ``audio_end``: where an MP3's frames end
before the APEv2 / ID3v2.4 tags appended to it), against tags written by mutagen (APEv2: text and
binary items, with its header; mutagen moves an ID3v1 tag behind it) and ID3v2.4 tags with their
footer (read back by mutagen), stacked in any order after a real MP3 stream, with or without an
ID3v1 tag between or after them; then damaged (a byte flipped anywhere in the tags, garbage
appended).  The rules: intact, it finds exactly the stream's end (an ID3v1 tag alone is left to
FFmpeg, which skips it); whatever the bytes, it never raises and never cuts into the stream nor past
the file's end, so at worst a damaged tag is read as FFmpeg read it before."""

from __future__ import annotations

import functools
import io
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from support.shapes import check_id3, id3v1, id3v2, lame
from mimi_extract.audio.trailing import Window, audio_end

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@functools.cache
def stream(which: int) -> bytes:
    return lame(*((44_100, 2, "vbr"), (16_000, 1, "cbr"))[which], 0.6, seed=which)


def ape(folder: Path, items: list[tuple[str, bytes | str]]) -> bytes:
    """An APEv2 tag as mutagen writes it at the end of a file (header, items, footer)."""
    from mutagen.apev2 import BINARY, APEv2, APEValue

    path = folder / "t.mp3"
    path.write_bytes(stream(1))
    tag = APEv2()
    for key, value in items:
        tag[key] = APEValue(value, BINARY) if isinstance(value, bytes) else value
    tag.save(str(path))
    data = path.read_bytes()
    assert data.startswith(stream(1))
    return data[len(stream(1)):]


def id3_appended(folder: Path, picture: int, title: str) -> bytes:
    """An ID3v2.4 tag with its footer (what may be appended), read back by mutagen (in front)."""
    tag = id3v2(4, picture=picture, title=title, footer=True)
    (folder / "front.mp3").write_bytes(tag + stream(1))
    check_id3(folder / "front.mp3", title)
    return tag


KEYS = st.sampled_from(["Title", "Artist", "Comment", "Cover Art (Front)", "Lyrics"])
APE_ITEMS = st.lists(st.tuples(KEYS, st.binary(min_size=1, max_size=4000) | st.text("abc xyz", min_size=1,
                                                                                    max_size=300)),
                     min_size=1, max_size=3, unique_by=lambda kv: kv[0])
# a tag, and whether an ID3v1 tag follows it (mutagen reads an APEv2 tag so followed; ID3v2.4 allows it)
TAG = st.tuples(st.one_of(st.tuples(st.just("ape"), APE_ITEMS),
                          st.tuples(st.just("id3"), st.integers(0, 5000), st.sampled_from(["a title", "b"]))),
                st.booleans())


def build(tags) -> bytes:
    """The tags' bytes, in order, each built by its writer and read back by mutagen."""
    from mutagen.apev2 import APEv2

    out = b""
    with tempfile.TemporaryDirectory() as folder:
        for (kind, *args), id3v1_after in tags:
            tag = ape(Path(folder), *args) if kind == "ape" else id3_appended(Path(folder), *args)
            tag += id3v1() if id3v1_after else b""
            if kind == "ape":  # mutagen finds it, with the ID3v1 tag after it
                (Path(folder) / "check.mp3").write_bytes(stream(1) + tag)
                assert set(APEv2(str(Path(folder) / "check.mp3")).keys()) == {k for k, _ in args[0]}
            out += tag
    return out


def end_of(data: bytes) -> int:
    view = memoryview(data)
    return audio_end(lambda at, n: bytes(view[at:at + n]), len(data))


@SETTINGS
@given(which=st.integers(0, 1), tags=st.lists(TAG, max_size=4), lone_id3v1=st.booleans())
def test_audio_end_is_the_streams_end_before_any_stack_of_tags(which, tags, lone_id3v1):
    audio = stream(which)
    if tags:
        assert end_of(audio + build(tags)) == len(audio)
    else:  # nothing, or an ID3v1 tag alone: left as it is (FFmpeg skips an ID3v1 tag itself)
        data = audio + (id3v1() if lone_id3v1 else b"")
        assert end_of(data) == len(data)


@SETTINGS
@given(which=st.integers(0, 1), tags=st.lists(TAG, min_size=1, max_size=3), at=st.floats(0, 1),
       xor=st.integers(1, 255), junk=st.binary(max_size=300))
def test_audio_end_never_raises_nor_cuts_into_the_stream_on_damaged_tags(which, tags, at, xor, junk):
    audio = stream(which)
    tail = bytearray(build(tags))
    tail[min(len(tail) - 1, int(at * len(tail)))] ^= xor
    for data in (audio + bytes(tail), audio + bytes(tail) + junk, audio + junk):
        assert len(audio) <= end_of(data) <= len(data)


@given(data=st.binary(max_size=3000), cut=st.integers(0, 3000), reads=st.lists(st.tuples(st.integers(-5, 4000),
                                                                                        st.integers(-1, 4000))))
def test_window_reads_as_the_bytes_before_its_end(data, cut, reads):
    """The file object FFmpeg reads a member through: exactly ``data[:cut]``, wherever it seeks."""
    cut = min(cut, len(data))
    window, want = Window(io.BytesIO(data), cut), data[:cut]
    for offset, n in reads:
        at = window.seek(offset)
        assert at == max(0, min(cut, offset)) == window.tell()
        assert window.read(n) == (want[at:] if n < 0 else want[at:at + n])
    assert window.seek(-10, 2) == max(0, cut - 10)
    assert window.read() == want[max(0, cut - 10):]
