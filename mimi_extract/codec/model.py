"""Getting a Mimi model: loading it (hub id or local directory) and naming it (config and weight hashes).

Kept apart from ``encoder.py``, which only computes: every output records which model made it
(``config_hash``, ``weights_hash``), and a resumed run refuses to mix outputs of two models.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from importlib import metadata

import torch
import transformers
from torch import nn
from transformers import MimiModel
from transformers.utils import logging as hf_logging

from .internals import drop_codebook_cache
from .hub import looks_local


@dataclass(frozen=True)
class ModelIdentity:
    """What names a loaded model in ``run.json`` and every shard: its config's and weights' hashes
    (a resume with another model is refused), the libraries that ran it (provenance, never
    compared), and the config itself (a tap's frame rate, a format's token layout)."""

    config: object
    config_hash: str
    weights: str
    versions: dict

    @classmethod
    def of(cls, model: nn.Module) -> "ModelIdentity":
        return cls(model.config, config_hash(model.config), weights_hash(model), library_versions())


def config_hash(config) -> str:
    """Short stable hash of a model config, stored with every output for provenance."""
    fields = {k: v for k, v in config.to_dict().items() if not k.startswith("_") and k != "transformers_version"}
    cfg = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(cfg.encode()).hexdigest()[:16]


def weights_hash(model: nn.Module) -> str:
    """Content hash of the encoder-side weights (every tensor of the state dict that encoding reads).

    Two checkpoints with one config but other weights (a fine-tune, another seed) differ here, so a
    resumed run can refuse to mix their outputs.  Hashed as float32 on CPU, so the dtype or device a
    run computes in does not change it."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if name.startswith(("decoder", "upsample")):
            continue  # not used to encode
        t = tensor.detach().to("cpu", torch.float32).contiguous()
        h.update(f"{name}:{tuple(t.shape)}:".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:24]


def library_versions() -> dict:
    """The versions of the libraries that compute the outputs (run.json's ``versions``): torch and
    transformers (the reference: transformers' Mimi attends to its sliding window only since 5.3.0),
    and the tests' resampling reference torchaudio (installed distribution, not imported: None when
    absent).  Provenance, not identity: a resume with other versions is not refused, and ``verify
    --out`` says when the installed transformers is not the one that made OUT."""
    try:
        torchaudio = metadata.version("torchaudio")
    except metadata.PackageNotFoundError:
        torchaudio = None
    return {"torch": torch.__version__, "transformers": transformers.__version__, "torchaudio": torchaudio}


def reset_codebook_cache(model: nn.Module) -> None:
    """Codebooks cache ``embed`` lazily; drop it after moving/casting the model or editing weights."""
    drop_codebook_cache(model)


def from_pretrained(cls, name_or_path: str, **kwargs):
    """``cls.from_pretrained`` with an actionable error instead of a long hub traceback."""
    path = os.path.expanduser(name_or_path)
    if looks_local(name_or_path) and not os.path.isdir(path):
        raise RuntimeError(f"model directory {name_or_path!r} does not exist")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        return cls.from_pretrained(path, **kwargs)
    except OSError as e:
        raise RuntimeError(
            f"could not load Mimi from {name_or_path!r}: {e}\n"
            "Pass a local directory saved with `save_pretrained`, or a hub id on a machine with network."
        ) from e
    except Exception as e:  # safetensors/json errors on a truncated or corrupt download
        raise RuntimeError(
            f"could not load Mimi from {name_or_path!r}: the weights or config are damaged "
            f"({type(e).__name__}: {e}); re-download or re-save the model"
        ) from e


def load_model(name_or_path: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """``MimiModel.from_pretrained`` (hub id or local dir) in eval mode on ``device``."""
    return prepare(from_pretrained(MimiModel, name_or_path, attn_implementation="sdpa"), device, dtype)


def prepare(model: nn.Module, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """``model`` in eval mode on ``device`` in ``dtype``, its codebook cache dropped (it was built
    for the old device and dtype)."""
    model = model.to(device=device, dtype=dtype).eval()
    reset_codebook_cache(model)
    return model
