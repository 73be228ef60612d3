"""Checkpoint tensors read from safetensors files, a few at a time, never with pickle.

:class:`TensorFiles` is one checkpoint: a single ``.safetensors`` file or the shards a
Hugging Face ``model.safetensors.index.json`` names. Opening it reads only the headers
(names, shapes, dtypes); :meth:`TensorFiles.check` holds them against what the model
expects (every parameter present once, no extra key, each shape and a dtype the model
can take) before anything is measured; :meth:`TensorFiles.read` reads the named tensors
and nothing else. Each read opens the file, copies the tensors out of the memory map and
closes it again, so the mapped pages of blocks already measured do not stay resident:
memory holds one block's tensors at a time, whatever the checkpoint's size.

Every problem is a :class:`CheckpointError` (a ConfigError naming ``--checkpoint``:
exit 2) of one line naming the file and what is wrong.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from ...model.config import ConfigError
from ...userfile import UserFileError, load_json, regular_file

#: safetensors dtypes a float model can take (cast to the audit's dtype when read).
FLOAT_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
#: The most tensors a checkpoint may name (a 1,000-layer model with a dozen tensors per
#: block is 12,000): bounds the header bookkeeping before anything is read.
MAX_TENSORS = 200_000


class CheckpointError(ConfigError):
    """A checkpoint that cannot be audited: one line naming the file and the problem."""

    def __init__(self, message: str, option: str = "--checkpoint"):
        super().__init__(option, message)


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
        raise CheckpointError(
            f"{path}: not a readable safetensors file (truncated or corrupt: {why})"
        ) from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot open it ({exc.strerror or exc})") from None


class TensorFiles:
    """The tensors of one checkpoint: name -> (file, shape, safetensors dtype)."""

    def __init__(self, files: dict[str, Path], where: str, metadata: dict[str, str] | None = None):
        self.files = files  # tensor name -> the file holding it
        self.where = where  # what the one-line errors name (the file, or the index)
        self.metadata = metadata or {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, str] = {}

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
                raise CheckpointError(f"{index}: names shard {shard}, which does not exist")
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
        for k in keys:
            sl = handle.get_slice(k)
            self.shapes[k] = tuple(int(x) for x in sl.get_shape())
            self.dtypes[k] = str(sl.get_dtype())

    @property
    def n_bytes(self) -> int:
        size = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
        return sum(math.prod(s) * size.get(self.dtypes[k], 4) for k, s in self.shapes.items())

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

    def read(self, keys: Iterable[str], dtype: torch.dtype, device) -> dict[str, torch.Tensor]:
        """The tensors ``keys``, in ``dtype`` on ``device``; each file opened and closed
        again here (its mapped pages released)."""
        by_file: dict[Path, list[str]] = {}
        for k in keys:
            by_file.setdefault(self.files[k], []).append(k)
        out = {}
        for path, names in by_file.items():
            handle = _open(path)
            try:
                for k in names:
                    out[k] = handle.get_tensor(k).to(device=device, dtype=dtype)
            except SafetensorError as exc:
                raise CheckpointError(f"{path}: {k} cannot be read: {' '.join(str(exc).split())}") from None
            finally:
                del handle
        return out


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
