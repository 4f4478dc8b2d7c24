"""Command line: ``mimi-extract features | codes | verify``."""

from __future__ import annotations

import sys
from enum import Enum
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from . import __version__
from .runner import Settings, extract, resolve_devices

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode="rich",
    help="Bulk Mimi (Kyutai neural audio codec) feature/code extraction into HDF5 shards, "
    "padding-aware: a file encoded in a padded batch gives what it gives alone.",
)
console = Console(stderr=True)


class Tap(str, Enum):
    encoder = "encoder"
    latent = "latent"


class Channel(str, Enum):
    mix = "mix"
    first = "first"
    each = "each"


class DType(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class FeatureDType(str, Enum):
    float32 = "float32"
    float16 = "float16"


ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Hub id or local directory (save_pretrained layout).")]
DeviceOpt = Annotated[str, typer.Option(help="auto (all GPUs, else cpu), cpu, cuda, cuda:N, or a list: cuda:0,cuda:1.")]
DTypeOpt = Annotated[DType, typer.Option(help="Compute dtype; bf16/fp16 only on GPU. fp32 is the exact path.")]
BatchOpt = Annotated[Optional[int], typer.Option(min=1, help="Maximum items per batch [default: 64 on GPU, 1 on CPU, where batching is slower].")]
SecondsOpt = Annotated[float, typer.Option(min=0.1, help="Padded audio seconds per batch (items x longest).")]
WorkersOpt = Annotated[int, typer.Option(min=0, help="DataLoader processes decoding audio (per device).")]
ChannelOpt = Annotated[Channel, typer.Option(help="Multichannel files: mix = mean of channels, first, each = one entry per channel (key#chN).")]
CausalOpt = Annotated[bool, typer.Option("--causal-16k/--no-causal-16k", help="16 kHz input: causal resampler (no output sample depends on future input) instead of torchaudio's.")]
LimitOpt = Annotated[Optional[int], typer.Option(min=1, help="Only the first N files (sorted by path).")]
ShardOpt = Annotated[int, typer.Option(min=1, help="Roll to a new shard after this many utterances.")]
ShardMBOpt = Annotated[float, typer.Option(min=1, help="... or after this many MiB of data.")]
StrictOpt = Annotated[bool, typer.Option(help="Exit 1 if any input failed (default: error rows, exit 0).")]


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(2)


def _run(input_dir, out_dir, settings: Settings, shard_size, shard_mb, limit, strict) -> None:
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[audio]} audio, {task.fields[speed]:.0f}x realtime, {task.fields[errors]} errors"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console,
    )
    state = {"seconds": 0.0, "errors": 0}

    def on_plan(s):
        console.print(
            f"{s['inputs']} inputs ({s['skipped']} already done), {s['unreadable']} unreadable, {s['todo']} to encode: "
            f"{_hours(s['seconds'])} in {s['batches']} batches, padding {100 * s['padding']:.1f}% "
            f"on {', '.join(settings.devices)}"
        )
        state["task"] = progress.add_task("encoding", total=s["todo"], audio=_hours(0), speed=0.0, errors=0)
        progress.start()

    def on_batch(n, seconds, errors):
        state["seconds"] += seconds
        state["errors"] += errors
        task = state["task"]
        elapsed = progress.tasks[task].elapsed or 1e-9
        progress.update(task, advance=n, audio=_hours(state["seconds"]), speed=state["seconds"] / elapsed,
                        errors=state["errors"])

    try:
        summary = extract(input_dir, out_dir, settings, shard_size, shard_mb, limit, on_plan, on_batch)
    except KeyboardInterrupt:
        progress.stop()
        console.print("[yellow]interrupted[/]: finished shards are kept; run the same command again to resume.")
        raise typer.Exit(130)
    except (ValueError, FileNotFoundError, RuntimeError, OSError) as e:
        progress.stop()
        _fail(str(e))
    progress.stop()
    console.print(
        f"[green]done[/]: {summary['ok']} ok, {summary['errors']} errors, {summary['skipped']} skipped "
        f"({summary['frame_rate']:g} Hz frames) -> {out_dir}/manifest.jsonl"
    )
    if summary["errors"]:
        console.print(f"error rows: grep '\"status\": \"error\"' {out_dir}/manifest.jsonl")
        if strict:
            raise typer.Exit(1)


