"""Where a model adds its branches to the residual stream.

A transformer with L blocks performs 2L additions x <- x + F(x). To measure them in
a model tinit did not build, tinit needs, per block: the block module (its input is
the stream entering the block), the attention and MLP branch modules, and, where the
family adds a *normed* branch (OLMo 2, Gemma 2/3: ``x + Norm(F(x))``), the module
whose output is what is added. Post-norm stacks (tinit's own ``--post-norm``) also
name the norm whose output continues as the stream.

Sites come from, in order: an explicit ``--sites`` spec; a family adapter (tinit's
``Transformer``, and HF model types whose layout is known); or the generic finder,
which takes the largest ``ModuleList`` of identical blocks and, in each, the two
children holding linear layers in the order they run (attention first), following
each branch output through any child that consumes it (a dropout or a norm) to the
tensor that is added. Every choice is checked when the model runs: the stream the
sites reconstruct (stream_in + branch) must equal each block's output.

Parallel residual (GPT-NeoX, GPT-J: ``x + Attn(LN1(x)) + MLP(LN2(x))``): both
branches read the block input, but the stream still gains two additions; tinit
records them in order, attention then MLP, so the "stream" entering the MLP addition
is x + Attn(...), a sum the model never materialises. The variances of the sums are
exact; only the reading of ``cross_corr`` at the MLP addition differs (its branch did
not see that stream).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

import torch
from torch import nn

from ...model.config import ConfigError
from ...model.placements import Placement, get_placement


class SiteError(ConfigError):
    """The additions cannot be found (names the ``--sites`` option)."""

    def __init__(self, message: str):
        super().__init__("--sites", message)


@dataclass(frozen=True)
class BlockSites:
    """Module paths of one block's two additions."""

    layer: int
    block: str  # its input is the stream entering the block
    attn: str  # the attention branch
    ffn: str  # the MLP branch
    attn_added: str | None = None  # module whose output is added (normed branch); None: the branch's
    ffn_added: str | None = None
    attn_stream: str | None = None  # post-norm: module whose output continues as the stream
    ffn_stream: str | None = None


@dataclass
class Sites:
    """The 2L additions of a model, and how its stream works."""

    family: str  # which adapter found them (an HF model_type, "tinit", "generic", "--sites")
    blocks: list[BlockSites]
    parallel: bool = False  # both branches read the block input (GPT-NeoX)
    norm_position: str = "pre"  # a placement's name: "post" when the stream is renormalised after each sum
    norm_offset: float = 0.0  # norms compute (offset + w) * x_hat; Gemma: 1, so w = 0 is gain 1
    declared_scheme: str | None = None  # the family's own init rule, in tinit's terms
    declared_rule: str = ""  # that rule in the family's own words, for the audit's report
    notes: list[str] = field(default_factory=list)

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    @property
    def placement(self) -> Placement:
        return get_placement(self.norm_position)

    @property
    def plain_sum(self) -> bool:
        """The stream is a plain sum of its branches: no norm after each sum, and each
        branch reads the stream the previous one wrote (not parallel)."""
        return not self.placement.resets and not self.parallel

    def describe(self) -> list[str]:
        """What was found, for the terminal and audit.md."""
        b0, bl = self.blocks[0], self.blocks[-1]

        def branch(name: str, added: str | None, stream: str | None) -> str:
            out = name + (f" -> {added}" if added else "")
            return out + (f" -> Norm {stream}" if stream else "")

        lines = [
            f"{self.family}: {self.n_layers} blocks {b0.block} .. {bl.block} ({2 * self.n_layers} additions)",
            f"  attention branch: {branch(b0.attn, b0.attn_added, b0.attn_stream)}",
            f"  MLP branch:       {branch(b0.ffn, b0.ffn_added, b0.ffn_stream)}",
            "  residual: "
            + ("parallel (both branches read the block input)" if self.parallel else "sequential")
            + (
                f", {self.placement.label} (stream renormalised after each addition)"
                if self.placement.resets
                else ""
            ),
        ]
        return lines + [f"  note: {n}" for n in self.notes]


