"""Checkpoint tensors read from safetensors files, a few at a time, never with pickle.

:class:`TensorFiles` is one checkpoint: a single ``.safetensors`` file or the shards a
Hugging Face ``model.safetensors.index.json`` names. Opening it reads only the headers
(names, shapes, dtypes, byte ranges: ``safetensors.safe_open`` validates each header and
the file's length against it, so a truncated file, a partial download and a header
bomb are refused before anything is read); :meth:`TensorFiles.check` holds them against
what the model expects (every parameter present once, no extra key, each shape and a
dtype the model can take) before anything is measured.

Tensors are then read with ``pread`` at the byte ranges the validated header gives, into
buffers the caller may reuse (:meth:`TensorFiles.read_into`), by rows (the embedding
rows a batch's tokens need, :meth:`TensorFiles.read_rows`) or in row chunks (a
128k-row embedding or head, :meth:`TensorFiles.row_chunks`). Nothing is memory-mapped:
no page of a block already measured stays in the process, and a file truncated while
it is read is a short read, not a SIGBUS. Before each read the file's size,
modification time and inode are held against those its header was read with: a shard
being written (a download, a save in progress) is never mixed into a measurement.

Every problem found before reading is a :class:`CheckpointError` (a ConfigError naming
``--checkpoint``: exit 2) of one line naming the file and what is wrong; a file that
changes while it is read is an :class:`~tinit.experiments.result.InputChanged`, a run
failure (what was measured is kept, the run marked incomplete with the reason, exit 1).
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from ...model.config import ConfigError
from ...userfile import UserFileError, load_json, regular_file
from ..result import InputChanged

#: safetensors dtypes a float model can take (cast to the audit's dtype when read).
FLOAT_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
#: Bytes per element of each float dtype.
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
#: The most tensors a checkpoint may name (a 1,000-layer model with a dozen tensors per
#: block is 12,000): bounds the header bookkeeping before anything is read.
MAX_TENSORS = 200_000
#: safetensors' own bound on a header's length (its Rust MAX_HEADER_SIZE).
MAX_HEADER = 100_000_000
#: A row chunk of :meth:`TensorFiles.row_chunks` holds about this many bytes as stored
#: (twice that converted to float32): a 128256 x 4096 table in 64 passes-worth of reads.
CHUNK_BYTES = 16 << 20


class CheckpointError(ConfigError):
    """A checkpoint that cannot be audited: one line naming the file and the problem."""

    def __init__(self, message: str, option: str = "--checkpoint"):
        super().__init__(option, message)


@dataclass(frozen=True)
class Stamp:
    """What a file was when its header was read: a change means it is being written."""

    size: int
    mtime_ns: int
    inode: int

    @classmethod
    def of(cls, st: os.stat_result) -> Stamp:
        return cls(st.st_size, st.st_mtime_ns, st.st_ino)


def _raw_header(path: Path) -> tuple[dict, int]:
    """The header JSON of a safetensors file and the offset its data starts at (the
    file is one safe_open has accepted, or one being diagnosed: bounded either way)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER:
            raise ValueError(f"a header of {n:,} bytes")
        doc = json.loads(f.read(n))
    if not isinstance(doc, dict):
        raise ValueError("a header that is not a JSON object")
    return doc, 8 + n


def _short_or_long(path: Path) -> str | None:
    """For a file safetensors calls incomplete: how its length differs from what its
    header describes (a partial download is shorter), or None when that cannot be said."""
    try:
        doc, start = _raw_header(path)
        ends = [v["data_offsets"][1] for k, v in doc.items() if k != "__metadata__"]
        want, have = start + max(ends, default=0), path.stat().st_size
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    if have < want:
        return (f"{have:,} bytes where its header describes {want:,}: {want - have:,} missing (a partial "
                "download, or a file still being written)")  # fmt: skip
    if have > want:
        return f"{have - want:,} bytes past the last tensor its header describes"
    return None


def regular(path: Path | str) -> None:
    """``path`` is a regular file (symlinks followed); else a CheckpointError saying what it
    is: no such file, a symlink loop, a directory, a FIFO, a device."""
    try:
        regular_file(path)
    except UserFileError as exc:
        raise CheckpointError(str(exc)) from None


