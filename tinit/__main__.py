"""``python -m tinit``, and the ``tinit`` console script's entry point.

The CLI is imported inside :func:`main`, so a Ctrl-C even while Python imports it
ends in one line, not a traceback."""

import gc
import sys


def interrupted() -> None:
    """The one line a Ctrl-C outside a measurement prints; exit code 130 (128 + SIGINT)."""
    try:
        if sys.stderr.isatty():
            sys.stderr.write("\n")  # past the terminal's ^C
        sys.stderr.write("Interrupted.\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    # CPython (3.11) marks a KeyboardInterrupt that escapes code run by exec(str) (a
    # dataclass or namedtuple being created when the Ctrl-C came) as unhandled even when
    # it was caught, and then ends the process by SIGINT instead of this exit code; the
    # next exec of a string clears that mark.
    exec("None")
    raise SystemExit(130)


def main() -> None:
    # Importing the CLI, then the command's torch, pandas and matplotlib, makes ~1e6
    # objects that live as long as the process and almost no garbage; full collections
    # over them took 0.45 s of every run. The collector is off until the command has
    # imported what it needs, then those objects are frozen out of its reach and it is
    # on again for the run (tinit.cli.runner.execute).
    gc.disable()
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        interrupted()
    cli_main()


if __name__ == "__main__":
    main()
