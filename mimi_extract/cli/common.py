"""What the commands share: the typer app and its console, the choices offered (from the torch-free
``config.choices`` and the formats' registry), the options that ``features`` and ``codes`` share
(``RUN_OPTIONS``, ``INPUT_OPTIONS``; ``verify`` and ``plan`` take the input ones), printing as plain
text (``say``: never rich markup, so a file named ``[bold]x.wav`` is shown as it is), the exit
codes, ``--version`` and the clean one-line errors (``fail_exit``)."""

from __future__ import annotations

import inspect
import json
import os
import sys
from enum import Enum
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.text import Text

from .._version import __version__
from . import limits
from ..common.messages import bounded
from ..config.choices import (CHANNEL_MODES, DTYPES, ENGINES, FEATURE_DTYPES, FRAMINGS, KEY_MODES, LIST_KEY_MODES,
                              RESAMPLE_ON, RESAMPLERS, SIDECAR_DURATION_MODES, TOKEN_LAYOUTS)

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
    """Print plain strings and (text, style) pairs; nothing is parsed as markup, and no line is
    over :data:`~mimi_extract.common.messages.MESSAGE_LIMIT` characters (a message quoting its input)."""
    parts = tuple(bounded(p) if isinstance(p, str) else (bounded(p[0]), p[1]) for p in parts)
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


def _format_help() -> str:
    from ..formats import formats

    return ("Output format: " + "; ".join(f"{f.name} = {f.summary}" if f.summary else f.name for f in formats())
            + ". Recorded in run.json: a resume must use the same.")


