"""Models whose weights come from a checkpoint, one block resident at a time.

:class:`BlockReader` reads the blocks in order: a background thread reads each block's
stored bytes (``pread``, :mod:`.tensors`) into one reused staging buffer; the main thread
converts them into one reused arena in the audit's dtype on the audit's device, hands
the buffer back, and runs the block's forward while the thread reads the next one into
it; a measuring thread (:class:`BlockWork`) measures the block's weights (``on_block``)
during that forward, and the arena is written again only once both are done.
Memory: one block as stored plus one block converted, whatever the depth (pinned
staging on CUDA, so the copy to the device is a DMA).

- :class:`CheckpointTransformer`: tinit's own :class:`~tinit.model.transformer.Transformer`,
  streamed: each block is built on the meta device and given the arena's views (the
  streamed forward of ``tinit variance``, with read weights where it draws them), so the
  stream is measured by the very code ``tinit variance`` runs.
- :class:`LazyBlocks`: a Hugging Face model built with its parameters on the meta device
  (buffers such as RoPE's frequencies real); a forward pre-hook on each block gives it
  the arena's views just before it runs, a forward hook puts them back on the meta
  device after. The audit's stream hooks (:mod:`.stream`) then see a plain forward of
  the base model (no head).

Either way the embedding is read by the rows the batch's tokens use (:func:`compact_rows`:
a 128k-row table is never held), the head is not needed by the stream, and each block's
weights are handed to ``on_block(layer, {name: tensor})`` while resident: the audit
measures them there (std, spectral norm, the change from the init where the init is
known), so each block is read once. The tensors outside the blocks are measured from
the file in row chunks (:func:`.weights.table_row`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
from torch import nn

from ...model.config import ConfigError, InitConfig, ModelConfig
from ...model.init import role_of, role_rule
from ...model.transformer import Block, Transformer, build_block
from .reader import BlockReader, BlockWork, _set, adopt, compact_rows
from .tensors import CheckpointError, TensorFiles, tied_groups

OnBlock = Callable[[int, dict[str, torch.Tensor]], None]
OnMeasured = Callable[[int], None]


def _user_schemes(entries, scheme: str, where: str) -> tuple:
    """The user's schemes (``--init-file``) a checkpoint's JSON carries as TOML text,
    parsed again as ``tinit.model.scheme_file`` parses the file; the run's own scheme
    must be among them when it is not the catalogue's."""
    from ...model.formula import FormulaError
    from ...model.scheme_file import parse_scheme
    from ...userfile import UserFileError, parse_toml

    out = []
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict) or not isinstance(e.get("toml"), str) or not e["toml"]:
            if isinstance(e, dict) and e.get("name") == scheme:
                raise CheckpointError(f"{where}: its scheme {scheme!r} came from an --init-file whose "
                                      "text the checkpoint does not carry (saved before tinit kept "
                                      "it)")  # fmt: skip
            continue
        label = f"{where} (scheme {e.get('name')!r})"
        try:
            s = parse_scheme(parse_toml(e["toml"], label), label, e["toml"])
        except (FormulaError, UserFileError) as exc:
            raise CheckpointError(f"{where}: its --init-file scheme does not parse: {exc}") from None
        if s.name != e.get("name"):
            raise CheckpointError(f"{where}: its --init-file text declares {s.name!r}, not {e.get('name')!r}")
        out.append(s)
    return tuple(out)


def model_from_info(info: dict, where: str) -> tuple[ModelConfig, InitConfig]:
    """The ModelConfig and InitConfig a tinit checkpoint's JSON records (a user's scheme
    rebuilt from the TOML text the JSON carries)."""
    m, i = dict(info["model"]), dict(info["init"])
    m["user_set"] = tuple(m.get("user_set") or ())
    i["schemes"] = _user_schemes(i.get("schemes"), i.get("scheme"), where)
    try:
        return ModelConfig(**m), InitConfig(**i)
    except (ConfigError, TypeError) as exc:
        why = exc.message if isinstance(exc, ConfigError) else str(exc)
        raise CheckpointError(
            f"{where}: its model or init config is not one tinit can build: {why}"
        ) from None


def _meta_block(cfg: ModelConfig, init: InitConfig, layer: int, dtype: torch.dtype) -> Block:
    with torch.device("meta"):
        return Block(cfg, layer, seed=init.seed, dtype=dtype, init=init)


def tinit_groups(cfg: ModelConfig, init: InitConfig, dtype: torch.dtype) -> list[tuple[list[str], tuple]]:
    """Every tensor a tinit model of ``cfg`` stores, as :meth:`TensorFiles.check` takes
    them: the non-block parts, then each block's (built on the meta device: no memory)."""
    groups = []
    d, V = cfg.d_model, cfg.vocab_size
    groups.append((["embed.weight"], (V, d)))
    if cfg.positions == "learned":
        groups.append((["pos.weight"], (cfg.max_seq_len, d)))
    for layer in range(cfg.n_layers):
        block = _meta_block(cfg, init, layer, dtype)
        groups += [([f"blocks.{layer}.{n}" for n in names], shape) for names, shape in tied_groups(block)]
    if cfg.placement.final_norm:
        groups += [([f"final_norm.{n}"], tuple(t.shape)) for n, t in _final_norm(cfg, init, dtype).items()]
    if not cfg.tie_embeddings:
        groups.append((["head.weight"], (V, d)))
        if cfg.bias:
            groups.append((["head.bias"], (V,)))
    return groups


