"""Command line: ``mimi-extract features | codes | verify | status | info | report | cuts | decode``.

Parsing and printing only: ``request`` turns the options into a run request, and the work happens
in ``runner``, ``verify`` and ``outputs``.  The options that ``features`` and ``codes`` share are
declared once (``RUN_OPTIONS``, ``INPUT_OPTIONS``; ``verify`` takes the input ones).  Every string that can
hold a path or an error message is printed as plain text (never as rich markup), so a file named
``[bold]x.wav`` is shown as it is and ``[/x]`` cannot crash the program.

Heavy modules (torch, transformers: seconds to import) are imported inside the commands that
encode, so ``--help``, ``--version``, ``info``, ``status`` and ``cuts`` answer in well under a second;
the choices offered come from the torch-free ``choices``.

Exit codes (also in ``--help``): 0 done; 1 ``--strict`` and some input failed, or ``verify`` found
a difference; 2 usage error, or OUT or the model unusable (an OUT that is missing, not a run, malformed --
its file and line named, one line, never a traceback -- or unreachable); 3 no input found; 4 every input
failed; 5 the address-space limit (``ulimit -v``) is too small for torch (see ``_limits``); 130
interrupted (what was encoded is committed: run the same command to resume).
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time
from enum import Enum
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .._version import __version__
from . import limits
from ..config.choices import (CHANNEL_MODES, DTYPES, ENGINES, FEATURE_DTYPES, FRAMINGS, KEY_MODES, LIST_KEY_MODES,
                              MAX_TOKEN_ID, RESAMPLE_ON, RESAMPLERS, SIDECAR_DURATION_MODES, TOKEN_LAYOUTS)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_INPUT, EXIT_ALL_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_ADDRESS_SPACE = limits.EXIT_ADDRESS_SPACE
EXIT_CODES_HELP = ("Exit codes: 0 done (error rows allowed unless --strict); 1 --strict and some input failed, "
                   "or verify found a difference; 2 usage error, OUT or model unusable (OUT missing, not a run, malformed: "
                   "the file and line are named, or unreachable); 3 no input found; "
                   "4 every input failed; 5 the address-space limit (ulimit -v) is too small for torch; "
                   "130 interrupted (run the same command to resume).")
PROGRESS_ENV = "MIMI_EXTRACT_PROGRESS_SECONDS"

# --help written to a file or a pipe (not a terminal) is laid out this wide, not rich's 80 columns, which
# cut option names and help short ("--max-batch-secon…"); TERMINAL_WIDTH (typer's) or COLUMNS still decide
HELP_WIDTH = 120


def _help_width() -> None:
    from typer import rich_utils

    if rich_utils.MAX_WIDTH is None and "COLUMNS" not in os.environ and not sys.stdout.isatty():
        rich_utils.MAX_WIDTH = HELP_WIDTH


_help_width()

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode="rich",
    help="Bulk Mimi (Kyutai neural audio codec) feature/code extraction into HDF5, Parquet, lhotse Shar or Megatron shards, "
    "padding-aware: a file encoded in a padded batch gives what it gives alone.\n\n" + EXIT_CODES_HELP,
)
console = Console(stderr=True, highlight=False)


def say(*parts: str | tuple[str, str], out: Console | None = None) -> None:
    """Print plain strings and (text, style) pairs; nothing is parsed as markup."""
    (out or console).print(Text.assemble(*parts), soft_wrap=True)


def _choices(name: str, values) -> type[Enum]:
    """A str Enum of the values a module defines (``choices``), so the CLI's choices cannot drift from them."""
    return Enum(name, {v: v for v in values}, type=str)


Tap = _choices("Tap", ("encoder", "latent"))  # codes have their own command
Channel = _choices("Channel", CHANNEL_MODES)
DType = _choices("DType", DTYPES)
FeatureDType = _choices("FeatureDType", FEATURE_DTYPES)
FramingOpt = _choices("FramingOpt", FRAMINGS)
EngineOpt = _choices("EngineOpt", ENGINES)
Resampler = _choices("Resampler", RESAMPLERS)
TokenLayout = _choices("TokenLayout", TOKEN_LAYOUTS)
ResampleOn = _choices("ResampleOn", RESAMPLE_ON)


def _format_choices() -> type[Enum]:
    from ..formats import names  # the registry: a new format module is offered without touching the CLI

    return _choices("OutFormat", names())


OutFormat = _format_choices()


InputArg = Annotated[str, typer.Argument(metavar="INPUT", help="A directory (searched recursively), a list "
                                         "(.txt/.jsonl/.csv: path[,id,start,end|duration,channel]; a NeMo manifest.json), a lhotse "
                                         "manifest (recordings/cuts/supervisions .jsonl.gz), tar shards (a .tar, a "
                                         "folder of them, or a pattern: 'shards/en-{000000..000123}.tar'), Parquet "
                                         "(a .parquet, a folder of them, a datasets save_to_disk folder) or a lhotse "
                                         "Shar folder (cuts.*.jsonl.gz + recording.*.tar).")]
OutArg = Annotated[str, typer.Argument(metavar="OUT", help="Output directory (shards + manifest.jsonl + cuts.jsonl.gz).")]
DTypeOpt = Annotated[DType, typer.Option(help="Compute dtype; bf16/fp16 only on GPU. fp32 is the exact path.")]
ChannelOpt = Annotated[Channel, typer.Option(help="Multichannel files: mix = mean of channels, first, each = one entry per channel (key#chN).")]
ResamplerOpt = Annotated[Resampler, typer.Option(help="Resampler to 24 kHz: torchaudio = torchaudio.functional.resample's sinc, for every rate (what a torchaudio + MimiModel loop computes); causal = 16 kHz input delayed by the filter's look-ahead (8 samples), so no output sample depends on future input. Recorded in run.json (causal_16k).")]
ResampleOnOpt = Annotated[ResampleOn, typer.Option(help="Where input is resampled to 24 kHz: host = the decoding threads; device = the encoder's device (a GPU), the host sending native-rate samples (int16 for 16-bit PCM): the same kernel in fp32, equal to float noise, and about half the host's CPU per audio second; auto = device on GPU, host on CPU.")]
CausalOpt = Annotated[Optional[bool], typer.Option("--causal-16k/--no-causal-16k", hidden=True, help="Old spelling of --resampler causal / torchaudio.")]
FramingArg = Annotated[FramingOpt, typer.Option(help="transformers = MimiModel.encode; moshi = moshi's non-streaming encode (zero-padded to whole 1920-sample frames); moshi-stream = moshi's streaming encode fed --frames-per-call frames per call (same padding; differs from non-streaming past the 250-step attention window, 10 s); muvap = the MuVAP front end (16 kHz delayed 16 samples, round(1.5n), pad to 960).")]
FramesPerCallOpt = Annotated[int, typer.Option(min=1, help="--framing moshi-stream: 1920-sample frames per moshi streaming encode call (the codes depend on it past 10 s); an item that is not a whole number of calls gets its last call zero-padded to N frames.")]
LimitOpt = Annotated[Optional[int], typer.Option(min=1, help="Only the first N inputs (a directory's sorted by path, a list's or manifest's in its order).")]


