"""One extraction run, a plain pipeline: find the inputs, refuse another run's OUT, lock OUT, start the
engine, load the model, begin on the run directory (identity, recovery, plan), plan the work units,
encode, write, finish, report.

The caller's thread holds OUT's lock and commits every shard; engines (``engines/``) encode in threads,
processes or Ray actors and hand back frame chunks, which it stores, or (device worker processes) build
and write whole shards themselves, in parallel, and hand back their rows, which it commits in order.  SIGINT/SIGTERM stop the engines, commit exactly the items that
were completely encoded, and leave OUT ready to resume; a second signal exits at once (OUT is
still consistent: the commit protocol survives any kill).  What the run directory holds and how it
is checked is the store's (:class:`~mimi_extract.store.directory.RunDirectory`); what a run writes
(every item, or ``--shar-extend``'s field) is a mode (``modes``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import closing
from dataclasses import replace

from ..audio.framing import Framing
from ..codec.encoder import PaddedMimiEncoder
from ..codec.model import ModelIdentity, from_pretrained
from ..common import remote
from ..config.choices import SAMPLE_RATE
from ..config.request import RunRequest
from ..config.settings import Settings
from ..config.taps import frame_rate
from ..engines import make_engine
from ..engines.assembly import Assembler
from ..engines.base import Progress
from ..engines.plan import padding_fraction
from ..formats import get_format
from ..sources import Discovered, discover
from ..store.directory import RunDirectory
from ..store.lock import start_ticks
from ..store.manifest import ManifestRow, item_attrs
from ..store.mirror import mirrored
from ..store.writer import PreparedShard
from .modes import mode_of
from .summary import RunSummary


def load_identity(settings: Settings):
    """Load the model once on CPU: validates the weights up front and hashes them; returns (model,
    :class:`~mimi_extract.codec.model.ModelIdentity`)."""
    from transformers.models.mimi.modeling_mimi import MimiModel

    model = from_pretrained(MimiModel, settings.model, attn_implementation="sdpa").eval()
    _check_codebooks(settings, model.config)
    stream_frames = Framing.of(settings).stream_frames
    if stream_frames is not None:
        PaddedMimiEncoder(model, stream_frames)  # refuses more steps per call than the window
    return model, ModelIdentity.of(model)


def _check_codebooks(settings: Settings, config) -> None:
    """``-q`` within the model's codebooks (at least its semantic ones): ValueError if not."""
    if settings.tap == "codes":
        low, high = config.num_semantic_quantizers, config.num_quantizers
        if not low <= settings.num_quantizers <= high:
            raise ValueError(f"--num-quantizers must be in {low}..{high} for this model "
                             f"({low} semantic + {high - low} acoustic codebooks)")


def check_model_config(settings: Settings) -> None:
    """What the model's config alone refuses (``-q`` past its codebooks), from its ``config.json``
    (no weights), before OUT is created or locked: a run refused for it leaves nothing behind (it
    left a lock file in an empty OUT, after loading the weights)."""
    if settings.tap == "codes":
        from transformers import MimiConfig

        _check_codebooks(settings, from_pretrained(MimiConfig, settings.model))


class NoInputError(ValueError):
    """INPUT holds nothing to encode (found before OUT is touched: such a run leaves nothing behind)."""


def no_input_message(source: str) -> str:
    what = (" (it is a mimi-extract OUT: give the audio it was made from)"
            if os.path.isfile(os.path.join(source, "run.json")) else "")
    return (f"no input found in {source}{what}: a directory is searched for audio files (wav, flac, mp3, ogg, ...); "
            "a list or lhotse manifest names them; nothing was written")


class _Signals:
    """SIGINT/SIGTERM -> ``stop`` (commit and exit cleanly); a second one exits at once."""

    def __init__(self, stop: threading.Event, on_signal=None, leave=os._exit):
        self.stop, self.on_signal, self.old = stop, on_signal, {}
        self.leave = leave  # how a second signal ends the process: at once, committing nothing more
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
            self.leave(130)
        self.received = name
        self.stop.set()
        if self.on_signal:
            self.on_signal(name)

    def __exit__(self, *exc):  # OUT is committed by now: the caller's own handlers take over again
        for sig, handler in self.old.items():
            signal.signal(sig, handler)