# model_type -> layout. attn/ffn are child names inside each block; *_added the child
# whose output is added (the normed branch); norm_offset 1 for (1 + w) norms.
FAMILIES: dict[str, dict] = {
    **{
        t: {"blocks": "model.layers", "attn": "self_attn", "ffn": "mlp"}
        for t in ("llama", "qwen2", "qwen3", "mistral", "phi3", "granite")
    },
    "gemma": {"blocks": "model.layers", "attn": "self_attn", "ffn": "mlp", "norm_offset": 1.0},
    **{
        t: {
            "blocks": "model.layers",
            "attn": "self_attn",
            "ffn": "mlp",
            "attn_added": "post_attention_layernorm",
            "ffn_added": "post_feedforward_layernorm",
            "norm_offset": 1.0,
        }
        for t in ("gemma2", "gemma3_text")
    },  # fmt: skip
    "olmo2": {
        "blocks": "model.layers",
        "attn": "self_attn",
        "ffn": "mlp",
        "attn_added": "post_attention_layernorm",
        "ffn_added": "post_feedforward_layernorm",
    },  # fmt: skip
    # GPT-2's own _init_weights scales c_proj by 1/sqrt(2 n_layer): tinit's "gpt2" (alias "scaled")
    "gpt2": {
        "blocks": "transformer.h",
        "attn": "attn",
        "ffn": "mlp",
        "declared": "gpt2",
        "declared_rule": "GPT-2's c_proj / sqrt(2 n_layer)",
    },
    "gpt_neox": {"blocks": "gpt_neox.layers", "attn": "attention", "ffn": "mlp", "parallel_attr": True},
}


def parse_sites_spec(spec: str) -> dict:
    """``BLOCKS:ATTN[>ADDED]:FFN[>ADDED]``, e.g. ``model.layers:self_attn:mlp`` or
    ``model.layers:self_attn>post_attention_layernorm:mlp>post_feedforward_layernorm``.
    BLOCKS is the path of the ModuleList of blocks; ATTN, FFN and ADDED are child names
    of each block, shell patterns allowed (``*attn*``)."""
    parts = spec.split(":")
    if len(parts) != 3 or not all(parts):
        raise SiteError(
            f"{spec!r}: expected BLOCKS:ATTN[>ADDED]:FFN[>ADDED], e.g. model.layers:self_attn:mlp"
        )
    out = {"blocks": parts[0]}
    for key, part in (("attn", parts[1]), ("ffn", parts[2])):
        name, _, added = part.partition(">")
        out[key], out[f"{key}_added"] = name, added or None
    return out