def _settings(model, device, dtype, batch_size, max_batch_seconds, num_workers, channel, causal_16k, **kw) -> Settings:
    try:
        devices = resolve_devices(device)
    except (ValueError, RuntimeError) as e:
        _fail(str(e))
    if dtype is not DType.fp32 and not all(d.startswith("cuda") for d in devices):
        _fail(f"--dtype {dtype.value} needs GPUs (devices: {', '.join(devices)}); use fp32 on CPU")
    return Settings(model=model, devices=devices, dtype=dtype.value, batch_size=batch_size,
                    max_batch_seconds=max_batch_seconds, num_workers=num_workers, channel=channel.value,
                    causal_16k=causal_16k, **kw)


@app.command()
def features(
    input_dir: Annotated[str, typer.Argument(metavar="DIR", help="Directory searched recursively for audio.")],
    out_dir: Annotated[str, typer.Argument(metavar="OUT", help="Output directory (shards + manifest.jsonl).")],
    tap: Annotated[Tap, typer.Option(help="encoder = 25 Hz before the downsample; latent = 12.5 Hz, pre-quantizer.")] = Tap.latent,
    feature_dtype: Annotated[FeatureDType, typer.Option(help="Storage dtype of the features.")] = FeatureDType.float32,
    model: ModelOpt = "kyutai/mimi",
    device: DeviceOpt = "auto",
    dtype: DTypeOpt = DType.fp32,
    batch_size: BatchOpt = None,
    max_batch_seconds: SecondsOpt = 300.0,
    num_workers: WorkersOpt = 2,
    channel: ChannelOpt = Channel.mix,
    causal_16k: CausalOpt = True,
    shard_size: ShardOpt = 1000,
    shard_mb: ShardMBOpt = 1024,
    limit: LimitOpt = None,
    strict: StrictOpt = False,
):
    """Continuous Mimi features, one \\[frames, dim] dataset per file.

    [bold]Examples[/]

      mimi-extract features corpus/ feats/                      # 12.5 Hz latents, all GPUs
      mimi-extract features corpus/ feats25/ --tap encoder      # 25 Hz, before the downsample
      mimi-extract features corpus/ feats/ --model ./mimi-local --device cpu

    Re-running the same command resumes: files already 'ok' in the manifest are skipped.
    """
    settings = _settings(model, device, dtype, batch_size, max_batch_seconds, num_workers, channel, causal_16k,
                         tap=tap.value, feature_dtype=feature_dtype.value)
    _run(input_dir, out_dir, settings, shard_size, shard_mb, limit, strict)


@app.command()
def codes(
    input_dir: Annotated[str, typer.Argument(metavar="DIR", help="Directory searched recursively for audio.")],
    out_dir: Annotated[str, typer.Argument(metavar="OUT", help="Output directory (shards + manifest.jsonl).")],
    num_quantizers: Annotated[int, typer.Option("--num-quantizers", "-q", min=1, max=32, help="Codebooks to keep (1..32).")] = 8,
    model: ModelOpt = "kyutai/mimi",
    device: DeviceOpt = "auto",
    dtype: DTypeOpt = DType.fp32,
    batch_size: BatchOpt = None,
    max_batch_seconds: SecondsOpt = 300.0,
    num_workers: WorkersOpt = 2,
    channel: ChannelOpt = Channel.mix,
    causal_16k: CausalOpt = True,
    shard_size: ShardOpt = 1000,
    shard_mb: ShardMBOpt = 1024,
    limit: LimitOpt = None,
    strict: StrictOpt = False,
):
    """Discrete Mimi codes, one int16 \\[num_quantizers, frames] dataset per file (12.5 Hz).

    [bold]Examples[/]

      mimi-extract codes corpus/ codes/ --num-quantizers 8
      mimi-extract codes corpus/ codes/ -q 32 --device cuda:0,cuda:1 --max-batch-seconds 1200
    """
    settings = _settings(model, device, dtype, batch_size, max_batch_seconds, num_workers, channel, causal_16k,
                         tap="codes", num_quantizers=num_quantizers)
    _run(input_dir, out_dir, settings, shard_size, shard_mb, limit, strict)