def _option(name: str, annotation, default) -> inspect.Parameter:
    """One shared command-line option: the parameter that ``_with_options`` adds to a command."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)


# -- input options (packaged corpora: tar shards, Parquet / HF datasets, lhotse Shar): each one is the field of
# input_options.Options of its name (request.input_options), so a new one is that field and its line here --
_INPUTS = "Input"
SidecarDurationChoice = _choices("SidecarDurationChoice", SIDECAR_DURATION_MODES)
KeyChoice = _choices("KeyChoice", KEY_MODES)
ListKeyChoice = _choices("ListKeyChoice", LIST_KEY_MODES)
INPUT_OPTIONS = [
    _option("input_format", Annotated[Optional[str], typer.Option(rich_help_panel=_INPUTS, help="Read INPUT as this kind instead of detecting it: directory, list, lhotse, tar, tgz (.tar.gz), parquet, shar.")], None),
    _option("audio_ext", Annotated[Optional[str], typer.Option(rich_help_panel=_INPUTS, help="Tar/Shar samples: the member extension(s) that hold the audio, comma-separated (e.g. flac) \\[default: the first member with an audio extension].")], None),
    _option("id_field", Annotated[Optional[str], typer.Option(rich_help_panel=_INPUTS, help="Tar samples: the field of the .json sidecar that holds the id \\[default: key = <shard file name>/<sample key>].")], None),
    _option("audio_column", Annotated[Optional[str], typer.Option(rich_help_panel=_INPUTS, help="Parquet: the audio column \\[default: the first struct of bytes and path, the datasets Audio feature].")], None),
    _option("id_column", Annotated[Optional[str], typer.Option(rich_help_panel=_INPUTS, help="Parquet: the id column \\[default: key = <file>/<row>].")], None),
    _option("sort_buffer_mb", Annotated[float, typer.Option(min=1, rich_help_panel=_INPUTS, help="Compressed tar (.tar.gz/.tgz, no random access): items are length-sorted within groups of this many MiB of the stream, not globally; each encoder process holds at most two groups in memory. Smaller groups pad more (measured: see the README).")], 256.0),
    _option("keep_fields", Annotated[Optional[str], typer.Option("--keep-fields", "--keep-columns", rich_help_panel=_INPUTS, help="Input metadata carried into the outputs (Parquet columns, the cuts' supervisions and custom fields): the fields of tar sidecars and list rows, the columns of Parquet input, a lhotse cut's custom fields. 'a,b' those; 'all' nested values too (as JSON); 'none' nothing (nor a lhotse cut's supervisions) \\[default: every string, number or boolean field]. text/speaker/language/gender become a lhotse supervision over the item. Recorded in run.json.")], None),
    _option("sidecar_duration", Annotated[SidecarDurationChoice, typer.Option(rich_help_panel=_INPUTS, help="A 'duration' with no start/end/offset in a tar sidecar, list row or NeMo manifest: auto = the file's length as the corpus wrote it (rounded, as Emilia's) when within 10 ms of it, so the whole file is encoded, else a segment from 0; segment = always a segment from 0; ignore = not read. Any segment ending past the file's end by <= 10 ms is clamped to the end. Recorded in run.json (items) unless auto.")], SidecarDurationChoice["auto"]),
    _option("list_keys", Annotated[Optional[ListKeyChoice], typer.Option("--list-keys", rich_help_panel=_INPUTS, help="A list's or NeMo manifest's rows without an id: root = keyed by the file's path relative to the corpus root (the list's folder, or the folder holding every file), the same on any machine; written = the path as the list writes it (absolute paths stay absolute; how OUTs made before 0.3 were keyed, and how such an OUT is resumed) \\[default: root]. Recorded in run.json (items).")], None),
    _option("metadata", Annotated[Optional[str], typer.Option("--metadata", metavar="FILE", rich_help_panel=_INPUTS, help="A .tsv/.csv/.jsonl file of fields (transcripts, speakers...) joined to the items by --metadata-key: an item's id, or its file or member stem (abc for en/x/abc.flac). Its fields go where the input's own go (manifest meta, cuts, Parquet columns; chosen by --keep-fields; the input's own field wins). Rows matching no item and items without a row are counted in the run's warnings. Recorded in run.json.")], None),
    _option("metadata_key", Annotated[str, typer.Option("--metadata-key", metavar="COLUMN", rich_help_panel=_INPUTS, help="--metadata: the column holding the id or stem.")], "id"),
    _option("key", Annotated[KeyChoice, typer.Option("--key", rich_help_panel=_INPUTS, help="Keys of items without an id: path = as named (<shard>/<sample>, the list's or directory's relative path); stem = the file or member name up to its first dot (e.g. to join a corpus TSV by utterance id; duplicates become error rows). Recorded in run.json (items) unless path.")], KeyChoice["path"]),
]

# the options of every run command (codes, features), declared once, in --help's order
RUN_OPTIONS = [
    _option("model", Annotated[str, typer.Option("--model", "-m", help="Hub id or local directory (save_pretrained layout).")], "kyutai/mimi"),
    _option("device", Annotated[str, typer.Option(help="auto (all GPUs, else cpu), cpu, cuda, cuda:N, or a list: cuda:0,cuda:1.")], "auto"),
    _option("cpu_workers", Annotated[Optional[int], typer.Option(min=1, help="Encoder processes on CPU \\[default: one per core, single-threaded].")], None),
    _option("feeders_per_gpu", Annotated[Optional[int], typer.Option(min=1, help="Processes feeding each GPU (one GIL each: one process feeds a GPU at ~7,000x real time at most) \\[default: from the cores, the GPUs and the format's single writer: see docs/performance.md].")], None),
    _option("dtype", DTypeOpt, DType["fp32"]),
    _option("batch_size", Annotated[Optional[int], typer.Option(min=1, help="Maximum rows (files or streams) per step \\[default: 64 on GPU, 8 on CPU].")], None),
    _option("max_batch_seconds", Annotated[Optional[float], typer.Option(min=0.1, help="Padded audio seconds per step, rows x longest \\[default: 300 on GPU, 4 on CPU: cache-sized, measured fastest].")], None),
    _option("chunk_seconds", Annotated[Optional[float], typer.Option(min=0.08, help="Files longer than this are streamed in chunks of this many seconds: exact, memory bounded by the chunk \\[default: 30 on GPU, 4 on CPU].")], None),
    _option("num_workers", Annotated[Optional[int], typer.Option(min=0, help="Decoding threads per device (0 counts as 1: decoding always overlaps encoding) \\[default: 2 on CPU; on GPU every core but 2 per GPU: decoding and resampling are the host's main work].")], None),
    _option("channel", ChannelOpt, Channel["mix"]),
    _option("resampler", ResamplerOpt, Resampler["torchaudio"]),
    _option("resample_on", ResampleOnOpt, ResampleOn["auto"]),
    _option("causal_16k", CausalOpt, None),
    _option("framing", FramingArg, FramingOpt["transformers"]),
    _option("frames_per_call", FramesPerCallOpt, 1),
    _option("shard_size", Annotated[int, typer.Option(min=1, help="Roll to a new shard after this many utterances.")], 1000),
    _option("shard_mb", Annotated[float, typer.Option(min=1, help="... or after this many MiB of data (a shard is built in memory).")], 256),
    _option("limit", LimitOpt, None),
    _option("strict", Annotated[bool, typer.Option(help="Exit 1 if any input failed (default: error rows, exit 0).")], False),
    _option("part", Annotated[Optional[str], typer.Option(help="Encode part I/N (0-based) of the inputs, by a stable hash of each key, or 'slurm' (SLURM_ARRAY_TASK_ID/COUNT). Over N or more tar/.tar.gz/Parquet/Shar shards (no --limit): whole shards (shard i -> part i % N), and a part opens only its own.")], None),
    _option("engine", Annotated[EngineOpt, typer.Option(help="local = processes on this machine; ray = actors on a Ray cluster (pip install 'mimi-extract\\[ray]').")], EngineOpt["local"]),
    _option("ray_address", Annotated[Optional[str], typer.Option(help="Ray cluster to join: auto, HOST:PORT \\[default: start a private local one].")], None),
    _option("ray_cpu_actors", Annotated[Optional[int], typer.Option(min=1, help="CPU actors on a cluster without GPUs \\[default: CPUs / 2].")], None),
    _option("recordings", Annotated[Optional[str], typer.Option(help="lhotse RecordingSet for a SupervisionSet input.")], None),
    _option("progress_seconds", Annotated[Optional[float], typer.Option(min=0, help=f"When the output is not a terminal (Slurm, nohup, CI): a plain progress line every this many seconds \\[default: ${PROGRESS_ENV} or 30].", show_default=False)], None),
    _option("split", Annotated[bool, typer.Option(help="Split a recording longer than a lane's fair share of the run (lanes: streams run side by side, workers x rows) into independent pieces of that share, run on any worker or row (exact: each piece is encoded from the model's receptive field, 80 s, before its first frame; pieces of at least 8.9 min, so the warm-up costs <= 15%). The plan line says what was split.")], True),
    _option("shar_extend", Annotated[bool, typer.Option("--shar-extend", help="INPUT is a lhotse Shar dataset: add our field to it. Writes only OUT/shar/<field>.NNNNNN.tar, one per input shard, in that shard's cut order (a failed cut: lhotse's placeholder), so CutSet.from_shar(fields={'cuts': INPUT's cuts, 'recording': INPUT's recordings, 'mimi_codes': OUT's tars}) lines up. Implies --format shar; holds about one shard's outputs in memory; with --part I/N, whole input shards are divided among the parts.")], False),
    _option("output_format", Annotated[OutFormat, typer.Option("--format", help="Output format: hdf5 = shard-N.h5 (one dataset per item; lhotse cuts read it in place); parquet = shard-N.parquet (one row per item, zstd; datasets.load_dataset('parquet'), pyarrow, polars; a Hub dataset card); shar = lhotse Shar in OUT/shar/ (cuts.N.jsonl.gz + mimi_codes.N.tar; CutSet.from_shar(in_dir=OUT/shar)); megatron = codes as token ids in Megatron indexed datasets, shard-N.bin/.idx (one document per item; --token-layout, --token-offset; OUT/megatron-data-args.txt for --data-args-path). Recorded in run.json: a resume must use the same.")], OutFormat["hdf5"]),
    _option("reencode_damaged", Annotated[bool, typer.Option("--reencode-damaged", help="Before resuming, read every stored item and check its checksums (bit rot, edited files: what verify --out --checksums lists); shards holding a damaged item are moved to quarantine/ and their items encoded again.")], False),
    _option("reencode_changed", Annotated[bool, typer.Option("--reencode-changed", help="Resume although input shards were rewritten since OUT began (re-downloaded: same names, other size or mtime; nothing else changed): the output shards holding their items are moved to quarantine/ and those items encoded again from the new shards.")], False),
]


class _OneInput(typer.core.TyperCommand):
    """A command whose INPUT is one argument: when the shell expanded an unquoted pattern into
    several (``shards/en-*.tar`` -> many files), click's "unexpected extra argument" says why."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except Exception as e:  # click's UsageError (typer vendors its own click: no one class to name)
            if "unexpected extra argument" in str(getattr(e, "message", "")):
                e.message += (". INPUT is one argument: quote a shard pattern ('shards/en-{000000..000123}.tar' or "
                              "'shards/*.tar') so that the shell does not expand it into many, or give their folder")
            raise


