"""A Python interpreter with the heavy imports done once, for tests that run a script
starting many Python processes (tests/test_benchmarks.py: benchmarks/device_check.sh
starts nine, each importing torch, ~3 s apiece on this machine).

:func:`forkserver` starts a server that imports torch, pandas, matplotlib, typer, rich,
pytest (and transformers where installed), then waits on a Unix socket, and writes an
executable ``python`` into a folder: a client that hands its arguments, working folder,
environment and standard streams to the server, which forks a child that runs them as
``python ARGS`` would (``-c CODE``, ``-m MODULE`` or ``SCRIPT``, with ``sys.argv``,
``sys.path[0]``, ``__main__`` and the exit code as the interpreter sets them). The
client exits with the child's exit code and passes SIGTERM and SIGINT on to it, so the
script's own `timeout` still ends a step. Every such "process" is a fresh fork of the
same imported state: nothing one step does reaches another.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from contextlib import contextmanager
from pathlib import Path

SERVER = r"""
import array, atexit, ctypes, io, json, os, runpy, signal, socket, sys, traceback, types

PRELOAD = ("torch", "torch._dynamo", "numpy", "pandas", "matplotlib.pyplot", "typer", "rich.console",
           "pytest", "tinit.cli", "transformers")
for name in PRELOAD:
    try:
        __import__(name)
    except ImportError:
        pass
exec(sys.argv[3])  # the caller's setup, which every child inherits

def recv(conn):
    fds = array.array("i")
    msg, anc, _, _ = conn.recvmsg(1 << 20, socket.CMSG_LEN(3 * fds.itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    while not msg.endswith(b"\n"):
        msg += conn.recv(1 << 20)
    return json.loads(msg), list(fds)

def run(req, fds):
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True,
                                  write_through=unbuffered)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True,
                                  write_through=True, errors="backslashreplace")
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in BASE_PATH if p not in extra]
    args = req["argv"]
    code = 0
    try:
        if args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            sys.path[:] = ["", *extra, *base]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(args[1], "<string>", "exec"), main.__dict__)
        elif args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            sys.path[:] = [os.getcwd(), *extra, *base]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            sys.path[:] = [os.path.dirname(os.path.abspath(args[0])), *extra, *base]
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException as e:  # the traceback from the script's frame on, as python prints it
        traceback.print_exception(e.with_traceback(e.__traceback__.tb_next))
        code = 130 if isinstance(e, KeyboardInterrupt) else 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)

BASE_PATH = [p for p in sys.path[1:]]
LOG = sys.argv[2]
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
listener.listen(8)
print("ready", flush=True)
while True:
    conn, _ = listener.accept()
    req, fds = recv(conn)
    pid = os.fork()
    if pid == 0:
        PR_SET_PDEATHSIG = 1  # the child ends with the server, never left running after a test
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        listener.close()
        conn.close()
        run(req, fds)
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    except OSError:  # the client is gone (killed before it could pass a signal on)
        os.kill(pid, signal.SIGTERM)
    _, status, usage = os.wait4(pid, 0)
    with open(LOG, "a") as log:  # what each "process" cost, for whoever profiles the script
        print(f"{usage.ru_utime + usage.ru_stime:.2f} s CPU: {' '.join(req['argv'])[:160]}", file=log)
    try:
        conn.sendall(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
    except OSError:
        pass
    conn.close()
"""

CLIENT = r"""#!{python} -S
import json, os, signal, socket, sys

sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect({path!r})
req = {{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}
socket.send_fds(sock, [json.dumps(req).encode() + b"\n"], [0, 1, 2])
reader = sock.makefile("rb")
child = json.loads(reader.readline())["pid"]
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda s, _: os.kill(child, s))
line = reader.readline()
code = json.loads(line)["code"] if line else 1
sys.exit(128 - code if code < 0 else code)
"""


@contextmanager
def forkserver(folder: Path, env: dict | None = None, setup: str = ""):
    """Start the server (its imports take a few seconds) and yield the path of the
    ``python`` that talks to it; the server is ended on leaving. ``env`` is added to the
    server's environment; ``setup``, Python code, runs in the server after its imports
    (every child starts from what it did)."""
    folder.mkdir(parents=True, exist_ok=True)
    short = Path(tempfile.mkdtemp(prefix="fork"))  # a socket's path has at most 107 bytes
    sock = short / "sock"
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(sock), str(folder / "cost.log"), setup],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        client = folder / "python"
        client.write_text(textwrap.dedent(CLIENT.format(python=sys.executable, path=str(sock))))
        client.chmod(0o755)
        yield client
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(short, ignore_errors=True)
