"""``verify``: what the tool produces against transformers' own single-item encode, file by file.

Two audits:

* :func:`verify_source` -- encode files through the extraction engine itself (length-sorted
  padded batches, long files chunked with carried state, continuous batching), then each file
  alone with ``MimiModel``'s unmodified forward passes, and compare;
* :func:`verify_outputs` -- re-encode a random sample of what an OUT directory holds, one by one
  in fp32, and compare with the stored arrays and attributes (a dataset made on another device,
  dtype or batch mix is audited after the fact).

Features pass when ``max|Δ| <= rtol * max|ref| + atol`` per file: fp32 rounding is relative, and
oneDNN/cuDNN pick other kernels for other lengths.  Features stored as float16
(``--feature-dtype float16``) are rounded to float16's 11 bits: there ``|Δ|`` is what a value
differs from the fp32 reference beyond half a float16 spacing at its magnitude (what rounding
itself may move it), held to the same bound -- not a looser tolerance, which would hide a leak.

Codes are judged along the *stored* codes (:func:`classify_codes`).  RVQ picks, codebook after
codebook, the codeword nearest to the residual, and the residual of codebook ``k`` is the group's
projected latent minus the codewords the producer picked before ``k``.  So for a frame whose codes
differ from the reference, the quantizer is walked again from the reference latent, subtracting the
STORED earlier codes, and every codebook of that frame is held to what its own residual allows:

* the stored code is the nearest codeword to that residual: fine (after a tie flip the later codes
  of its group follow from it: a *cascade*);
* ``d(stored) - d(best) <= noise``: a *tie flip* -- either answer is right;
* anything else: a *real* mismatch, which fails.

The noise bound: the producer's residual on that same path differs from ours only by the projected
latent's perturbation ``Δr`` (the same codewords are subtracted), and by the triangle inequality
that moves every distance by at most ``|Δr|``; so a code the producer picked as nearest is at most
``2|Δr|`` plus the float rounding of two distances (``2 * 8ε(|r|² + max|c|²) / d(best)``, ``ε`` the
fp32 epsilon: cdist expands ``|r-c|²``) plus the rounding of the residual subtractions so far
(``ε * Σ(|r| + max|c|)``) farther than the best.  ``|Δr|`` is measured when the batched latent is at
hand (``verify INPUT``); for stored codes alone (``verify --out``) it is bounded by ``rtol`` times
the norm of the group's projected latent in that frame (the features' own tolerance).
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from ..common import remote
from ..config.choices import SAMPLE_RATE
from ..audio.framing import Framing
from ..audio.reader import load
from ..codec.encoder import PaddedMimiEncoder, encode_chunked
from ..codec.reference import reference_single
from ..codec.model import library_versions, load_model, weights_hash
from ..engines import DeviceRunner
from ..engines.plan import plan_units
from ..config.settings import Settings
from ..sources import Item, Options, discover, loc_of, open_audio, seconds_to_samples
from ..store.files import PART_RE
from ..formats.records import RunInfo, StoredRow
from ..store.identity import read_run
from ..store.manifest import out_rows, run_dirs, shard_attrs
from ..store.read import item_attrs, load_row

EPS32 = float(torch.finfo(torch.float32).eps)


@dataclass
class Mismatch:
    """One classified code: ``margin`` is the stored code's distance minus the best distance along the
    stored codes (0: the stored code is the nearest), ``noise`` the bound a tie may reach there."""
    frame: int
    codebook: int
    margin: float
    noise: float
    tie: bool
    cascade: bool = False  # differs from the reference only because an earlier code of its group did


@dataclass
class FileCheck:
    key: str
    duration: float
    frames: int = 0
    diff: dict = field(default_factory=dict)  # tap -> max |Δ|
    scale: dict = field(default_factory=dict)  # tap -> max |ref|
    first_diverging: dict = field(default_factory=dict)  # tap -> first frame over tolerance (None: none)
    mismatches: list[Mismatch] = field(default_factory=list)
    code_total: int = 0
    error: str | None = None  # the comparison failed (or the stored item is unusable)
    note: str | None = None  # not compared (unreadable input, too long for the reference)
    chunked: bool = False

    @property
    def ties(self) -> int:
        return sum(m.tie for m in self.mismatches)

    @property
    def real(self) -> int:
        return sum(not m.tie for m in self.mismatches)

    def relative(self, tap: str) -> float:
        return self.diff.get(tap, 0.0) / max(self.scale.get(tap, 0.0), 1e-30)

    def passed(self, rtol: float, atol: float, max_real: int = 0) -> bool:
        if self.error is not None:
            return False
        features_ok = all(self.diff[t] <= rtol * self.scale[t] + atol for t in self.diff)
        return features_ok and self.real <= max_real


# -- RVQ decisions along the stored codes ----------------------------------------------------
def _groups(model, num_quantizers: int):
    """Mimi's split RVQ: (first global codebook, quantizer, codebooks used) per group."""
    q = model.quantizer
    n_sem = min(q.num_semantic_quantizers, num_quantizers)
    groups = [(0, q.semantic_residual_vector_quantizer, n_sem),
              (n_sem, q.acoustic_residual_vector_quantizer, num_quantizers - n_sem)]
    return [g for g in groups if g[2] > 0]