def _with_options(*groups: list[inspect.Parameter], skip: tuple[str, ...] = ()):
    """Give a command the shared options of ``groups`` (but ``skip``) after its own parameters: typer
    reads the signature, and the command receives them as its ``**options``."""
    def add(command):
        own = inspect.signature(command, eval_str=True)
        params = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]
        command.__signature__ = own.replace(parameters=params + [p for g in groups for p in g if p.name not in skip])
        return command

    return add


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


def _fail(message: str | Exception, code: int = EXIT_USAGE):
    """Print ``error: message`` and exit ``code``; an exception that a too-small address space
    (ulimit -v) caused is reported as that, with exit 5."""
    if isinstance(message, BaseException):
        limit = limits.explain(message)
        message, code = (limit, EXIT_ADDRESS_SPACE) if limit else (str(message), code)
    say(("error: ", "bold red"), str(message))
    raise typer.Exit(code)


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class _PlainProgress:
    """Progress for a log file (stdout/stderr not a terminal: Slurm, nohup, CI): one plain line
    every ``every`` seconds, and one at the end, instead of a bar that only a terminal can show."""

    def __init__(self, every: float):
        self.every, self.started, self.last, self.total = every, time.monotonic(), None, 0.0

    def start(self, total: float) -> None:
        self.total, self.started, self.last = total, time.monotonic(), time.monotonic()

    def update(self, state: dict, final: bool = False) -> None:
        now = time.monotonic()
        if self.last is None or (not final and now - self.last < self.every):
            return
        self.last = now
        elapsed = max(now - self.started, 1e-9)
        done, total = state["seconds"], self.total
        speed = done / elapsed
        eta = _clock((total - done) / speed) if speed > 0 and total > done else ("0:00:00" if done >= total else "?")
        pct = 100 * done / total if total > 0 else 100.0
        say(f"[{_clock(elapsed)}] {_hours(done)} / {_hours(total)} audio ({pct:.0f}%), {state['items']} files, "
            f"{speed:.1f}x real time, ETA {eta}, {state['errors']} errors")


