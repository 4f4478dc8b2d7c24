"""Console entry point, kept import-light: Ctrl-C during start-up (torch imports take seconds) ends
with a one-line message and exit 130, not a traceback; an address-space limit too small for torch
(``ulimit -v``) ends with a one-line message and exit 5 (see :mod:`.cli.limits`).  OpenMP's wait
policy is set before anything imports torch (see :mod:`.common.threads`)."""

import os
import sys

from .cli import limits
from .common.threads import passive_openmp

TORCH_COMMANDS = ("codes", "features", "verify", "decode")  # the others never import torch


def _needs_torch(args: list[str]) -> bool:
    return bool(args) and args[0] in TORCH_COMMANDS and "--help" not in args


def _leave(message: str, code: int) -> None:
    sys.stdout.flush()
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    os._exit(code)  # a half-imported torch may not survive interpreter shutdown


def run() -> int:
    passive_openmp()  # before torch's libgomp reads the environment (this process, and the workers it starts)
    if _needs_torch(sys.argv[1:]):
        problem = limits.check()
        if problem:
            _leave(problem, limits.EXIT_ADDRESS_SPACE)
    try:
        from .cli.app import app

        return app(prog_name="mimi-extract", standalone_mode=True)
    except KeyboardInterrupt:  # during start-up (torch imports): nothing held, nothing written; an
        sys.stderr.write("interrupted.\n")  # interpreter shutdown after an interrupted import is not reliable
        sys.stderr.flush()
        os._exit(130)
    except SystemExit as e:
        if e.code == 130:  # interrupted, everything committed: leave now, so that a second Ctrl-C
            sys.stdout.flush()  # arriving during interpreter shutdown cannot change the outcome
            sys.stderr.flush()
            os._exit(130)
        raise
    except Exception as e:  # noqa: BLE001 -- only to recognise a too-small address space
        problem = limits.explain(e)
        if problem:
            _leave(problem, limits.EXIT_ADDRESS_SPACE)
        raise


if __name__ == "__main__":
    sys.exit(run())