def run_request(request: RunRequest, *, on_plan=None, on_progress=None, on_signal=None,
                stop: threading.Event | None = None, on_phase=None, on_commit=None) -> RunSummary:
    """Encode every item of ``request.source`` (or of its part) into ``request.out_dir``; resumes.

    ``on_plan(summary)`` is called once the work is planned, ``on_progress(items, seconds, errors)``
    as frame chunks arrive, ``on_signal(name)`` on the first SIGINT/SIGTERM, ``on_phase(text)`` as each
    start-up phase begins (loading the model, finding inputs, planning).  ``request.reencode_damaged``:
    first read every stored item of the run directory and check its checksums; shards holding a
    damaged one are quarantined and their items encoded again.  ``request.reencode_changed``: see
    ``RunDirectory.check_identity``.  ``on_commit()``: called after each shard is committed.  An
    ``out_dir`` on object storage (``s3://...``) is staged on local disk and mirrored to it after
    each commit (``store.mirror.mirrored``).  Returns the :class:`RunSummary`."""
    callbacks = dict(on_plan=on_plan, on_progress=on_progress, on_signal=on_signal, stop=stop, on_phase=on_phase)
    if not remote.is_url(request.out_dir):
        return _run(request, on_commit=on_commit, **callbacks)
    check_model_config(request.settings)  # (before the lock object: _run checks it again, in no time)
    with mirrored(request.out_dir, None if request.part.whole else request.part.dirname) as staged:
        summary = _run(replace(request, out_dir=staged.path), on_commit=staged.push, **callbacks)
    return replace(summary, remote=staged.url, staging=staged.path, engine_notes=summary.engine_notes + staged.notes)


def _run(request: RunRequest, on_plan, on_progress, on_signal, stop, on_phase, on_commit) -> RunSummary:
    stop = stop or threading.Event()
    on_phase = on_phase or (lambda text: None)
    request = RunDirectory.as_before(request)
    source, out_dir, settings, part = request.source, request.out_dir, request.settings, request.part
    mode = mode_of(request)
    # the input first: finding it checks it and its options (a wrong column or sidecar field is one
    # clear error), so a run that finds nothing, or cannot resume OUT, stops before it creates or
    # locks OUT and before any model is loaded
    on_phase(f"finding inputs in {source} and reading their headers")
    # parts of a job array over a sharded input take whole shards (only theirs are indexed), unless
    # --limit (the first N inputs of the whole input), --shar-extend (its own rule), or a part of
    # this OUT already divided by key
    by_shard = (not part.whole and mode.parts_by_shard and request.limit is None
                and not RunDirectory.divided_by_key(os.path.join(out_dir, part.dirname)))
    found = discover(source, settings.channel, Framing.of(settings), request.limit, exclude=out_dir,
                     options=request.options, part=(part.index, part.count) if by_shard else None)
    if not found.items and not found.bad:
        raise NoInputError(no_input_message(source))
    # each GPU's feeding processes: by default as many as this corpus's codecs want (an MP3 corpus more than a FLAC one;
    # the mix, a pass over every item, only where it is used)
    settings = settings.fed(found.codec_mix if settings.on_gpu and settings.feeders_per_gpu is None else None)
    request = replace(request, settings=settings)
    RunDirectory.refuse_other_run(request, found)
    check_model_config(settings)
    with RunDirectory.open(out_dir, part) as run, _Signals(stop, on_signal) as signals:
        on_phase(f"starting {len(settings.devices)} encoder worker(s) on {', '.join(sorted(set(settings.devices)))}"
                 if settings.engine == "local" else f"starting the {settings.engine} engine")
        with make_engine(settings) as engine:  # first: worker processes load the weights while we check them
            summary = _encode(found, request, mode, run, engine, on_plan, on_progress, stop, on_phase, on_commit)
        summary.interrupted = signals.received if stop.is_set() else None
        return summary