def _run(input_path: str, out_dir: str, strict: bool = False, progress_seconds: float | None = None, **values) -> None:
    """Build the run's request from the command line's ``values`` (usage errors: exit 2), run it with
    a progress display, and print the outcome."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from .request import build_request

    try:
        request = build_request(input_path, out_dir, **values)
    except (ValueError, RuntimeError) as e:
        _fail(e)
    from ..run.runner import NoInputError, run_request
    from ..store.files import OutputError

    if progress_seconds is None:
        try:
            progress_seconds = float(os.environ.get(PROGRESS_ENV, 30))
        except ValueError:
            _fail(f"{PROGRESS_ENV}={os.environ[PROGRESS_ENV]!r} is not a number of seconds")
    plain = None if console.is_terminal else _PlainProgress(progress_seconds)
    progress = Progress(
        TextColumn("encoding"), BarColumn(),
        TextColumn("{task.fields[audio]} / {task.fields[total_audio]} audio, {task.fields[items]} files, "
                   "{task.fields[speed]:.1f}x realtime, {task.fields[errors]} errors"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console, disable=plain is not None,
    )
    state = {"seconds": 0.0, "errors": 0, "items": 0}

    def on_phase(text):
        say((f"{time.strftime('%H:%M:%S')} ", "dim"), text)

    def on_plan(s):
        for w in s.warnings:
            say(("warning: ", "yellow"), w)
        for n in s.notes:
            say(("repaired: ", "yellow"), n)
        devices = sorted(set(s.devices))
        on = ", ".join(f"{s.devices.count(d)}x {d}" if s.devices.count(d) > 1 else d for d in devices)
        say(f"{s.inputs} inputs ({s.skipped} already done), {s.unreadable} unreadable, {s.todo} to encode: "
            f"{_hours(s.seconds)} in {s.units} work units ({s.streamed} long files streamed), "
            f"padding {100 * s.padding:.1f}% on " + (s.engine or on))
        if s.split.items:
            sp = s.split
            say(f"split {sp.items} long recording(s) into {sp.pieces} pieces "
                f"(warm-up {100 * sp.overhead:.1f}% of their audio encoded twice)")
        state["total"] = s.seconds
        state["task"] = progress.add_task("encoding", total=max(s.seconds, 1e-9), audio=_hours(0),
                                          total_audio=_hours(s.seconds), items=0, speed=0.0, errors=0)
        if plain is not None:
            plain.start(s.seconds)
        else:
            progress.start()

    def on_progress(items, seconds, errors):
        state["seconds"] += seconds
        state["errors"] += errors
        state["items"] += items
        task = state["task"]
        elapsed = progress.tasks[task].elapsed or 1e-9
        progress.update(task, advance=seconds, audio=_hours(state["seconds"]), speed=state["seconds"] / elapsed,
                        errors=state["errors"], items=state["items"])
        if plain is not None:
            plain.update(state)

    def on_signal(name):
        progress.stop()
        say((f"{name}: ", "yellow"), "stopping; committing what was completely encoded "
            "(press Ctrl-C again to stop at once)...")

    try:
        summary = run_request(request, on_plan=on_plan, on_progress=on_progress, on_signal=on_signal, on_phase=on_phase)
    except KeyboardInterrupt:
        progress.stop()
        say(("interrupted", "yellow"), " before encoding started; run the same command again to resume.")
        raise typer.Exit(EXIT_INTERRUPTED)
    except NoInputError as e:  # found before OUT was touched: nothing written
        _fail(e, EXIT_NO_INPUT)
    except (ValueError, FileNotFoundError, RuntimeError, OSError, OutputError) as e:
        progress.stop()
        _fail(e)
    progress.stop()
    if plain is not None:
        plain.update(state, final=True)
    for n in summary.engine_notes:
        say(("note: ", "yellow"), n)
    stats = summary.stats
    startup = summary.startup or {}
    where = summary.run_dir
    if summary.interrupted:
        say((f"interrupted ({summary.interrupted})", "yellow"),
            f": {summary.ok} items committed to {where}; run the same command again to resume.")
        raise typer.Exit(EXIT_INTERRUPTED)
    say(("done", "green"), f": {summary.ok} ok, {summary.errors} errors, {summary.skipped} skipped "
        f"({summary.frame_rate:g} Hz frames) -> {where}/manifest.jsonl"
        + (f" (staged; mirrored to {summary.remote})" if summary.remote else "")
        + (f"; encoder idle {100 * stats.idle_fraction:.0f}% of {stats.wall:.1f} s" if stats.wall else "")
        + (f"; first result {startup['to_first_result']:.1f} s after start" if startup.get("to_first_result") else ""))
    if summary.errors:
        from ..audit.outputs import run_failures

        _say_common_failures(run_failures(where), summary.inputs)
        say(f"error rows: mimi-extract info {out_dir}  (or grep '\"status\": \"error\"' {where}/manifest.jsonl)")
    if summary.inputs == 0:
        say(("error: ", "bold red"), f"no input found in {input_path}" + (f" (part {request.part})" if not request.part.whole else "")
            + ": a directory is searched for audio files (wav, flac, mp3, ogg, ...); a list or lhotse manifest "
            "names them")
        raise typer.Exit(EXIT_NO_INPUT)
    if summary.errors and summary.ok == 0 and summary.skipped == 0:
        say(("error: ", "bold red"), f"every input failed ({summary.errors} of {summary.inputs})")
        raise typer.Exit(EXIT_ALL_FAILED)
    if summary.errors and strict:
        raise typer.Exit(EXIT_FAILED)


def _say_common_failures(failures: list[dict], inputs: int, out=None) -> None:
    """The reasons many error rows share, each in one prominent line: a systematic rejection (a whole
    format refused, a wrong option) must not read like a clean run's few bad files."""
    for f in failures:
        say(("warning: ", "bold yellow"), f"{f['count']} of {inputs} inputs ({100 * f['share']:.0f}%) failed for one "
            f"reason: ", (f["reason"], "yellow"), f" (first: {', '.join(f['first_keys'])})", out=out)


_RUN_HELP = ("\n\n    Re-running the same command resumes: items already 'ok' in the manifest are skipped; a "
             "second run on the same OUT is refused while the first holds it. Ctrl-C (or SIGTERM) commits "
             "what was completely encoded; a second Ctrl-C stops at once (OUT stays consistent).\n\n    "
             + EXIT_CODES_HELP)


@app.command(cls=_OneInput)
@_with_options(RUN_OPTIONS, INPUT_OPTIONS)
def features(
    input_path: InputArg,
    out_dir: OutArg,
    tap: Annotated[Optional[Tap], typer.Option(help="encoder = 25 Hz before the downsample; latent = 12.5 Hz, pre-quantizer \\[default: latent; encoder with --framing muvap, the features MuVAP models are trained on].", show_default=False)] = None,
    feature_dtype: Annotated[FeatureDType, typer.Option(help="Storage dtype of the features.")] = FeatureDType["float32"],
    **options,
):
    """Continuous Mimi features, one \\[frames, dim] dataset per input.

    [bold]Examples[/]

      mimi-extract features corpus/ feats/                      # 12.5 Hz latents, all GPUs
      mimi-extract features corpus/ feats25/ --tap encoder      # 25 Hz, before the downsample
      mimi-extract features corpus/ feats/ --model ./mimi-local --device cpu
      mimi-extract features vad.jsonl feats/ --framing muvap    # 25 Hz encoder features, as MuVAP
    """
    _run(input_path, out_dir, tap=tap, feature_dtype=feature_dtype, **options)


features.__doc__ += _RUN_HELP


@app.command(cls=_OneInput)
@_with_options(RUN_OPTIONS, INPUT_OPTIONS)
def codes(
    input_path: InputArg,
    out_dir: OutArg,
    num_quantizers: Annotated[int, typer.Option("--num-quantizers", "-q", min=1, max=32, help="Codebooks to keep (1..32).")] = 8,
    token_layout: Annotated[Optional[TokenLayout], typer.Option(help="--format megatron: flat = one sequence per item, per frame codebook 0..N-1, id = offset + codebook x codebook_size + code; per-codebook = one sequence per codebook, id = offset + code (an item's sequences are one document). Recorded in run.json \\[default: flat].", show_default=False)] = None,
    token_offset: Annotated[Optional[int], typer.Option(min=0, max=MAX_TOKEN_ID - 2**16, help="--format megatron: the id of code 0 of codebook 0, so audio ids can sit after a text vocabulary (e.g. 128256 after Llama 3's). Recorded in run.json \\[default: 0].", show_default=False)] = None,
    **options,
):
    """Discrete Mimi codes, one int16 \\[frames, num_quantizers] dataset per input (12.5 Hz).

    [bold]Examples[/]

      mimi-extract codes corpus/ codes/ --num-quantizers 8
      mimi-extract codes corpus/ codes/ -q 32 --device cuda:0,cuda:1 --max-batch-seconds 1200
      mimi-extract codes corpus/ codes/ --part slurm            # one task of sbatch --array=0-15
      mimi-extract codes corpus/ codes/ --engine ray --ray-address auto
      mimi-extract codes corpus/ tokens/ --format megatron --token-offset 128256   # Megatron .bin/.idx
    """
    _run(input_path, out_dir, tap="codes", num_quantizers=num_quantizers, token_layout=token_layout,
         token_offset=token_offset, **options)


