"""Finding an input's items: the kind that reads INPUT (:func:`source_kind`: ``--input-format``, or
detection in the registry's order), its entries, the ``--metadata`` join, every header probed (16 at
a time), keys made unique.  Above the kinds' common ground (``base``, ``probing``, ``keys``...) and
``metadata`` (the join), so neither needs the other."""

from __future__ import annotations

import os
from dataclasses import replace

from ..common import remote
from ..audio.framing import Framing
from ..config.choices import KEY_MODES, LIST_KEY_MODES, SIDECAR_DURATION_MODES
from ..config.input_options import Options
from .base import REGISTRY, safe_probe
from .items import Discovered
from .kept import metadata_columns
from .keys import dedup, key_stem
from .metadata import MetadataTable


def discover(source: str, channel: str = "mix", framing: Framing = Framing(), limit: int | None = None,
             recordings: str | None = None, exclude: str | None = None, input_format: str | None = None,
             options: Options | None = None, part: tuple[int, int] | None = None) -> Discovered:
    """Every item of ``source``, probed: its kind is ``input_format`` or the first registered kind
    that detects it.  ``exclude``: the run's OUT, never an input.

    ``part`` (index, count): a job array's part of a sharded input (tar, .tar.gz, Parquet, Shar)
    with at least ``count`` shards takes whole shards -- the shard at position i of the input's
    shard list goes to part i % count -- and only those are opened, indexed and probed (the result's
    ``part_shards`` says so); otherwise every item is found and the caller divides them by key."""
    from concurrent.futures import ThreadPoolExecutor

    remote.forget()  # (objects read by an earlier run of this process may have changed since)
    options = options or Options()
    options = replace(options, recordings=recordings or options.recordings, exclude=exclude or options.exclude)
    if options.key not in KEY_MODES:
        raise ValueError(f"--key {options.key!r}: choose from {', '.join(KEY_MODES)}")
    if options.list_keys not in (None, *LIST_KEY_MODES):
        raise ValueError(f"--list-keys {options.list_keys!r}: choose from {', '.join(LIST_KEY_MODES)}")
    if options.sidecar_duration not in SIDECAR_DURATION_MODES:
        raise ValueError(f"--sidecar-duration {options.sidecar_duration!r}: choose from "
                         f"{', '.join(SIDECAR_DURATION_MODES)}")
    kind = source_kind(source, input_format or options.input_format)
    src = REGISTRY[kind](source, options)
    part_shards = None
    if part is not None and part[1] > 1:
        shards = src.input_shards()
        if shards is not None and len(shards) >= part[1]:  # fewer shards than parts: by key (no idle part)
            part_shards = shards
            src.only = frozenset(range(part[0], len(shards), part[1]))
    warnings: list[str] = []
    if options.metadata:  # read first: a wrong file or --metadata-key is one clear error before any shard
        table = MetadataTable.load(options.metadata, options.metadata_key)
    entries = src.entries(warnings)
    if options.metadata:
        warnings += table.join(entries, options.keep, whole_input=part_shards is None and part is None)
    metadata = metadata_columns(e.meta for e in entries)  # the whole input's: every part, every --limit the same
    if options.keep.dropped:
        warnings.append("not kept as metadata (the outputs have their own): " + ", ".join(sorted(options.keep.dropped)))
    entries = entries[:limit]
    if options.key == "stem":  # (a tar sample's key is its stem already: sources/tar.py)
        for e in entries:
            if e.key is None:
                e.key_base = key_stem(e.rel)
    with ThreadPoolExecutor(16) as pool:  # header reads are I/O bound (network file systems)
        probed = [it for found in pool.map(lambda e: safe_probe(src, e, channel, framing), entries) for it in found]
    items, bad = dedup(probed)
    return Discovered(items, bad, warnings, remote.real(source), kind, src.identity(), metadata, part_shards)


def source_kind(source: str, input_format: str | None = None) -> str:
    """The registered kind that reads ``source``; one clear error when none does."""
    if input_format:
        if input_format not in REGISTRY:
            raise ValueError(f"--input-format {input_format!r}: choose from {', '.join(sorted(REGISTRY))}")
        return input_format
    if not remote.exists(source) and not any(c in source for c in "*?{["):
        raise FileNotFoundError(f"input {source!r} does not exist")
    for kind, cls in REGISTRY.items():
        if cls.detect(source):
            return kind
    if os.path.isfile(source):
        raise ValueError(f"input {source!r} is a file but not a list (.txt .jsonl .csv .tsv, a NeMo .json), a lhotse manifest "
                         "(.jsonl.gz) or another known input (" + ", ".join(sorted(REGISTRY)) + ")")
    for cls in REGISTRY.values():
        if why := cls.why_not(source):
            raise FileNotFoundError(why)
    raise FileNotFoundError(f"input {source!r} matches nothing")
