"""``verify``: the tool's outputs against transformers' own single-item encode (``audit.verify``),
printed as a table with each mismatch explained; ``--checksums``: every stored item read back."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .common import (CausalOpt, Channel, ChannelOpt, DType, DTypeOpt, EXIT_FAILED, FramesPerCallOpt, FramingArg, FramingOpt, INPUT_OPTIONS, LimitOpt, ResampleOn, ResampleOnOpt, Resampler, ResamplerOpt, OneInput, fail_exit, reading_errors, with_options, app, say)


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


@app.command(cls=OneInput)
@with_options(INPUT_OPTIONS, skip=("keep_fields",))
def verify(
    input_path: Annotated[Optional[str], typer.Argument(metavar="[INPUT]", help="Files to encode both ways (omit with --out).")] = None,
    out: Annotated[Optional[str], typer.Option("--out", help="Audit this OUT: re-encode a sample of its items one by one and compare with what it holds.")] = None,
    sample: Annotated[Optional[int], typer.Option(min=1, help="With --out: items to re-encode (random, --seed) \\[default: 20].", show_default=False)] = None,
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
    _check_options(input_path, out, sample, checksums)
    if checksums:
        _verify_checksums(out)
        return
    out_console = Console(width=max(Console().width, 120), highlight=False)
    try:
        if out is not None:
            checks, problems, title, shown = _audit_out(out, 20 if sample is None else sample, seed, device, model,
                                                        rtol, atol, chunk_seconds)
        else:
            settings = dict(model=model or "kyutai/mimi", device=device, dtype=dtype, batch_size=batch_size,
                            max_batch_seconds=max_batch_seconds, channel=channel, resampler=resampler,
                            causal_16k=causal_16k, resample_on=resample_on, tap="codes",
                            num_quantizers=num_quantizers, chunk_seconds=chunk_seconds, framing=framing,
                            frames_per_call=frames_per_call)
            checks, problems, title, shown = _check_engine(input_path, settings, limit, rtol, atol, inputs)
    except (RuntimeError, KeyError, *reading_errors()) as e:
        fail_exit(e)
    table, failed = _check_table(title, checks, rtol, atol, max_real_mismatches, shown)
    out_console.print(table)
    if out is not None:
        from ..audit.verify import transformers_drift

        if drift := transformers_drift(out):
            say(("warning: ", "yellow"), drift, out=out_console)
    _mismatch_report(out_console, checks)
    for p in problems:
        say(("problem: ", "bold red"), p, out=out_console)
    _say_verdict(out_console, checks, problems, failed, rtol, atol)


def _check_options(input_path: str | None, out: str | None, sample: int | None, checksums: bool) -> None:
    """Usage errors of what INPUT, --out, --sample and --checksums ask together."""
    if checksums:
        if out is None or input_path is not None:
            fail_exit("--checksums checks what an OUT holds: give --out OUT (and no INPUT)")
        if sample is not None:
            fail_exit("--checksums reads every stored item; --sample picks items to re-encode: give one or the other")
    elif (input_path is None) == (out is None):
        fail_exit("give INPUT (encode it both ways) or --out OUT (audit what OUT holds)"
              + (", not both" if out is not None else ""))


def _audit_out(out: str, sample: int, seed: int, device: str, model: str | None, rtol: float, atol: float,
               chunk_seconds: float):
    """``verify --out``: (checks, problems, the table's title, the feature taps it shows)."""
    from ..audit.verify import verify_outputs
    from ..engines.device import resolve_devices
    from ..store.identity import read_run
    from ..store.manifest import run_dirs
    from .request import model_path

    checks, problems = verify_outputs(out, sample, seed, resolve_devices(device)[0], model and model_path(model),
                                      rtol, atol, chunk_seconds=chunk_seconds)
    info = read_run(run_dirs(out)[0])
    shown = (info.tap,) if info is not None and info.tap != "codes" else ()
    return checks, problems, f"{out}: stored vs single-item (fp32, transformers)", shown


def _check_engine(input_path: str, values: dict, limit: int | None, rtol: float, atol: float, inputs: dict):
    """``verify INPUT``: (checks, problems, the table's title, the feature taps it shows)."""
    from ..audit.verify import verify_source
    from .request import engine_check_settings, input_options

    settings = engine_check_settings(values)
    checks = verify_source(input_path, settings, limit, rtol, atol, options=input_options(dict(inputs)))
    return checks, [], f"engine ({settings.dtype}) vs single-item (fp32, transformers)", ("encoder", "latent")


def _say_verdict(out: Console, checks, problems: list[str], failed: int, rtol: float, atol: float) -> None:
    """The summary line, PASS or FAIL (exit 1: a check failed, a problem, or nothing compared)."""
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
                                                      if not good else "FAIL", "bold red"), out=out)
    if not verdict:
        raise typer.Exit(EXIT_FAILED)


def _verify_checksums(out: str) -> None:
    from ..common import remote
    from ..store.read import scan_checksums

    if not remote.isdir(out):
        fail_exit(f"{out} does not exist")
    try:
        report = scan_checksums(out)
    except reading_errors() as e:
        fail_exit(str(e))
    for d in report["damaged"]:
        say((d["key"], "bold red"), f" in {d['shard']}: {d['problem']}")
    for problem in report["problems"]:
        say(("run.json", "bold red"), f": {problem}")
    total = report["checked"] + report["unchecked"]
    line = (f"{total} stored items read, {report['checked']} against their checksums"
            + (f" ({report['unchecked']} written before checksums existed: format checks only)" if report["unchecked"] else "")
            + f"; {len(report['damaged'])} damaged"
            + (f"; {len(report['problems'])} unreadable run.json" if report["problems"] else ""))
    if report["damaged"] or report["problems"]:
        say(line + "; ", ("FAIL", "bold red"))
        if report["damaged"]:
            say(f"to encode them again: re-run the command that made {out} with --reencode-damaged")
        raise typer.Exit(EXIT_FAILED)
    say(line + "; ", ("PASS", "green"))
