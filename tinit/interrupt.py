"""What a Ctrl-C outside a measurement does: one line, exit code 130. Its own small
module, so that the entry point (:mod:`tinit.__main__`, before the CLI is imported)
and the CLI share it without importing each other."""

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
