"""``run.json``: the settings, model identity and input a run directory was made with.  A resume
(or another part of the same job array) with anything else is refused, naming what differs, so
one OUT never mixes outputs that mean different things."""

from __future__ import annotations

import json
import os
import shlex

import numpy as np

from ..common import remote
from ..formats.records import RunInfo
from .files import RUN_INFO, LayoutError, MalformedError, OutputError, read_json, write_atomic
from .manifest import committed_rows, shard_attrs


# run.json's layout: a reader refuses a newer one (it cannot know what the new keys mean) instead of
# misreading it; a run.json without the key was written before it existed, in layout 1
SCHEMA_KEY = "schema_version"
SCHEMA_VERSION = 1


def read_run(run_dir: str, read=None) -> RunInfo | None:
    """A run directory's ``run.json`` as a typed :class:`RunInfo` (None when it has none): what
    the package's readers take; checked as :func:`read_run_info` checks it."""
    info = read_run_info(run_dir, read)
    return None if info is None else RunInfo.from_dict(info)


def read_run_info(run_dir: str, read=None) -> dict | None:
    """A run directory's ``run.json`` as its JSON (None when it has none), in a layout this version
    reads; ``read``: see ``files.read_json``.  The JSON itself is what a resume compares key by key
    (:func:`check_run_info`) and rewrites; readers take :func:`read_run`'s record."""
    path = remote.join(run_dir, RUN_INFO)
    info = read_json(path, read)
    if info is None:
        return None
    version = info.get(SCHEMA_KEY, 1)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise LayoutError(f"{path} has {SCHEMA_KEY} {version!r}; this mimi-extract reads up to {SCHEMA_VERSION}: "
                          "it was written by a newer mimi-extract; upgrade it to read or resume this OUT")
    for key, kinds in _INFO_TYPES.items():
        if key in info and not isinstance(info[key], kinds):
            raise MalformedError(f"{path} has {key} {json.dumps(info[key])[:40]}, not what this tool writes there: "
                                 "it was edited or damaged")
    if info.get("tap", "codes") not in ("codes", "latent", "encoder"):
        raise MalformedError(f"{path} has tap {info['tap']!r}: not one this tool writes (codes, latent, encoder)")
    return info


# the fields of run.json that readers use, and their types (bool is an int: excluded where it matters)
_INFO_TYPES = {"tap": str, "format": str, "model": str, "input": (str, type(None)), "framing": str,
               "num_quantizers": (int, type(None)), "channel": (str, int, type(None)), "part_shards": (list, type(None))}


def write_run_info(run_dir: str, info: dict) -> None:
    """``run.json``, atomically, in this version's layout."""
    write_atomic(os.path.join(run_dir, RUN_INFO), json.dumps({**info, SCHEMA_KEY: SCHEMA_VERSION}, indent=2,
                                                             sort_keys=True))


_EXPLAIN = {
    "weights": "the model's weights differ (same config, other checkpoint)",
    "input": "another input (directory or list)",
    "input_identity": "the input's shards or files changed (added, removed, rewritten: size or mtime)",
    "decoders": "other decoder versions: a resume must decode each format as the first run did",
    "format": "another output format (--format)",
    "metadata": "other input metadata kept as output columns and cut fields (--keep-fields; an OUT written before "
                "metadata was kept resumes with --keep-fields none)",
    "keep_fields": "another --keep-fields / --keep-columns",
    "metadata_file": "another --metadata file joined to the items (their fields would differ between shards)",
    "resampled_length": "another rule for the 24 kHz length of resampled items: an OUT made before 0.3 is resumed "
                        "with its own (exact) rule by this version; another tool made this change",
    "channel": "--channel: other items and keys",
    "input_kind": "INPUT read as another kind (--input-format): other items and keys",
    "token_layout": "another --token-layout: the same codes as other token ids",
    "token_offset": "another --token-offset: every token id would move",
    "codebook_size": "a model with other codebooks: other token ids",
    "token_dtype": "token ids of another width (megatron-core's dtype for the vocabulary)",
    "part_shards": "every part of one OUT must divide the input the same way (an OUT begun before --part took whole "
                   "input shards, or by another tool version): run every part with one version, or use a new OUT",
}
# run.json: the input options that shape the items and their keys, {flag: value} (sources.item_identity)
ITEMS = "items"
_ITEMS_EXPLAIN = "an option that decides the items and their keys: the same audio would be stored again, or mixed"


