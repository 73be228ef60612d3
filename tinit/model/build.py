"""How a model comes to exist: built on the meta device, materialised on its device and
initialised, or, streamed, rebuilt block by block just before each runs.

A module is first built on the ``meta`` device (shapes only, no memory, no draws), then
allocated uninitialised on its device (:func:`to_empty`) and given its values by
:func:`tinit.model.init.init_weights_`, the one place weights get values. Since a
block's weights depend only on (seed, layer, role), a streamed model builds each block
just before it runs and drops it after (:func:`stream_blocks`): memory stays flat in
depth and the numbers are those of the fully built model.

The two start-up shortcuts here exist for speed: :func:`to_empty` allocates with plain
``torch.empty`` (``Module.to_empty`` imports torch's symbolic shapes and sympy), and
:func:`meta_embedding` passes the table to ``nn.Embedding`` (its ``reset_parameters``
would import torch._dynamo to draw numbers that are overwritten).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from .block import Block
from .config import InitConfig, ModelConfig
from .init import init_weights_


def to_empty(module: nn.Module, device) -> nn.Module:
    """``module.to_empty(device=device)`` for a meta-built module, without its cost:
    ``Module.to_empty`` calls ``torch.empty_like`` on each meta tensor, whose Python
    reference implementation imports torch's symbolic-shapes module and sympy (0.3 s
    of every process's start). Plain ``torch.empty`` of each shape instead; a tensor
    shared by two modules stays shared."""
    new: dict[int, torch.Tensor] = {}

    def empty(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in new:
            e = torch.empty(t.shape, dtype=t.dtype, device=device)
            new[id(t)] = nn.Parameter(e, t.requires_grad) if isinstance(t, nn.Parameter) else e
        return new[id(t)]

    for m in module.modules():
        for store in (m._parameters, m._buffers):
            for name, t in store.items():
                if t is not None and t.device.type == "meta":
                    store[name] = empty(t)
    return module


def materialize(
    module: nn.Module, cfg: ModelConfig, init: InitConfig, layer: int, device, prefix: str = ""
) -> nn.Module:
    """Allocate a meta-built module on ``device`` (uninitialised) and initialise it."""
    module = to_empty(module, device)
    init_weights_(module, cfg, init, layer, prefix)
    return module


def meta_embedding(rows: int, dim: int, dtype: torch.dtype) -> nn.Embedding:
    """An uninitialised meta-device embedding table. Passing the weight skips
    nn.Embedding.reset_parameters, whose normal_ on a meta tensor would import
    torch._dynamo (seconds of start-up) only to draw numbers that are overwritten."""
    return nn.Embedding(rows, dim, _weight=torch.empty(rows, dim, device="meta", dtype=dtype))


def build_block(cfg: ModelConfig, init: InitConfig, layer: int, device="cpu", dtype=torch.float32) -> Block:
    """Block ``layer`` with its scheme's weights, built directly on ``device`` in ``dtype``."""
    # built on the meta device by argument, not under ``with torch.device("meta")``: the
    # context mode intercepts every torch call of the constructor (~0.3 ms a block)
    block = Block(cfg, layer, seed=init.seed, device="meta", dtype=dtype, init=init)
    return materialize(block, cfg, init, layer, device)


def stream_blocks(
    cfg: ModelConfig, init: InitConfig, device: torch.device, dtype: torch.dtype, overlap: bool = True
) -> Iterator[Block]:
    """The blocks of a streamed model in order, each built just before it is used.

    On CUDA (with ``overlap``) a block is generated on a side stream while the previous
    block computes on the current stream, so weight generation overlaps compute; at most
    two blocks are alive at once."""
    if device.type != "cuda" or not overlap:
        for layer in range(cfg.n_layers):
            yield build_block(cfg, init, layer, device, dtype)
        return
    yield from overlapped_blocks(cfg, init, device, dtype)


def overlapped_blocks(cfg: ModelConfig, init: InitConfig, device, dtype: torch.dtype) -> Iterator[Block]:
    """:func:`stream_blocks` on CUDA: block l + 1 generated on a side stream while block l
    runs on the current one."""
    main = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)

    def build_on_side(layer: int) -> tuple[Block, torch.cuda.Event]:
        side.wait_stream(main)  # allocator reuse on the side stream stays ordered after main's work
        with torch.cuda.stream(side):
            block = build_block(cfg, init, layer, device, dtype)
            ready = torch.cuda.Event()
            ready.record(side)
        return block, ready

    pending = build_on_side(0)
    for layer in range(cfg.n_layers):
        block, ready = pending
        main.wait_event(ready)
        for p in block.parameters():
            # the weights were allocated on the side stream and are used on main:
            # keep the allocator from recycling them before main is done
            p.record_stream(main)
        if layer + 1 < cfg.n_layers:
            pending = build_on_side(layer + 1)
        yield block
        del block
