"""Reading a checkpoint's blocks in order, one resident at a time (see
:mod:`.checkpoint`): :class:`BlockReader` (a reader thread, one staging buffer, one
arena), the arena's views given to a module's parameters (:func:`adopt`), and a table's
rows for a batch's ids (:func:`compact_rows`)."""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch import nn

from ...process import return_freed_memory
from .tensors import TensorFiles


def _aligned(n: int, to: int = 64) -> int:
    return -(-n // to) * to


class BlockReader:
    """The blocks of ``files`` in order (``blocks``: each block's stored keys), each as
    ``{key: view of the arena}`` in ``dtype`` on ``device``; the next block read on a
    background thread while this one is measured (where there is more than one; see the module
    docstring). A view is valid until the next
    block is taken. Errors of the reading thread (a file changed or truncated) are
    raised in the caller's thread when it takes that block."""

    def __init__(self, files: TensorFiles, blocks: list[list[str]], dtype: torch.dtype, device):
        self.files, self.blocks, self.dtype = files, blocks, dtype
        self.device = torch.device(device)
        self.ahead = len(blocks) > 1  # (one block: nothing to read ahead of)
        self.staged = max((files.staged_bytes(b) for b in blocks), default=0)
        self.layout: list[dict[str, int]] = []
        size = 0
        for keys in blocks:
            at, offsets = 0, {}
            for k in keys:
                offsets[k] = at
                at += _aligned(math.prod(files.shapes[k]))
            self.layout.append(offsets)
            size = max(size, at)
        self.arena_elements = size
        self.itemsize = torch.empty((), dtype=dtype).element_size()

    @property
    def bytes_held(self) -> int:
        """The buffers this reader holds: the arena and the staging."""
        return self.arena_elements * self.itemsize + self.staged

    def _views(self, arena: torch.Tensor, i: int) -> dict[str, torch.Tensor]:
        f = self.files
        return {k: arena[o : o + math.prod(f.shapes[k])].view(f.shapes[k]) for k, o in self.layout[i].items()}

    def blank(self) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
        """Every block as zeros, nothing read (a forward that only traces the structure)."""
        arena = torch.zeros(self.arena_elements, dtype=self.dtype, device=self.device)
        for i in range(len(self.blocks)):
            yield i, self._views(arena, i)

    def __iter__(self) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
        arena = torch.empty(self.arena_elements, dtype=self.dtype, device=self.device)
        pinned = self.device.type == "cuda"
        buffers = [torch.empty(self.staged, dtype=torch.uint8, pin_memory=pinned)]
        if not self.ahead:
            for i, keys in enumerate(self.blocks):
                yield i, self._convert(arena, i, self.files.read_into(keys, buffers[0]))
            return
        free: queue.Queue = queue.Queue()
        ready: queue.Queue = queue.Queue()
        for b in buffers:
            free.put(b)
        stop = threading.Event()

        def read() -> None:
            try:
                for keys in self.blocks:
                    buf = free.get()
                    if stop.is_set() or buf is None:
                        return
                    ready.put((buf, self.files.read_into(keys, buf), None))
            except BaseException as exc:  # handed to the caller's thread, raised there
                ready.put((None, None, exc))

        worker = threading.Thread(target=read, name="tinit-checkpoint-reader", daemon=True)
        worker.start()
        try:
            for i in range(len(self.blocks)):
                while True:  # (a timeout, so that a signal reaches the main thread promptly)
                    try:
                        buf, stored, exc = ready.get(timeout=0.2)
                        break
                    except queue.Empty:
                        if not worker.is_alive() and ready.empty():
                            raise RuntimeError("the checkpoint reader stopped without a word") from None
                if exc is not None:
                    raise exc
                views = self._convert(arena, i, stored)
                free.put(buf)
                yield i, views
        finally:
            stop.set()
            free.put(None)
            worker.join(timeout=60)

    def _convert(
        self, arena: torch.Tensor, i: int, stored: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        # the block before is done (its forward and its measuring): the heap's freed pages
        # handed back before this one is written. Without it the heap kept 3-7 MiB more a
        # block, the forward's temporaries (0.1-0.25 GiB over an 8B model's 32 blocks,
        # above the memory plan); with it the peak is the plan's (docs/performance.md)
        return_freed_memory()
        views = self._views(arena, i)
        cuda = self.device.type == "cuda"
        for k, v in views.items():
            v.copy_(stored[k], non_blocking=cuda)
        if cuda:  # the staging buffer is handed back for the next read once its copy is done
            torch.cuda.current_stream(self.device).synchronize()
        return views


class BlockWork:
    """``fn(layer, tensors)`` for each block on one measuring thread, while the calling
    thread runs that block's forward on the same tensors (read only by both); ``then(layer)``
    (a progress tick) on the calling thread once it is done. :meth:`settle` waits for the
    block before, raising its error here: call it before the reader writes its arena again.
    Blocks are measured one at a time and in order, so the rows and the bytes are those of
    the same work done inline."""

    def __init__(self, fn: Callable[[int, dict[str, torch.Tensor]], None] | None,
                 then: Callable[[int], None] | None = None):  # fmt: skip
        self.fn, self.then = fn, then
        self._pool: ThreadPoolExecutor | None = None
        self._pending: tuple[int, Future] | None = None

    def submit(self, layer: int, tensors: dict[str, torch.Tensor]) -> None:
        self.settle()
        if self.fn is None:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="tinit-block-measure")
        self._pending = (layer, self._pool.submit(self.fn, layer, tensors))

    def settle(self) -> None:
        if self._pending is None:
            return
        layer, done = self._pending
        self._pending = None
        done.result()
        if self.then is not None:
            self.then(layer)

    def close(self, failed: bool = False) -> None:
        """Waits for the last block and ends the thread; its error is raised unless the
        caller is failing already (``failed``: an interrupt, a forward that raised), whose
        error then stands."""
        pending, self._pending = self._pending, None
        try:
            if pending is not None:
                if failed:
                    pending[1].exception()  # (waited for, not raised)
                else:
                    self._pending = pending
                    self.settle()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None


def adopt(module: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Give ``module``'s parameters and buffers (state-dict names) the tensors given
    (views of a reader's arena): no copy, no allocation."""
    for name, t in tensors.items():
        _set(module, name, t)


def compact_rows(files: TensorFiles, key: str, ids: torch.Tensor, dtype: torch.dtype,
                 device) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The rows of the table ``key`` that ``ids`` use (sorted, distinct: only their bytes
    are read) in ``dtype`` on ``device``, and ``ids`` renumbered into them."""
    host = ids.detach().cpu().contiguous()
    rows = torch.unique(host)
    table = files.read_rows(key, rows).to(device=device, dtype=dtype)
    return table, torch.searchsorted(rows, host).to(ids.device)


def _set(model: nn.Module, name: str, value: torch.Tensor | None) -> None:
    mod, _, leaf = name.rpartition(".")
    owner = model.get_submodule(mod) if mod else model
    if leaf in owner._parameters:
        t = owner._parameters[leaf]
        owner._parameters[leaf] = nn.Parameter(value if value is not None else t.to("meta"),
                                               requires_grad=False)  # fmt: skip
    elif leaf in owner._buffers:
        owner._buffers[leaf] = value if value is not None else owner._buffers[leaf].to("meta")