def _final_norm(cfg: ModelConfig, init: InitConfig, dtype: torch.dtype) -> dict:
    from ...model.layers import make_norm

    with torch.device("meta"):
        return make_norm(cfg, dtype=dtype, offset=init.definition.norm_offset).state_dict()


class CheckpointTransformer(Transformer):
    """tinit's Transformer, streamed, with each block's weights read from ``files``
    (``keys``: model name -> stored key, from :meth:`TensorFiles.check`) by ``reader``.
    The embedding's rows are read for the batch's tokens; the learned positions and the
    final norm (small) are read whole; the head is not read (the stream does not use
    it). ``on_block`` gets each block's tensors while resident."""

    def __init__(self, cfg: ModelConfig, init: InitConfig, files: TensorFiles, keys: dict[str, str],
                 reader: BlockReader, device="cpu", dtype: torch.dtype = torch.float32,
                 on_block: OnBlock | None = None, on_measured: OnMeasured | None = None):  # fmt: skip
        super().__init__(cfg, init, "meta", dtype, stream=True, overlap=False, drawn=False)
        self._device = torch.device(device)
        self.files, self.keys, self.reader, self.on_block = files, keys, reader, on_block
        self.on_measured = on_measured
        small = [n for n in self.state_dict() if n.startswith(("pos.", "final_norm."))]
        read = files.read([keys[n] for n in small], dtype, self._device)
        adopt(self, {n: read[keys[n]] for n in small})
        if cfg.positions == "rope":  # (the cache was built on the meta device with the rest)
            from ...model.layers import rope_cache

            cos, sin = rope_cache(cfg.max_seq_len, cfg.head_dim, cfg.rope_base, self._device, dtype)
            self.rope_cos, self.rope_sin = cos, sin

    def embed_tokens(self, tokens: torch.Tensor, probe=None) -> torch.Tensor:
        table, local = compact_rows(self.files, self.keys["embed.weight"], tokens, self._dtype, self._device)
        self.embed = nn.Embedding(table.shape[0], table.shape[1], _weight=table)
        try:
            return super().embed_tokens(local, probe)
        finally:
            self.embed = None

    def iter_blocks(self) -> Iterator[Block]:
        # each block measured (on_block) on a thread of its own while it runs its forward
        # here; the arena is written again only once that is done (BlockWork.settle)
        work = BlockWork(self.on_block, self.on_measured)
        blocks = iter(self.reader)
        failed = True
        try:
            while True:
                work.settle()
                try:
                    layer, stored = next(blocks)
                except StopIteration:
                    break
                block = _meta_block(self.cfg, self.init, layer, self._dtype)
                names = {n: f"blocks.{layer}.{n}" for n in block.state_dict()}
                state = {n: stored[self.keys[full]] for n, full in names.items()}
                adopt(block, state)
                work.submit(layer, {names[n]: t for n, t in state.items()})
                yield block
                del block, state
            failed = False
        finally:
            try:
                work.close(failed)
            finally:
                blocks.close()


def init_block_state(
    cfg: ModelConfig, init: InitConfig, layer: int, device, dtype
) -> dict[str, torch.Tensor]:
    """The weights of block ``layer`` (-1: the non-block parts) at step 0, rebuilt from the
    run's seed (a block depends only on (seed, layer, role): docs/design.md §3)."""
    if layer >= 0:
        block = build_block(cfg, init, layer, device, dtype)
        return {f"blocks.{layer}.{n}": t for n, t in block.state_dict().items()}
    return dict(Transformer(cfg, init, device, dtype, stream=True).state_dict())


def init_top_tensor(cfg: ModelConfig, init: InitConfig, name: str, device, dtype) -> torch.Tensor:
    """One tensor outside the blocks at step 0 (``embed.weight``, ``head.weight``, ...),
    rebuilt from the run's seed alone: the embedding and the head one at a time, each
    whole (the draw of a table is one generator's stream), never the two together."""
    from ...model.build import materialize, meta_embedding
    from ...model.layers import make_norm

    part, _, leaf = name.partition(".")
    d, V, L = cfg.d_model, cfg.vocab_size, cfg.n_layers
    with torch.device("meta"):
        if part == "embed":
            mod, layer = meta_embedding(V, d, dtype), -1
        elif part == "pos":
            mod, layer = meta_embedding(cfg.max_seq_len, d, dtype), -1
        elif part == "final_norm":
            mod, layer = make_norm(cfg, dtype=dtype, offset=init.definition.norm_offset), L
        else:
            mod, layer = nn.Linear(d, V, bias=cfg.bias, dtype=dtype), L
    mod = materialize(mod, cfg, init, layer, device, prefix=part)
    return mod.state_dict()[leaf]


