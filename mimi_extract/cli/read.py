"""The commands that read INPUT or OUT without writing OUT, each answering in well under a second
without torch (but ``decode``): ``status``, ``plan``, ``info``, ``report``, ``cuts``, ``decode``."""

from __future__ import annotations

import json
import math
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..config.choices import MAX_TOKEN_ID
from .common import (Channel, ChannelOpt, EXIT_FAILED, FeatureDType, FramingArg, FramingOpt, INPUT_OPTIONS, InputArg, LimitOpt, OutFormat, Resampler, ResamplerOpt, TokenLayout, OneInput, fail_exit, format_hours, reading_errors, make_report, say_common_failures, format_size, with_options, app, console, say)


def _say_durations(d: dict, out) -> None:
    """The duration summary and histogram that ``plan`` and ``report`` print alike."""
    if d["max"] is None:
        return
    say(f"durations: min {d['min']:.2f} s, median {d['median']:.2f} s, mean {d['mean']:.2f} s, "
        f"p95 {d['p95']:.2f} s, max {d['max']:.2f} s", out=out)
    bins = [(f"{a:g}-{b:g}", c) for a, b, c in zip(d["edges"], d["edges"][1:], d["counts"])]
    bins.append((f">={d['edges'][-1]:g}", d["counts"][-1]))
    say("  " + ", ".join(f"{label} s: {c}" for label, c in bins if c), out=out)


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
        except reading_errors() as e:
            fail_exit(e)
        if as_json:
            print(json.dumps({k: report[k] for k in ("parts", "incomplete_parts", "array", "incomplete_shards")}))
        elif shards:
            if report["incomplete_shards"] is None and report["incomplete_parts"]:
                fail_exit("this OUT is not divided by input shard (a whole run, or parts divided by key, not by input shard): no shard list", EXIT_FAILED)
            print("".join(s + "\n" for s in report["incomplete_shards"] or []), end="")
        else:
            print(report["array"])
        raise typer.Exit(1 if report["incomplete_parts"] else 0)
    report = make_report(status_report, out_dir, as_json)
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


