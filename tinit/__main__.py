"""``python -m tinit``, and the ``tinit`` console script's entry point.

The CLI is imported inside :func:`main`, so a Ctrl-C even while Python imports it
ends in one line, not a traceback."""

import ctypes
import gc

from .interrupt import interrupted

#: glibc's mallopt parameters (malloc.h) and the values the console sets.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # glibc's own ceiling for its dynamic threshold
TRIM_THRESHOLD = 64 << 20


def keep_freed_heap() -> bool:
    """Let glibc keep freed blocks below 32 MiB in the heap for reuse (up to 64 MiB free
    at its top) instead of handing each back to the system and faulting fresh pages in on
    the next allocation. A forward makes and frees temporaries of ~1 MiB many times per
    layer; with glibc's defaults each one past its 2 MiB trim threshold went back to the
    system and came back as ~250 page faults. The runner still hands freed memory back
    after each configuration (``malloc_trim``), so ``rss_mib`` stays what is alive.
    A no-op (False) without glibc."""
    try:  # (not ctypes.util.find_library: it runs ldconfig, ~0.1 s)
        mallopt = getattr(ctypes.CDLL("libc.so.6"), "mallopt", None)
    except OSError:
        return False
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def main() -> None:
    # Importing the CLI, then the command's torch, pandas and matplotlib, makes ~1e6
    # objects that live as long as the process and almost no garbage; full collections
    # over them took 0.45 s of every run. The collector is off until the command has
    # imported what it needs, then those objects are frozen out of its reach and it is
    # on again for the run (tinit.cli.runner.execute).
    gc.disable()
    keep_freed_heap()
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        interrupted()
    cli_main()


if __name__ == "__main__":
    main()
