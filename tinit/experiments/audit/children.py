"""No process a user's ``--module`` code starts outlives its import and factory call.

``tinit audit --module`` runs the user's code in its own process (the model must be a
live ``nn.Module`` there, with hooks: it cannot come back from another process without
pickle, which tinit never loads). A factory that forks left its child running after the
audit ended (issue 41: reparented to init, still running after SIGTERM). While the
import and the call run (:func:`children_stopped`):

- the process is its own children's *subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``), so a
  grandchild whose parent exits (a daemon's double fork) is reparented to it, not to init;
- SIGTERM and SIGHUP raise :class:`~tinit.experiments.result.Stopped` (as in a run), so
  a stop while the factory runs still passes through the cleanup below;
- after the factory returns or fails, every process started meanwhile that is still
  there (children, and their children; running, or ended but never waited for) is
  killed (SIGKILL) and reaped, and the audit is refused in one line naming ``--module``
  and the processes (:class:`LeftChildren`): deterministically, whether a forked child
  had ended by then or not;
- a forked copy of tinit that returns from the factory ends there (``os._exit``), never
  running the audit a second time.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from ...model.config import ConfigError
from ..result import Stopped

#: prctl options (linux/prctl.h).
PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37


class LeftChildren(ConfigError):
    """The user's code left processes running (they have been stopped)."""

    def __init__(self, spec: str, pids: list[int]):
        shown = ", ".join(map(str, pids[:5])) + (f" and {len(pids) - 5} more" if len(pids) > 5 else "")
        super().__init__("--module", f"{spec}: its import or factory left process(es) behind (pid {shown}), "
                         "which tinit stopped and reaped: a factory must return its model without starting a "
                         "process it does not wait for (no fork, no background worker)")  # fmt: skip
        self.pids = pids


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process /proc lists (zombies included: they are reaped)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out[int(stat.parent.name)] = ppid
    return out


def _descendants(pid: int, skip: set[int]) -> list[int]:
    """The processes below ``pid`` (children first), leaving out ``skip`` and theirs."""
    parents = _parents()
    kids: dict[int, list[int]] = {}
    for p, pp in parents.items():
        kids.setdefault(pp, []).append(p)
    out, todo = [], [c for c in kids.get(pid, []) if c not in skip]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += kids.get(p, [])
    return out


def _libc():
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True)
    except (OSError, ImportError, AttributeError):
        return None


def _subreaper(on: bool | None = None) -> bool | None:
    """Whether this process is its descendants' subreaper; with ``on``, set it first.
    None where the platform has no such thing (not Linux)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "prctl") or not Path("/proc/self").exists():
        return None
    import ctypes

    if on is not None:
        libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)
    flag = ctypes.c_int(0)
    if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) != 0:
        return None
    return bool(flag.value)


def stop_new(pid: int, before: set[int]) -> list[int]:
    """Kill (SIGKILL) and reap every process below ``pid`` not below ``before``: the
    children first found, then any orphan reparented here meanwhile. Returns them all
    (one that had ended but was never waited for, a zombie, included)."""
    stopped: list[int] = []
    for _ in range(1000):  # (each round: the processes found, killed; their orphans come next)
        found = _descendants(pid, before)
        if not found:
            break
        for p in found:
            if p not in stopped:
                stopped.append(p)
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue  # (gone already; or not ours to end: never waited for)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(p, 0)  # (ours: reaped; a grandchild: reaped once reparented here)
    return stopped


@contextlib.contextmanager
def children_stopped(spec: str) -> Iterator[None]:
    """Run the user's code inside; see the module docstring. Raises :class:`LeftChildren`
    after the code when it left processes (the code's own error, if it raised, wins)."""
    if not Path("/proc/self/stat").exists():  # (no /proc: nothing to find them by)
        yield
        return
    pid = os.getpid()
    before = set(_descendants(pid, set()))
    was = _subreaper(True)
    handlers = {}

    def stop(signum, frame):
        raise Stopped(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            handlers[sig] = signal.signal(sig, stop)
        except ValueError:  # not the main thread
            pass
    left: list[int] = []
    try:
        yield
    finally:
        if os.getpid() != pid:  # a forked copy returning from the factory: it ends here
            os._exit(0)
        left = stop_new(pid, before)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if was is not None:
            _subreaper(was)
    if left:
        raise LeftChildren(spec, left)
