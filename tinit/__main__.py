"""``python -m tinit``, and the ``tinit`` console script's entry point.

The CLI is imported inside :func:`main`, so a Ctrl-C even while Python imports it
ends in one line, not a traceback. What the process does to itself (the collector, the
heap) is :mod:`tinit.process`'s."""

from . import process
from .interrupt import interrupted


def main() -> None:
    process.start()
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        interrupted()
    cli_main()


if __name__ == "__main__":
    main()