codes.__doc__ += _RUN_HELP


def _check_table(title: str, checks, rtol: float, atol: float, max_real: int, features=("encoder", "latent")):
    table = Table(title=Text(title))  # a path: never markup
    cols = ["file", "sec", "frames"] + [f"rel max|Δ| {t}" for t in features] + ["codes ≠ (tie / real)", "first bad frame", "result"]
    for col in cols:
        table.add_column(col, justify="left" if col == "file" else "right", overflow="fold")
    failed = 0
    for c in checks:
        name = Text(c.key + (" (chunked)" if c.chunked else ""))
        if c.error is not None or c.note is not None:
            failed += c.error is not None
            status = Text("error", "bold red") if c.error is not None else Text(
                "unreadable" if c.note.startswith("unreadable") else "skipped", "yellow")
            table.add_row(name, f"{c.duration:.2f}", "-", *["-"] * len(features), "-", "-", status)
            continue
        ok = c.passed(rtol, atol, max_real)
        failed += not ok
        firsts = [v for v in c.first_diverging.values() if v is not None]
        table.add_row(name, f"{c.duration:.2f}", str(c.frames), *[f"{c.relative(t):.1e}" for t in features if t in c.diff]
                      or ["-"] * len(features), f"{c.ties} / {c.real} of {c.code_total}" if c.code_total else "-",
                      str(min(firsts)) if firsts else "-", Text("ok", "green") if ok else Text("FAIL", "bold red"))
    return table, failed


def _mismatch_report(out: Console, checks) -> None:
    for c in checks:
        for m in c.mismatches:
            if m.cascade:
                continue
            kind = "tie flip" if m.tie else "REAL MISMATCH"
            later = sum(1 for o in c.mismatches if o.frame == m.frame and o.cascade)
            say(f"{c.key}: frame {m.frame}, codebook {m.codebook}: {kind} (stored code's distance - nearest "
                f"{m.margin:.3g}, tie bound {m.noise:.3g})" + (f"; {later} later codebooks of that frame follow it" if later
                                                             else ""), out=out)
        if c.error:
            say((c.key, "yellow"), f": {c.error}", out=out)
        elif c.note:
            say((c.key, "yellow"), f": {c.note}", out=out)


@app.command(cls=_OneInput)
@_with_options(INPUT_OPTIONS, skip=("keep_fields",))
def verify(
    input_path: Annotated[Optional[str], typer.Argument(metavar="[INPUT]", help="Files to encode both ways (omit with --out).")] = None,
    out: Annotated[Optional[str], typer.Option("--out", help="Audit this OUT: re-encode a sample of its items one by one and compare with what it holds.")] = None,
    sample: Annotated[int, typer.Option(min=1, help="With --out: items to re-encode (random, --seed).")] = 20,
    seed: int = 0,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Hub id or local directory \\[default: kyutai/mimi, or the model OUT was made with].")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N (auto = first GPU, else cpu).")] = "auto",
    dtype: DTypeOpt = DType["fp32"],
    num_quantizers: Annotated[int, typer.Option("--num-quantizers", "-q", min=1, max=32)] = 8,
    batch_size: Annotated[int, typer.Option(min=1, help="Rows per step of the engine under test.")] = 16,
    max_batch_seconds: Annotated[float, typer.Option(min=0.1, help="Padded audio seconds per step of the engine under test.")] = 120.0,
    chunk_seconds: Annotated[float, typer.Option(min=0.08, help="Files longer than this are streamed in chunks (checked against the unchunked reference); with --out, longer items are re-encoded alone in chunks.")] = 30.0,
    channel: ChannelOpt = Channel["mix"],
    resampler: ResamplerOpt = Resampler["torchaudio"],
    resample_on: ResampleOnOpt = ResampleOn["auto"],
    causal_16k: CausalOpt = None,
    framing: FramingArg = FramingOpt["transformers"],
    frames_per_call: FramesPerCallOpt = 1,
    limit: LimitOpt = 50,
    rtol: Annotated[float, typer.Option(help="Relative feature tolerance: max|Δ| <= rtol * max|reference| + atol, per file; with --out also the latent perturbation a code tie may come from (rtol x |projected latent|).")] = 1e-5,
    atol: Annotated[float, typer.Option(help="Absolute floor of the feature tolerance.")] = 1e-6,
    max_real_mismatches: Annotated[int, typer.Option(min=0, help="Real (non-tie) code mismatches allowed per file.")] = 0,
    checksums: Annotated[bool, typer.Option("--checksums", help="With --out: read every stored item and check its checksums instead (no model, no re-encoding); list the damaged items; exit 1 if any.")] = False,
    **inputs,
):
    """Check outputs against transformers' own single-item MimiModel encode, file by file.

    Without --out: INPUT is encoded through the extraction engine (padded length-sorted batches,
    long files chunked with carried state) and each file alone; the 25 Hz encoder output, the
    12.5 Hz latent and the codes are compared.  With --out: a random sample of what OUT holds is
    re-encoded alone (fp32) and compared with the stored arrays and attributes, whatever device,
    dtype or batch mix made them; a warning says when the installed transformers is not the one
    that made OUT (run.json).

    Codes are judged along the stored codes: in a frame that differs, each codebook's residual is
    the reference latent minus the STORED earlier codes, and each stored code must be the nearest
    codeword to it (a later code that follows an earlier flip), or a [bold]tie flip[/]: its distance
    at most the noise bound farther than the nearest's (reported, not a failure).  The bound is
    2|Δr| + 2 x the float rounding of a distance: |Δr| is the latent's perturbation, measured
    without --out, and rtol x |projected latent| with --out.  Anything else is [bold]real[/] and
    fails.  Exit 1 on any failure or if nothing could be compared.

    [bold]Examples[/]

      mimi-extract verify corpus/ --limit 100 --batch-size 32
      mimi-extract verify --out codes/ --sample 50
      mimi-extract verify --out codes/ --checksums             # bit rot: every item, no model
    """
    if checksums:
        if out is None or input_path is not None:
            _fail("--checksums checks what an OUT holds: give --out OUT (and no INPUT)")
        _verify_checksums(out)
        return
    from ..engines.device import resolve_devices
    from .request import engine_check_settings, input_options, model_path
    from ..audit.verify import transformers_drift, verify_outputs, verify_source

    out_console = Console(width=max(Console().width, 120), highlight=False)
    if (input_path is None) == (out is None):
        _fail("give INPUT (encode it both ways) or --out OUT (audit what OUT holds), not both")
    try:
        if out is not None:
            dev = resolve_devices(device)[0]
            checks, problems = verify_outputs(out, sample, seed, dev, model and model_path(model), rtol, atol,
                                              chunk_seconds=chunk_seconds)
            title = f"{out}: stored vs single-item (fp32, transformers)"
            from ..store.identity import read_run_info
            from ..store.manifest import run_dirs

            info = read_run_info(run_dirs(out)[0]) or {}
            shown = (info.get("tap", "codes"),) if info.get("tap") != "codes" else ()
        else:
            settings = engine_check_settings(dict(
                model=model or "kyutai/mimi", device=device, dtype=dtype, batch_size=batch_size,
                max_batch_seconds=max_batch_seconds, channel=channel, resampler=resampler, causal_16k=causal_16k,
                resample_on=resample_on,
                tap="codes", num_quantizers=num_quantizers, chunk_seconds=chunk_seconds, framing=framing,
                frames_per_call=frames_per_call))
            checks, problems = verify_source(input_path, settings, limit, rtol, atol,
                                             options=input_options(dict(inputs))), []
            title = f"engine ({settings.dtype}) vs single-item (fp32, transformers)"
            shown = ("encoder", "latent")
    except (RuntimeError, KeyError, *_reading_errors()) as e:
        _fail(e)
    table, failed = _check_table(title, checks, rtol, atol, max_real_mismatches, shown)
    out_console.print(table)
    if out is not None and (drift := transformers_drift(out)):
        say(("warning: ", "yellow"), drift, out=out_console)
    _mismatch_report(out_console, checks)
    for p in problems:
        say(("problem: ", "bold red"), p, out=out_console)
    good = [c for c in checks if c.error is None and c.note is None]
    ties = sum(c.ties for c in good)
    real = sum(c.real for c in good)
    total = sum(c.code_total for c in good)
    worst = max((c.relative(t) for c in good for t in c.diff), default=0.0)
    verdict = not failed and not problems and good
    summary = (f"{len(good)} files compared, {sum(c.error is not None for c in checks)} errors, "
               f"{sum(c.note is not None for c in checks)} skipped; worst relative max|Δ| {worst:.1e} "
               f"(rtol {rtol:g}, atol {atol:g}); codes differing {ties + real}/{total}: {ties} tie flips, {real} real; ")
    say(summary, ("PASS", "green") if verdict else (f"FAIL ({failed} files)" if failed else "FAIL (nothing compared)"
                                                      if not good else "FAIL", "bold red"), out=out_console)
    if not verdict:
        raise typer.Exit(EXIT_FAILED)


