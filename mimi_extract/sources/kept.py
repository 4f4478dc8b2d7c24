"""An item's metadata, kept for the outputs (``--keep-fields``: ``input_options.Keep``): the row fields
never kept (they say what the item itself is), the output columns the kept fields make over a whole
input, and a multi-channel item's supervisions divided by channel."""

from __future__ import annotations

from ..config.input_options import is_scalar

# what a list row or a sidecar already says about the item itself (read, never kept as metadata)
ITEM_FIELDS = ("id", "path", "start", "end", "duration", "channel")


def _value_kind(name: str, value) -> str:
    if name == "supervisions" or not is_scalar(value):
        return "json"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64" if -2**63 <= value < 2**63 else "json"
    return "float64" if isinstance(value, float) else "string"


def metadata_columns(metas) -> dict[str, str]:
    """The output columns of the kept fields over all of an input's ``meta`` dicts: name -> type
    (``string``, ``int64``, ``float64``, ``bool``; ``json``: a JSON string, for nested or mixed
    values and lhotse ``supervisions``).  Decided over the whole input before any shard is written
    (and recorded in run.json), so every shard, and every part of a job array, has the same schema."""
    kinds: dict[str, set] = {}
    for meta in metas:
        for name, value in (meta or {}).items():
            kinds.setdefault(name, set()).add(_value_kind(name, value))
    out = {}
    for name, found in sorted(kinds.items()):
        if len(found) == 1:
            out[name] = found.pop()
        elif found == {"int64", "float64"}:
            out[name] = "float64"
        else:
            out[name] = "json"
    return out


def supervisions_for_channel(meta: dict | None, channel: int) -> dict | None:
    """``meta`` for one channel of a multi-channel item: only the supervisions on that channel."""
    if not meta or "supervisions" not in meta:
        return meta
    sups = [s for s in meta["supervisions"] if s.get("channel") is None or s["channel"] == channel
            or (isinstance(s["channel"], list) and channel in s["channel"])]
    return {**meta, "supervisions": sups}
