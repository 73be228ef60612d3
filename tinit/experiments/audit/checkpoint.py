"""Models whose weights come from a checkpoint, one block resident at a time.

- :class:`CheckpointTransformer`: tinit's own :class:`~tinit.model.transformer.Transformer`,
  streamed: :meth:`~CheckpointTransformer.iter_blocks` builds each block on the meta
  device, gives it storage and copies its tensors out of the checkpoint just before it
  runs (the streamed forward of ``tinit variance``, with read weights where it draws
  them), so the stream is measured by the very code ``tinit variance`` runs.
- :class:`LazyBlocks`: a Hugging Face model built with its parameters on the meta device
  (buffers such as RoPE's frequencies real); the embedding, final norm and head are read
  up front, and a forward pre-hook on each block reads that block's tensors just before
  it runs, a forward hook puts them back on the meta device after. The audit's stream
  hooks (:mod:`.stream`) then see a plain forward.

Either way each block's weights are handed to ``on_block(layer, {name: tensor})`` while
resident: :func:`weight_rows` measures them there (std, spectral norm, the change from
the init where the init is known), so the weights are read once.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
from torch import nn

from ...model.config import ConfigError, InitConfig, ModelConfig
from ...model.init import role_of, role_rule
from ...model.transformer import Block, Transformer, build_block, to_empty
from .tensors import CheckpointError, TensorFiles, tied_groups

#: Above this many elements a matrix's spectral norm is computed in float32 (an SVD of a
#: 4096 x 14336 matrix in float64 takes a minute on a CPU); below, in float64.
SPECTRAL_F64_MAX = 4_000_000

OnBlock = Callable[[int, dict[str, torch.Tensor]], None]


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
    (``keys``: model name -> stored key, from :meth:`TensorFiles.check`). ``on_block``
    gets each block's tensors (and, as layer -1, the non-block ones) while resident."""

    def __init__(self, cfg: ModelConfig, init: InitConfig, files: TensorFiles, keys: dict[str, str],
                 device="cpu", dtype: torch.dtype = torch.float32,
                 on_block: OnBlock | None = None):  # fmt: skip
        super().__init__(cfg, init, device, dtype, stream=True, overlap=False, drawn=False)
        self.files, self.keys, self.on_block = files, keys, on_block
        top = self.state_dict()  # embed, positions, final norm, head: allocated, not drawn; filled here
        read = files.read([keys[n] for n in top], dtype, self._device)
        with torch.no_grad():
            for name, t in top.items():
                t.copy_(read[keys[name]])
        if on_block is not None:
            on_block(-1, dict(top))

    def iter_blocks(self) -> Iterator[Block]:
        for layer in range(self.cfg.n_layers):
            block = to_empty(_meta_block(self.cfg, self.init, layer, self._dtype), self._device)
            state = block.state_dict()
            names = {n: f"blocks.{layer}.{n}" for n in state}
            read = self.files.read([self.keys[m] for m in names.values()], self._dtype, self._device)
            with torch.no_grad():
                for n, t in state.items():
                    t.copy_(read[self.keys[names[n]]])
            del read
            if self.on_block is not None:
                self.on_block(layer, {names[n]: t for n, t in state.items()})
            yield block
            del block, state


def init_block_state(
    cfg: ModelConfig, init: InitConfig, layer: int, device, dtype
) -> dict[str, torch.Tensor]:
    """The weights of block ``layer`` (-1: the non-block parts) at step 0, rebuilt from the
    run's seed (a block depends only on (seed, layer, role): docs/design.md §3)."""
    if layer >= 0:
        block = build_block(cfg, init, layer, device, dtype)
        return {f"blocks.{layer}.{n}": t for n, t in block.state_dict().items()}
    return dict(Transformer(cfg, init, device, dtype, stream=True).state_dict())


