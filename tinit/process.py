"""What the ``tinit`` console process does to itself, in one place (torch-free).

Three phases of a console run, each measured (docs/performance.md):

1. :func:`start` (``tinit.__main__``, before the CLI is imported): the garbage collector
   off, and glibc told to keep freed heap blocks (:func:`keep_freed_heap`).
2. :func:`imports_done` (``tinit.cli.runner.execute``, when the command has imported
   torch, pandas and matplotlib and is about to measure): the ~1e6 objects those imports
   made are frozen out of the collector's reach and the collector is on again for the
   run. Full collections over them cost ~0.45 s of every run's start (paired, 2-layer
   variance: 0.5 s CPU more without the pair).
3. :func:`before_exit` (``tinit.cli.main``): everything flushed, the objects frozen, so
   that Python's last collection at exit does not walk them (~1 s after torch, pandas and
   matplotlib; the operating system frees them with the process).

Library users (``import tinit``) get none of this: their process is theirs. Sweep
workers, forked from ``tinit sweep``, inherit phase 1 and run phase 2 themselves.
"""

from __future__ import annotations

import ctypes
import gc
import sys

#: glibc's mallopt parameters (malloc.h) and the values the console sets.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # glibc's own ceiling for its dynamic threshold
TRIM_THRESHOLD = 32 << 20

_LIBC: ctypes.CDLL | None | bool = None


def _libc() -> ctypes.CDLL | None:
    """glibc, or None (another C library, another system)."""
    global _LIBC
    if _LIBC is None:
        try:  # (not ctypes.util.find_library: it runs ldconfig, ~0.1 s)
            _LIBC = ctypes.CDLL("libc.so.6")
        except OSError:
            _LIBC = False
    return _LIBC or None


def keep_freed_heap() -> bool:
    """Let glibc keep freed blocks below 32 MiB in the heap for reuse (up to 32 MiB free
    at its top) instead of handing each back to the system and faulting fresh pages in on
    the next allocation. A forward makes and frees temporaries of ~1 MiB many times per
    layer; with glibc's defaults each one past its 2 MiB trim threshold went back to the
    system and came back as ~250 page faults. :func:`return_freed_memory` still hands
    freed memory back after each configuration, so ``rss_mib`` stays what is alive.
    False (nothing done) without glibc."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def return_freed_memory() -> None:
    """Hand the heap memory the process has freed back to the operating system (glibc's
    ``malloc_trim``; a no-op elsewhere). Freed blocks below the mmap threshold stay in the
    heap: without this the resident memory after a configuration is that of the largest
    one before it, although nothing of it is alive."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


def start() -> None:
    """Phase 1: the collector off until the command's imports are done; freed heap kept."""
    gc.disable()
    keep_freed_heap()


def imports_done() -> None:
    """Phase 2: freeze what the imports made and turn the collector on (only where
    :func:`start` turned it off: in-process callers such as tests keep theirs)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def before_exit() -> None:
    """Phase 3: flush, then freeze every object alive, so that the interpreter's last
    collection skips them (the atexit handlers still run)."""
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()
