"""``python -m tinit``, and the ``tinit`` console script's entry point.

The CLI is imported inside :func:`main`, so a Ctrl-C even while Python imports it
ends in one line, not a traceback."""

import gc

from .interrupt import interrupted


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