# what made the OUT, recorded and never compared: a resume or another part with another tool version or
# other torch/transformers/torchaudio versions (``versions``), or resampling elsewhere (``resample_on``:
# host or device, equal up to float noise) is not refused for it (``verify --out`` says when the
# installed transformers differs); run.json keeps the first run's
PROVENANCE = ("tool_version", "versions", "resample_on")

# keys run.json gained after OUT directories existed: an OUT written before them lacks them, and is
# resumed (it cannot say otherwise); once recorded they are compared like every other key
_ADDED_LATER = ("decoders", "keep_fields", ITEMS, "metadata_file")
# item options (``items``) recorded later, with what their absence from an older run.json meant: a
# list input's rows were keyed as written (sources.item_identity)
ITEMS_BEFORE = {"--list-keys": "written"}
# settings recorded later, with what their absence meant: items cut to the exact 24 kHz length
# (audio.Framing.length); the runner resumes such an OUT that way (runner.as_before)
SETTINGS_BEFORE = {"resampled_length": "exact"}


def _shown(value) -> str:
    return "not given" if value is None else repr(value)


def _with_items_before(old: dict, new: dict) -> dict:
    """``old`` with the settings and item options it predates read as what they meant then
    (:data:`SETTINGS_BEFORE`, :data:`ITEMS_BEFORE`)."""
    old = {**{k: v for k, v in SETTINGS_BEFORE.items() if k in new}, **old}
    if not isinstance(old.get(ITEMS), dict) or not isinstance(new.get(ITEMS), dict):
        return old
    return {**old, ITEMS: {**{f: v for f, v in ITEMS_BEFORE.items() if f in new[ITEMS]}, **old[ITEMS]}}


def _differences(old: dict, new: dict, ignore: tuple[str, ...]) -> str:
    old = _with_items_before(old, new)
    diff = {k: (old.get(k), v) for k, v in new.items()
            if k not in ignore and k not in PROVENANCE and old.get(k) != v and not (k in _ADDED_LATER and k not in old)}
    if "part_shards" in old and "part_shards" not in new and "part_shards" not in ignore:
        diff["part_shards"] = (old["part_shards"], None)
    out = []
    for k, (a, b) in diff.items():
        if k == ITEMS and isinstance(a, dict) and isinstance(b, dict):  # one entry per option, named by its flag
            out += [f"{flag}: {_shown(a.get(flag))} -> {_shown(b.get(flag))}, {_ITEMS_EXPLAIN}"
                    for flag in sorted(set(a) | set(b)) if a.get(flag) != b.get(flag)]
        else:
            out.append(_shard_changes(k, a, b) or f"{k}: {a!r} -> {b!r}" + (f" ({_EXPLAIN[k]})" if k in _EXPLAIN else ""))
    return "; ".join(out)


def _shard_changes(key: str, old, new) -> str | None:
    """A change of the input's shards, naming only the shards that changed (not every shard's size
    and mtime): ``input_identity``'s ``shards``/``files`` ([path, size, mtime]) and ``part_shards``."""
    def listed(names: list[str], what: str) -> str:
        return f"{what} {', '.join(names[:5])}" + (f" and {len(names) - 5} more" if len(names) > 5 else "")

    if key == "part_shards":
        if old is None or new is None:
            return ("part_shards: the parts of this OUT divide " + ("their items by key" if old is None else "whole input shards")
                    + ", this one " + ("whole input shards" if old is None else "its items by key") + ": " + _EXPLAIN[key])
        changes = [listed(n, w) for n, w in (([s for s in new if s not in old], "added"),
                                             ([s for s in old if s not in new], "removed")) if n]
        return (f"part_shards: the input's shards differ ({'; '.join(changes) or 'reordered'}): the parts of one OUT "
                "must divide the same shards; run every part over the same input, or use a new OUT")
    if key != "input_identity" or not isinstance(old, dict) or not isinstance(new, dict):
        return None
    field = next((f for f in ("shards", "files") if f in old or f in new), None)
    if field is None or {k: v for k, v in old.items() if k != field} != {k: v for k, v in new.items() if k != field}:
        return None  # (another --key / --sidecar-duration: the plain rendering says which)
    before = {p: (size, mtime) for p, size, mtime in old.get(field, [])}
    after = {p: (size, mtime) for p, size, mtime in new.get(field, [])}
    changes = [listed(n, w) for n, w in (
        ([f"{p} ({before[p][0]} -> {after[p][0]} bytes)" if before[p][0] != after[p][0] else f"{p} (modified)"
          for p in after if p in before and before[p] != after[p]], "rewritten:"),
        ([p for p in after if p not in before], "added:"), ([p for p in before if p not in after], "removed:")) if n]
    only_rewritten = list(before) == list(after)
    return (f"input_identity: input shards changed since this run began ({'; '.join(changes) or 'reordered'}); "
            "their stored outputs would describe other audio"
            + ("; to encode their items again from the new shards, resume with --reencode-changed" if only_rewritten else ""))


