"""``verify``: what the tool produces against transformers' own single-item encode, file by file.

Two audits:

* :func:`verify_source` -- encode files through the extraction engine itself (length-sorted
  padded batches, long files chunked with carried state, continuous batching), then each file
  alone with ``MimiModel``'s unmodified forward passes, and compare;
* :func:`verify_outputs` -- re-encode a random sample of what an OUT directory holds, one by one
  in fp32, and compare with the stored arrays and attributes (a dataset made on another device,
  dtype or batch mix is audited after the fact).

Features pass when ``max|Δ| <= rtol * max|ref| + atol`` per file: fp32 rounding is relative, and
oneDNN/cuDNN pick other kernels for other lengths.  A code that differs is a *tie flip* when the
reference's decision there was within float noise: RVQ picks the nearest codeword, and if the
two nearest are closer in distance than the perturbation of the residual can move them, either
answer is right.  By the triangle inequality a perturbation ``Δr`` moves each distance by at most
``|Δr|``, so a flip with margin ``d2 - d1 <= 2|Δr| + 2ρ`` (ρ: the float rounding of one cdist
distance) is a tie flip; the codebooks after it in that frame follow from it.  Every other
mismatch is real, and fails.  ``Δr`` is measured when the batched latent is at hand; for stored
codes alone it is bounded by the relative tolerance (``rtol * |r|``).
"""

from __future__ import annotations

import os
import random
import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from .audio import SAMPLE_RATE, Framing, load
from .encoder import PaddedMimiEncoder, encode_chunked, encoder_parts, load_model, reference_single, weights_hash
from .engines import DeviceRunner
from .plan import plan_units
from .settings import Settings
from .sources import Item, Options, discover, open_audio, seconds_to_samples
from .formats.common import _PART_RE, item_attrs, load_row, read_manifest, read_run_info, shard_attrs

EPS32 = float(torch.finfo(torch.float32).eps)


@dataclass
class Mismatch:
    frame: int
    codebook: int
    margin: float  # reference: distance to 2nd-best minus best codeword
    noise: float  # how much float noise could move that margin
    tie: bool
    cascade: bool = False  # follows an earlier flip in the same frame


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

    @property
    def first_real_frame(self) -> int | None:
        return min((m.frame for m in self.mismatches if not m.tie), default=None)

    def relative(self, tap: str) -> float:
        return self.diff.get(tap, 0.0) / max(self.scale.get(tap, 0.0), 1e-30)

    def passed(self, rtol: float, atol: float, max_real: int = 0) -> bool:
        if self.error is not None:
            return False
        features_ok = all(self.diff[t] <= rtol * self.scale[t] + atol for t in self.diff)
        return features_ok and self.real <= max_real


# -- RVQ decision margins ------------------------------------------------------------------
@torch.no_grad()
def rvq_trace(model, latent: torch.Tensor, num_quantizers: int) -> dict:
    """Re-run Mimi's split RVQ on one item's latent [frames, D] exactly as transformers does, and
    record per codebook: codes [F, N], best and second-best distances, residual norms, and the
    projected input of each RVQ group (to measure how far a perturbation moves a residual)."""
    q = model.quantizer
    x = latent.T[None].float()  # [1, D, F]
    n_sem = q.num_semantic_quantizers
    codes, d1, d2, rnorm, cnorm, group = [], [], [], [], [], []
    for g, (rvq, n) in enumerate(((q.semantic_residual_vector_quantizer, min(n_sem, num_quantizers)),
                                  (q.acoustic_residual_vector_quantizer, num_quantizers - n_sem))):
        if n <= 0:
            continue
        residual = rvq.input_proj(x) if rvq.input_proj is not None else x
        for layer in rvq.layers[:n]:
            r = residual[0].T  # [F, d]
            embed = layer.codebook.embed.float()
            dists = torch.cdist(r[None], embed[None], p=2)[0]
            idx = dists.argmin(dim=-1)  # the reference's choice (first minimum)
            best2 = dists.topk(min(2, dists.shape[-1]), dim=-1, largest=False).values
            codes.append(idx)
            d1.append(best2[:, 0])
            d2.append(best2[:, -1])
            rnorm.append(r.norm(dim=-1))
            cnorm.append(embed.norm(dim=-1).max().expand(r.shape[0]))
            group.append(g)
            residual = residual - layer.decode(idx[None])
    return {"codes": torch.stack(codes, 1), "d1": torch.stack(d1, 1), "d2": torch.stack(d2, 1),
            "rnorm": torch.stack(rnorm, 1), "cnorm": torch.stack(cnorm, 1), "group": group}


