"""One extraction run as asked: :class:`RunRequest` -- what to compute (``Settings``), how to read
INPUT (``Options``), where to write, how much and which part.  Torch-free; ``cli.request.build_request``
makes one from a command line, ``run.runner.run_request`` runs it."""

from __future__ import annotations

from dataclasses import dataclass, field

from .input_options import Options
from .settings import Part, Settings


@dataclass(frozen=True)
class RunRequest:
    """Everything one extraction run is asked (picklable, torch-free); ``runner.run_request`` runs it."""

    source: str  # INPUT
    out_dir: str  # OUT
    settings: Settings = field(default_factory=Settings)
    options: Options = field(default_factory=Options)  # how INPUT is read (a SupervisionSet's recordings too)
    shard_size: int = 1000  # a new output shard after this many items...
    shard_mb: float = 256  # ... or this many MiB of data
    limit: int | None = None  # only the first N inputs
    part: Part = Part()  # a job array's part: its share of the inputs
    reencode_damaged: bool = False  # first read every stored item; encode the damaged shards' items again
    reencode_changed: bool = False  # resume over input shards rewritten in place (store.run_info.rewritten_since)
