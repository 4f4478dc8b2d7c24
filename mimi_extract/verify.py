"""``verify``: the batched path against transformers' own single-item encode, file by file."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .discover import BatchDataset, plan_batches
from .encoder import PaddedMimiEncoder, load_model, reference_single
from .runner import DTYPES, Settings, discover


@dataclass
class FileCheck:
    key: str
    duration: float
    frames: int = 0
    diff_encoder: float = 0.0  # max |batched - single| over the 25 Hz encoder output
    diff_latent: float = 0.0  # same for the 12.5 Hz latent
    code_mismatches: int = 0
    code_total: int = 0
    error: str | None = None

    def passed(self, atol: float, max_code_mismatches: int) -> bool:
        return self.error is None and max(self.diff_encoder, self.diff_latent) <= atol and (
            self.code_mismatches <= max_code_mismatches
        )


def verify(input_dir: str, settings: Settings, limit: int | None = None, on_file=None) -> list[FileCheck]:
    """Encode files in padded batches (``settings.dtype``) and one by one (fp32 reference)."""
    device = settings.devices[0]
    reference = load_model(settings.model, device, torch.float32)
    batched = reference if settings.dtype == "fp32" else load_model(settings.model, device, DTYPES[settings.dtype])
    encoder = PaddedMimiEncoder(batched)
    items, bad = discover(input_dir, settings.channel, limit)
    checks = [FileCheck(it.key, it.duration, error=it.error) for it in bad]
    data = BatchDataset(plan_batches(items, settings.max_batch_seconds, settings.batch_size), settings.causal_16k)
    for batch in data:
        checks += [FileCheck(it.key, it.duration, error=msg) for it, msg in batch.errors]
        if not batch.items:
            continue
        audio = batch.audio.to(device)
        taps = ("encoder", "latent", "codes")
        out = encoder(audio.to(DTYPES[settings.dtype]), batch.lengths, taps, settings.num_quantizers)
        for i, item in enumerate(batch.items):
            ref = reference_single(reference, audio[i, : batch.lengths[i]], settings.num_quantizers)
            check = FileCheck(item.key, item.duration, frames=int(out.lengths["latent"][i]))
            for tap in ("encoder", "latent"):
                n = int(out.lengths[tap][i])
                got = out.tensors[tap][i, :n].float()
                if got.shape != ref[tap].shape:
                    check.error = f"{tap} shape {tuple(got.shape)} != single-item {tuple(ref[tap].shape)}"
                    break
                setattr(check, f"diff_{tap}", float((got - ref[tap]).abs().max()))
            n = int(out.lengths["codes"][i])
            if check.error is None:
                check.code_mismatches = int((out.tensors["codes"][i, :, :n] != ref["codes"]).sum())
                check.code_total = ref["codes"].numel()
            checks.append(check)
            if on_file:
                on_file(check)
    return checks