def _verify_checksums(out: str) -> None:
    from ..common import remote
    from ..store.read import scan_checksums

    if not remote.isdir(out):
        _fail(f"{out} does not exist")
    try:
        report = scan_checksums(out)
    except _reading_errors() as e:
        _fail(str(e))
    for d in report["damaged"]:
        say((d["key"], "bold red"), f" in {d['shard']}: {d['problem']}")
    total = report["checked"] + report["unchecked"]
    line = (f"{total} stored items read, {report['checked']} against their checksums"
            + (f" ({report['unchecked']} written before checksums existed: format checks only)" if report["unchecked"] else "")
            + f"; {len(report['damaged'])} damaged")
    if report["damaged"]:
        say(line + "; ", ("FAIL", "bold red"))
        say(f"to encode them again: re-run the command that made {out} with --reencode-damaged")
        raise typer.Exit(EXIT_FAILED)
    say(line + "; ", ("PASS", "green"))


def _reading_errors() -> tuple[type[Exception], ...]:
    """What reading an OUT raises for an OUT that is not there, not a run, malformed (MalformedError,
    naming the file and line), damaged or unreachable (object storage): one line each, exit 2."""
    from ..store.files import OutputError

    return FileNotFoundError, ValueError, OSError, OutputError


def _report(make, out_dir: str, as_json: bool) -> dict | None:
    """``make(out_dir)``, or a clean error; with ``--json`` it is printed and None returned."""
    try:
        report = make(out_dir)
    except _reading_errors() as e:
        _fail(e)
    if as_json:
        print(json.dumps(report, indent=2))
        return None
    return report


@app.command()
def status(out_dir: Annotated[str, typer.Argument(metavar="OUT")],
           as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
           missing: Annotated[bool, typer.Option("--missing", help="Print only the part indices not complete (never "
                              "started, killed, or with inputs not yet encoded) as `sbatch --array=` takes them "
                              "(0,3,5-7; a whole run is part 0); exit 0 when nothing is missing, 1 when something "
                              "is, 2 when OUT is not a run (or malformed, or unreachable).")] = False,
           shards: Annotated[bool, typer.Option("--shards", help="With --missing: print the input shards of the parts "
                             "not complete instead, one a line (parts that took whole input shards; --json: both).")] = False):
    """Progress of OUT: per part of a job array, inputs, ok, errors, and what is missing.

    [bold]Examples[/]

      mimi-extract status codes/

      sbatch --array=$(mimi-extract status codes/ --missing) job.sh   # job.sh: --part $SLURM_ARRAY_TASK_ID/16
    """
    from ..audit.outputs import status_report

    if missing:
        try:
            report = status_report(out_dir)
        except _reading_errors() as e:
            _fail(e)
        if as_json:
            print(json.dumps({k: report[k] for k in ("parts", "incomplete_parts", "array", "incomplete_shards")}))
        elif shards:
            if report["incomplete_shards"] is None and report["incomplete_parts"]:
                _fail("this OUT is not divided by input shard (a whole run, or parts divided by key, not by input shard): no shard list", EXIT_FAILED)
            print("".join(s + "\n" for s in report["incomplete_shards"] or []), end="")
        else:
            print(report["array"])
        raise typer.Exit(1 if report["incomplete_parts"] else 0)
    report = _report(status_report, out_dir, as_json)
    if report is None:
        return
    out = Console(highlight=False)
    for name, p in report["runs"].items():
        line = f"{name}: {p['ok']} ok, {p['errors']} errors" + (
            f" of {p['inputs']} inputs ({100 * (p['ok'] + p['errors']) / max(1, p['inputs']):.0f}% done)"
            if p["inputs"] is not None else "") + (f", updated {p['updated']}" if p.get("updated") else "")
        say(line, out=out)
    for name, who in report["starting"].items():
        say((f"{name}: starting", "yellow"), f" ({who}): finding inputs or loading the model; no run.json yet", out=out)
    for missing in report["missing_parts"]:
        say((f"part {missing}: not started", "yellow"), out=out)
    say(("complete", "green") if report["complete"] else ("incomplete", "yellow"),
        f": {report['ok']} ok, {report['errors']} errors, {report['remaining']} not yet encoded", out=out)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