@app.command()
def verify(
    input_dir: Annotated[str, typer.Argument(metavar="DIR", help="Directory searched recursively for audio.")],
    model: ModelOpt = "kyutai/mimi",
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N (auto = first GPU, else cpu).")] = "auto",
    dtype: DTypeOpt = DType.fp32,
    num_quantizers: Annotated[int, typer.Option("--num-quantizers", "-q", min=1, max=32)] = 8,
    batch_size: BatchOpt = 16,
    max_batch_seconds: SecondsOpt = 120.0,
    channel: ChannelOpt = Channel.mix,
    causal_16k: CausalOpt = True,
    limit: LimitOpt = 50,
    atol: Annotated[float, typer.Option(help="Max abs feature difference allowed.")] = 1e-4,
    max_code_mismatches: Annotated[int, typer.Option(min=0, help="Code mismatches allowed per file.")] = 0,
):
    """Encode files batched (padded) and one by one with transformers' MimiModel; compare.

    Prints max |batched - single| for the 25 Hz encoder output and the 12.5 Hz latent, and code
    mismatches, per file; exits 1 if any file is over tolerance. With --dtype bf16/fp16 the batched
    side runs in that dtype and is compared to the fp32 single-item reference (raise --atol).

    [bold]Example[/]

      mimi-extract verify corpus/ --limit 100 --batch-size 32
    """
    from .verify import verify as run_verify

    settings = _settings(model, device, dtype, batch_size, max_batch_seconds, 0, channel, causal_16k,
                         tap="codes", num_quantizers=num_quantizers)
    settings.devices = settings.devices[:1]
    table = Table(title=f"batched ({settings.dtype}) vs single-item (fp32, transformers)")
    for col in ("file", "sec", "frames", "max|Δ| encoder", "max|Δ| latent", "codes ≠", "result"):
        table.add_column(col, justify="left" if col == "file" else "right", overflow="fold")
    try:
        checks = run_verify(input_dir, settings, limit)
    except (ValueError, FileNotFoundError, RuntimeError, OSError) as e:
        _fail(str(e))
    failed = 0
    for c in checks:
        if c.error is not None:
            table.add_row(c.key, f"{c.duration:.2f}", "-", "-", "-", "-", "[yellow]unreadable[/]")
            continue
        ok = c.passed(atol, max_code_mismatches)
        failed += not ok
        table.add_row(c.key, f"{c.duration:.2f}", str(c.frames), f"{c.diff_encoder:.2e}", f"{c.diff_latent:.2e}",
                      f"{c.code_mismatches}/{c.code_total}", "[green]ok[/]" if ok else "[bold red]FAIL[/]")
    out = Console(width=max(Console().width, 110))
    out.print(table)
    for c in checks:
        if c.error is not None:
            out.print(f"[yellow]{c.key}[/]: {c.error}", highlight=False)
    good = [c for c in checks if c.error is None]
    worst = max((max(c.diff_encoder, c.diff_latent) for c in good), default=0.0)
    mism = sum(c.code_mismatches for c in good)
    total = sum(c.code_total for c in good)
    out.print(
        f"{len(good)} files compared, {len(checks) - len(good)} unreadable; worst max|Δ| {worst:.2e} "
        f"(atol {atol:g}); code mismatches {mism}/{total}; "
        + ("[green]PASS[/]" if not failed else f"[bold red]FAIL ({failed} files)[/]")
    )
    if failed:
        raise typer.Exit(1)


def version_callback(value: bool):
    if value:
        print(__version__)
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=version_callback, is_eager=True)] = False):
    """Bulk Mimi feature/code extraction."""


if __name__ == "__main__":
    sys.exit(app())