@app.command(cls=OneInput)
@with_options(INPUT_OPTIONS, skip=("keep_fields",))
def plan(
    input_path: InputArg,
    num_quantizers: Annotated[int, typer.Option("--num-quantizers", "-q", min=1, max=32, help="Codebooks the codes would keep (tokens, bytes).")] = 8,
    feature_dtype: Annotated[FeatureDType, typer.Option(help="Storage dtype of features (bytes).")] = FeatureDType["float32"],
    output_format: Annotated[OutFormat, typer.Option("--format", help="The format whose single writer caps a Ray run whose actors do not see OUT's folder (other machines without a shared file system: the driver stores their items; the local engine's workers and Ray actors that see it write their own shards).")] = OutFormat["hdf5"],
    channel: ChannelOpt = Channel["mix"],
    resampler: ResamplerOpt = Resampler["torchaudio"],
    framing: FramingArg = FramingOpt["transformers"],
    limit: LimitOpt = None,
    recordings: Annotated[Optional[str], typer.Option(help="lhotse RecordingSet for a SupervisionSet input.")] = None,
    part_hours: Annotated[float, typer.Option(min=0, help="Audio hours per task of a job array: the --part count suggested.")] = 1000.0,
    cores: Annotated[Optional[int], typer.Option(min=1, help="Host CPU cores of the machine to plan for \\[default: this one's].")] = None,
    gpus: Annotated[int, typer.Option(min=1, help="GPUs of that machine.")] = 1,
    gpu_rate: Annotated[Optional[float], typer.Option(min=1, help="A GPU's encoding rate, x real time (from scripts/gpu_check.sh on your GPU) \\[default: the measured one; unmeasured so far].")] = None,
    token_layout: Annotated[TokenLayout, typer.Option(help="--format megatron's token layout (the ids' width).")] = TokenLayout["flat"],
    token_offset: Annotated[int, typer.Option(min=0, max=MAX_TOKEN_ID - 2**16, help="--format megatron's --token-offset: ids past 65,500 are int32, twice the .bin.")] = 0,
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
        ask = PlanAsk(num_quantizers, feature_dtype.value, part_hours, cores, gpus, gpu_rate, output_format.value, limit,
                      token_layout.value, token_offset)
        report = plan_report(input_path, options, channel.value, rule, ask)
    except (ValueError, FileNotFoundError, OSError) as e:
        fail_exit(e)
    if as_json:
        print(json.dumps(report, indent=2))
        return
    _say_plan(report, feature_dtype.value)


def _say_plan(report: dict, feature_dtype: str) -> None:
    """``plan``'s report as lines and a table of output sizes."""
    out = Console(highlight=False)
    ix = report["indexing"]
    say(f"{report['input']} ({report['kind']}): {report['items']} items, {report['unreadable']} unreadable; "
        f"{format_hours(report['hours'] * 3600)} of audio (indexed in {ix['wall_s']:.1f} s, {ix['cpu_s']:.1f} CPU s)", out=out)
    for reason, n in report["errors_by_reason"].items():
        say(f"  {n} x ", (str(reason), "yellow"), out=out)
    _say_durations(report["durations"], out)
    fr = report["frames"]
    say(f"frames: {fr['12.5 Hz (latent, codes)']} at 12.5 Hz (latent, codes), {fr['25 Hz (encoder)']} at 25 Hz "
        f"(encoder); tokens at -q {report['num_quantizers']}: {report['tokens']}", out=out)
    table = Table(title="output size (estimated from measured format overheads)")
    columns = ("arrays", "hdf5", "parquet", "shar", "megatron")
    for name in ("tap",) + columns:
        table.add_column(name + (f" ({report['token_ids']['dtype']} ids)" if name == "megatron" else ""),
                         justify="left" if name == "tap" else "right")
    for tap, b in report["bytes"].items():
        label = f"codes (-q {report['num_quantizers']})" if tap == "codes" else f"{tap} ({feature_dtype})"
        table.add_row(label, *(format_size(b[k]) if k in b else "-" for k in columns))
    out.print(table)
    host = report["host"]
    say("codecs: " + "; ".join(f"{m['codec']} {m['sample_rate'] / 1000:g} kHz {100 * m['share']:.0f}% "
                               f"({m['mean_item_s']:.1f} s an item: {m['host_us_per_audio_s']:.0f} µs host CPU per audio s)"
                               for m in report["codecs"][:6]), out=out)
    say(f"host: a GPU at {host['target_x']:,.0f}x real time needs {host['cores_per_gpu']:.1f} cores for this corpus "
        f"(resampling on the GPU; {host['cores_per_gpu_host_resampling']:.1f} with --resample-on host); "
        f"rates measured on {host['measured_on']}", out=out)
    _say_feeders(report["feeders"], out)
    for name, e in report["estimates"].items():
        if not e["x_real_time"]:
            say(f"time on {name}: unmeasured (run scripts/gpu_check.sh on one, then plan --gpu-rate X)", out=out)
            continue
        what = f"{e['cores']} cores" if name == "cpu" else f"{e['gpus']} GPU(s), {e['cores']} cores, bound by {e['bound']}"
        say(f"time on {name} ({what}): {format_hours(e['hours'] * 3600)} at {e['x_real_time']:,.0f}x real time"
            + ("" if e["measured"] else " (given --gpu-rate)")
            + (f"; with --engine ray, Ray actors on machines that do not see OUT's folder hand their items to "
               f"the driver, one writer, which caps them at {e['ray_x_real_time']:,.0f}x"
               if e.get("ray_x_real_time", math.inf) < e["x_real_time"] else ""), out=out)
    p = report["parts"]
    say(f"parts: --part I/{p['count']} (sbatch --array=0-{p['count'] - 1}) for ~{format_hours(p['hours_per_part'] * 3600)} "
        f"of audio each (--part-hours {p['part_hours']:g})", out=out)


def _say_feeders(f: dict, out: Console) -> None:
    """``plan``'s suggested --feeders-per-gpu, and whether the host's cores bound it."""
    say(f"feeding: --feeders-per-gpu {f['per_gpu']} (one process feeds ~{f['one_process_x']:,.0f}x of this corpus's "
        f"codecs; {f['wanted']} for {f['target_x']:,.0f}x per GPU)"
        + (f"; bound by the host's cores: at most half of them per GPU, {f['half_cores_per_gpu']}"
           if f["bound_by_cores"] else "")
        + (f"; the run's default here: {f['default_per_gpu']}" if f["default_per_gpu"] != f["per_gpu"] else ""),
        out=out)


_SHOWN = 20  # failing items listed by `info` (all of them with --json)


@app.command()
def info(out_dir: Annotated[str, typer.Argument(metavar="OUT")],
         as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False):
    """What OUT holds: inputs, ok, errors by reason and the failing items, hours, frames, tokens, shard sizes, settings.

    [bold]Example[/]

      mimi-extract info codes/ --json | jq .hours
    """
    from ..audit.outputs import fidelity_lines, info_report

    report = make_report(info_report, out_dir, as_json)
    if report is None:
        return
    out = Console(highlight=False)
    say(f"{report['inputs']} inputs: {report['ok']} ok, {report['errors']} errors"
        + (f", {report['pending']} not yet encoded" if report["pending"] else "")
        + f"; {report['hours']:.3f} h of audio, "
        f"{report['frames']} frames" + (f", {report['tokens']} tokens" if report.get("tokens") is not None else ""), out=out)
    say_common_failures(report["common_failures"], report["inputs"], out=out)
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
    for line in fidelity_lines(report.get("fidelity")):
        say(line, out=out)
    for key, value in report["settings"].items():
        if value not in ({}, [], None):  # (a rule with nothing in it: directory input's item keys; --json has all)
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
    from ..audit.report import card_out, corpus_report, summary_lines, write_card, write_png

    from rich.progress import Progress, TextColumn, TimeElapsedColumn

    try:
        if card:
            card_out(out_dir)  # (refused before the report is computed)
        with Progress(TextColumn("reading OUT: {task.completed} shards"), TimeElapsedColumn(), console=console,
                      transient=True, disable=not console.is_terminal) as bar:  # a terminal only, not logs
            task = bar.add_task("", total=None)
            result = corpus_report(out_dir, by=by, arrays=not manifest_only, workers=workers,
                                   on_shard=lambda n: bar.update(task, completed=n))
        if png:
            write_png(result, png)
        card_path = write_card(out_dir, result) if card else None
    except (FileNotFoundError, ValueError, RuntimeError, OutputError, OSError) as e:
        fail_exit(e)
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
    _say_durations(result["durations"], out)
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

    Parquet and Megatron OUTs (and HDF5 on object storage) are read through mimi-extract's own lhotse
    storages: call mimi_extract.formats.cuts.register_lhotse_readers() before loading their arrays
    (mimi_extract.read_cuts does it).

    [bold]Example[/]

      mimi-extract cuts codes/ -o codes-cuts.jsonl.gz   # then CutSet.from_jsonl_lazy("codes-cuts.jsonl.gz")
    """
    from ..formats.cuts import our_storages
    from ..readers.reader import write_merged_cuts

    storages: set = set()
    try:
        n = write_merged_cuts(out_dir, output, storages)
    except reading_errors() as e:
        fail_exit(e)
    say(("done", "green"), f": {n} cuts -> {output}")
    ours = sorted(storages & set(our_storages()))
    if ours:
        say(("note: ", "yellow"), f"these cuts load their arrays through mimi-extract's lhotse storage {', '.join(ours)}: "
            "call mimi_extract.formats.cuts.register_lhotse_readers() before cut.load_custom(...) "
            "(mimi_extract.read_cuts(OUT) does it)")


@app.command()
def decode(
    out_dir: Annotated[str, typer.Argument(metavar="OUT")],
    keys: Annotated[Optional[list[str]], typer.Argument(metavar="[KEY]...", help="Items to decode.")] = None,
    output: Annotated[Optional[str], typer.Option("-o", "--output", help="A .wav file (one key) or a folder (several keys, --all). \\[default for one key: KEY's name + .wav, here]")] = None,
    all_items: Annotated[bool, typer.Option("--all", help="Every ok item of OUT, into the -o folder, each key's folders mirrored (sub/x.flac -> FOLDER/sub/x.flac.wav).")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace existing files (refused by default, before anything is decoded).")] = False,
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
        fail_exit("name KEYs to decode, or --all")
    if all_items and output is None:
        fail_exit("--all writes every item of OUT: name a folder for them with -o")
    try:
        written = decode_items(out_dir, keys or None, output, model and model_path(model), resolve_devices(device)[0],
                               on_item=lambda key, path: say(f"{key} -> {path}"), overwrite=overwrite)
    except (KeyError, RuntimeError, *reading_errors()) as e:
        fail_exit(e if not isinstance(e, KeyError) else e.args[0])
    say(("done", "green"), f": {len(written)} files")