@app.command(cls=_OneInput)
@_with_options(INPUT_OPTIONS, skip=("keep_fields",))
def plan(
    input_path: InputArg,
    num_quantizers: Annotated[int, typer.Option("--num-quantizers", "-q", min=1, max=32, help="Codebooks the codes would keep (tokens, bytes).")] = 8,
    feature_dtype: Annotated[FeatureDType, typer.Option(help="Storage dtype of features (bytes).")] = FeatureDType["float32"],
    output_format: Annotated[OutFormat, typer.Option("--format", help="The format whose single writer caps the GPU estimate.")] = OutFormat["hdf5"],
    channel: ChannelOpt = Channel["mix"],
    resampler: ResamplerOpt = Resampler["torchaudio"],
    framing: FramingArg = FramingOpt["transformers"],
    limit: LimitOpt = None,
    recordings: Annotated[Optional[str], typer.Option(help="lhotse RecordingSet for a SupervisionSet input.")] = None,
    part_hours: Annotated[float, typer.Option(min=0, help="Audio hours per task of a job array: the --part count suggested.")] = 1000.0,
    cores: Annotated[Optional[int], typer.Option(min=1, help="Host CPU cores of the machine to plan for \\[default: this one's].")] = None,
    gpus: Annotated[int, typer.Option(min=1, help="GPUs of that machine.")] = 1,
    gpu_rate: Annotated[Optional[float], typer.Option(min=1, help="A GPU's encoding rate, x real time (from scripts/gpu_check.sh on your GPU) \\[default: the measured one; unmeasured so far].")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    **inputs,
):
    """A dry run: what encoding INPUT would take, without loading a model.

    Reads only what a run's indexing reads (the listing and each item's audio header): items, hours,
    durations, frames and tokens, output bytes per format and tap, the host cores a GPU needs for this
    corpus's codecs, an estimated time per device kind (from the measured rates of
    docs/performance.md; a GPU's own rate is unmeasured until scripts/gpu_check.sh runs on one:
    give it with --gpu-rate), and a --part count for tasks of --part-hours each.

    [bold]Examples[/]

      mimi-extract plan corpus/
      mimi-extract plan 'shards/en-{000000..000999}.tar' -q 32 --cores 112 --gpus 8 --gpu-rate 12000
      mimi-extract plan manifest.jsonl --json | jq .host.cores_per_gpu
    """
    from ..audit.dry_run import PlanAsk, plan_report
    from .request import input_options
    from ..audio.framing import Framing

    try:
        options = input_options({**inputs, "recordings": recordings})
        rule = Framing(framing.value, resampler.value == "causal")
        ask = PlanAsk(num_quantizers, feature_dtype.value, part_hours, cores, gpus, gpu_rate, output_format.value, limit)
        report = plan_report(input_path, options, channel.value, rule, ask)
    except (ValueError, FileNotFoundError, OSError) as e:
        _fail(e)
    if as_json:
        print(json.dumps(report, indent=2))
        return
    out = Console(highlight=False)
    ix = report["indexing"]
    say(f"{report['input']} ({report['kind']}): {report['items']} items, {report['unreadable']} unreadable; "
        f"{_hours(report['hours'] * 3600)} of audio (indexed in {ix['wall_s']:.1f} s, {ix['cpu_s']:.1f} CPU s)", out=out)
    for reason, n in report["errors_by_reason"].items():
        say(f"  {n} x ", (str(reason), "yellow"), out=out)
    d = report["durations"]
    if d["max"] is not None:
        say(f"durations: min {d['min']:.2f} s, median {d['median']:.2f} s, mean {d['mean']:.2f} s, "
            f"p95 {d['p95']:.2f} s, max {d['max']:.2f} s", out=out)
        bins = [(f"{a:g}-{b:g}", c) for a, b, c in zip(d["edges"], d["edges"][1:], d["counts"])]
        bins.append((f">={d['edges'][-1]:g}", d["counts"][-1]))
        say("  " + ", ".join(f"{label} s: {c}" for label, c in bins if c), out=out)
    fr = report["frames"]
    say(f"frames: {fr['12.5 Hz (latent, codes)']} at 12.5 Hz (latent, codes), {fr['25 Hz (encoder)']} at 25 Hz "
        f"(encoder); tokens at -q {report['num_quantizers']}: {report['tokens']}", out=out)
    table = Table(title="output size (estimated from measured format overheads)")
    for name in ("tap", "arrays", "hdf5", "parquet", "shar"):
        table.add_column(name, justify="left" if name == "tap" else "right")
    for tap, b in report["bytes"].items():
        label = f"codes (-q {report['num_quantizers']})" if tap == "codes" else f"{tap} ({feature_dtype.value})"
        table.add_row(label, *(_size(b[k]) for k in ("arrays", "hdf5", "parquet", "shar")))
    out.print(table)
    host = report["host"]
    say("codecs: " + "; ".join(f"{m['codec']} {m['sample_rate'] / 1000:g} kHz {100 * m['share']:.0f}% "
                               f"({m['host_us_per_audio_s']:.0f} µs host CPU per audio s)" for m in report["codecs"][:6]),
        out=out)
    say(f"host: a GPU at {host['target_x']:,.0f}x real time needs {host['cores_per_gpu']:.1f} cores for this corpus "
        f"(resampling on the GPU; {host['cores_per_gpu_host_resampling']:.1f} with --resample-on host); "
        f"rates measured on {host['measured_on']}", out=out)
    for name, e in report["estimates"].items():
        if not e["x_real_time"]:
            say(f"time on {name}: unmeasured (run scripts/gpu_check.sh on one, then plan --gpu-rate X)", out=out)
            continue
        what = f"{e['cores']} cores" if name == "cpu" else f"{e['gpus']} GPU(s), {e['cores']} cores, bound by {e['bound']}"
        say(f"time on {name} ({what}): {_hours(e['hours'] * 3600)} at {e['x_real_time']:,.0f}x real time"
            + ("" if e["measured"] else " (given --gpu-rate)"), out=out)
    p = report["parts"]
    say(f"parts: --part I/{p['count']} (sbatch --array=0-{p['count'] - 1}) for ~{_hours(p['hours_per_part'] * 3600)} "
        f"of audio each (--part-hours {p['part_hours']:g})", out=out)


_SHOWN = 20  # failing items listed by `info` (all of them with --json)


@app.command()
def info(out_dir: Annotated[str, typer.Argument(metavar="OUT")],
         as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False):
    """What OUT holds: inputs, ok, errors by reason and the failing items, hours, frames, tokens, shard sizes, settings.

    [bold]Example[/]

      mimi-extract info codes/ --json | jq .hours
    """
    from ..audit.outputs import info_report

    report = _report(info_report, out_dir, as_json)
    if report is None:
        return
    out = Console(highlight=False)
    say(f"{report['inputs']} inputs: {report['ok']} ok, {report['errors']} errors"
        + (f", {report['pending']} not yet encoded" if report["pending"] else "")
        + f"; {report['hours']:.3f} h of audio, "
        f"{report['frames']} frames" + (f", {report['tokens']} tokens" if report.get("tokens") is not None else ""), out=out)
    _say_common_failures(report["common_failures"], report["inputs"], out=out)
    if report["unplanned"]:
        say(("warning: ", "yellow"), f"{report['unplanned']} of these items are beyond the "
            f"{report['inputs'] - report['unplanned']} inputs the last run found (an earlier run with a larger --limit, "
            "or items stored under other keys by a resume with other --id-column/--id-field)", out=out)
    for reason, n in report["errors_by_reason"].items():
        say(f"  {n} x ", (reason, "yellow"), out=out)
    if report["failed"]:
        say(f"failing items (key, path: reason){'' if len(report['failed']) <= _SHOWN else f', first {_SHOWN}'}:", out=out)
        for f in report["failed"][:_SHOWN]:
            say(f"  {f['key']}  {f['path']}: ", (f["reason"], "yellow"), out=out)
        if len(report["failed"]) > _SHOWN:
            say(f"  ... and {len(report['failed']) - _SHOWN} more (--json lists them all)", out=out)
    say(f"{len(report['shards'])} shards, {report['bytes'] / 2**20:.1f} MiB "
        f"({report['bytes'] / max(1, len(report['shards'])) / 2**20:.1f} MiB per shard)", out=out)
    for key, value in report["settings"].items():
        say(f"  {key}: {value}", out=out)


_SUBSETS_SHOWN = 30  # subsets in the terminal table (all of them with --json)


@app.command()
def report(out_dir: Annotated[str, typer.Argument(metavar="OUT")],
           by: Annotated[Optional[str], typer.Option(
               "--by", metavar="FIELD", help="Group subsets by this manifest row field (a.b for a nested one, e.g. "
               "channel, sample_rate, source.kind) instead of by input shard (tar, Parquet, Shar input) or "
               "top-level folder of the key.")] = None,
           as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output (every subset, the code "
                                                 "histograms).")] = False,
           png: Annotated[Optional[str], typer.Option("--png", metavar="FILE", help="Write a figure: the duration "
                                                      "histogram and each codebook's usage (needs matplotlib: "
                                                      "pip install 'mimi-extract\\[report]').")] = None,
           card: Annotated[bool, typer.Option("--card", help="Write the numbers into a Parquet OUT's dataset card "
                                              "(OUT/README.md); a later run rewrites the card without them.")] = False,
           manifest_only: Annotated[bool, typer.Option("--manifest-only", help="Read the manifests only: no codebook "
                                                       "statistics, no checksum check; seconds at any size.")] = False,
           workers: Annotated[Optional[int], typer.Option("--workers", min=1, help="Processes reading shards "
                                                          "\\[default: the CPUs, at most 8].")] = None):
    """A corpus report of OUT: per subset hours, items, frames, tokens and errors; per codebook entropy,
    perplexity and unused codes; durations; error reasons; the model's weight hash and precision.

    Reads every item once (checksums verified), one shard at a time per worker process.

    [bold]Examples[/]

      mimi-extract report codes/
      mimi-extract report codes/ --png codes.png --card
      mimi-extract report codes/ --json | jq '.codebooks.per_codebook[].perplexity'
    """
    from ..store.files import OutputError
    from ..audit.report import corpus_report, summary_lines, write_card, write_png

    from rich.progress import Progress, TextColumn, TimeElapsedColumn

    try:
        with Progress(TextColumn("reading OUT: {task.completed} shards"), TimeElapsedColumn(), console=console,
                      transient=True, disable=not console.is_terminal) as bar:  # a terminal only, not logs
            task = bar.add_task("", total=None)
            result = corpus_report(out_dir, by=by, arrays=not manifest_only, workers=workers,
                                   on_shard=lambda n: bar.update(task, completed=n))
        if png:
            write_png(result, png)
        card_path = write_card(out_dir, result) if card else None
    except (FileNotFoundError, ValueError, RuntimeError, OutputError, OSError) as e:
        _fail(e)
    if as_json:
        print(json.dumps(result, indent=2))
        return
    out = Console(highlight=False)
    for line in summary_lines(result):
        say(line, out=out)
    table = Table(title=f"subsets by {result['subsets_by']}")
    for name in ("subset", "items", "errors", "hours", "frames", "tokens"):
        table.add_column(name, justify="left" if name == "subset" else "right")
    for name, s in list(result["subsets"].items())[:_SUBSETS_SHOWN]:
        table.add_row(Text(name), str(s["items"]), str(s["errors"]), f"{s['hours']:.3f}", str(s["frames"]),
                      "" if s["tokens"] is None else str(s["tokens"]))
    out.print(table)
    if len(result["subsets"]) > _SUBSETS_SHOWN:
        say(f"  ... and {len(result['subsets']) - _SUBSETS_SHOWN} more subsets (--json lists them all)", out=out)
    d = result["durations"]
    if d["max"] is not None:
        say(f"durations: min {d['min']:.2f} s, median {d['median']:.2f} s, mean {d['mean']:.2f} s, "
            f"p95 {d['p95']:.2f} s, max {d['max']:.2f} s", out=out)
        bins = [(f"{a:g}-{b:g}", c) for a, b, c in zip(d["edges"], d["edges"][1:], d["counts"])]
        bins.append((f">={d['edges'][-1]:g}", d["counts"][-1]))
        say("  " + ", ".join(f"{label} s: {c}" for label, c in bins if c), out=out)
    if result["codebooks"]:
        cb = result["codebooks"]
        books = Table(title=f"codebooks ({cb['size']} codes each, size from {cb['size_from']})")
        for name in ("codebook", "entropy (bits)", "perplexity", "used", "unused"):
            books.add_column(name, justify="right")
        for b in cb["per_codebook"]:
            books.add_row(str(b["index"]), f"{b['entropy_bits']:.3f}", f"{b['perplexity']:.1f}", str(b["used"]),
                          str(b["unused"]))
        out.print(books)
    elif result["dims"]:
        say(f"features: {', '.join(map(str, result['dims']))} dims per frame at {result['frame_rate']:g} Hz", out=out)
    for reason, n in result["errors_by_reason"].items():
        say(f"  {n} x ", (reason, "yellow"), out=out)
    for d in result["damaged"][:_SHOWN]:
        say(f"  damaged: {d['key']} in {d['shard']}: ", (d["problem"], "red"), out=out)
    if png:
        say(f"figure -> {png}", out=out)
    if card_path:
        say(f"dataset card -> {card_path}", out=out)


