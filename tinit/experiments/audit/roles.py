"""The tinit role of every parameter of any model, told by structure.

A name list is the bug class this tool exists to catch (HF transformers #47458:
a depth-scaled init that never ran because a name match never fired). So the role
comes from where a parameter sits and what its module does:

- a 2-D weight inside a branch whose output is what the branch writes to the stream
  (the last linear layer to run in the branch with output width d) is the *writer*:
  ``o`` in attention, ``down`` in the MLP; every other linear weight in a branch is a
  *reader* (``q``/``k``/``v``/``qkv`` in attention, ``gate``/``up`` in the MLP). Names
  only split the readers for display; readers share one expected std;
- a 1-D parameter of a module with only 1-D parameters (LayerNorm, RMSNorm, q/k norms):
  ``norm`` (its ``bias``: ``bias``); a linear layer's bias: ``bias``;
- a single number held by a block itself (not by a module inside it): ``gain``, a
  learned branch gain (ReZero's resweight, tinit's ``gain``);
- ``nn.Embedding`` outside the blocks: ``embed`` (the token table, ``vocab`` rows)
  or ``pos``; a linear layer outside the blocks writing ``vocab`` outputs: ``head``;
- anything else: ``unknown``, reported, never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ...model.roles import reader_label, writer_role
from .sites import Sites, Trace, is_linear_like


@dataclass(frozen=True)
class ParamRole:
    name: str
    role: str
    layer: int  # block index; -1 the embedding side, L the final norm and head
    kind: str  # linear, embedding, norm or other: what the module is
    fan_in: int | None  # inputs of a linear layer (for PyTorch's default init bound)


def _out_in(m: nn.Module) -> tuple[int, int]:
    """(out, in) features of a linear-like module: nn.Linear stores (out, in), HF
    Conv1D (in, out) with ``nf`` = out."""
    w = m.weight
    if hasattr(m, "nf"):
        return int(w.shape[1]), int(w.shape[0])
    return int(w.shape[0]), int(w.shape[1])


def _is_norm(m: nn.Module) -> bool:
    ps = list(m.parameters(recurse=False))
    return bool(ps) and all(p.dim() == 1 for p in ps) and not any(True for _ in m.children())


def writers(model: nn.Module, sites: Sites, tr: Trace, d_model: int) -> dict[str, str]:
    """Path of the linear layer that writes each branch: the last one to run inside the
    branch with output width d. Keyed by branch path."""
    out = {}
    for b in sites.blocks:
        for branch in (b.attn, b.ffn):
            ran = [
                p for p in tr.order
                if p.startswith(branch + ".") and is_linear_like(model.get_submodule(p))
                and _out_in(model.get_submodule(p))[0] == d_model
            ]  # fmt: skip
            if ran:
                out[branch] = ran[-1]
    return out


def classify_roles(model: nn.Module, sites: Sites, tr: Trace, vocab: int) -> list[ParamRole]:
    """One :class:`ParamRole` per parameter, in ``model.named_parameters()`` order
    (a tied head shares the embedding's tensor and appears once, as ``embed``)."""
    x0 = tr.inputs.get(sites.blocks[0].block)
    d_model = int(x0.shape[-1]) if x0 is not None else None
    writer = writers(model, sites, tr, d_model)
    L = sites.n_layers
    out = []
    for name, _p in model.named_parameters():
        owner_path, _, leaf = name.rpartition(".")
        owner = model.get_submodule(owner_path) if owner_path else model
        block = next(
            (b for b in sites.blocks if owner_path == b.block or owner_path.startswith(b.block + ".")), None
        )
        layer = block.layer if block is not None else None
        kind, fan_in, role = "other", None, "unknown"
        if is_linear_like(owner):
            kind = "linear"
            out_f, fan_in = _out_in(owner)
            if leaf == "bias":
                role = "bias"
            elif leaf == "weight" and block is not None:
                for br, sub in ((block.attn, "attn"), (block.ffn, "ffn")):
                    if owner_path.startswith(br + "."):
                        if writer.get(br) == owner_path:
                            role = writer_role(sub)
                        else:
                            role = reader_label(sub, owner_path[len(br) + 1 :])
            elif leaf == "weight" and out_f == vocab:
                role = "head"
        elif isinstance(owner, nn.Embedding):
            kind = "embedding"
            if block is None:
                role = "embed" if owner.num_embeddings == vocab else "pos"
        elif _is_norm(owner):
            kind = "norm"
            role = "bias" if leaf == "bias" else "norm"
        elif block is not None and owner_path == block.block and _p.numel() == 1:
            role = "gain"
        if layer is None:
            layer = -1 if role in ("embed", "pos") else L
        out.append(ParamRole(name, role, layer, kind, fan_in))
    return out
