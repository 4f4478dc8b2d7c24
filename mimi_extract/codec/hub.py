"""Can the model be loaded here?  Answered before a run touches OUT.

Without network, transformers retries the Hub for about 45 s and then says it could not connect,
and the run has already created ``OUT/lock``.  A hub id that is neither a local directory nor in
the Hugging Face cache needs the Hub: when it is off (``HF_HUB_OFFLINE``) or unreachable (one
HEAD request, a few seconds), the run stops at once with the way to run offline.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request

OFFLINE_HELP = ("Without network: pass a local model directory with --model DIR (a copy of kyutai/mimi saved "
                "with save_pretrained, or a Hugging Face cache filled on another machine), or try the pipeline "
                "with a seeded random tiny model: python scripts/make_demo.py demo --random-model tiny, then "
                "--model tiny (run it with the Python that has mimi-extract installed, e.g. .venv/bin/python).")


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _cached(model: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        return isinstance(try_to_load_from_cache(model, "config.json"), str)
    except Exception:  # not a valid repo id: transformers will say so
        return False


def hub_reachable(timeout: float = 5.0) -> str | None:
    """None if the Hub answers (any HTTP status counts), else why not."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return f"{endpoint} is unreachable ({reason})"
    return None


def looks_local(model: str) -> bool:
    """Whether ``--model`` names a directory rather than a Hub id (``name`` or ``org/name``): it
    starts with ``.``, ``/`` or ``~``, or holds more than one ``/``.  Such a name never goes to the
    Hub: when the directory (``~`` expanded) is missing, the run says so instead of asking the Hub.
    The one rule for the offline check and for loading (``model.from_pretrained``)."""
    return model.startswith((".", "/", "~")) or model.count("/") > 1


def offline_problem(model: str, timeout: float = 5.0) -> str | None:
    """A message if ``model`` can only come from the Hub and the Hub cannot be used; else None."""
    if os.path.isdir(os.path.expanduser(model)):
        return None
    if looks_local(model):
        return f"--model {model!r}: the directory does not exist. {OFFLINE_HELP}"
    if _cached(model):
        return None
    if _truthy("HF_HUB_OFFLINE") or _truthy("TRANSFORMERS_OFFLINE"):
        why = "HF_HUB_OFFLINE is set" if _truthy("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE is set"
    else:
        why = hub_reachable(timeout)
        if why is None:
            return None
    return f"cannot load {model!r}: it is not in the Hugging Face cache and {why}. {OFFLINE_HELP}"