def _encode(found: Discovered, request: RunRequest, mode, run: RunDirectory, engine, on_plan, on_progress, stop,
            on_phase, on_commit) -> RunSummary:
    settings = request.settings
    fmt = get_format(settings.format)
    fmt.require()  # its library installed, before anything is encoded
    on_phase(f"loading the model {settings.model} and hashing its weights")
    model, identity = load_identity(settings)
    on_phase(f"planning {len(found.items)} readable inputs ({len(found.bad)} unreadable)")
    items, bad = found.items, found.bad
    refused = {it.key: why for it in items if (why := fmt.key_problem(it.key))}
    if refused:  # keys the output format cannot store (a Shar cut id): error rows, not a crash mid-run
        bad = bad + [replace(it, error=refused[it.key]) for it in items if it.key in refused]
        items = [it for it in items if it.key not in refused]
    items, bad, warnings = mode.select(found, items, bad)
    begun = run.begin(found, request, identity, items, bad, on_phase)

    todo = [it for it in items if it.key not in begun.done]
    skipped = len(items) - len(todo) + sum(it.key in begun.done for it in bad)  # this run's inputs already stored
    bad = [it for it in bad if it.key not in begun.done]
    planned = engine.plan_settings  # a Ray cluster's actors decide the unit sizes
    streamed = sum(it.samples > planned.chunk_samples() for it in todo)
    units, split = mode.plan(engine, todo, model)
    summary = RunSummary(
        run_dir=run.path, inputs=len(items) + len(bad), skipped=skipped, todo=len(todo), unreadable=len(bad),
        units=len(units), streamed=streamed, seconds=sum(it.samples for u in units for it in u.items) / SAMPLE_RATE,
        padding=padding_fraction([u.items for u in units if not u.stream]), frame_rate=frame_rate(settings.tap, identity.config),
        devices=planned.devices, engine=engine.describe(), split=split, notes=begun.notes,
        warnings=list(found.warnings) + warnings)
    if on_plan:
        on_plan(summary)
    if stop.is_set():
        return summary
    with mode.writer(run, fmt, begun.attrs, on_commit) as writer:
        for it in bad:
            writer.add_error(ManifestRow.for_item(it), it.error)
        summary.errors += len(bad)
        if on_progress:
            on_progress(len(bad), sum(it.samples for it in bad) / SAMPLE_RATE, len(bad))
        started = time.perf_counter()
        startup = summary.startup = {"to_encoding": process_age(), "to_first_result": None}
        with closing(engine.run(units, stop, model, mode.worker_shards(writer))) as chunks:  # (closed: stops the workers)
            del model
            assembler = Assembler()  # chunks -> whole items: nothing of an item is stored before it is whole
            for chunk in chunks:
                if startup["to_first_result"] is None:
                    startup["to_first_result"] = process_age()
                if isinstance(chunk, PreparedShard):  # a worker built and wrote it: commit it
                    if writer.commit_prepared(chunk):
                        summary.ok += len(chunk.rows)
                        if on_progress:
                            on_progress(len(chunk.rows), chunk.seconds, 0)
                    continue
                if isinstance(chunk, Progress):
                    if on_progress:
                        on_progress(0, chunk.seconds, 0)
                    continue
                whole = assembler.add(chunk)
                if whole is None:
                    if on_progress:
                        on_progress(0, chunk.seconds, 0)
                    continue
                item = whole.item
                if whole.error is not None:
                    writer.add_error(ManifestRow.for_item(item), whole.error)
                    summary.errors += 1
                else:
                    writer.add(item.key, whole.data, whole.row(), item_attrs(item))
                    summary.ok += 1
                if on_progress:
                    on_progress(1, chunk.seconds, int(whole.error is not None))
    summary.engine_notes = engine.notes
    summary.held_peak_bytes = getattr(writer, "peak_held_bytes", None)  # --shar-extend: outputs held at once
    summary.stats = stats = engine.stats
    run.finish(fmt, {  # this run's timing, for bench and users
        "wall": stats.wall, "busy": stats.busy, "wait_input": stats.wait_input, "wait_output": stats.wait_output,
        "idle_fraction": stats.idle_fraction, "steps": stats.steps, "padding": stats.padding_fraction,
        "elapsed": time.perf_counter() - started, "workers": len(settings.devices), "seconds": summary.seconds,
        "ok": summary.ok, "interrupted": stop.is_set(), "startup": startup})  # interrupted too: the cuts of what is committed
    return summary


def process_age() -> float | None:
    """Seconds since this process started (Linux's /proc; None elsewhere): where a short job's time
    goes is mostly before its first encoded step (imports, weights), so the run reports it."""
    try:
        started = start_ticks()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return round(uptime - started / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, ValueError, IndexError):
        return None

