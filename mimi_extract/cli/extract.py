"""``features`` and ``codes``: the run a command line asks (``request.build_request``), run with a
progress display (a bar on a terminal, plain lines in a log), and its outcome printed."""

from __future__ import annotations

import os
import time
from typing import Annotated, Optional

import typer

from ..config.choices import MAX_TOKEN_ID
from .common import (EXIT_ALL_FAILED, EXIT_CODES_HELP, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_NO_INPUT, FeatureDType, INPUT_OPTIONS, InputArg, OutArg, PROGRESS_ENV, RUN_OPTIONS, Tap, TokenLayout, OneInput, format_clock, fail_exit, format_hours, say_common_failures, with_options, app, console, say)


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
        eta = format_clock((total - done) / speed) if speed > 0 and total > done else ("0:00:00" if done >= total else "?")
        pct = 100 * done / total if total > 0 else 100.0
        say(f"[{format_clock(elapsed)}] {format_hours(done)} / {format_hours(total)} audio ({pct:.0f}%), {state['items']} files, "
            f"{speed:.1f}x real time, ETA {eta}, {state['errors']} errors")


def _progress_every(progress_seconds: float | None) -> float:
    """Seconds between plain progress lines: the option's, else ``PROGRESS_ENV``'s (usage error if not a number), else 30."""
    if progress_seconds is not None:
        return progress_seconds
    try:
        return float(os.environ.get(PROGRESS_ENV, 30))
    except ValueError:
        fail_exit(f"{PROGRESS_ENV}={os.environ[PROGRESS_ENV]!r} is not a number of seconds")


class _Display:
    """The run's progress as ``run_request``'s callbacks show it: a bar on a terminal, plain lines
    (:class:`_PlainProgress`) in a log."""

    def __init__(self, every: float):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.plain = None if console.is_terminal else _PlainProgress(every)
        self.progress = Progress(
            TextColumn("encoding"), BarColumn(),
            TextColumn("{task.fields[audio]} / {task.fields[total_audio]} audio, {task.fields[items]} files, "
                       "{task.fields[speed]:.1f}x realtime, {task.fields[errors]} errors"),
            TimeElapsedColumn(), TimeRemainingColumn(), console=console, disable=self.plain is not None,
        )
        self.state = {"seconds": 0.0, "errors": 0, "items": 0}

    def on_phase(self, text) -> None:
        say((f"{time.strftime('%H:%M:%S')} ", "dim"), text)

    def on_plan(self, s) -> None:
        for w in s.warnings:
            say(("warning: ", "yellow"), w)
        for n in s.notes:
            say(("repaired: ", "yellow"), n)
        devices = sorted(set(s.devices))
        on = ", ".join(f"{s.devices.count(d)}x {d}" if s.devices.count(d) > 1 else d for d in devices)
        say(f"{s.inputs} inputs ({s.skipped} already done), {s.unreadable} unreadable, {s.todo} to encode: "
            f"{format_hours(s.seconds)} in {s.units} work units ({s.streamed} long files streamed), "
            f"padding {100 * s.padding:.1f}% on " + (s.engine or on))
        if s.split.items:
            sp = s.split
            say(f"split {sp.items} long recording(s) into {sp.pieces} pieces "
                f"(warm-up {100 * sp.overhead:.1f}% of their audio encoded twice)")
        self.state["total"] = s.seconds
        self.state["task"] = self.progress.add_task("encoding", total=max(s.seconds, 1e-9), audio=format_hours(0),
                                                    total_audio=format_hours(s.seconds), items=0, speed=0.0, errors=0)
        if self.plain is not None:
            self.plain.start(s.seconds)
        else:
            self.progress.start()

    def on_progress(self, items, seconds, errors) -> None:
        state = self.state
        state["seconds"] += seconds
        state["errors"] += errors
        state["items"] += items
        task = state["task"]
        elapsed = self.progress.tasks[task].elapsed or 1e-9
        self.progress.update(task, advance=seconds, audio=format_hours(state["seconds"]), speed=state["seconds"] / elapsed,
                             errors=state["errors"], items=state["items"])
        if self.plain is not None:
            self.plain.update(state)

    def on_signal(self, name) -> None:
        self.progress.stop()
        say((f"{name}: ", "yellow"), "stopping; committing what was completely encoded "
            "(press Ctrl-C again to stop at once)...")

    def end(self) -> None:
        self.progress.stop()
        if self.plain is not None:
            self.plain.update(self.state, final=True)


