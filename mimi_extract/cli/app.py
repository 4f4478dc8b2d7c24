"""Command line: ``mimi-extract features | codes | verify | status | plan | info | report | cuts | decode``.

Parsing and printing only: ``request`` turns the options into a run request, and the work happens
in ``run``, ``audit`` and ``readers``.  The app and what its commands share are ``common``; the
commands, registered in --help's order, are ``extract`` (features, codes), ``verify`` and ``read``
(status, plan, info, report, cuts, decode).  Every string that can
hold a path or an error message is printed as plain text (never as rich markup), so a file named
``[bold]x.wav`` is shown as it is and ``[/x]`` cannot crash the program.

Heavy modules (torch, transformers: seconds to import) are imported inside the commands that
encode, so ``--help``, ``--version``, ``info``, ``status`` and ``cuts`` answer in well under a second;
the choices offered come from the torch-free ``choices``.

Exit codes (also in ``--help``): 0 done; 1 ``--strict`` and some input failed, or ``verify`` found
a difference; 2 usage error, or OUT or the model unusable (an OUT that is missing, not a run, malformed --
its file and line named, one line, never a traceback -- or unreachable); 3 no input found; 4 every input
failed; 5 the address-space limit (``ulimit -v``) is too small for torch (see ``limits``); 130
interrupted (what was encoded is committed: run the same command to resume).
"""

from .common import app
from . import extract, verify, read  # noqa: F401,E402  (each registers its commands on the app, in --help's order)

__all__ = ["app"]

if __name__ == "__main__":
    import sys

    sys.exit(app())