def _project(rvq, latent: torch.Tensor) -> torch.Tensor:
    x = latent.T[None].float()  # [1, D, F]
    return rvq.input_proj(x) if rvq.input_proj is not None else x


@torch.no_grad()
def rvq_trace(model, latent: torch.Tensor, num_quantizers: int) -> dict:
    """Re-run Mimi's split RVQ on one item's latent [frames, D] exactly as transformers does, and
    record per codebook: codes [F, N] and the best and second-best distances [F, N]."""
    codes, d1, d2 = [], [], []
    for _, rvq, n in _groups(model, num_quantizers):
        residual = _project(rvq, latent)
        for layer in rvq.layers[:n]:
            dists = torch.cdist(residual[0].T[None], layer.codebook.embed.float()[None], p=2)[0]
            idx = dists.argmin(dim=-1)  # the reference's choice (first minimum)
            best2 = dists.topk(min(2, dists.shape[-1]), dim=-1, largest=False).values
            codes.append(idx)
            d1.append(best2[:, 0])
            d2.append(best2[:, -1])
            residual = residual - layer.decode(idx[None])
    return {"codes": torch.stack(codes, 1), "d1": torch.stack(d1, 1), "d2": torch.stack(d2, 1)}


@torch.no_grad()
def classify_codes(model, got: torch.Tensor, ref_latent: torch.Tensor, num_quantizers: int,
                   got_latent: torch.Tensor | None = None, rtol: float = 1e-5) -> tuple[list[Mismatch], torch.Tensor]:
    """Classify ``got`` [F, N] against what the reference latent allows, along the stored codes (the
    module docstring gives the rule and the noise bound).  Every frame where ``got`` differs from the
    reference codes is walked again, all its codebooks; a code is reported when it differs from the
    reference's or when its own residual rules it out.  Returns (mismatches, reference codes)."""
    ref = rvq_trace(model, ref_latent, num_quantizers)["codes"]
    if got.shape != ref.shape:
        raise ValueError(f"codes shape {tuple(got.shape)} != reference {tuple(ref.shape)}")
    got = got.to(ref.device).long()
    diff = got != ref
    frames = torch.nonzero(diff.any(dim=1)).flatten()
    if not len(frames):
        return [], ref
    measured = got_latent is not None and got_latent.shape == ref_latent.shape
    columns = []  # per codebook, in global order: (margin [F'], noise bound [F'], its group)
    for first, rvq, n in _groups(model, num_quantizers):
        residual = _project(rvq, ref_latent[frames])  # [1, d, F']
        if measured:
            perturbation = _project(rvq, (got_latent.float() - ref_latent.float())[frames])[0].norm(dim=0)
        else:
            perturbation = rtol * residual[0].norm(dim=0)
        subtraction = torch.zeros_like(perturbation)  # rounding of the residual updates so far
        for k, layer in enumerate(rvq.layers[:n]):
            r = residual[0].T  # [F', d]
            embed = layer.codebook.embed.float()
            dists = torch.cdist(r[None], embed[None], p=2)[0]
            best, nearest = dists.min(dim=-1)
            stored = got[frames, first + k]
            valid = (stored >= 0) & (stored < embed.shape[0])
            own = dists.gather(1, stored.clamp(0, embed.shape[0] - 1)[:, None])[:, 0]
            margin = torch.where(valid, own - best, torch.full_like(best, float("inf")))
            rnorm, cnorm = r.norm(dim=-1), embed.norm(dim=-1).max()
            rounding = 8 * EPS32 * (rnorm ** 2 + cnorm ** 2) / best.clamp(min=1e-12)
            columns.append((margin, 2 * (perturbation + subtraction) + 2 * rounding, first))
            subtraction = subtraction + EPS32 * (rnorm + cnorm)
            followed = torch.where(valid, stored, nearest)  # an impossible code: the frame is real anyway
            residual = residual - layer.decode(followed[None])
    out = []
    for row, frame in enumerate(frames.tolist()):
        differed = set()  # groups with an earlier differing code in this frame
        for k, (margin, noise, group) in enumerate(columns):
            m, bound, differs = float(margin[row]), float(noise[row]), bool(diff[frame, k])
            nearest = m <= 0
            if differs and nearest and group in differed:
                out.append(Mismatch(frame, k, m, bound, True, cascade=True))
            elif differs or m > bound:
                out.append(Mismatch(frame, k, m, bound, m <= bound))
            if differs:
                differed.add(group)
    return out, ref