def _run(input_path: str, out_dir: str, strict: bool = False, progress_seconds: float | None = None, **values) -> None:
    """Build the run's request from the command line's ``values`` (usage errors: exit 2), run it with
    a progress display, and print the outcome."""
    from .request import build_request

    try:
        request = build_request(input_path, out_dir, **values)
    except (ValueError, RuntimeError) as e:
        fail_exit(e)
    from ..run.runner import NoInputError, run_request
    from ..store.files import OutputError

    display = _Display(_progress_every(progress_seconds))
    try:
        summary = run_request(request, on_plan=display.on_plan, on_progress=display.on_progress,
                              on_signal=display.on_signal, on_phase=display.on_phase)
    except KeyboardInterrupt:
        display.progress.stop()
        say(("interrupted", "yellow"), " before encoding started; run the same command again to resume.")
        raise typer.Exit(EXIT_INTERRUPTED)
    except NoInputError as e:  # found before OUT was touched: nothing written
        fail_exit(e, EXIT_NO_INPUT)
    except (ValueError, FileNotFoundError, RuntimeError, OSError, OutputError) as e:
        display.progress.stop()
        fail_exit(e)
    display.end()
    _say_outcome(summary, input_path, out_dir, request.part)
    if summary.errors and strict:
        raise typer.Exit(EXIT_FAILED)


def _say_outcome(summary, input_path: str, out_dir: str, part) -> None:
    """The run's outcome; exits with its code when it was interrupted, found no input or every input failed."""
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

        say_common_failures(run_failures(where), summary.inputs)
        say(f"error rows: mimi-extract info {out_dir}  (or grep '\"status\": \"error\"' {where}/manifest.jsonl)")
    if summary.inputs == 0:
        say(("error: ", "bold red"), f"no input found in {input_path}" + (f" (part {part})" if not part.whole else "")
            + ": a directory is searched for audio files (wav, flac, mp3, ogg, ...); a list or lhotse manifest "
            "names them")
        raise typer.Exit(EXIT_NO_INPUT)
    if summary.errors and summary.ok == 0 and summary.skipped == 0:
        say(("error: ", "bold red"), f"every input failed ({summary.errors} of {summary.inputs})")
        raise typer.Exit(EXIT_ALL_FAILED)


_RUN_HELP = ("\n\n    Re-running the same command resumes: items already 'ok' in the manifest are skipped; a "
             "second run on the same OUT is refused while the first holds it. Ctrl-C (or SIGTERM) commits "
             "what was completely encoded; a second Ctrl-C stops at once (OUT stays consistent).\n\n    "
             + EXIT_CODES_HELP)


@app.command(cls=OneInput)
@with_options(RUN_OPTIONS, INPUT_OPTIONS)
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


@app.command(cls=OneInput)
@with_options(RUN_OPTIONS, INPUT_OPTIONS)
def codes(
    input_path: InputArg,
    out_dir: OutArg,
    num_quantizers: Annotated[int, typer.Option("--num-quantizers", "-q", min=1, max=32, help="Codebooks to keep (1..32).")] = 8,
    token_layout: Annotated[Optional[TokenLayout], typer.Option(help="--format megatron: flat = one sequence per item, per frame codebook 0..N-1, id = offset + codebook x codebook_size + code; per-codebook = one sequence per codebook, id = offset + code (an item's sequences are one document). Recorded in run.json \\[default: flat].", show_default=False)] = None,
    token_offset: Annotated[Optional[int], typer.Option(min=0, max=MAX_TOKEN_ID - 2**16, help="--format megatron: the id of code 0 of codebook 0, so audio ids can sit after a text vocabulary (e.g. 128256 after Llama 3's). Recorded in run.json \\[default: 0].", show_default=False)] = None,
    fidelity: Annotated[bool, typer.Option("--fidelity", help="Also decode each item's stored codes and store how well they give back the encoder's 24 kHz input: si_sdr (dB) and mel_distance in its manifest row and fields (docs/fidelity.md). Costs a decode per item.")] = False,
    **options,
):
    """Discrete Mimi codes, one int16 \\[frames, num_quantizers] dataset per input (12.5 Hz).

    [bold]Examples[/]

      mimi-extract codes corpus/ codes/ --num-quantizers 8
      mimi-extract codes corpus/ codes/ -q 32 --device cuda:0,cuda:1 --max-batch-seconds 1200
      mimi-extract codes corpus/ codes/ --part slurm            # one task of sbatch --array=0-15
      mimi-extract codes corpus/ codes/ --engine ray --ray-address auto
      mimi-extract codes corpus/ tokens/ --format megatron --token-offset 128256   # Megatron .bin/.idx
      mimi-extract codes corpus/ codes/ --fidelity              # + SI-SDR and log-mel distance per item
    """
    _run(input_path, out_dir, tap="codes", num_quantizers=num_quantizers, token_layout=token_layout,
         token_offset=token_offset, fidelity=fidelity, **options)


codes.__doc__ += _RUN_HELP