def _original_items(old: dict, new: dict) -> str | None:
    """The item options that made ``old``, as flags to type again, when ``new`` changes them; else None."""
    old = _with_items_before(old, new)
    if ITEMS not in old or ITEMS not in new or old[ITEMS] == new[ITEMS]:
        return None
    given = " ".join(f"{flag} {shlex.quote(str(value))}" for flag, value in sorted(old[ITEMS].items()))
    return given or "no " + ", no ".join(sorted(new[ITEMS]))


def check_run_info(run_dir: str, info: dict, siblings: list[str] = (), expected_attrs: dict | None = None,
                   write: bool = True) -> None:
    """Refuse to mix outputs of different settings, weights or inputs in one run directory, or in
    one job array: every part of an OUT (``siblings``: the other parts' run directories) must have
    been made from the same input with the same model and settings, or their union means nothing.
    A ``run.json`` without ``format`` was written before formats existed: it is an HDF5 run.
    ``write=False``: compare only (the keys ``info`` has), write nothing -- the check a run makes
    before it locks OUT or loads the model, so a refused resume touches nothing and costs nothing."""
    for other in siblings:
        theirs = _with_format(read_run_info(other))
        # parts of whole shards: each has its own shards' identity (the shard list is compared instead)
        mine = ("input_identity",) if "part_shards" in info or "part_shards" in (theirs or {}) else ()
        changes = _differences(theirs, info, ("part",) + mine) if theirs is not None else ""
        if changes:
            items = _original_items(theirs, info)
            raise OutputError(f"{other} (another part of this job array) was made with other settings ({changes}); "
                              + (f"run every part with {items}" if items else
                                 "run every part with the same input, model and settings") + ", or use a new OUT directory")
    old = _with_format(read_run_info(run_dir))
    if old is None and not write:
        return
    if old is None:  # run.json deleted (or never written): the shards still say what made them
        if expected_attrs is not None:
            for shard in sorted({r.shard for r in committed_rows(run_dir) if r.shard}):
                try:
                    attrs = shard_attrs(run_dir, shard)
                except Exception:  # noqa: BLE001 -- damaged: recover() quarantines it
                    continue
                check_shard_settings(run_dir, shard, attrs, expected_attrs)
        write_run_info(run_dir, info)
        return
    other_division = ("input_identity",) if ("part_shards" in old) != ("part_shards" in info) else ()  # (said once)
    changes = _differences(old, info, other_division)
    if changes:
        items = _original_items(old, info)
        raise OutputError(f"{run_dir} holds a run with other settings ({changes}); resume with the original "
                          + (f"settings ({items})" if items else "settings") + " or use a new OUT directory")
    if write and ITEMS in info and ITEMS not in old:  # written before items were recorded: pinned from now on
        write_run_info(run_dir, {**read_run_info(run_dir), ITEMS: info[ITEMS]})


def _with_format(info: dict | None) -> dict | None:
    return info if info is None or "format" in info else {**info, "format": "hdf5"}




def check_shard_settings(run_dir: str, shard: str, attrs: dict, expected: dict) -> None:
    """Refuse a committed shard made with other settings than this run's (its file attributes are
    the settings it was made with; run.json can be deleted, and attributes edited in place)."""
    changes = [f"{k}: {_plain(attrs.get(k))!r} -> {v!r}" + (f" ({_EXPLAIN[k]})" if k in _EXPLAIN else "")
               for k, v in expected.items() if k not in PROVENANCE and _plain(attrs.get(k)) != _plain(v)]
    if changes:
        raise OutputError(f"{os.path.join(run_dir, shard)} was made with other settings than this run "
                          f"({'; '.join(changes)}); resume with the original settings or use a new OUT directory")


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value

