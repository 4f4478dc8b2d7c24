""":class:`RunSummary`: what a run did, as the runner tells its caller -- once the work is planned
(``on_plan``), and when the run ends."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..engines.base import Stats
from ..engines.plan import Split


@dataclass
class RunSummary:
    """The counts of one run (of one part of a job array).  The plan's figures are set once the work
    is planned; ``ok``, ``errors``, ``stats`` and the rest as the run goes and ends."""

    run_dir: str  # the run directory written (the local staging one, for an OUT on object storage)
    inputs: int  # this run's inputs, readable or not
    skipped: int  # of them, already stored by an earlier run
    todo: int  # readable inputs to encode now
    unreadable: int  # inputs that become error rows without being encoded
    units: int  # work units planned
    streamed: int  # items longer than a chunk (streamed chunk by chunk)
    seconds: float  # audio seconds to encode (a split recording's warm-ups included)
    padding: float  # the share of padded samples in the planned batches of short items
    frame_rate: float  # frames per second of the tap
    devices: tuple[str, ...]  # what the work units were sized for
    engine: str | None  # what runs the work, when the devices do not say it (a Ray cluster)
    split: Split  # what splitting long recordings did
    notes: list[str]  # what resuming repaired
    warnings: list[str]  # what finding the inputs said (a --metadata row matching no item...)
    ok: int = 0  # items stored
    errors: int = 0  # error rows written
    stats: Stats = field(default_factory=Stats)  # where the devices' wall time went
    engine_notes: list[str] = field(default_factory=list)  # a worker that died, a request capped
    startup: dict | None = None  # the process's age when encoding began and at its first result
    held_peak_bytes: int | None = None  # --shar-extend: the outputs held at once, at most
    interrupted: str | None = None  # the signal that stopped the run (what was encoded is committed)
    remote: str | None = None  # an OUT on object storage: its URL (run_dir is its local staging)
    staging: str | None = None  # ... and the staging OUT