def _open(path: Path):
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except SafetensorError as exc:
        why = " ".join(str(exc).split())
        short = _short_or_long(path) if "not fully covered" in why else None
        if short:
            raise CheckpointError(f"{path}: not a readable safetensors file (truncated or corrupt: "
                                  f"{short})") from None  # fmt: skip
        raise CheckpointError(
            f"{path}: not a readable safetensors file (truncated or corrupt: {why})"
        ) from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot open it ({exc.strerror or exc})") from None


def _pread(fd: int, buf: torch.Tensor, offset: int, path: Path) -> None:
    """Fill the uint8 tensor ``buf`` from ``fd`` at ``offset`` (a short read: an error)."""
    view = memoryview(buf.numpy()).cast("B")
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n <= 0:
            raise InputChanged(f"{path} ended {len(view) - got:,} bytes early while being read (truncated "
                               "while the audit ran)")  # fmt: skip
        got += n


class TensorFiles:
    """The tensors of one checkpoint: name -> (file, shape, safetensors dtype, bytes)."""

    def __init__(self, files: dict[str, Path], where: str, metadata: dict[str, str] | None = None):
        self.files = files  # tensor name -> the file holding it
        self.where = where  # what the one-line errors name (the file, or the index)
        self.metadata = metadata or {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, str] = {}
        self.offsets: dict[str, tuple[int, int]] = {}  # absolute [begin, end) in the file
        self.stamps: dict[Path, Stamp] = {}
        self.bytes_read = 0  # every read adds its bytes (the progress bar's count)

    @classmethod
    def single(cls, path: Path | str) -> TensorFiles:
        """One ``.safetensors`` file (its header read, no tensor)."""
        path = Path(path)
        regular(path)
        handle = _open(path)
        keys = list(handle.keys())
        if len(keys) > MAX_TENSORS:
            raise CheckpointError(f"{path}: {len(keys):,} tensors, more than {MAX_TENSORS:,}")
        out = cls(dict.fromkeys(keys, path), str(path), handle.metadata() or {})
        out._headers(path, handle, keys)
        return out

    @classmethod
    def sharded(cls, index: Path | str) -> TensorFiles:
        """The shards of a ``model.safetensors.index.json`` (``weight_map``: tensor -> shard
        file beside the index), every shard's header read and held against the map."""
        index = Path(index)
        try:
            doc = load_json(index)
        except UserFileError as exc:
            raise CheckpointError(f"{index}: cannot read it as a JSON index: {exc}") from None
        wmap = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
            raise CheckpointError(f"{index}: no weight_map of tensor names to shard files")
        if len(wmap) > MAX_TENSORS:
            raise CheckpointError(f"{index}: {len(wmap):,} tensors, more than {MAX_TENSORS:,}")
        shards = {}
        for shard in dict.fromkeys(wmap.values()):
            p = index.parent / shard
            if Path(shard).name != shard:
                raise CheckpointError(f"{index}: shard {shard!r} is not a file beside the index")
            if not os.path.lexists(p):
                raise CheckpointError(f"{index}: names shard {shard}, which does not exist (a download still "
                                      "in progress?)")  # fmt: skip
            regular(p)
            shards[shard] = p
        out = cls({k: shards[v] for k, v in wmap.items()}, str(index))
        for shard, p in shards.items():
            handle = _open(p)
            keys = set(handle.keys())
            named = {k for k, v in wmap.items() if v == shard}
            if named - keys:
                raise CheckpointError(f"{p}: lacks {sorted(named - keys)[0]}, which {index.name} puts there")
            out._headers(p, handle, sorted(named))
        return out

    def _headers(self, path: Path, handle, keys: Iterable[str]) -> None:
        stamp = Stamp.of(path.stat())
        try:
            raw, start = _raw_header(path)
        except (OSError, ValueError) as exc:  # (safe_open accepted it: changed since, or unreadable)
            raise CheckpointError(f"{path}: its header cannot be read again ({exc})") from None
        for k in keys:
            sl = handle.get_slice(k)
            self.shapes[k] = tuple(int(x) for x in sl.get_shape())
            self.dtypes[k] = str(sl.get_dtype())
            try:
                b, e = (int(x) for x in raw[k]["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise CheckpointError(f"{path}: {k} changed between two reads of its header") from None
            self.offsets[k] = (start + b, start + e)
        self.stamps[path] = stamp

    @property
    def n_bytes(self) -> int:
        return sum(math.prod(s) * ITEMSIZE.get(self.dtypes[k], 4) for k, s in self.shapes.items())

    def nbytes(self, key: str) -> int:
        """The bytes ``key`` is stored in."""
        b, e = self.offsets[key]
        return e - b

    def check(self, groups: list[tuple[list[str], tuple[int, ...]]], what: str) -> dict[str, str]:
        """Hold the checkpoint against the model ``what`` expects: ``groups`` lists each
        tensor of the model as (its names, shape) (tied weights have several names, any
        one of which may be stored). Returns model name -> stored key; a CheckpointError
        for a missing tensor, an extra key, a shape or a dtype the model cannot take."""
        out: dict[str, str] = {}
        used: set[str] = set()
        for names, shape in groups:
            stored = [n for n in names if n in self.shapes]
            if not stored:
                raise CheckpointError(f"{self.where}: missing {names[0]} (the {what} has it)")
            key = stored[0]
            got = self.shapes[key]
            if got != tuple(shape):
                raise CheckpointError(f"{self.where}: {key} has shape {list(got)}, the {what} needs "
                                      f"{list(shape)}")  # fmt: skip
            if self.dtypes[key] not in FLOAT_DTYPES:
                allowed = ", ".join(FLOAT_DTYPES)
                raise CheckpointError(f"{self.where}: {key} is {self.dtypes[key]}; the model takes floating "
                                      f"point ({allowed})")  # fmt: skip
            for n in names:
                out[n] = key
            used.update(stored)
        extra = sorted(set(self.shapes) - used)
        if extra:
            more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
            raise CheckpointError(f"{self.where}: has {extra[0]}{more}, which the {what} does not")
        return out

    # ---- reading ------------------------------------------------------------------------

    def _fd(self, path: Path) -> int:
        """An open descriptor of ``path``, refused when the file is not the one whose
        header was read (its size, modification time or inode changed)."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot open it ({exc.strerror or exc})") from None
        if Stamp.of(os.fstat(fd)) != self.stamps[path]:
            os.close(fd)
            raise InputChanged(f"{path} changed while the audit read it (a download or a save in progress?); "
                               "audit it once it is complete")  # fmt: skip
        return fd

    def typed(self, key: str, raw: torch.Tensor) -> torch.Tensor:
        """The bytes ``raw`` of ``key`` as its stored dtype and shape (no copy)."""
        return raw.view(FLOAT_DTYPES[self.dtypes[key]]).view(self.shapes[key])

    def read_into(self, keys: Iterable[str], raw: torch.Tensor) -> dict[str, torch.Tensor]:
        """Read ``keys`` one after another into the uint8 buffer ``raw`` (at least their
        bytes; reused by the caller); each as its stored dtype and shape, views of it."""
        out, at = {}, 0
        by_file: dict[Path, list[str]] = {}
        for k in keys:
            by_file.setdefault(self.files[k], []).append(k)
        for path, names in by_file.items():
            fd = self._fd(path)
            try:
                for k in names:
                    b, e = self.offsets[k]
                    # (each tensor at an 8-byte aligned place, so a float64 view is allowed)
                    at = -(-at // 8) * 8
                    buf = raw[at : at + (e - b)]
                    _pread(fd, buf, b, path)
                    out[k] = self.typed(k, buf)
                    at += e - b
                    self.bytes_read += e - b
            finally:
                os.close(fd)
        return out

    def staged_bytes(self, keys: Iterable[str]) -> int:
        """The buffer :meth:`read_into` needs for ``keys`` (each 8-byte aligned)."""
        return sum(-(-self.nbytes(k) // 8) * 8 for k in keys)

    def read(self, keys: Iterable[str], dtype: torch.dtype, device) -> dict[str, torch.Tensor]:
        """The tensors ``keys``, each read then converted to ``dtype`` on ``device``."""
        out = {}
        for k in keys:
            raw = torch.empty(self.staged_bytes([k]), dtype=torch.uint8)
            out[k] = self.read_into([k], raw)[k].to(device=device, dtype=dtype)
        return out

    def read_rows(self, key: str, rows: torch.Tensor) -> torch.Tensor:
        """Rows ``rows`` (sorted, distinct row indices) of the matrix ``key``, in its
        stored dtype: only their bytes are read (a batch's embedding rows, not the table)."""
        shape, path = self.shapes[key], self.files[key]
        row_bytes = math.prod(shape[1:]) * ITEMSIZE[self.dtypes[key]]
        raw = torch.empty(len(rows) * row_bytes, dtype=torch.uint8)
        b = self.offsets[key][0]
        fd = self._fd(path)
        try:
            for i, r in enumerate(rows.tolist()):
                _pread(fd, raw[i * row_bytes : (i + 1) * row_bytes], b + r * row_bytes, path)
        finally:
            os.close(fd)
        self.bytes_read += len(rows) * row_bytes
        return raw.view(FLOAT_DTYPES[self.dtypes[key]]).view(len(rows), *shape[1:])

    def row_chunks(self, key: str, dtype: torch.dtype | None, device, chunk_bytes: int = CHUNK_BYTES,
                   count: bool = True, keep: dict | None = None) -> Iterator[torch.Tensor]:  # fmt: skip
        """The matrix ``key`` in consecutive row chunks of about ``chunk_bytes`` as
        stored, each converted to ``dtype`` on ``device`` (``dtype`` None: as stored, on
        the CPU, no copy: the caller converts what it needs); the next chunk is read on a
        second thread while this one is converted and used (``pread`` lets go of the
        interpreter: the copy from the page cache overlaps the arithmetic). The chunks
        are views of buffers reused from chunk to chunk: use each before taking the next;
        ``keep``, a dict the caller holds, keeps them for its next pass too (no fresh
        pages to fault in at every Lanczos step). ``count``: add the bytes to
        :attr:`bytes_read` (False for a second pass over the same rows)."""
        from concurrent.futures import ThreadPoolExecutor

        shape, path = self.shapes[key], self.files[key]
        rows = shape[0] if shape else 1
        row_bytes = max(math.prod(shape[1:]), 1) * ITEMSIZE[self.dtypes[key]]
        step = max(1, min(rows, chunk_bytes // max(row_bytes, 1)))
        sig = (step * row_bytes, (step, *shape[1:]), dtype, str(device))
        if keep is not None and keep.get("sig") == sig:
            raws, conv = keep["raws"], keep["conv"]
        else:
            raws = [torch.empty(step * row_bytes, dtype=torch.uint8) for _ in range(2)]
            conv = None if dtype is None else torch.empty((step, *shape[1:]), dtype=dtype, device=device)
            if keep is not None:
                keep.update(sig=sig, raws=raws, conv=conv)
        b = self.offsets[key][0]
        stored = FLOAT_DTYPES[self.dtypes[key]]
        starts = list(range(0, rows, step))
        fd = self._fd(path)

        def read(i: int) -> torch.Tensor:
            n = min(step, rows - starts[i])
            part = raws[i % 2][: n * row_bytes]
            _pread(fd, part, b + starts[i] * row_bytes, path)
            return part

        pool = ThreadPoolExecutor(1, thread_name_prefix="tinit-rows") if len(starts) > 1 else None
        try:
            ahead = pool.submit(read, 0) if pool else None
            for i, r0 in enumerate(starts):
                part = ahead.result() if pool else read(i)
                if pool and i + 1 < len(starts):
                    ahead = pool.submit(read, i + 1)  # (into the other buffer)
                n = min(step, rows - r0)
                if count:
                    self.bytes_read += n * row_bytes
                typed = part.view(stored).view(n, *shape[1:])
                if conv is None:  # (valid until the next chunk: its buffer is read into after that)
                    yield typed if shape else typed.reshape(())
                    continue
                out = conv[:n]
                out.copy_(typed)
                yield out if shape else out.reshape(())
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            os.close(fd)


def tied_groups(module: torch.nn.Module) -> list[tuple[list[str], tuple[int, ...]]]:
    """Each tensor of ``module``'s state dict once, as (every name it has, shape): tied
    weights (an HF head sharing the embedding) are one tensor under two names."""
    groups: dict[int, tuple[list[str], tuple[int, ...]]] = {}
    for name, t in module.state_dict(keep_vars=True).items():
        groups.setdefault(id(t), ([], tuple(t.shape)))[0].append(name)
    return list(groups.values())


def read_json(path: Path, what: str) -> dict:
    """A small JSON file (a config, a checkpoint's sidecar) as a dict, or a CheckpointError."""
    try:
        doc = load_json(path)
    except UserFileError as exc:
        raise CheckpointError(f"{path}: cannot read it as {what}: {exc}") from None
    except json.JSONDecodeError as exc:  # (load_json's own errors are UserFileError; kept for safety)
        raise CheckpointError(f"{path}: not JSON ({exc.msg})") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path}: not a JSON object ({what})")
    return doc
