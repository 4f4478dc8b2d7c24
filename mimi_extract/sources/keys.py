"""Keys: how an item's key is derived (from its name, its segment, ``--key stem``), made unique across
an input (:func:`dedup`: a duplicate is an error row, never a second dataset), named in an HDF5 file
(:func:`dataset_name`), and the options that shape keys and items, recorded as the run's item
identity (:func:`item_identity`)."""

from __future__ import annotations

from ..config.input_options import Options
from .items import Item


def _key_seconds(seconds: float) -> str:
    """Seconds in a segment key, to the microsecond (below one sample at any audio rate), so that
    distinct segments of a long recording get distinct keys (``%g`` kept six digits: 1234.56 and
    1234.564 collided)."""
    return f"{seconds:.6f}".rstrip("0").rstrip(".")


def segment_key(rel: str, start: float, end: float) -> str:
    return f"{rel}@{_key_seconds(start)}-{_key_seconds(end)}"


def key_stem(name: str) -> str:
    """``--key stem``: a file or member name's base name up to its first dot (WebDataset's sample
    key; VoxPopuli's and most corpus TSVs' utterance id): ``en/x/abc.flac`` -> ``abc``."""
    return name.rstrip("/").rpartition("/")[2].partition(".")[0]


def dataset_name(key: str) -> str:
    """HDF5 dataset name for ``key``: flat and injective ('%' -> %25, '/' -> %2F, leading '.' ->
    %2E), so no key can collide with another key's group (``a.wav#ch0`` vs ``a.wav#ch0/b.wav``)."""
    name = key.replace("%", "%25").replace("/", "%2F")
    return "%2E" + name[1:] if name.startswith(".") else name


def dedup(probed: list[Item]) -> tuple[list[Item], list[Item]]:
    """(items, error items) with unique keys.  Only an encodable item reserves its key: a later
    item with a taken key is a "duplicate key" error, but a bad row never shadows a good one.  An
    error item whose key is taken gets its row's name appended, so every manifest row has its own
    key and a resume (which skips keys already done) writes the same error rows again."""
    seen: dict[str, Item] = {}
    items, bad = [], []
    for it in probed:
        if it.error is not None:
            bad.append(it)
        elif it.key in seen:
            first = seen[it.key]
            it.error = f"duplicate key {it.key!r} (also {first.where + ': ' if first.where else ''}{first.rel})"
            if it.where:
                it.error = f"{it.where}: {it.error}"
            bad.append(it)
        else:
            seen[it.key] = it
            items.append(it)
    taken = set(seen)
    for it in bad:
        if it.key in taken:
            base, n = f"{it.key} [{it.where or it.rel}]", 1
            it.key = base
            while it.key in taken:
                n += 1
                it.key = f"{base} ({n})"
        taken.add(it.key)
    return items, bad


# The input options that decide which items an input yields, what audio each one is and its key
# (Options field -> its command-line flag).  They are the run's item identity, recorded in run.json
# (``items``, see :func:`item_identity`): a resume that changes one is refused, since its items would
# be stored a second time under other keys (or other audio under the same keys).  A new option that
# shapes items or keys is one line here.  (The kind read, ``--input-format`` or detected, is recorded
# as ``input_kind``, and ``--channel`` as ``channel``: both are compared the same way.)
ITEM_OPTIONS: dict[str, str] = {
    "list_keys": "--list-keys",
    "audio_ext": "--audio-ext",
    "id_field": "--id-field",
    "audio_column": "--audio-column",
    "id_column": "--id-column",
    "key": "--key",
    "sidecar_duration": "--sidecar-duration",
}


def item_identity(options: Options | None, kind: str | None = None) -> dict[str, str]:
    """{flag: value} of the :data:`ITEM_OPTIONS` given a value other than their default.  Only those
    are recorded, so an option added later (absent from an older run.json) reads as its default,
    which is how that older run made its items -- except ``--list-keys``, whose default changed (a
    list's rows were keyed as written): it is recorded for every list input, and its absence from an
    older list OUT's run.json reads as ``written`` (``store.identity``; the runner resumes such an OUT
    with its keys)."""
    options = options or Options()
    default = Options()
    out = {}
    for name, flag in ITEM_OPTIONS.items():
        value = getattr(options, name)
        if value != getattr(default, name):
            out[flag] = ",".join(value) if isinstance(value, (tuple, list)) else value
    if kind == "list":
        out["--list-keys"] = options.list_keys or "root"
    else:
        out.pop("--list-keys", None)
    return out
