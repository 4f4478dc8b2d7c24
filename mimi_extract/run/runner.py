"""One extraction run: discover, check identity, lock OUT, load the model, recover, plan, encode, write, report.

The caller's thread is the only writer; engines (``engines/``) encode in threads, processes or
Ray actors and hand back pieces.  SIGINT/SIGTERM stop the engines, commit exactly the items that
were completely encoded, and leave OUT ready to resume; a second signal exits at once (OUT is
still consistent: the commit protocol survives any kill).
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, replace

from .._version import __version__
from ..common import remote
from ..config.choices import SAMPLE_RATE
from ..audio.decoders import decoder_versions
from ..codec.encoder import PaddedMimiEncoder
from ..codec.model import config_hash, from_pretrained, library_versions, weights_hash
from ..engines import Engine, Stats, make_engine
from ..engines.assembly import Assembler
from ..engines.plan import Split, padding_fraction, part_of, plan_units, split_items
from ..config.request import RunRequest
from ..audio.framing import Framing
from ..config.settings import Part, Settings
from ..sources import Discovered, Item, Options, discover, item_identity, plan_group
from ..formats import get_format
from ..store.mirror import extract_remote
from ..store.directory import RunDirectory
from ..store.files import OutputError
from ..store.identity import ITEMS, check_run_info, read_run_info
from ..store.manifest import ManifestRow, committed_rows, run_dirs


def frame_rate(tap: str, config) -> float:
    """Frames per second of the tap (25 Hz before the downsample, 12.5 Hz after)."""
    return float(config.sampling_rate / math.prod(config.upsampling_ratios)) if tap == "encoder" else float(config.frame_rate)


def file_attrs(settings: Settings, config, identity: dict, metadata: dict | None = None) -> dict:
    attrs = {
        "tap": settings.tap,
        "frame_rate": frame_rate(settings.tap, config),
        "sample_rate": SAMPLE_RATE,
        "model": settings.model,
        "config_hash": identity["config_hash"],
        "weights": identity["weights"],
        "tool_version": __version__,
        "dtype": settings.dtype,
        "framing": settings.framing,
        "layout": "[frames, num_quantizers]" if settings.tap == "codes" else "[frames, dim]",
    }
    if settings.tap == "codes":
        attrs["num_quantizers"] = settings.num_quantizers
    if Framing.of(settings).stream_frames is not None:
        attrs["frames_per_call"] = settings.frames_per_call
    if metadata:  # the kept fields' columns (name -> type, JSON text: an HDF5 attribute holds no dict)
        attrs["metadata"] = json.dumps(metadata, sort_keys=True)
    attrs.update(get_format(settings.format).run_settings(settings, config))  # (megatron: its token layout)
    return attrs


def run_info(settings: Settings, identity: dict, input_root: str, kind: str, part: Part,
             input_identity: dict | None = None, metadata: dict | None = None, options: Options | None = None,
             part_shards: list[str] | None = None, config=None) -> dict:
    """What run.json records: the settings, model identity and input a resume must share, and the
    output format's own settings (``Format.run_settings``; ``config``: the model's, once loaded).  ``items``:
    the input options that shape the items and their keys (``sources.ITEM_OPTIONS``), so a resume
    that changes one is refused instead of storing every item again under other keys; ``metadata``:
    the columns the outputs carry, with ``options.keep_fields`` as given; ``part_shards``: the input's
    shards, when the parts of a job array divide them whole (every part must agree)."""
    keep = ("model", "tap", "channel", "causal_16k", "feature_dtype", "dtype", "framing", "format", "resampled_length")
    info = {k: v for k, v in asdict(settings).items() if k in keep}
    if settings.shar_extend:
        info["shar_extend"] = True
    if settings.tap == "codes":
        info["num_quantizers"] = settings.num_quantizers
    if Framing.of(settings).stream_frames is not None:  # the codes depend on it
        info["frames_per_call"] = settings.frames_per_call
    info["decoders"] = decoder_versions()  # a resume must decode every format the same way
    info["versions"] = library_versions()  # provenance (store.identity.PROVENANCE): never compared
    if input_identity:  # e.g. tar shards: each shard's size and mtime
        info["input_identity"] = input_identity
    if options is not None and options.metadata:  # --metadata: the file joined (its path; its columns: metadata)
        info["metadata_file"] = os.path.abspath(options.metadata)
    keep_fields = options.keep_fields if options is not None else None
    if keep_fields is not None:  # --keep-fields / --keep-columns, as given
        info["keep_fields"] = keep_fields
    if metadata:  # the metadata columns the outputs carry (name -> type): every shard must have the same
        info["metadata"] = metadata
    info[ITEMS] = item_identity(options, kind)
    if part_shards is not None:  # how the parts divide the input: every part must agree
        info["part_shards"] = part_shards
    info.update(get_format(settings.format).run_settings(settings, config))
    return {**info, **identity, "input": input_root, "input_kind": kind, "part": str(part),
            "tool_version": __version__}


def divided_by_key(run_dir: str) -> bool:
    """Whether a part of this job array already ran with its items divided by key (its run.json has
    no ``part_shards``: an input with fewer shards than parts, not sharded at all, or an OUT begun
    before parts took whole shards): the other parts then divide by key too, so one OUT never mixes
    the two divisions (its union would lose or repeat items)."""
    return any((info := read_run_info(d)) is not None and "part_shards" not in info
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
    old = read_run_info(run_dir)
    if old is None or old.get("input_identity") == info.get("input_identity"):
        return []
    rewritten = rewritten_shards(old.get("input_identity"), info.get("input_identity")) or []
    if rewritten and not part.whole and "part_shards" not in info:
        raise OutputError("--reencode-changed: this job array's parts divide their items by key, and each records "
                          "every input shard; re-encode into a new OUT (or use parts of whole shards)")
    return rewritten


def load_identity(settings: Settings):
    """Load the model once on CPU: validates the weights up front and hashes them."""
    from transformers.models.mimi.modeling_mimi import MimiModel

    model = from_pretrained(MimiModel, settings.model, attn_implementation="sdpa").eval()
    config = model.config
    if settings.tap == "codes":
        low, high = config.num_semantic_quantizers, config.num_quantizers
        if not low <= settings.num_quantizers <= high:
            raise ValueError(f"--num-quantizers must be in {low}..{high} for this model "
                             f"({low} semantic + {high - low} acoustic codebooks)")
    if Framing.of(settings).stream_frames is not None:
        PaddedMimiEncoder(model, Framing.of(settings).stream_frames)  # refuses more steps per call than the window
    return model, config, {"config_hash": config_hash(config), "weights": weights_hash(model)}


def refuse_changed_inputs(items: list[Item], done: dict[str, dict]) -> None:
    """Refuse to resume over inputs whose file changed since they were encoded (same key, another
    sample rate, length or channel count): their stored outputs would silently describe old audio."""
    def shape(rate, frames, channels) -> str:
        return f"{rate} Hz, {frames} samples, {channels} channel(s)"

    changed = []
    for it in items:
        row = done.get(it.key)
        src = row.get("source") if row else None
        if not src:
            continue
        was = (row.get("sample_rate"), src.get("frames"), src.get("channels"))
        now = (it.sample_rate, it.file_frames, it.file_channels)
        if was != now:
            changed.append(f"{it.key}: {shape(*was)} when encoded, now {shape(*now)}")
    if changed:
        raise OutputError(f"{len(changed)} input file(s) changed since they were encoded ({changed[0]}"
                          + (f"; and {len(changed) - 1} more" if len(changed) > 1 else "")
                          + "); their stored outputs no longer match: encode into a new OUT directory")


class NoInputError(ValueError):
    """INPUT holds nothing to encode (found before OUT is touched: such a run leaves nothing behind)."""


def no_input_message(source: str) -> str:
    what = (" (it is a mimi-extract OUT: give the audio it was made from)"
            if os.path.isfile(os.path.join(source, "run.json")) else "")
    return (f"no input found in {source}{what}: a directory is searched for audio files (wav, flac, mp3, ogg, ...); "
            "a list or lhotse manifest names them; nothing was written")


def as_before(request: RunRequest) -> RunRequest:
    """A resume of an OUT made before 0.3 goes on as that OUT was made, so it never mixes two rules:
    a list input's rows keyed as written (its run.json records no ``--list-keys``; else every item
    would be stored again under a new key: ``sources.item_identity``), and items cut to the exact
    24 kHz length (no ``resampled_length``: ``audio.Framing.length``).  Other requests as they are."""
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
    info = run_info(request.settings, {}, found.root, found.kind, part, found.identity, found.metadata,
                    request.options, found.part_shards)
    if request.reencode_changed and os.path.isdir(run_dir) and rewritten_since(run_dir, info, part):
        info["input_identity"] = read_run_info(run_dir)["input_identity"]  # (moved on under the lock)
    del info["model"]  # the model (its path, config and weights) is compared as one, once it is loaded
    check_run_info(run_dir, info, siblings, write=False)
    old = read_run_info(run_dir) if os.path.isdir(run_dir) else None
    if old is None or ITEMS in old:
        return
    stored = [r["key"] for r in committed_rows(run_dir) if r.get("status") == "ok"]
    keys = {it.key for it in found.items} | {it.key for it in found.bad}
    if stored and keys and keys.isdisjoint(stored):
        raise OutputError(f"{run_dir} holds {len(stored)} items and none of them is among this run's {len(keys)} "
                          f"inputs (stored {stored[0]!r}, now {min(keys)!r}): they were keyed by other input options "
                          f"(--id-column, --id-field, ...), so every item would be stored twice; resume with the "
                          "options that made OUT, or use a new OUT directory")


class _Signals:
    """SIGINT/SIGTERM -> ``stop`` (commit and exit cleanly); a second one exits at once."""

    def __init__(self, stop: threading.Event, on_signal=None):
        self.stop, self.on_signal, self.old = stop, on_signal, {}
        self.received: str | None = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.stop.is_set():
            sys.stderr.write(f"\n{name} again: stopping now; the shard in progress is discarded. "
                             "OUT is consistent: run the same command to resume.\n")
            sys.stderr.flush()
            os._exit(130)
        self.received = name
        self.stop.set()
        if self.on_signal:
            self.on_signal(name)

    def __exit__(self, *exc):  # OUT is committed by now: the caller's own handlers take over again
        for sig, handler in self.old.items():
            signal.signal(sig, handler)


def extract(source: str, out_dir: str, settings: Settings, *, on_plan=None, on_progress=None, on_signal=None,
            stop: threading.Event | None = None, on_phase=None, **asked) -> dict:
    """:func:`run_request` of ``RunRequest(source, out_dir, settings, **asked)`` (``options``,
    ``part``, ``limit``, ``shard_size``...: the request's fields)."""
    return run_request(RunRequest(source, out_dir, settings, **asked), on_plan=on_plan, on_progress=on_progress,
                       on_signal=on_signal, stop=stop, on_phase=on_phase)


def run_request(request: RunRequest, *, on_plan=None, on_progress=None, on_signal=None,
                stop: threading.Event | None = None, on_phase=None, on_commit=None) -> dict:
    """Encode every item of ``request.source`` (or of its part) into ``request.out_dir``; resumes.

    ``on_plan(summary)`` is called once the work is planned, ``on_progress(items, seconds, errors)``
    as pieces are written, ``on_signal(name)`` on the first SIGINT/SIGTERM, ``on_phase(text)`` as each
    start-up phase begins (loading the model, finding inputs, planning).  ``request.reencode_damaged``:
    first read every stored item of the run directory and check its checksums; shards holding a
    damaged one are quarantined and their items encoded again.  ``request.reencode_changed``: see
    ``RunDirectory.check_identity``.  ``on_commit()``: called after each shard is committed.  An
    ``out_dir`` on object storage (``s3://...``) is staged on local disk and mirrored to it after
    each commit (``mirror.py``).  Returns counts."""
    if remote.is_url(request.out_dir):
        return extract_remote(request.out_dir, None if request.part.whole else request.part.dirname,
                              lambda staging, on_commit: run_request(
                                  replace(request, out_dir=staging), on_plan=on_plan, on_progress=on_progress,
                                  on_signal=on_signal, stop=stop, on_phase=on_phase, on_commit=on_commit))
    stop = stop or threading.Event()
    on_phase = on_phase or (lambda text: None)
    request = as_before(request)
    source, out_dir, settings, part = request.source, request.out_dir, request.settings, request.part
    # the input first: finding it checks it and its options (a wrong column or sidecar field is one
    # clear error), so a run that finds nothing, or cannot resume OUT, stops before it creates or
    # locks OUT and before any model is loaded
    on_phase(f"finding inputs in {source} and reading their headers")
    # parts of a job array over a sharded input take whole shards (only theirs are indexed), unless
    # --limit (the first N inputs of the whole input), --shar-extend (its own rule), or a part of
    # this OUT already divided by key
    by_shard = (not part.whole and not settings.shar_extend and request.limit is None
                and not divided_by_key(os.path.join(out_dir, part.dirname)))
    found = discover(source, settings.channel, Framing.of(settings), request.limit, exclude=out_dir,
                     options=request.options, part=(part.index, part.count) if by_shard else None)
    if not found.items and not found.bad:
        raise NoInputError(no_input_message(source))
    refuse_other_run(request, found)
    fresh = not os.path.exists(out_dir)
    run = RunDirectory.open(out_dir, *(() if part.whole else (part.dirname, part.count)))
    started = False
    try:
        with _Signals(stop, on_signal) as signals:
            summary = _extract_locked(found, request, run, on_plan, on_progress, stop, on_phase, on_commit)
            started = True
            summary["interrupted"] = signals.received if stop.is_set() else None
            return summary
    finally:
        run.close(remove_if_unused=not started and fresh)  # a run that never started leaves no OUT behind


def _extract_locked(found: Discovered, request: RunRequest, run: RunDirectory, on_plan, on_progress, stop,
                    on_phase, on_commit=None) -> dict:
    settings = request.settings
    on_phase(f"starting {len(settings.devices)} encoder worker(s) on {', '.join(sorted(set(settings.devices)))}"
             if settings.engine == "local" else f"starting the {settings.engine} engine")
    engine = make_engine(settings)  # first: worker processes load the weights while we check them
    try:
        return _extract_with(engine, found, request, run, on_plan, on_progress, stop, on_phase, on_commit)
    finally:
        engine.close()


def _extract_with(engine: Engine, found: Discovered, request: RunRequest, run: RunDirectory, on_plan, on_progress,
                  stop, on_phase=lambda text: None, on_commit=None) -> dict:
    settings, part, options = request.settings, request.part, request.options
    get_format(settings.format).require()  # its library installed, before anything is encoded
    on_phase(f"loading the model {settings.model} and hashing its weights")
    model, config, identity = load_identity(settings)
    on_phase(f"planning {len(found.items)} readable inputs ({len(found.bad)} unreadable)")
    items, bad = found.items, found.bad
    fmt = get_format(settings.format)
    refused = {it.key: why for it in items if (why := fmt.key_problem(it.key))}
    if refused:  # keys the output format cannot store (a Shar cut id): error rows, not a crash mid-run
        bad = bad + [replace(it, error=refused[it.key]) for it in items if it.key in refused]
        items = [it for it in items if it.key not in refused]
    if not part.whole and not settings.shar_extend and found.part_shards is None:  # (else whole input shards)
        items = [it for it in items if part_of(it.key, part.count) == part.index]
        bad = [it for it in bad if part_of(it.key, part.count) == part.index]
    layout, warnings = None, list(found.warnings)
    if settings.shar_extend:  # a new field for the input's Shar shards, one tar each
        from ..store.shar_extend import plan_extend

        mine = None if part.whole else (lambda n: part_of(f"shar-shard-{n}", part.count) == part.index)
        layout, items, bad, more = plan_extend(request.source, found.kind, items, bad, mine, settings.format)
        warnings += more
    attrs = file_attrs(settings, config, identity, found.metadata)
    info = run_info(settings, identity, found.root, found.kind, part, found.identity, found.metadata, options,
                    found.part_shards, config)
    requeued = run.check_identity(info, attrs, fmt, rewritten_since(run.path, info, part) if request.reencode_changed
                                  else [])
    damaged = None
    if request.reencode_damaged:
        on_phase("reading every stored item to check its checksums (--reencode-damaged)")
        damaged = run.damaged_shards()
    done, notes = run.recover(attrs, fmt, damaged)
    notes = requeued + notes
    refuse_changed_inputs(items, done)
    run.write_plan(len(items) + len(bad), sum(it.duration for it in items), str(part))

    todo = [it for it in items if it.key not in done]
    skipped = len(items) - len(todo) + sum(it.key in done for it in bad)  # this run's inputs already stored
    bad = [it for it in bad if it.key not in done]
    planned = engine.plan_settings  # a Ray cluster's actors decide the unit sizes
    count, streamed = len(todo), sum(it.samples > planned.chunk_samples() for it in todo)
    split = Split()
    if settings.split and layout is None:  # (--shar-extend plans shard by shard: whole items)
        encoder = PaddedMimiEncoder(model)
        if encoder.window is not None:
            # lanes: streams that run side by side (a step holds as many full chunks as its budget allows)
            per_device = max(1, min(planned.rows, int(planned.step_seconds * SAMPLE_RATE) // planned.chunk_samples()))
            todo, split = split_items(todo, len(planned.devices) * per_device, encoder.receptive_field, encoder.hop)
        del encoder

    def plan(todo: list[Item]) -> list:
        groups: dict[int, list[Item]] = {}
        for it in todo:  # a compressed tar is sorted within each buffer-full only (see sources/tgz.py)
            groups.setdefault(plan_group(it), []).append(it)
        units = [u for g in sorted(groups) for u in plan_units(groups[g], planned.chunk_samples(), planned.step_seconds,
                                                                planned.rows,
                                                                long_group=planned.rows if settings.engine == "ray" else 1)]
        for i, u in enumerate(units):
            u.index = i
        return units

    if layout is not None:  # --shar-extend: shard by shard (extend_units renumbers)
        from ..store import shar_extend

        units = shar_extend.extend_units(todo, layout, plan)
    else:
        units = plan(todo)
    short = [u.items for u in units if not u.stream]
    summary = {
        "run_dir": run.path, "inputs": len(items) + len(bad), "skipped": skipped, "todo": count,
        "unreadable": len(bad), "units": len(units), "streamed": streamed,
        "seconds": sum(it.samples for it in todo) / SAMPLE_RATE, "padding": padding_fraction(short),
        "ok": 0, "errors": 0, "notes": notes, "warnings": warnings, "frame_rate": frame_rate(settings.tap, config),
        "devices": planned.devices, "stats": Stats(), "engine_notes": [],
        "engine": engine.describe(), "split": split,
    }
    if on_plan:
        on_plan(summary)
    if stop.is_set():
        return summary
    if layout is not None:
        writer = run.extend_writer(fmt, attrs, layout)
    else:
        writer = run.writer(fmt, attrs, request.shard_size, int(request.shard_mb * 2**20), on_commit)
    attrs_of = lambda it: {"duration": it.duration, "source_sample_rate": it.sample_rate,  # noqa: E731
                           **({"start": it.segment[0], "end": it.segment[1]} if it.segment else {})}
    pieces = None
    try:
        for it in bad:
            writer.add_error(ManifestRow.for_item(it), it.error)
        summary["errors"] += len(bad)
        if on_progress:
            on_progress(len(bad), sum(it.samples for it in bad) / SAMPLE_RATE, len(bad))
        started = time.perf_counter()
        startup = summary["startup"] = {"to_encoding": process_age(), "to_first_result": None}
        pieces = engine.run(units, stop, model)
        del model
        assembler = Assembler()  # pieces -> whole items: nothing of an item is stored before it is whole
        for piece in pieces:
            if startup["to_first_result"] is None:
                startup["to_first_result"] = process_age()
            whole = assembler.add(piece)
            if whole is None:
                if on_progress:
                    on_progress(0, piece.seconds, 0)
                continue
            item = whole.item
            if whole.error is not None:
                writer.add_error(ManifestRow.for_item(item), whole.error)
                summary["errors"] += 1
            else:
                writer.add(item.key, whole.data, ManifestRow.for_item(item, whole.warnings), attrs_of(item))
                summary["ok"] += 1
            if on_progress:
                on_progress(1, piece.seconds, int(whole.error is not None))
        writer.close()
    except BaseException:
        if pieces is not None:
            pieces.close()  # stops the engine's workers
        writer.abort()
        try:
            writer.close()
        except OutputError:
            pass
        raise
    summary["engine_notes"] = engine.notes
    summary["held_peak_bytes"] = getattr(writer, "peak_held_bytes", None)  # --shar-extend: outputs held at once
    summary["stats"] = stats = engine.stats
    run.finish(fmt, {  # this run's timing, for bench and users
        "wall": stats.wall, "busy": stats.busy, "wait_input": stats.wait_input, "wait_output": stats.wait_output,
        "idle_fraction": stats.idle_fraction, "steps": stats.steps, "padding": stats.padding_fraction,
        "elapsed": time.perf_counter() - started, "workers": len(settings.devices), "seconds": summary["seconds"], "ok": summary["ok"],
        "interrupted": stop.is_set(), "startup": startup})  # interrupted too: the cuts of what is committed
    return summary


def process_age() -> float | None:
    """Seconds since this process started (Linux's /proc; None elsewhere): where a short job's time
    goes is mostly before its first encoded step (imports, weights), so the run reports it."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return round(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, ValueError, IndexError):
        return None

