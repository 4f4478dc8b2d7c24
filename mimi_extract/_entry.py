"""Console entry point, kept import-light: Ctrl-C during start-up (torch imports take seconds) ends
with a one-line message and exit 130, not a traceback."""

import sys


def run() -> int:
    try:
        from .cli import app

        return app(prog_name="mimi-extract", standalone_mode=True)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted.\n")
        return 130


if __name__ == "__main__":
    sys.exit(run())