def _input_format_help() -> str:
    from ..sources.base import REGISTRY  # (light: the kinds, not their decoders)

    kinds = ", ".join(f"{k} ({cls.summary})" if cls.summary else k for k, cls in REGISTRY.items())
    return f"Read INPUT as this kind instead of detecting it: {kinds}."


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
    """One shared command-line option: the parameter that ``with_options`` adds to a command."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)


# -- input options (packaged corpora: tar shards, Parquet / HF datasets, lhotse Shar): each one is the field of
# input_options.Options of its name (request.input_options), so a new one is that field and its line here --
_INPUTS = "Input"
SidecarDurationChoice = _choices("SidecarDurationChoice", SIDECAR_DURATION_MODES)
KeyChoice = _choices("KeyChoice", KEY_MODES)
ListKeyChoice = _choices("ListKeyChoice", LIST_KEY_MODES)
INPUT_OPTIONS = [
    _option("input_format", Annotated[Optional[str], typer.Option(rich_help_panel=_INPUTS, help=_input_format_help())], None),
    _option("audio_ext", Annotated[Optional[str], typer.Option(rich_help_panel=_INPUTS, help="Tar/Shar samples: the member extension(s) that hold the audio, comma-separated (e.g. flac) \\[default: the first member with an audio extension].")], None),
    _option("id_field", Annotated[Optional[str], typer.Option(rich_help_panel=_INPUTS, help="Tar samples: the field of the .json sidecar that holds the id \\[default: key = <shard file name>/<sample key>].")], None),
    _option("audio_column", Annotated[Optional[str], typer.Option(rich_help_panel=_INPUTS, help="Parquet: the audio column \\[default: the first struct of bytes and path, the datasets Audio feature].")], None),
    _option("id_column", Annotated[Optional[str], typer.Option(rich_help_panel=_INPUTS, help="Parquet: the id column \\[default: key = <file>/<row>].")], None),
    _option("sort_buffer_mb", Annotated[float, typer.Option(min=1, rich_help_panel=_INPUTS, help="Compressed tar (.tar.gz/.tgz, no random access): items are length-sorted within groups of this many MiB of the stream, not globally; each encoder process holds at most two groups in memory. Smaller groups pad more (measured: docs/performance.md).")], 256.0),
    _option("keep_fields", Annotated[Optional[str], typer.Option("--keep-fields", "--keep-columns", rich_help_panel=_INPUTS, help="Input metadata carried into the outputs (Parquet columns, the cuts' supervisions and custom fields): the fields of tar sidecars and list rows, the columns of Parquet input, a lhotse cut's custom fields. 'a,b' those; 'all' nested values too (as JSON); 'none' nothing (nor a lhotse cut's supervisions) \\[default: every string, number or boolean field]. text/speaker/language/gender become a lhotse supervision over the item. Recorded in run.json.")], None),
    _option("sidecar_duration", Annotated[SidecarDurationChoice, typer.Option(rich_help_panel=_INPUTS, help="A 'duration' with no start/end/offset in a tar sidecar, list row or NeMo manifest: auto = the file's length as the corpus wrote it (rounded, as Emilia's) when within 10 ms of it, so the whole file is encoded, else a segment from 0; segment = always a segment from 0; ignore = not read. Any segment ending past the file's end by <= 10 ms is clamped to the end. Recorded in run.json (items) unless auto.")], SidecarDurationChoice["auto"]),
    _option("list_keys", Annotated[Optional[ListKeyChoice], typer.Option("--list-keys", rich_help_panel=_INPUTS, help="A list's or NeMo manifest's rows without an id: root = keyed by the file's path relative to the corpus root (the list's folder, or the folder holding every file), the same on any machine; written = the path as the list writes it (absolute paths stay absolute; how OUTs made before 0.3 were keyed, and how such an OUT is resumed) \\[default: root]. Recorded in run.json (items).")], None),
    _option("metadata", Annotated[Optional[str], typer.Option("--metadata", metavar="FILE", rich_help_panel=_INPUTS, help="A .tsv/.csv/.jsonl file of fields (transcripts, speakers...) joined to the items by --metadata-key: an item's id, or its file or member name (with its extension or as a relative path: Common Voice's path column) or stem (abc for en/x/abc.flac). Its fields go where the input's own go (manifest meta, cuts, Parquet columns; chosen by --keep-fields; the input's own field wins). Rows matching no item and items without a row are counted in the run's warnings; a join that matches nothing is an error. Recorded in run.json.")], None),
    _option("metadata_key", Annotated[str, typer.Option("--metadata-key", metavar="COLUMN", rich_help_panel=_INPUTS, help="--metadata: the column holding the id, file name or stem.")], "id"),
    _option("key", Annotated[KeyChoice, typer.Option("--key", rich_help_panel=_INPUTS, help="Keys of items without an id: path = as named (<shard>/<sample>, the list's or directory's relative path); stem = the file or member name up to its first dot (e.g. to join a corpus TSV by utterance id; duplicates become error rows). Recorded in run.json (items) unless path.")], KeyChoice["path"]),
]

# the options of every run command (codes, features), declared once, in --help's order
RUN_OPTIONS = [
    _option("model", Annotated[str, typer.Option("--model", "-m", help="Hub id or local directory (save_pretrained layout).")], "kyutai/mimi"),
    _option("device", Annotated[str, typer.Option(help="auto (all GPUs, else cpu), cpu, cuda, cuda:N, or a list: cuda:0,cuda:1.")], "auto"),
    _option("cpu_workers", Annotated[Optional[int], typer.Option(min=1, help="Encoder processes on CPU \\[default: one per core, single-threaded].")], None),
    _option("feeders_per_gpu", Annotated[Optional[int], typer.Option(min=1, help="Processes feeding each GPU (one GIL each: one process feeds a GPU at ~7,000x real time at most, and decodes MP3/Opus/AAC at one core's FFmpeg speed, ~600-1,000x) \\[default: enough for 20,000x per GPU for the corpus's codecs (more for MP3/Opus/AAC than FLAC/WAV), at most half the cores per GPU; `plan` says how many: see docs/performance.md].")], None),
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
    _option("single_writer", Annotated[bool, typer.Option("--single-writer", hidden=True, help="Measurement only (scripts/gpu_check.sh's 1-vs-N-writers rows): the run's own process writes every shard, as before 0.4.0, instead of each device worker writing its own.")], False),
    _option("split", Annotated[bool, typer.Option(help="Split a recording longer than a lane's fair share of the run (lanes: streams run side by side, workers x rows) into independent pieces of that share, run on any worker or row (exact: each piece is encoded from the model's receptive field, 80 s, before its first frame; pieces of at least 8.9 min, so the warm-up costs <= 15%). The plan line says what was split.")], True),
    _option("shar_extend", Annotated[bool, typer.Option("--shar-extend", help="INPUT is a lhotse Shar dataset: add our field to it. Writes only OUT/shar/<field>.NNNNNN.tar, one per input shard, in that shard's cut order (a failed cut: lhotse's placeholder), so CutSet.from_shar(fields={'cuts': INPUT's cuts, 'recording': INPUT's recordings, 'mimi_codes': OUT's tars}) lines up. Implies --format shar; holds about one shard's outputs in memory; with --part I/N, whole input shards are divided among the parts.")], False),
    _option("output_format", Annotated[OutFormat, typer.Option("--format", help=_format_help())], OutFormat["hdf5"]),
    _option("reencode_damaged", Annotated[bool, typer.Option("--reencode-damaged", help="Before resuming, read every stored item and check its checksums (bit rot, edited files: what verify --out --checksums lists); shards holding a damaged item are moved to quarantine/ and their items encoded again.")], False),
    _option("reencode_changed", Annotated[bool, typer.Option("--reencode-changed", help="Resume although input shards were rewritten since OUT began (re-downloaded: same names, other size or mtime; nothing else changed): the output shards holding their items are moved to quarantine/ and those items encoded again from the new shards.")], False),
]


class OneInput(typer.core.TyperCommand):
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


def with_options(*groups: list[inspect.Parameter], skip: tuple[str, ...] = ()):
    """Give a command the shared options of ``groups`` (but ``skip``) after its own parameters: typer
    reads the signature, and the command receives them as its ``**options``."""
    def add(command):
        own = inspect.signature(command, eval_str=True)
        params = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]
        command.__signature__ = own.replace(parameters=params + [p for g in groups for p in g if p.name not in skip])
        return command

    return add


def format_hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


def fail_exit(message: str | Exception, code: int = EXIT_USAGE):
    """Print ``error: message`` and exit ``code``; an exception that a too-small address space
    (ulimit -v) caused is reported as that, with exit 5."""
    if isinstance(message, BaseException):
        limit = limits.explain(message)
        message, code = (limit, EXIT_ADDRESS_SPACE) if limit else (str(message), code)
    say(("error: ", "bold red"), str(message))
    raise typer.Exit(code)


def format_clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def say_common_failures(failures: list[dict], inputs: int, out=None) -> None:
    """The reasons many error rows share, each in one prominent line: a systematic rejection (a whole
    format refused, a wrong option) must not read like a clean run's few bad files."""
    for f in failures:
        say(("warning: ", "bold yellow"), f"{f['count']} of {inputs} inputs ({100 * f['share']:.0f}%) failed for one "
            f"reason: ", (f["reason"], "yellow"), f" (first: {', '.join(f['first_keys'])})", out=out)


def reading_errors() -> tuple[type[Exception], ...]:
    """What reading an OUT raises for an OUT that is not there, not a run, malformed (MalformedError,
    naming the file and line), damaged or unreachable (object storage): one line each, exit 2."""
    from ..store.files import OutputError

    return FileNotFoundError, ValueError, OSError, OutputError


def make_report(make, out_dir: str, as_json: bool) -> dict | None:
    """``make(out_dir)``, or a clean error; with ``--json`` it is printed and None returned."""
    try:
        report = make(out_dir)
    except reading_errors() as e:
        fail_exit(e)
    if as_json:
        print(json.dumps(report, indent=2))
        return None
    return report


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def version_callback(value: bool):
    if value:
        print(__version__)
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=version_callback, is_eager=True)] = False):
    """Bulk Mimi feature/code extraction."""