def tinit_expected(cfg: ModelConfig, init: InitConfig, name: str, layer: int, shape) -> tuple[str, float]:
    """(role, the std the scheme draws ``name`` with at step 0; NaN for a constant: a
    norm gain, a bias)."""
    role, _ = role_of(name)
    if role in ("norm", "bias", "gain"):
        return role, math.nan
    draw = role_rule(init, cfg, role, layer, tuple(shape))
    return role, draw.std_drawn if draw.random else math.nan


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Build a model with every parameter on the meta device and its buffers real (a
    RoPE module computes its frequencies in its constructor): ``register_parameter``
    moves each parameter to meta as it is registered (one parameter's storage at a time
    exists, never the model's)."""
    old = nn.Module.register_parameter

    def register(self, name, param):
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        old(self, name, param)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = old


class LazyBlocks:
    """Gives a meta-built model's blocks their tensors block by block (see the module
    docstring). ``blocks``: the module paths of the blocks, in order; ``keys``: model
    name -> stored key. Inside ``with lazy.reading(reader):`` each block's forward takes
    the reader's next block; inside ``with lazy.reading(reader, blank=True):`` zeros
    (nothing read: a trace of the structure)."""

    def __init__(self, model: nn.Module, blocks: list[str], keys: dict[str, str],
                 on_block: OnBlock | None = None, on_measured: OnMeasured | None = None):  # fmt: skip
        self.model, self.blocks, self.keys, self.on_block = model, blocks, keys, on_block
        self.on_measured = on_measured
        self._work = BlockWork(None)
        groups = tied_groups(model)
        inside = tuple(b + "." for b in blocks)
        self.top = [names for names, _ in groups if not names[0].startswith(inside)]
        self.per_block = [[names for names, _ in groups if names[0].startswith(b + ".")] for b in blocks]
        self._handles: list = []
        self._source: Iterator | None = None
        self._measure = False

    def block_keys(self) -> list[list[str]]:
        """Each block's stored keys (one per tensor: tied names share one)."""
        return [[self.keys[names[0]] for names in b] for b in self.per_block]

    @contextlib.contextmanager
    def reading(self, reader: BlockReader, blank: bool = False) -> Iterator[None]:
        self._source = iter(reader.blank() if blank else reader)
        self._measure = not blank
        # each block measured (on_block) on a thread of its own while its forward runs
        self._work = work = BlockWork(None if blank else self.on_block, self.on_measured)
        for i, b in enumerate(self.blocks):
            mod = self.model.get_submodule(b)
            self._handles.append(mod.register_forward_pre_hook(self._pre(i)))
            self._handles.append(mod.register_forward_hook(self._post(i)))
        failed = True
        try:
            yield
            failed = False
        finally:
            try:
                work.close(failed)
            finally:
                for h in self._handles:
                    h.remove()
                self._handles.clear()
                close = getattr(self._source, "close", None)
                self._source = None
                if close is not None:
                    close()

    def _pre(self, i: int):
        def fn(_m, _args):
            self._work.settle()  # the block before measured: its arena may be written again
            layer, stored = next(self._source)
            if layer != i:  # (a model that runs its blocks out of order: not a stack)
                raise CheckpointError(f"block {i} ran where block {layer} was expected: the blocks of "
                                      f"{self.blocks[0].rpartition('.')[0]} do not run in order")  # fmt: skip
            state = {}
            for names in self.per_block[i]:
                t = stored[self.keys[names[0]]]
                for n in names:  # one tensor under each of its names (tied weights stay tied)
                    _set(self.model, n, t)
                state[names[0]] = t
            if self._measure:
                self._work.submit(i, state)

        return fn

    def _post(self, i: int):
        def fn(_m, _args, _out):
            for names in self.per_block[i]:
                for n in names:
                    _set(self.model, n, None)

        return fn


@contextlib.contextmanager
def embedding_rows(
    model: nn.Module, files: TensorFiles, key: str, dtype: torch.dtype, device
) -> Iterator[None]:
    """While inside, the model's input embedding module reads only the rows of the ids it
    is called with: a forward pre-hook reads those rows and renumbers the ids into them,
    the module's own forward (a scaled embedding's scale included) runs on that small
    table, and a forward hook puts the meta weight back."""
    emb = model.get_input_embeddings()
    saved = {}

    def pre(mod, args):
        ids = args[0]
        table, local = compact_rows(files, key, ids, dtype, device)
        saved["weight"], saved["padding_idx"] = mod._parameters["weight"], getattr(mod, "padding_idx", None)
        mod._parameters["weight"] = nn.Parameter(table, requires_grad=False)
        mod.padding_idx = None  # (it only shapes gradients; the small table need not hold its row)
        return (local, *args[1:])

    def post(mod, _args, _out):
        mod._parameters["weight"] = saved.pop("weight")
        mod.padding_idx = saved.pop("padding_idx")

    handles = [emb.register_forward_pre_hook(pre), emb.register_forward_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        if "weight" in saved:  # (the forward failed between the two hooks)
            emb._parameters["weight"] = saved.pop("weight")
            emb.padding_idx = saved.pop("padding_idx")
