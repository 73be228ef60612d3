"""Factories that start processes and leave them (issue 41, item 4): each writes the pids
it started to the file $TINIT_TEST_PIDS, so the test can see them end."""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # (tests/: audit_models)

from audit_models import good_model  # noqa: E402


def _note(pid: int) -> None:
    with open(os.environ["TINIT_TEST_PIDS"], "a") as f:
        f.write(f"{pid}\n")


def _sleep_forever() -> None:
    try:
        time.sleep(600)
    finally:
        os._exit(0)


def forks():
    """A child that sleeps on after the factory returns."""
    pid = os.fork()
    if pid == 0:
        _sleep_forever()
    _note(pid)
    return good_model()


def forks_and_returns_twice():
    """The child returns from the factory too (it would run the audit a second time)."""
    pid = os.fork()
    if pid:
        _note(pid)
    return good_model()


def daemonizes():
    """A double fork: the grandchild's parent exits at once (it would be reparented to init)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        grand = os.fork()
        if grand == 0:
            _sleep_forever()
        os.write(w, f"{grand}\n".encode())
        os._exit(0)
    os.close(w)
    grand = int(os.read(r, 64).decode())
    _note(grand)
    return good_model()


def forks_then_sleeps():
    """A child, then the factory itself takes long (the audit is stopped meanwhile)."""
    pid = os.fork()
    if pid == 0:
        _sleep_forever()
    _note(pid)
    time.sleep(600)
    return good_model()


def forks_and_waits():
    """A child that ends and is waited for: nothing is left behind."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return good_model()