def first_tensor(x) -> torch.Tensor | None:
    """The hidden states in a module's input or output (a tensor, or the first of a tuple)."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, tuple | list) and x and isinstance(x[0], torch.Tensor):
        return x[0]
    return getattr(x, "last_hidden_state", None)


def block_input(args, kwargs) -> torch.Tensor | None:
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    if "hidden_states" in kwargs:
        return kwargs["hidden_states"]
    return next((v for v in kwargs.values() if isinstance(v, torch.Tensor) and v.is_floating_point()), None)


def is_linear_like(m: nn.Module) -> bool:
    """A module with a 2-D weight that is not an embedding table (nn.Linear, HF Conv1D)."""
    w = getattr(m, "weight", None)
    return isinstance(w, torch.Tensor) and w.dim() == 2 and not isinstance(m, nn.Embedding)


@dataclass
class Trace:
    """One small forward pass: the order modules ran in, and each one's first input
    and output tensor (by object, so data flow can be followed)."""

    order: list[str]
    inputs: dict[str, torch.Tensor | None]
    outputs: dict[str, torch.Tensor | None]


def trace(model: nn.Module, tokens: torch.Tensor, roots: list[str], forward=None) -> Trace:
    """Run ``model(tokens)`` (or ``forward(tokens)``: a part of it, such as a causal LM's
    base model) without gradients, recording every module under ``roots`` (module paths;
    "" for the whole model)."""
    order: list[str] = []
    inputs: dict = {}
    outputs: dict = {}
    handles = []

    def hook(path):
        def fn(_m, args, kwargs, output):
            if path not in inputs:
                order.append(path)
                inputs[path] = block_input(args, kwargs)
                outputs[path] = first_tensor(output)

        return fn

    seen = set()
    for root in roots:
        base = model.get_submodule(root) if root else model
        for name, m in base.named_modules():
            path = f"{root}.{name}".strip(".") if name else root
            if path not in seen:
                seen.add(path)
                handles.append(m.register_forward_hook(hook(path), with_kwargs=True))
    try:
        with torch.no_grad():
            (forward or model)(tokens)
    finally:
        for h in handles:
            h.remove()
    return Trace(order, inputs, outputs)


def _blocks_list(model: nn.Module, path: str) -> list[str]:
    try:
        blocks = model.get_submodule(path)
    except AttributeError:
        raise SiteError(f"the model has no module {path!r}") from None
    if not isinstance(blocks, nn.ModuleList | nn.Sequential) or len(blocks) == 0:
        raise SiteError(f"{path!r} is not a non-empty ModuleList of blocks")
    return [f"{path}.{i}" for i in range(len(blocks))]


def _match_child(model: nn.Module, block: str, pattern: str, what: str) -> str:
    names = [n for n, _ in model.get_submodule(block).named_children()]
    hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
    if len(hits) != 1:
        found = "no child" if not hits else f"{len(hits)} children ({', '.join(hits)})"
        raise SiteError(
            f"{what} pattern {pattern!r} matches {found} of {block} (its children: {', '.join(names)})"
        )
    return hits[0]


def largest_block_list(model: nn.Module) -> str:
    """The path of the ModuleList of identical modules holding the most parameters."""
    best, best_n = None, 0
    for path, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) > 0 and len({type(b) for b in m}) == 1:
            n = sum(p.numel() for p in m.parameters())
            if n > best_n:
                best, best_n = path, n
    if best is None:
        raise SiteError("found no ModuleList of repeated blocks; name them with --sites BLOCKS:ATTN:FFN")
    return best


def _follow(tr: Trace, block: str, branch: str) -> str | None:
    """The last block child in a chain that consumes the branch output (dropout, norm):
    its output is what the block adds. None when the branch output is added as is."""
    out, added = tr.outputs.get(f"{block}.{branch}"), None
    children = [p for p in tr.order if p.startswith(block + ".") and "." not in p[len(block) + 1 :]]
    changed = True
    while changed and out is not None:
        changed = False
        for p in children:
            if tr.inputs.get(p) is out and tr.outputs.get(p) is not None and tr.outputs[p].shape == out.shape:
                added, out, changed = p[len(block) + 1 :], tr.outputs[p], True
                break
    return added


def _generic_branches(model: nn.Module, tr: Trace, block: str) -> tuple[str, str]:
    """The attention-like and MLP-like children of ``block``: the children holding
    linear layers, in the order they ran; attention runs first."""
    mod = model.get_submodule(block)
    with_linear = [
        n for n, c in mod.named_children()
        if any(is_linear_like(m) for m in c.modules()) and f"{block}.{n}" in tr.inputs
    ]  # fmt: skip
    with_linear.sort(key=lambda n: tr.order.index(f"{block}.{n}"))
    if len(with_linear) > 2:
        attn = [n for n in with_linear if re.search(r"attn|attention", n, re.I)]
        ffn = [n for n in with_linear if re.search(r"mlp|ffn|feed_?forward|ff$", n, re.I)]
        if len(attn) == 1 and len(ffn) == 1:
            return attn[0], ffn[0]
    if len(with_linear) != 2:
        raise SiteError(
            f"cannot tell the attention and MLP branches of {type(mod).__name__} apart "
            f"(children with linear layers: {', '.join(with_linear) or 'none'}); name them with --sites"
        )
    return with_linear[0], with_linear[1]


def find_sites(model: nn.Module, tokens: torch.Tensor, spec: str | None = None,
               forward=None) -> tuple[Sites, Trace]:  # fmt: skip
    """The model's additions, and the trace of one small forward pass that found them
    (``forward``: what runs the tokens, default the model itself)."""
    from ...model.transformer import Transformer

    layout: dict = {}
    family = "generic"
    if spec is not None:
        layout, family = parse_sites_spec(spec), "--sites"
    elif isinstance(model, Transformer):
        if model.streamed:
            raise SiteError(
                "a streamed tinit Transformer holds no blocks to hook; build it with stream=False"
            )
        family = "tinit"
        layout = {"blocks": "blocks", "attn": "attn", "ffn": "ffn"}
        layout["norm_offset"] = model.init.definition.norm_offset  # Gemma's (1 + w) norms
        # the block's norms by slot: the branch's output norm is what is added (sandwich,
        # reordered); a norm after the sum continues as the stream (post)
        names = model.blocks[0].norm_names
        for sub in ("attn", "ffn"):
            layout[f"{sub}_added"] = names.get(f"{sub}_out")
            layout[f"{sub}_stream"] = names.get(f"{sub}_stream")
    else:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        if model_type in FAMILIES:
            family, layout = model_type, dict(FAMILIES[model_type])
    blocks_path = layout.get("blocks") or largest_block_list(model)
    paths = _blocks_list(model, blocks_path)
    tr = trace(model, tokens, paths, forward)
    if "attn" in layout:
        attn = _match_child(model, paths[0], layout["attn"], "attention")
        ffn = _match_child(model, paths[0], layout["ffn"], "MLP")
    else:
        attn, ffn = _generic_branches(model, tr, paths[0])
    for key in ("attn_added", "ffn_added", "attn_stream", "ffn_stream"):
        if layout.get(key):
            layout[key] = _match_child(model, paths[0], layout[key], key.replace("_", " "))
    if family == "generic":
        layout["attn_added"] = _follow(tr, paths[0], attn)
        layout["ffn_added"] = _follow(tr, paths[0], ffn)
    for p in paths:
        for child in (attn, ffn):
            if f"{p}.{child}" not in tr.inputs:
                raise SiteError(f"{p}.{child} did not run in a forward pass; name the branches with --sites")
    blocks = [
        BlockSites(
            i, p, f"{p}.{attn}", f"{p}.{ffn}",
            *(f"{p}.{layout[k]}" if layout.get(k) else None
              for k in ("attn_added", "ffn_added", "attn_stream", "ffn_stream")),
        )
        for i, p in enumerate(paths)
    ]  # fmt: skip
    parallel = bool(layout.get("parallel_attr") and getattr(model.config, "use_parallel_residual", False))
    sites = Sites(
        family=family,
        blocks=blocks,
        parallel=parallel,
        norm_position="post" if layout.get("attn_stream") else "pre",
        norm_offset=layout.get("norm_offset", 0.0),
        declared_scheme=layout.get("declared"),
        declared_rule=layout.get("declared_rule", ""),
    )
    if parallel:
        sites.notes.append(
            "parallel residual: x + Attn(LN1(x)) + MLP(LN2(x)) is recorded as two additions, attention "
            "first; the MLP's stream_in (x + Attn) is a sum the model never forms"
        )
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    modules = model.named_modules(remove_duplicate=False)
    tied = [n for n, m in modules if is_linear_like(m) and id(m.weight) in tables]
    if tied:
        sites.notes.append(f"{tied[0]} shares the embedding's weight (tied head): audited once, as embed")
    if sites.norm_offset:
        sites.notes.append(
            f"norms scale by ({sites.norm_offset:g} + w): a gain of 1 is w = {1 - sites.norm_offset:g}"
        )
    if family == "generic":
        sites.notes.append("found by the generic finder; if it guessed wrong, name the sites with --sites")
    return sites, tr