def float16_half_spacing(x: torch.Tensor) -> torch.Tensor:
    """Half the gap between float16 values around each of ``x`` (float32): the most that rounding a
    value to float16 moves it (normal numbers: 2^(e-11) for |x| in [2^e, 2^(e+1)); subnormals: 2^-25)."""
    exponent = torch.floor(torch.log2(x.abs().float())).clamp(min=-14)  # (0: -inf, clamped to the subnormals')
    return torch.exp2(exponent - 11)


def _compare_features(check: FileCheck, tap: str, got: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> bool:
    if got.shape != ref.shape:
        check.error = f"{tap} shape {tuple(got.shape)} != single-item {tuple(ref.shape)}"
        return False
    delta = (got.float() - ref.float()).abs()
    if got.dtype == torch.float16:  # stored as float16: beyond its own rounding (either side of a power of two)
        spacing = torch.maximum(float16_half_spacing(ref), float16_half_spacing(got.float()))
        delta = (delta - spacing).clamp(min=0)
    check.diff[tap] = float(delta.max()) if delta.numel() else 0.0
    check.scale[tap] = float(ref.abs().max()) if ref.numel() else 0.0
    over = torch.nonzero(delta.amax(dim=-1) > rtol * check.scale[tap] + atol).flatten()
    check.first_diverging[tap] = int(over[0]) if len(over) else None
    return True


# -- audit 1: the engine path --------------------------------------------------------------
def verify_source(source: str, settings: Settings, limit: int | None = 50, rtol: float = 1e-5, atol: float = 1e-6,
                  max_reference_seconds: float = 600.0, on_file=None, options: Options | None = None) -> list[FileCheck]:
    """Encode ``source`` through the extraction engine (``settings.dtype``) and each file alone
    (fp32 transformers); compare the encoder output, the latent and the codes."""
    device = settings.devices[0]
    reference = load_model(settings.model, device, torch.float32)
    found = discover(source, settings.channel, Framing.of(settings), limit, options=options)
    checks = [FileCheck(it.key, it.duration, note=f"unreadable: {it.error}") for it in found.bad]
    if not found.items:
        return checks
    runner = DeviceRunner(settings, device, reference if settings.dtype == "fp32" else None,
                          taps=("encoder", "latent", "codes"))
    units = plan_units(found.items, runner.chunk, settings.step_seconds, settings.rows)
    todo = iter(units)
    results: dict[str, dict] = {}
    errors: dict[str, str] = {}

    def collect(frames):  # a FrameChunk of {tap: frames}
        if frames.error is not None:
            errors[frames.item.key] = frames.error
            return
        got = results.setdefault(frames.item.key, {t: [] for t in frames.data})
        for t, v in frames.data.items():
            got[t].append(v)

    runner.run(lambda block=True: next(todo, None), collect, threading.Event())
    chunk = runner.chunk
    for item in found.items:
        check = FileCheck(item.key, item.duration, chunked=item.samples > chunk)
        if item.key in errors:
            check.note = f"unreadable: {errors[item.key]}"
        elif item.samples / 24_000 > max_reference_seconds:
            check.note = f"longer than {max_reference_seconds:g} s: not compared (the unchunked reference would not fit)"
        else:
            audio = load(open_audio(item), item.channel, framing=Framing.of(settings), start=item.start,
                         frames=item.frames)
            ref = reference_single(reference, audio.to(device), settings.num_quantizers,
                                   Framing.of(settings).stream_frames)
            got = {t: torch.cat(v) for t, v in results[item.key].items()}
            check.frames = int(ref["codes"].shape[0])
            if all(_compare_features(check, t, got[t], ref[t], rtol, atol) for t in ("encoder", "latent")):
                check.code_total = ref["codes"].numel()
                check.mismatches, _ = classify_codes(reference, got["codes"], ref["latent"], settings.num_quantizers,
                                                     got["latent"], rtol)
                bad = [m.frame for m in check.mismatches if not m.tie]
                check.first_diverging["codes"] = min(bad) if bad else None
        checks.append(check)
        if on_file:
            on_file(check)
    return checks


# -- audit 2: what OUT holds ---------------------------------------------------------------
def _item_of_row(row: StoredRow) -> Item:
    src = row.source
    rate = row.sample_rate
    start = seconds_to_samples(row.start or 0.0, rate)  # the very samples discovery read
    frames = seconds_to_samples(row.end - row.start, rate) if row.end is not None else src.frames
    kind = src.kind or "file"
    return Item(src.path, row.path, row.key, row.channel, rate, start, frames, kind=kind, loc=loc_of(kind, src.loc))


def transformers_drift(out_dir: str) -> str | None:
    """A one-line warning when the installed transformers is not the one OUT was made with (run.json's
    ``versions``; an OUT made before they were recorded says nothing): ``verify --out`` re-encodes
    through the installed one, so a difference it finds may be the version's.  None when they agree."""
    made = sorted({v for d in run_dirs(out_dir)
                   if (info := read_run(d)) is not None and isinstance(v := (info.versions or {}).get("transformers"), str)})
    installed = library_versions()["transformers"]
    if not made or made == [installed]:
        return None
    return (f"{out_dir} was made with transformers {', '.join(made)} (run.json), this is transformers {installed}: "
            "the reference re-encodes with the installed one, so a difference may be the version's")


def _run_info(out_dir: str, rows: list[StoredRow]) -> RunInfo:
    """The settings OUT's items were made with: run.json of the first run (part) the ``rows`` are in;
    an error if one of those runs has none (channel, causal_16k... are not all in the shards)."""
    infos = {}
    for row in rows:
        top = row.shard.split("/")[0]  # a part's folder, or a shard (or a format's folder) of a whole run
        run_dir = remote.join(out_dir, top) if PART_RE.fullmatch(top) else out_dir
        if run_dir not in infos:
            infos[run_dir] = read_run(run_dir)
    missing = sorted(d for d, i in infos.items() if i is None)
    if missing:
        raise ValueError(f"{remote.join(missing[0], 'run.json')} is missing: verify --out re-encodes with the "
                         "settings OUT was made with, which it records; resume OUT with its original settings "
                         "(that writes run.json back), or use verify --out OUT --checksums (no settings needed)")
    return next(iter(infos.values()))


class _StoredCheck:
    """One stored item of OUT against its re-encode: the reference model (fp32) and its chunked
    encoder for long items, with the settings (``run.json``) OUT was made with."""

    def __init__(self, out_dir: str, info: RunInfo, reference, device: str, rtol: float, atol: float,
                 chunk_seconds: float):
        self.out_dir, self.info, self.reference, self.device, self.rtol, self.atol = (out_dir, info, reference,
                                                                                      device, rtol, atol)
        self.framing = Framing(info.framing, info.causal_16k, info.frames_per_call,
                               info.resampled_length)  # (an OUT made before 0.3 was cut to the exact length: RunInfo)
        self.tap, self.nq = info.tap, info.num_quantizers
        self.chunked = PaddedMimiEncoder(reference, self.framing.stream_frames)
        self.chunk = max(self.chunked.hop, int(chunk_seconds * SAMPLE_RATE) // self.chunked.hop * self.chunked.hop)

    def __call__(self, row: StoredRow, on_file=None) -> FileCheck:
        """``row``'s check; ``on_file(check)`` once it is compared (not when its source, its re-encode
        or its stored item fails)."""
        item = _item_of_row(row)
        check = FileCheck(row.key, row.duration if row.duration is not None else 0.0)
        try:
            channel = item.channel if item.channel is not None else self.info.channel
            audio = load(open_audio(item), channel, framing=self.framing, start=item.start, frames=item.frames)
        except Exception as e:
            check.error = f"cannot re-read the source: {e}"
            return check
        try:
            ref = self._reencode(check, audio)
        except Exception as e:  # out of memory, or anything else: this item's check fails, the audit goes on
            check.error = f"cannot re-encode: {type(e).__name__}: {e}"
            return check
        try:  # through the shard's format: an HDF5 dataset, a Parquet row...
            stored = torch.from_numpy(np.ascontiguousarray(load_row(self.out_dir, row)))
            attrs, ds_attrs = shard_attrs(self.out_dir, row.shard), item_attrs(self.out_dir, row)
        except Exception as e:  # noqa: BLE001 -- a damaged item fails its check, the audit goes on
            check.error = f"cannot read the stored item: {type(e).__name__}: {e}"
            return check
        self._check_attributes(check, row, attrs, ds_attrs)
        if check.error is None:
            self._compare(check, stored, ref)
        if on_file:
            on_file(check)
        return check

    def _reencode(self, check: FileCheck, audio: torch.Tensor) -> dict:
        if audio.shape[-1] > self.chunk:
            check.chunked = True
            return encode_chunked(self.chunked, [audio.to(self.device)], self.chunk, ("encoder", "latent", "codes"),
                                  self.nq)[0]
        return reference_single(self.reference, audio.to(self.device), self.nq, self.framing.stream_frames)

    def _check_attributes(self, check: FileCheck, row: StoredRow, attrs: dict, ds_attrs: dict) -> None:
        """The shard's attributes against run.json, the item's duration against the manifest's."""
        for key, want in (("tap", self.tap), ("framing", self.framing.name), ("weights", self.info.weights)):
            if attrs.get(key) is not None and attrs.get(key) != want:
                check.error = f"shard attribute {key}={attrs.get(key)!r}, run.json says {want!r}"
        if check.error is None and abs(float(ds_attrs.get("duration", row.duration)) - row.duration) > 1e-3:
            check.error = f"dataset duration {ds_attrs.get('duration')} != manifest {row.duration}"

    def _compare(self, check: FileCheck, stored: torch.Tensor, ref: dict) -> None:
        tap = self.tap
        check.frames = int(ref[tap].shape[0])  # (the encoder tap runs at 25 Hz, the others at 12.5)
        if tap != "codes":
            _compare_features(check, tap, stored, ref[tap], self.rtol, self.atol)
        elif stored.shape != ref["codes"].shape:
            check.error = f"codes shape {tuple(stored.shape)} != reference {tuple(ref['codes'].shape)}"
        else:
            check.code_total = stored.numel()
            check.mismatches, _ = classify_codes(self.reference, stored, ref["latent"], self.nq, None, self.rtol)
            bad = [m.frame for m in check.mismatches if not m.tie]
            check.first_diverging["codes"] = min(bad) if bad else None


def verify_outputs(out_dir: str, sample: int | None = 20, seed: int = 0, device: str = "cpu", model: str | None = None,
                   rtol: float = 1e-5, atol: float = 1e-6, on_file=None,
                   chunk_seconds: float = 30.0) -> tuple[list[FileCheck], list[str]]:
    """Re-encode a random sample of OUT's items one by one (fp32) and compare with what is stored.

    Items longer than ``chunk_seconds`` are re-encoded alone through the chunked encoder (its
    equality with the unchunked reference is what ``verify INPUT`` and the test suite check):
    transformers' unchunked encode of an hour-long item needs a T x T attention mask that no
    machine holds.  Returns (checks, problems found with the run as a whole)."""
    rows = [r for r in out_rows(out_dir) if r.ok]
    problems = []
    if not rows:
        return [], [f"{out_dir} holds no encoded items"]
    info = _run_info(out_dir, rows)
    name = model or info.model
    reference = load_model(name, device, torch.float32)
    if weights_hash(reference) != info.weights:
        problems.append(f"the model {name!r} is not the one OUT was made with (weights {info.weights})")
    picked = random.Random(seed).sample(rows, min(sample, len(rows))) if sample else rows
    check = _StoredCheck(out_dir, info, reference, device, rtol, atol, chunk_seconds)
    return [check(row, on_file) for row in picked], problems


__all__ = ["FileCheck", "Mismatch", "classify_codes", "rvq_trace", "verify_source", "verify_outputs"]
