"""Reading a file a user names (``--init-file``, ``audit --hf config.json``, ``--data``):
the one guard every such read goes through, so that no file can hang, exhaust memory or
end in a traceback.

:func:`regular_file` stats the path first (following symlinks: a loop is an ``ELOOP``
OSError, said in one line) and refuses anything that is not a regular file before it is
opened: a FIFO would block the open until a writer comes, ``/dev/zero`` or
``/dev/urandom`` never end, a directory is no document. :func:`read_text` then reads at
most :data:`MAX_TEXT_BYTES` (a file in ``/proc`` says size 0, so the read itself is
bounded too) and decodes UTF-8; :func:`load_toml` and :func:`load_json` parse it and
refuse nesting deeper than :data:`MAX_DEPTH` (a parser's RecursionError included).

Every failure is a :class:`UserFileError` whose message names the path and says what is
wrong in one line; the caller turns it into its own error naming the option."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

import tomllib

#: The most bytes a text file (a TOML scheme, a config.json) may hold: the largest
#: transformers config.json is ~30 KiB, a scheme file a few KiB.
MAX_TEXT_BYTES = 2**20
#: The most nested levels of tables, arrays and objects in a parsed document (a scheme
#: file uses 3, a transformers config.json 4).
MAX_DEPTH = 32


class UserFileError(ValueError):
    """A user's file that cannot be used; the message is one line naming the path."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return name
    return "not a regular file"


def regular_file(path: str | Path) -> os.stat_result:
    """The stat of ``path``, a regular file (symlinks followed); else UserFileError."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UserFileError(f"{path}: no such file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserFileError(f"{path}: a symlink loop (too many levels of symbolic links)") from None
        raise UserFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:  # a NUL byte in the path
        raise UserFileError(f"{path!r}: not a path ({exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise UserFileError(f"{path}: {_kind(st.st_mode)}, not a regular file")
    return st


def file_or_folder(path: str | Path) -> str:
    """``"file"`` (a regular file) or ``"folder"`` (a directory): what ``path`` is, symlinks
    followed; anything else (no such path, a symlink loop, a FIFO, a device, a socket) a
    UserFileError saying which, in one line."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UserFileError(f"{path}: no such file or folder") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserFileError(f"{path}: a symlink loop (too many levels of symbolic links)") from None
        raise UserFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:  # a NUL byte in the path
        raise UserFileError(f"{path!r}: not a path ({exc})") from None
    if stat.S_ISDIR(st.st_mode):
        return "folder"
    if stat.S_ISREG(st.st_mode):
        return "file"
    raise UserFileError(f"{path}: {_kind(st.st_mode)}, neither a regular file nor a folder")


def read_text(path: str | Path, limit: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of the regular file ``path``, at most ``limit`` bytes."""
    st = regular_file(path)
    too_big = f"{path}: larger than {limit:,} bytes; not a file of this kind"
    if st.st_size > limit:
        raise UserFileError(too_big)
    try:
        # O_NONBLOCK: should the path have become a FIFO since the stat, the open does not wait
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise UserFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise UserFileError(too_big)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserFileError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def depth_problem(value: Any, limit: int = MAX_DEPTH) -> str | None:
    """None, or why a parsed document is unusable: nested deeper than ``limit`` (walked
    without recursion)."""
    todo = [(value, 0)]
    while todo:
        v, depth = todo.pop()
        if isinstance(v, dict | list):
            if depth >= limit:
                return f"nested deeper than {limit} levels"
            todo += [(x, depth + 1) for x in (v.values() if isinstance(v, dict) else v)]
    return None


def _checked(doc: Any, path: str | Path) -> Any:
    why = depth_problem(doc)
    if why:
        raise UserFileError(f"{path}: {why}")
    return doc


def load_toml(path: str | Path) -> dict[str, Any]:
    """The TOML document of ``path`` (read by :func:`read_text`)."""
    return parse_toml(read_text(path), path)


def parse_toml(text: str, path: str | Path) -> dict[str, Any]:
    """The TOML document ``text`` (``path`` names it in the errors), its nesting bounded."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserFileError(f"{path}: not valid TOML ({exc})") from None
    except RecursionError:
        raise UserFileError(f"{path}: nested deeper than {MAX_DEPTH} levels") from None
    return _checked(doc, path)


def load_json(path: str | Path) -> Any:
    """The JSON document of ``path`` (read by :func:`read_text`)."""
    text = read_text(path)
    try:
        doc = json.loads(text)
    except RecursionError:
        raise UserFileError(f"{path}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise UserFileError(f"{path}: not valid JSON ({exc})") from None
    return _checked(doc, path)
