"""What a run records of itself, built from its request, the input it found and the model it loaded:
``run.json`` (:func:`run_info`: the settings, input and model a resume must share) and every shard's
attributes (:func:`file_attrs`); and the checks made with them before anything is written -- a
resume of another run refused before OUT is locked (:func:`refuse_other_run`), an OUT made before
0.3 resumed by its own rules (:func:`as_before`), input shards rewritten in place
(:func:`rewritten_since`), inputs changed since they were encoded (:func:`refuse_changed_inputs`).
``identity.py`` reads, writes and compares ``run.json``; :class:`~.directory.RunDirectory` is the door
the runner goes through."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, replace

from .._version import __version__
from ..audio.decoders import decoder_versions
from ..audio.framing import Framing
from ..common import remote
from ..config.choices import SAMPLE_RATE
from ..config.request import RunRequest
from ..config.settings import Part, Settings
from ..config.taps import frame_rate
from ..formats import get_format
from ..formats.records import StoredRow
from ..sources import Discovered, Item, item_identity
from .files import OutputError
from .identity import ITEMS, check_run_info, read_run, read_run_info
from .manifest import committed_rows, run_dirs


def file_attrs(settings: Settings, identity, metadata: dict | None = None) -> dict:
    """What every shard of the run stores about how it was made (``identity``: the loaded model's
    :class:`~mimi_extract.codec.model.ModelIdentity`; ``metadata``: the kept fields' columns)."""
    attrs = {
        "tap": settings.tap,
        "frame_rate": frame_rate(settings.tap, identity.config),
        "sample_rate": SAMPLE_RATE,
        "model": settings.model,
        "config_hash": identity.config_hash,
        "weights": identity.weights,
        "tool_version": __version__,
        "dtype": settings.dtype,
        "framing": settings.framing,
        "layout": "[frames, num_quantizers]" if settings.tap == "codes" else "[frames, dim]",
    }
    if settings.tap == "codes":
        attrs["num_quantizers"] = settings.num_quantizers
        if settings.fidelity:  # (Parquet: its columns)
            attrs["fidelity"] = True
    if Framing.of(settings).stream_frames is not None:
        attrs["frames_per_call"] = settings.frames_per_call
    if metadata:  # the kept fields' columns (name -> type, JSON text: an HDF5 attribute holds no dict)
        attrs["metadata"] = json.dumps(metadata, sort_keys=True)
    attrs.update(get_format(settings.format).run_settings(settings, identity.config))  # (megatron: its token layout)
    return attrs


def run_info(request: RunRequest, found: Discovered, identity=None) -> dict:
    """What run.json records: the settings, model identity and input a resume must share, and the
    output format's own settings (``Format.run_settings``; ``identity``: the loaded model's
    :class:`~mimi_extract.codec.model.ModelIdentity`, None before it is loaded: the checks made
    before OUT is locked).  ``items``: the input options that shape the items and their keys
    (``sources.ITEM_OPTIONS``), so a resume that changes one is refused instead of storing every item
    again under other keys; ``metadata``: the columns the outputs carry, with ``options.keep_fields``
    as given; ``part_shards``: the input's shards, when the parts of a job array divide them whole
    (every part must agree)."""
    settings, options, part = request.settings, request.options, request.part
    keep = ("model", "tap", "channel", "causal_16k", "feature_dtype", "dtype", "framing", "format", "resampled_length")
    info = {k: v for k, v in asdict(settings).items() if k in keep}
    if settings.shar_extend:
        info["shar_extend"] = True
    if settings.tap == "codes":
        info["num_quantizers"] = settings.num_quantizers
        if settings.fidelity:  # every row of the OUT has its fidelity, or none does
            info["fidelity"] = True
    if Framing.of(settings).stream_frames is not None:  # the codes depend on it
        info["frames_per_call"] = settings.frames_per_call
    info["decoders"] = decoder_versions()  # a resume must decode every format the same way
    # where items were resampled to 24 kHz (--resample-on, auto resolved: the device on a GPU): equal up
    # to float noise, so provenance (identity.PROVENANCE), never compared: a GPU run resumes on a CPU
    info["resample_on"] = "device" if settings.device_resample else "host"
    if identity is not None:
        info["versions"] = identity.versions  # provenance (identity.PROVENANCE): never compared
    if found.identity:  # e.g. tar shards: each shard's size and mtime
        info["input_identity"] = found.identity
    if options.metadata:  # --metadata: the file joined (its path; its columns: metadata)
        info["metadata_file"] = os.path.abspath(options.metadata)
    if options.keep_fields is not None:  # --keep-fields / --keep-columns, as given
        info["keep_fields"] = options.keep_fields
    if found.metadata:  # the metadata columns the outputs carry (name -> type): every shard must have the same
        info["metadata"] = found.metadata
    info[ITEMS] = item_identity(options, found.kind)
    if found.part_shards is not None:  # how the parts divide the input: every part must agree
        info["part_shards"] = found.part_shards
    info.update(get_format(settings.format).run_settings(settings, identity.config if identity is not None else None))
    hashes = {"config_hash": identity.config_hash, "weights": identity.weights} if identity is not None else {}
    return {**info, **hashes, "input": found.root, "input_kind": found.kind, "part": str(part),
            "tool_version": __version__}


def divided_by_key(run_dir: str) -> bool:
    """Whether a part of this job array already ran with its items divided by key (its run.json has
    no ``part_shards``: an input with fewer shards than parts, not sharded at all, or an OUT begun
    before parts took whole shards): the other parts then divide by key too, so one OUT never mixes
    the two divisions (its union would lose or repeat items)."""
    return any((info := read_run(d)) is not None and info.part_shards is None
               for d in run_dirs(os.path.dirname(run_dir)))


def rewritten_shards(old: dict | None, new: dict | None) -> list[str] | None:
    """The input shards (paths) whose size or mtime differ between two ``input_identity`` records
    that list the same shards and differ in nothing else; None when anything else differs."""
    if not isinstance(old, dict) or not isinstance(new, dict) or old.keys() != new.keys():
        return None
    field = next((f for f in ("shards", "files") if f in old), None)
    if field is None or any(old[k] != new[k] for k in old if k != field):
        return None
    before = {p: (size, mtime) for p, size, mtime in old[field]}
    after = {p: (size, mtime) for p, size, mtime in new[field]}
    if list(before) != list(after):
        return None
    return [p for p in after if before[p] != after[p]]


def rewritten_since(run_dir: str, info: dict, part: Part) -> list[str]:
    """``--reencode-changed``: the input shards rewritten in place (re-downloaded: same paths, other
    size or mtime) since the run directory's ``run.json``, when nothing else of the input changed
    (else none: ``check_run_info`` refuses as usual).  Parts divided by key each record every shard,
    so one part cannot move on alone: refused.  ``RunDirectory.check_identity`` re-encodes them."""
    old = read_run(run_dir)
    if old is None or old.input_identity == info.get("input_identity"):
        return []
    rewritten = rewritten_shards(old.input_identity, info.get("input_identity")) or []
    if rewritten and not part.whole and "part_shards" not in info:
        raise OutputError("--reencode-changed: this job array's parts divide their items by key, and each records "
                          "every input shard; re-encode into a new OUT (or use parts of whole shards)")
    return rewritten


def refuse_changed_inputs(items: list[Item], done: dict[str, StoredRow]) -> None:
    """Refuse to resume over inputs whose file changed since they were encoded (same key, another
    sample rate, length or channel count): their stored outputs would silently describe old audio."""
    def shape(rate, frames, channels) -> str:
        return f"{rate} Hz, {frames} samples, {channels} channel(s)"

    changed = []
    for it in items:
        row = done.get(it.key)
        src = row.source if row else None
        if not src:
            continue
        was = (row.sample_rate, src.frames, src.channels)
        now = (it.sample_rate, it.file_frames, it.file_channels)
        if was != now:
            changed.append(f"{it.key}: {shape(*was)} when encoded, now {shape(*now)}")
    if changed:
        raise OutputError(f"{len(changed)} input file(s) changed since they were encoded ({changed[0]}"
                          + (f"; and {len(changed) - 1} more" if len(changed) > 1 else "")
                          + "); their stored outputs no longer match: encode into a new OUT directory")


def as_before(request: RunRequest) -> RunRequest:
    """A resume of an OUT made before 0.3 goes on as that OUT was made, so it never mixes two rules:
    a list input's rows keyed as written (its run.json records no ``--list-keys``; else every item
    would be stored again under a new key: ``sources.item_identity``), and items cut to the exact
    24 kHz length (no ``resampled_length``: ``audio.framing.Framing.length``).  Other requests as they are."""
    if remote.is_url(request.out_dir) or not os.path.isdir(request.out_dir):
        return request
    for d in run_dirs(request.out_dir):
        old = read_run_info(d)
        if old is None:
            continue
        if (request.options.list_keys is None and old.get("input_kind") == "list"
                and "--list-keys" not in (old.get(ITEMS) or {})):
            request = replace(request, options=replace(request.options, list_keys="written"))
        if "resampled_length" not in old:
            request = replace(request, settings=replace(request.settings, resampled_length="exact"))
    return request


def refuse_other_run(request: RunRequest, found: Discovered) -> None:
    """Before OUT is locked or the model loaded (so a refusal touches nothing): refuse to resume a run
    directory made with other settings, input or item options (all but the model, compared with its
    weights' hash once loaded; ``check_run_info`` compares everything again under the lock), and an
    older run.json (no ``items``) whose stored keys are none of this run's: its item options were others."""
    out_dir, part = request.out_dir, request.part
    if not os.path.isdir(out_dir):
        return
    run_dir = out_dir if part.whole else os.path.join(out_dir, part.dirname)
    here = {os.path.abspath(run_dir), os.path.abspath(out_dir)}  # (a whole run in OUT: the layout check's to refuse)
    siblings = [d for d in run_dirs(out_dir) if os.path.abspath(d) not in here] if not part.whole else []
    info = run_info(request, found)
    if request.reencode_changed and os.path.isdir(run_dir) and rewritten_since(run_dir, info, part):
        info["input_identity"] = read_run(run_dir).input_identity  # (moved on under the lock)
    del info["model"]  # the model (its path, config and weights) is compared as one, once it is loaded
    check_run_info(run_dir, info, siblings, write=False)
    old = read_run(run_dir) if os.path.isdir(run_dir) else None
    if old is None or old.items is not None:
        return
    stored = [r.key for r in committed_rows(run_dir) if r.ok]
    keys = {it.key for it in found.items} | {it.key for it in found.bad}
    if stored and keys and keys.isdisjoint(stored):
        raise OutputError(f"{run_dir} holds {len(stored)} items and none of them is among this run's {len(keys)} "
                          f"inputs (stored {stored[0]!r}, now {min(keys)!r}): they were keyed by other input options "
                          f"(--id-column, --id-field, ...), so every item would be stored twice; resume with the "
                          "options that made OUT, or use a new OUT directory")
