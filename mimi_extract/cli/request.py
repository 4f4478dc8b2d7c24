"""The request a command line asks (:func:`build_request`: the options of ``codes`` and ``features``
as a :class:`~mimi_extract.config.request.RunRequest`), and the settings of ``verify INPUT``.

Torch-free to import.  The checks that need no torch (option combinations, ``--part``, whether the
model can be loaded here at all) run before the devices are resolved, which imports torch (seconds):
an offline first run fails in about a second, before OUT is touched.
"""

from __future__ import annotations

import os
from dataclasses import fields, replace

from ..codec.hub import offline_problem
from ..config.input_options import Options
from ..config.request import RunRequest
from ..config.settings import Settings, parse_part


# the command line's options that are the request's own fields (the rest: Settings and Options)
_REQUEST_FIELDS = ("shard_size", "shard_mb", "limit", "reencode_damaged", "reencode_changed")


def build_request(source: str, out_dir: str, **values) -> RunRequest:
    """The request that a command line (``codes``, ``features``) asks: ``values`` are its options by
    parameter name, each of the request's, the :class:`Settings`' or the :class:`Options`' fields
    (enum members stand for their values; :func:`run_settings` names the few spelled otherwise).
    Raises ValueError for a usage error or a model that cannot be loaded here."""
    values = _plain(values)
    options = input_options(values)
    asked = {name: values.pop(name) for name in _REQUEST_FIELDS if name in values}
    part = parse_part(values.pop("part", None))
    settings = run_settings(values)
    if options.input_format:
        from ..sources import REGISTRY  # (torch is imported by now: resolving the devices did)

        if options.input_format not in REGISTRY:
            raise ValueError(f"--input-format {options.input_format!r}: choose from {', '.join(sorted(REGISTRY))}")
    return RunRequest(source, out_dir, settings, options, part=part, **asked)


def input_options(values: dict) -> Options:
    """The :class:`Options` among the command line's ``values``, taken out of them: each value named
    as a field of Options; ``audio_ext`` is comma-separated.  A reserved ``--keep-fields`` name is a
    ValueError here, before OUT is touched."""
    given = _plain({f.name: values.pop(f.name) for f in fields(Options) if f.name in values})
    if "audio_ext" in given:
        ext = given["audio_ext"]
        given["audio_ext"] = tuple(e.strip().lstrip(".") for e in ext.split(",") if e.strip()) if ext else None
    options = Options(**given)
    options.keep  # noqa: B018 -- parsed now: a reserved name is a usage error
    return options


def run_settings(values: dict, offline_check: bool = True) -> Settings:
    """:class:`Settings` of the command line's ``values`` (the Settings' fields by name), but for
    ``model`` (a local directory becomes its resolved path), ``device`` and ``cpu_workers`` (the
    devices), ``resampler`` or the old ``causal_16k`` flag, ``output_format`` (``--format``; implied
    by ``shar_extend``) and ``tap`` None (the framing's own: ``encoder`` for muvap, else ``latent``).
    The model is checked before the devices are resolved (torch imported): ``offline_problem``."""
    values = _plain(values)
    model = model_path(values.pop("model"))
    resampler, causal_16k = values.pop("resampler", "torchaudio"), values.pop("causal_16k", None)
    values["causal_16k"] = causal_16k if causal_16k is not None else resampler == "causal"
    values.update(format_settings(values.pop("output_format", "hdf5"), values.pop("shar_extend", False)))
    if "tap" in values and values["tap"] is None:
        values["tap"] = "encoder" if values.get("framing") == "muvap" else "latent"
    values.update(token_settings(values["format"], values.get("tap", "latent"), values.pop("token_layout", None),
                                 values.pop("token_offset", None)))
    if values.get("frames_per_call", 1) != 1 and values.get("framing") != "moshi-stream":
        raise ValueError("--frames-per-call is for --framing moshi-stream (moshi's streaming encode) only")
    problem = offline_problem(model) if offline_check else None  # before OUT is touched, and before torch
    if problem:
        raise ValueError(problem)
    from ..engines.device import resolve_devices  # (imports torch)

    feeders = values.pop("feeders_per_gpu", None)  # None: sized from the corpus's codecs by the run (Settings.fed)
    devices = resolve_devices(values.pop("device"), values.pop("cpu_workers", None), feeders)
    dtype = values.get("dtype", "fp32")
    if dtype != "fp32" and not all(d.startswith("cuda") for d in devices):
        raise ValueError(f"--dtype {dtype} needs GPUs (devices: {', '.join(sorted(set(devices)))}); use fp32 on CPU")
    return Settings(model=model, devices=devices, feeders_per_gpu=feeders, **values)


def engine_check_settings(values: dict) -> Settings:
    """The settings of the engine under test in ``verify INPUT``: ``values`` as for a run (the model
    is not checked first: verify loads it at once), on one device, with one decoding thread."""
    settings = run_settings({**values, "num_workers": 1}, offline_check=False)
    return replace(settings, devices=settings.devices[:1])


def format_settings(output_format: str, shar_extend: bool) -> dict:
    """--format, and --shar-extend (a lhotse Shar field: the shar format, implied)."""
    if not shar_extend:
        return {"format": output_format}
    if output_format not in ("hdf5", "shar"):  # hdf5: the default, not chosen
        raise ValueError(f"--shar-extend adds a lhotse Shar field: it writes --format shar, not {output_format}")
    return {"shar_extend": True, "format": "shar"}


def token_settings(output_format: str, tap: str, layout: str | None, offset: int | None) -> dict:
    """What --format stores (a token format: codes only), and --token-layout / --token-offset (only
    for a format that writes token ids): usage errors here, before OUT is touched."""
    from ..formats import formats, get_format  # (the registry imports no torch)

    fmt = get_format(output_format)
    if tap not in fmt.taps:
        raise ValueError(f"--format {fmt.name} writes token ids, made from codes only: use `mimi-extract codes ... "
                         f"--format {fmt.name}`, or another --format for {tap} features")
    if not fmt.tokens:
        if layout is not None or offset is not None:
            raise ValueError("--token-layout and --token-offset are for a format that writes token ids (--format "
                             + " or ".join(f.name for f in formats() if f.tokens) + ")")
        return {}
    return {k: v for k, v in (("token_layout", layout), ("token_offset", offset)) if v is not None}


def _plain(values: dict) -> dict:
    """A copy of ``values`` with each enum member (a command-line choice) as its value."""
    return {name: getattr(value, "value", value) for name, value in values.items()}


def model_path(model: str) -> str:
    """A local model directory as an absolute, resolved path (stored in run.json: ``verify --out``
    and ``decode`` then find it from any directory); a hub id as typed."""
    return os.path.realpath(model) if os.path.isdir(model) else model