@app.command()
def cuts(out_dir: Annotated[str, typer.Argument(metavar="OUT")],
         output: Annotated[str, typer.Option("-o", "--output", help="The file to write (.jsonl.gz or .jsonl).")]):
    """One lhotse CutSet over every part of OUT, written to one file (built from the manifests).

    [bold]Example[/]

      mimi-extract cuts codes/ -o codes-cuts.jsonl.gz   # then CutSet.from_jsonl_lazy("codes-cuts.jsonl.gz")
    """
    from ..readers.reader import write_merged_cuts

    try:
        n = write_merged_cuts(out_dir, output)
    except _reading_errors() as e:
        _fail(e)
    say(("done", "green"), f": {n} cuts -> {output}")


@app.command()
def decode(
    out_dir: Annotated[str, typer.Argument(metavar="OUT")],
    keys: Annotated[Optional[list[str]], typer.Argument(metavar="[KEY]...", help="Items to decode.")] = None,
    output: Annotated[Optional[str], typer.Option("-o", "--output", help="A .wav file (one key) or a folder.")] = None,
    all_items: Annotated[bool, typer.Option("--all", help="Every ok item of OUT (into the -o folder).")] = False,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="\\[default: the model OUT was made with]")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N (auto = first GPU, else cpu).")] = "auto",
):
    """Codes (or features) back to 24 kHz audio with MimiModel.decode, to listen to what they keep.

    Features (latent or encoder tap) go through the quantizer (all codebooks) first.

    [bold]Examples[/]

      mimi-extract decode codes/ sub/utt1.wav -o utt1.wav
      mimi-extract decode codes/ --all -o listen/
    """
    from ..engines.device import resolve_devices
    from ..audit.decode import decode_items
    from .request import model_path

    if not keys and not all_items:
        _fail("name KEYs to decode, or --all")
    try:
        written = decode_items(out_dir, keys or None, output, model and model_path(model), resolve_devices(device)[0],
                               on_item=lambda key, path: say(f"{key} -> {path}"))
    except (KeyError, RuntimeError, *_reading_errors()) as e:
        _fail(e if not isinstance(e, KeyError) else e.args[0])
    say(("done", "green"), f": {len(written)} files")


def version_callback(value: bool):
    if value:
        print(__version__)
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=version_callback, is_eager=True)] = False):
    """Bulk Mimi feature/code extraction."""


if __name__ == "__main__":
    sys.exit(app())