def _projected_delta(model, delta: torch.Tensor, groups: list[int]) -> torch.Tensor:
    """|input_proj(Δlatent)| per frame for each codebook's RVQ group [F, N] (the projection is linear)."""
    q = model.quantizer
    norms = []
    for rvq in (q.semantic_residual_vector_quantizer, q.acoustic_residual_vector_quantizer):
        d = delta.T[None].float()
        d = rvq.input_proj(d) if rvq.input_proj is not None else d
        norms.append(d[0].norm(dim=0))
    return torch.stack([norms[g] for g in groups], 1)


@torch.no_grad()
def classify_codes(model, got: torch.Tensor, ref_latent: torch.Tensor, num_quantizers: int,
                   got_latent: torch.Tensor | None = None, rtol: float = 1e-5) -> tuple[list[Mismatch], torch.Tensor]:
    """Mismatches of ``got`` [F, N] against the reference codes of ``ref_latent``, each classified
    as a tie flip or a real mismatch (see the module docstring).  Returns (mismatches, ref codes)."""
    trace = rvq_trace(model, ref_latent, num_quantizers)
    ref = trace["codes"]
    if got.shape != ref.shape:
        raise ValueError(f"codes shape {tuple(got.shape)} != reference {tuple(ref.shape)}")
    diff = (got.to(ref.device).long() != ref)
    if not bool(diff.any()):
        return [], ref
    margin = trace["d2"] - trace["d1"]
    rounding = 8 * EPS32 * (trace["rnorm"] ** 2 + trace["cnorm"] ** 2) / trace["d1"].clamp(min=1e-12)
    if got_latent is not None and got_latent.shape == ref_latent.shape:
        perturbation = _projected_delta(model, got_latent.float() - ref_latent.float(), trace["group"])
    else:
        perturbation = rtol * trace["rnorm"]
    noise = 2 * perturbation + 2 * rounding
    out = []
    for frame in torch.nonzero(diff.any(dim=1)).flatten().tolist():
        books = torch.nonzero(diff[frame]).flatten().tolist()
        first = books[0]
        tie = bool(margin[frame, first] <= noise[frame, first])
        for k in books:
            out.append(Mismatch(frame, k, float(margin[frame, k]), float(noise[frame, k]), tie, cascade=k != first))
    return out, ref


