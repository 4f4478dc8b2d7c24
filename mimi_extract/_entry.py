"""Console entry point, kept import-light: Ctrl-C during start-up (torch imports take seconds) ends
with a one-line message and exit 130, not a traceback."""

import os
import sys


def run() -> int:
    try:
        from .cli import app

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


if __name__ == "__main__":
    sys.exit(run())