def spectral_norm(w: torch.Tensor) -> float:
    """The largest singular value of a matrix (float64 up to :data:`SPECTRAL_F64_MAX`
    elements); NaN for a tensor that is not 2-D or not finite."""
    if w.dim() != 2 or not bool(torch.isfinite(w).all()):
        return math.nan
    dt = torch.float64 if w.numel() <= SPECTRAL_F64_MAX else torch.float32
    return float(torch.linalg.svdvals(w.to(dt))[0])


def weight_row(name: str, w: torch.Tensor, w0: torch.Tensor | None, expected: float) -> dict:
    """std, spectral norm and ||W - W0|| / ||W0|| of one tensor (NaN where W0 is unknown
    or zero: a zero-initialised matrix has no relative change)."""
    x = w.detach().to(torch.float64)
    rel = math.nan
    if w0 is not None:
        x0 = w0.detach().to(torch.float64)
        base = float(torch.linalg.vector_norm(x0))
        if base > 0:
            rel = float(torch.linalg.vector_norm(x - x0)) / base
    return {
        "param": name, "shape": "x".join(map(str, w.shape)) or "scalar", "numel": w.numel(),
        "std": float(x.std(unbiased=False)) if x.numel() > 1 else math.nan,
        "expected_std": expected, "spectral_norm": spectral_norm(x), "rel_change": rel,
    }  # fmt: skip


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


def _set(model: nn.Module, name: str, value: torch.Tensor | None) -> None:
    mod, _, leaf = name.rpartition(".")
    owner = model.get_submodule(mod) if mod else model
    if leaf in owner._parameters:
        t = owner._parameters[leaf]
        owner._parameters[leaf] = nn.Parameter(value if value is not None else t.to("meta"),
                                               requires_grad=False)  # fmt: skip
    elif leaf in owner._buffers:
        owner._buffers[leaf] = value if value is not None else owner._buffers[leaf].to("meta")


class LazyBlocks:
    """Reads a meta-built model's tensors from ``files`` block by block (see the module
    docstring). ``blocks``: the module paths of the blocks, in order."""

    def __init__(self, model: nn.Module, blocks: list[str], files: TensorFiles, keys: dict[str, str],
                 device, dtype: torch.dtype, on_block: OnBlock | None = None):  # fmt: skip
        self.model, self.blocks, self.files, self.keys = model, blocks, files, keys
        self.device, self.dtype, self.on_block = device, dtype, on_block
        self.measuring = False  # on_block only in the measured pass (not the sites' trace)
        groups = tied_groups(model)
        inside = tuple(b + "." for b in blocks)
        self.top = [names for names, _ in groups if not names[0].startswith(inside)]
        self.per_block = [[names for names, _ in groups if names[0].startswith(b + ".")] for b in blocks]
        self._handles = []

    def load_top(self) -> dict[str, torch.Tensor]:
        """Read the tensors outside the blocks (embedding, final norm, head), held throughout."""
        return self._load(self.top)

    def _load(self, groups: list[list[str]]) -> dict[str, torch.Tensor]:
        read = self.files.read([self.keys[names[0]] for names in groups], self.dtype, self.device)
        out = {}
        for names in groups:
            t = read[self.keys[names[0]]]
            for n in names:  # one tensor under each of its names (tied weights stay tied)
                _set(self.model, n, t)
            out[names[0]] = t
        return out

    def __enter__(self):
        for i, b in enumerate(self.blocks):
            mod = self.model.get_submodule(b)
            self._handles.append(mod.register_forward_pre_hook(self._pre(i)))
            self._handles.append(mod.register_forward_hook(self._post(i)))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _pre(self, i: int):
        def fn(_m, _args):
            state = self._load(self.per_block[i])
            if self.on_block is not None and self.measuring:
                self.on_block(i, state)

        return fn

    def _post(self, i: int):
        def fn(_m, _args, _out):
            for names in self.per_block[i]:
                for n in names:
                    _set(self.model, n, None)

        return fn
