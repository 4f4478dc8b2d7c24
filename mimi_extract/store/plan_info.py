"""``plan.json``: what the last run of a run directory planned (its inputs and their seconds, when,
which part), written once a run has planned (:func:`write_plan`: ``RunDirectory.begin``), read by
``status`` and ``info`` (:func:`read_plan`)."""

from __future__ import annotations

import json
import os
import time

from ..common import remote
from .files import PLAN_INFO, MalformedError, read_json, write_atomic
from .manifest import RunFiles


def write_plan(run_dir: str, inputs: int, seconds: float, part: str) -> None:
    """``plan.json`` of ``run_dir``, atomically: ``inputs`` (readable and unreadable) and their seconds."""
    write_atomic(os.path.join(run_dir, PLAN_INFO), json.dumps(
        {"inputs": inputs, "seconds": seconds, "updated": time.strftime("%Y-%m-%d %H:%M:%S %z"), "part": part}))


def read_plan(files: RunFiles) -> dict:
    """What the last run of a run directory planned (``plan.json``: inputs, seconds, when); a
    malformed one is a MalformedError naming it."""
    if not files.exists(PLAN_INFO):
        return {}
    path = remote.join(files.path, PLAN_INFO)
    plan = read_json(path, files.read) or {}
    inputs = plan.get("inputs")
    if inputs is not None and (not isinstance(inputs, int) or isinstance(inputs, bool) or inputs < 0):
        raise MalformedError(f"{path} has inputs {json.dumps(inputs)[:40]}, not a count: it was edited or damaged")
    return plan
