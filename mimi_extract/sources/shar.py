"""lhotse Shar as input: a folder with ``cuts.NNNNNN.jsonl.gz`` and ``recording.NNNNNN.tar``.

Shard N's cuts and the data members of its recording tar are paired in order, as lhotse's own
reader pairs them (each member is named ``<cut id>.<ext>``; a name that does not match its cut is
that cut's error row).  Cut ids are the keys; a cut's ``start``/``duration`` within its stored
recording is honoured as a segment; a MultiCut's channels follow ``--channel`` (a MultiCut of a
subset of its recording's channels gives one item per listed channel, ``id#chN``).  The audio is
read in place by offset, exactly as tar shards are (``tar.py``'s indexer and member view).
"""

from __future__ import annotations

import os
import re

from ..common import remote
from .base import Source, register
from .items import Entry
from .kept import supervisions_for_channel
from .rows import row_failed
from .text import printable, text_problem
from .lhotse import manifest_items, cut_meta
from .tar import SPARSE, MemberLoc, index_tar, shard_identity, sparse_error

_CUTS = re.compile(r"cuts\.(\d+)\.jsonl(\.gz)?$")


def shar_shards(path: str) -> list[tuple[str, str, str]]:
    """(index, cuts file, recording tar path) per shard of a Shar folder, in index order."""
    out = []
    for name in sorted(remote.listdir(path)):
        m = _CUTS.match(name)
        if m:
            out.append((m.group(1), remote.join(path, name), remote.join(path, f"recording.{m.group(1)}.tar")))
    return out


@register
class SharSource(Source):
    """A lhotse Shar folder; see the module docstring."""

    kind = "shar"
    detect_order = 30

    @classmethod
    def detect(cls, path: str) -> bool:
        return remote.isdir(path) and bool(remote.glob(remote.join(remote.escape(path), "cuts.*.jsonl*")))

    def entries(self, warnings: list[str]) -> list[Entry]:
        from ..common.optional import lhotse as _lhotse

        _lhotse()
        entries = []
        wanted = tuple(e.lower().lstrip(".") for e in self.options.audio_ext) if self.options.audio_ext else None
        for _index, cuts_file, tar in self.mine(shar_shards(self.path)):
            shown_tar = os.path.basename(tar)
            full = remote.absolute(tar)
            if remote.isfile(tar):
                members, damage = index_tar(full)
            else:
                members, damage = [], f"{shown_tar} is missing"
            data = [m for m in members if not m[0].endswith(".json")
                    and (wanted is None or m[0].rsplit(".", 1)[-1].lower() in wanted)]
            rows = list(manifest_items(cuts_file))
            for n, (where, cut, ident, kind) in enumerate(rows):
                where = f"{os.path.basename(cuts_file)}:{where}"
                key = getattr(cut, "id", None) or ident or where
                if isinstance(cut, str) or kind != "CutSet":
                    reason = cut if isinstance(cut, str) else f"a {type(cut).__name__} is not a cut"
                    entries.append(Entry(full, where, key=printable(key), where=where, kind="tar", error=reason))
                    continue
                if problem := text_problem(key):
                    entries.append(Entry(full, where, key=printable(key), where=where, kind="tar", error=f"id {problem}"))
                    continue
                if n >= len(data):
                    why = damage or f"{shown_tar} has {len(data)} audio members for {len(rows)} cuts"
                    entries.append(Entry(full, f"{shown_tar}/{key}", key=key, where=where, kind="tar",
                                         error=f"no audio for this cut: {why}"))
                    continue
                name, offset, size, kept = data[n]
                base = f"{shown_tar}/{name}"
                if kept is SPARSE:
                    entries.append(Entry(full, base, key=key, where=where, kind="tar", error=sparse_error(name)))
                    continue
                if not name.startswith(cut.id + "."):
                    entries.append(Entry(full, base, key=key, where=where, kind="tar",
                                         error=f"member {name!r} does not belong to cut {cut.id!r}"))
                    continue
                try:
                    entries += self._cut_entries(cut, full, base, where, MemberLoc(offset, size, name), self.options.keep)
                except Exception as e:  # whatever the cut holds: its own error row, never the shard's end
                    entries.append(row_failed(where, e, full, "tar"))
        return entries

    @staticmethod
    def _cut_entries(cut, tar: str, rel: str, where: str, loc: MemberLoc, keep=None) -> list[Entry]:
        recording = getattr(cut, "recording", None)
        if recording is None or type(cut).__name__ == "MixedCut":
            return [Entry(tar, rel, key=cut.id, where=where, kind="tar", error="only MonoCut/MultiCut with a recording")]
        ids = list(recording.channel_ids)
        whole = abs(cut.start) < 1e-9 and abs(cut.duration - recording.duration) < 0.5 / recording.sampling_rate
        start, duration = (None, None) if whole else (cut.start, cut.duration)
        chans = cut.channel if isinstance(cut.channel, list) else [cut.channel]
        if len(ids) == 1 or sorted(chans) == sorted(ids) and len(chans) > 1:
            entry_channels = [None]  # the whole recording: --channel decides (mix, first, each)
        else:
            entry_channels = [ids.index(c) for c in chans]
        if not entry_channels:  # (a cut naming no channel would otherwise vanish without a row)
            return [Entry(tar, rel, key=cut.id, where=where, kind="tar", error="the cut names no channel")]
        meta = cut_meta(cut, keep, start) if keep is not None else None  # supervisions, custom fields
        out = []
        for c in entry_channels:
            key = cut.id if c is None or len(entry_channels) == 1 else f"{cut.id}#ch{ids[c]}"
            out.append(Entry(tar, rel, key=key, start=start, duration=duration, channel=c, where=where, kind="tar",
                             loc=loc, meta=supervisions_for_channel(meta, ids[c]) if len(entry_channels) > 1 else meta))
        return out

    def input_shards(self) -> list[str]:
        """A shard is its cuts file and recording tar: named by the tar (what is downloaded again)."""
        return [remote.absolute(tar) for _, _, tar in shar_shards(self.path)]

    def identity(self) -> dict:
        files = []
        for _, cuts_file, tar in self.mine(shar_shards(self.path)):
            files += [cuts_file] + ([tar] if remote.isfile(tar) else [])
        return shard_identity(files)