def _compare_features(check: FileCheck, tap: str, got: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> bool:
    if got.shape != ref.shape:
        check.error = f"{tap} shape {tuple(got.shape)} != single-item {tuple(ref.shape)}"
        return False
    delta = (got.float() - ref.float()).abs()
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
    found = discover(source, settings.channel, settings.framing_rule, limit, options=options)
    checks = [FileCheck(it.key, it.duration, note=f"unreadable: {it.error}") for it in found.bad]
    if not found.items:
        return checks
    runner = DeviceRunner(settings, device, reference if settings.dtype == "fp32" else None,
                          taps=("encoder", "latent", "codes"))
    units = plan_units(found.items, runner.chunk, settings.step_seconds, settings.rows)
    todo = iter(units)
    results: dict[str, dict] = {}
    errors: dict[str, str] = {}

    def collect(piece):
        if piece.error is not None:
            errors[piece.item.key] = piece.error
            return
        got = results.setdefault(piece.item.key, {t: [] for t in piece.data})
        for t, v in piece.data.items():
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
            audio = load(open_audio(item), item.channel, framing=settings.framing_rule, start=item.start,
                         frames=item.frames)
            ref = reference_single(reference, audio.to(device), settings.num_quantizers,
                                   settings.framing_rule.stream_frames)
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
def _item_of_row(row: dict) -> Item:
    src = row["source"]
    rate = row["sample_rate"]
    start = seconds_to_samples(row.get("start") or 0.0, rate)  # the very samples discovery read
    frames = seconds_to_samples(row["end"] - row["start"], rate) if row.get("end") is not None else src["frames"]
    channel = row["channel"] if row.get("channel") is not None else None
    loc = tuple(src["loc"]) if src.get("loc") is not None else None
    return Item(src["path"], row["path"], row["key"], channel, rate, start, frames, kind=src.get("kind", "file"), loc=loc)


def verify_outputs(out_dir: str, sample: int | None = 20, seed: int = 0, device: str = "cpu", model: str | None = None,
                   rtol: float = 1e-5, atol: float = 1e-6, on_file=None,
                   chunk_seconds: float = 30.0) -> tuple[list[FileCheck], list[str]]:
    """Re-encode a random sample of OUT's items one by one (fp32) and compare with what is stored.

    Items longer than ``chunk_seconds`` are re-encoded alone through the chunked encoder (its
    equality with the unchunked reference is what ``verify INPUT`` and the test suite check):
    transformers' unchunked encode of an hour-long item needs a T x T attention mask that no
    machine holds.  Returns (checks, problems found with the run as a whole)."""
    rows = [r for r in read_manifest(out_dir) if r.get("status") == "ok"]
    problems = []
    if not rows:
        return [], [f"{out_dir} holds no encoded items"]
    infos = {}
    for row in rows:
        top = row["shard"].split("/")[0]  # a part's folder, or a shard (or a format's folder) of a whole run
        run_dir = os.path.join(out_dir, top) if _PART_RE.fullmatch(top) else out_dir
        infos.setdefault(run_dir, read_run_info(run_dir))
    info = next(iter(infos.values()))
    name = model or info["model"]
    reference = load_model(name, device, torch.float32)
    if weights_hash(reference) != info.get("weights"):
        problems.append(f"the model {name!r} is not the one OUT was made with (weights {info.get('weights')})")
    picked = random.Random(seed).sample(rows, min(sample, len(rows))) if sample else rows
    framing = Framing(info.get("framing", "transformers"), info.get("causal_16k", True), info.get("frames_per_call", 1))
    tap, nq = info["tap"], info.get("num_quantizers")
    chunked = PaddedMimiEncoder(reference, framing.stream_frames)
    chunk = max(chunked.hop, int(chunk_seconds * SAMPLE_RATE) // chunked.hop * chunked.hop)
    checks = []
    for row in picked:
        item = _item_of_row(row)
        check = FileCheck(row["key"], row.get("duration", 0.0))
        try:
            channel = item.channel if item.channel is not None else info.get("channel", "mix")
            audio = load(open_audio(item), channel, framing=framing, start=item.start, frames=item.frames)
        except Exception as e:
            check.error = f"cannot re-read the source: {e}"
            checks.append(check)
            continue
        try:
            if audio.shape[-1] > chunk:
                check.chunked = True
                ref = encode_chunked(chunked, [audio.to(device)], chunk, ("encoder", "latent", "codes"), nq)[0]
            else:
                ref = reference_single(reference, audio.to(device), nq, framing.stream_frames)
        except Exception as e:  # out of memory, or anything else: this item's check fails, the audit goes on
            check.error = f"cannot re-encode: {type(e).__name__}: {e}"
            checks.append(check)
            continue
        try:  # through the shard's format: an HDF5 dataset, a Parquet row...
            stored = torch.from_numpy(np.ascontiguousarray(load_row(out_dir, row)))
            attrs, ds_attrs = shard_attrs(out_dir, row["shard"]), item_attrs(out_dir, row)
        except Exception as e:  # noqa: BLE001 -- a damaged item fails its check, the audit goes on
            check.error = f"cannot read the stored item: {type(e).__name__}: {e}"
            checks.append(check)
            continue
        for key, want in (("tap", tap), ("framing", framing.name), ("weights", info.get("weights"))):
            if attrs.get(key) is not None and attrs.get(key) != want:
                check.error = f"shard attribute {key}={attrs.get(key)!r}, run.json says {want!r}"
        if check.error is None and abs(float(ds_attrs.get("duration", row["duration"])) - row["duration"]) > 1e-3:
            check.error = f"dataset duration {ds_attrs.get('duration')} != manifest {row['duration']}"
        if check.error is None:
            check.frames = int(ref["codes"].shape[0])
            if tap == "codes":
                if stored.shape != ref["codes"].shape:
                    check.error = f"codes shape {tuple(stored.shape)} != reference {tuple(ref['codes'].shape)}"
                else:
                    check.code_total = stored.numel()
                    check.mismatches, _ = classify_codes(reference, stored, ref["latent"], nq, None, rtol)
                    bad = [m.frame for m in check.mismatches if not m.tie]
                    check.first_diverging["codes"] = min(bad) if bad else None
            else:
                _compare_features(check, tap, stored, ref[tap], max(rtol, 1e-3 if stored.dtype == torch.float16 else 0),
                                  atol)
        checks.append(check)
        if on_file:
            on_file(check)
    return checks, problems


__all__ = ["FileCheck", "Mismatch", "classify_codes", "rvq_trace", "verify_source", "verify_outputs", "encoder_parts"]
