"""Blocks with explicit residual additions, and the stack, built whole or streamed.

Each addition, attention then FFN, is one literal residual sum (nanoGPT's shape):

    s = a x + g Out(F(In(x)));   x <- Stream(s)

with the init scheme's stream multiplier a and branch multiplier g (1 and 1 for most
schemes), and In, Out, Stream each a norm or the identity as the placement
(``cfg.norm_position``, :mod:`tinit.model.placements`) says:

pre (GPT-2 onwards):         In = Norm                  x <- a x + g F(N(x))
post (Vaswani 2017):         Stream = Norm              x <- N(a x + g F(x))
sandwich (Gemma 2, Peri-LN): In = Norm, Out = Norm      x <- a x + g N_out(F(N_in(x)))
reordered (OLMo 2):          Out = Norm                 x <- a x + g N(F(x))
none (ReZero, T-Fixup):      all identity               x <- a x + g F(x)

A block's norms keep the names they had when each placement was written out (state
dicts, init draw keys and grad-norms' tensor names depend on them): the first norm of
the attention sublayer is ``norm1``, a second ``norm1o`` (``norm2``, ``norm2o`` for the
FFN), in the order In, Out, Stream.

A scheme with an x0 mix (nanochat) first sets x <- lambda_l x + mu_l x0 before block l;
one with a backout (nanochat) subtracts beta x_mid (the stream after block L // 2) on
the last addition's identity path, so the probe's ``stream_in`` there is x - beta x_mid
(at L <= 2 the middle block is the last: its output is scaled by 1 - beta). The rest of
a scheme's architecture lives in the layers: Gemma's (1 + w) norms, soft-caps and
attention scale, nanochat's q/k gain and relu^2 MLP, torchscale's sub-LN.

An L-layer stack performs 2L additions, k = 1..2L (attention k = 2l+1, FFN
k = 2l+2); k = 0 is the embedding output. Each addition, in every placement, calls
the optional probe with (k, layer, sublayer, stream_in, branch, stream_out) and,
when a norm follows the sum (post), the normalised stream as ``normed``; ``branch`` is
Out(F(In(x))) before the multiplier g, ``stream_out`` the sum s, and ``stream_in`` the
stream entering the addition (after the x0 mix). With no probe the model is a plain
model.

A block's weights depend only on (seed, layer, role), so a model can be
*streamed*: each block is built on the device just before it runs and dropped
right after, and memory does not grow with depth. Streamed and fully built
models give identical numbers.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .config import InitConfig, ModelConfig
from .init import init_weights_
from .layers import Attention, GaussianBranch, make_ffn, make_norm, rope_cache
from .placements import SLOTS
from .schemes import Scheme, environment, evaluate, ffn_of
from .structure import structure_warning


class Probe(Protocol):
    """Called at k = 0 (embedding: only ``stream_out``) and at every addition k >= 1."""

    def __call__(
        self,
        k: int,
        layer: int,
        sublayer: str,
        stream_in: torch.Tensor | None,
        branch: torch.Tensor | None,
        stream_out: torch.Tensor,
        normed: torch.Tensor | None = None,
    ) -> None: ...


def _optional(formula, env, what: str) -> float | None:
    return None if formula is None else evaluate(formula, env, what)


def block_multipliers(cfg: ModelConfig, scheme: Scheme, init: InitConfig | None, layer: int) -> dict:
    """The scheme's multipliers at block ``layer``: stream a, branch g, the x0 mix
    (lambda, mu) or None, the attention logit scale, the q/k gain and the attention
    soft-cap (each None when the scheme has none)."""
    env = environment(cfg, init or InitConfig(), layer)
    what = f"{scheme.name} multipliers"
    mix = None
    if scheme.x0_mix is not None:
        mix = (evaluate(scheme.x0_mix[0], env, what), evaluate(scheme.x0_mix[1], env, what))
    return {
        "a": evaluate(scheme.stream_mult, env, what),
        "g": evaluate(scheme.branch_mult, env, what),
        "mix": mix,
        "attn_scale": _optional(scheme.attn_scale, env, what),
        "qk_gain": _optional(scheme.qk_gain, env, what),
        "attn_softcap": _optional(scheme.attn_softcap, env, what),
    }


def backout_of(cfg: ModelConfig, init: InitConfig) -> tuple[float, int] | None:
    """nanochat's backout: (beta, mid) with x <- x - beta x_mid before the final norm,
    x_mid the stream after block mid = L // 2 (nanochat/gpt.py GPT.forward); None when
    the scheme has none."""
    scheme = init.scheme
    if scheme.backout is None:
        return None
    beta = evaluate(scheme.backout, environment(cfg, init, cfg.n_layers), f"{scheme.name} backout")
    return beta, cfg.n_layers // 2


def _times(m: float | torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """m * t, skipping the multiply when m is the number 1 (the common case costs
    nothing). A learned gain (a tensor) always multiplies: comparing it with 1 would
    read it back from the device, and skipping it would cut its gradient."""
    return t if not isinstance(m, torch.Tensor) and m == 1.0 else m * t


class Block(nn.Module):
    """One layer: an attention addition and an FFN addition, their norms where the
    placement puts them (identities elsewhere)."""

    def __init__(self, cfg: ModelConfig, layer: int, seed: int = 0, device=None, dtype=None,
                 init: InitConfig | None = None):  # fmt: skip
        super().__init__()
        self.layer = layer
        init = init if init is not None else InitConfig()
        scheme = init.scheme
        m = block_multipliers(cfg, scheme, init, layer)
        self.placement = cfg.placement
        self.a, self.mix = m["a"], m["mix"]
        back = backout_of(cfg, init)
        # the last block carries the backout onto its final addition's identity path
        self.backout = back if back is not None and layer == cfg.n_layers - 1 else None
        # ReZero trains its gain: a parameter (role "gain"), valued by init_weights_
        learned = scheme.branch_learned
        self.gain = nn.Parameter(torch.empty((), device=device, dtype=dtype)) if learned else None
        self.g = m["g"]
        self._place_norms(cfg, device, dtype, scheme.norm_offset)
        qk_norm = scheme.qk_norm if cfg.qk_norm is None else cfg.qk_norm
        span = scheme.qk_norm_span if cfg.qk_norm_span is None else cfg.qk_norm_span
        if cfg.branch == "gaussian":
            self.attn = GaussianBranch(cfg.branch_var, seed, layer, "attn")
            self.ffn = GaussianBranch(cfg.branch_var, seed, layer, "ffn")
        else:
            off = scheme.norm_offset
            self.attn = Attention(cfg, device=device, dtype=dtype, scale=m["attn_scale"], qk_norm=qk_norm,
                                  qk_gain=m["qk_gain"], softcap=m["attn_softcap"], norm_offset=off,
                                  subln=scheme.subln, qk_norm_span=span)  # fmt: skip
            kind, d_ff = ffn_of(cfg, scheme)
            self.ffn = make_ffn(cfg, device, dtype, kind, d_ff, subln=scheme.subln, norm_offset=off)

    def _place_norms(self, cfg: ModelConfig, device, dtype, offset: float) -> None:
        """The six slots attn_in, attn_out, attn_stream, ffn_in, ffn_out, ffn_stream: a
        norm where the placement has one, registered under its kept name (per sublayer,
        ``norm1`` then ``norm1o``; ``norm2``, ``norm2o``), else an identity. The slots are
        plain attributes, not submodules (``object.__setattr__`` skips nn.Module's
        registration), so each norm's parameters appear once, under that name."""
        names: dict[str, str] = {}
        for i, slot in enumerate(self.placement.slots):
            for n, sub in ((1, "attn"), (2, "ffn")):
                name = f"norm{n}" + ("", "o", "s")[i]
                self.add_module(name, make_norm(cfg, device, dtype, offset=offset))
                names[f"{sub}_{slot}"] = name
        identity = nn.Identity()
        for sub in ("attn", "ffn"):
            for slot in SLOTS:
                key = f"{sub}_{slot}"
                object.__setattr__(self, key, getattr(self, names[key]) if key in names else identity)
        self.norm_names = names  # slot -> the norm's name in the block (the audit's sites read it)

    def forward(
        self, x: torch.Tensor, rope=None, probe: Probe | None = None, x0: torch.Tensor | None = None,
        x_mid: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """The block's two residual sums. ``x0``: the embedding output (a scheme with an
        x0 mix); ``x_mid``: the stream after the middle block (a scheme with a backout,
        at the last block; None when the middle block is this one)."""
        a, g, k = self.a, (self.gain if self.gain is not None else self.g), 2 * self.layer + 1
        if self.mix is not None:
            if x0 is None:
                raise ValueError("this scheme mixes the embedding x0 into every block: pass x0")
            x = self.mix[0] * x + self.mix[1] * x0

        # attention: x <- Stream(a x + g Out(Attn(In(x))))
        f = self.attn_out(self.attn(self.attn_in(x), rope))
        s = _times(a, x) + _times(g, f)
        y = self.attn_stream(s)
        self._report(probe, k, "attn", x, f, s, y)
        x = y

        # FFN: x <- Stream(a x + g Out(FFN(In(x)))); the identity path x - beta x_mid at a backout
        x_id, c = self._backout_path(x, x_mid)
        f = _times(c, self.ffn_out(self.ffn(self.ffn_in(x), rope)))
        s = _times(a, x_id) + _times(g, f)
        y = self.ffn_stream(s)
        self._report(probe, k + 1, "ffn", x_id, f, s, y)
        return y

    def _backout_path(self, x: torch.Tensor, x_mid: torch.Tensor | None) -> tuple[torch.Tensor, float]:
        """The FFN addition's identity path and the scale of the whole addition: (x, 1),
        or at the last block of a scheme with a backout (x - beta x_mid, 1), or, when
        x_mid is this block's own output (L <= 2), ((1 - beta) x, 1 - beta)."""
        if self.backout is None:
            return x, 1.0
        beta = self.backout[0]
        if x_mid is not None:
            return x - beta * x_mid, 1.0
        return (1.0 - beta) * x, 1.0 - beta

    def _report(self, probe: Probe | None, k: int, sublayer: str, x, f, s, y) -> None:
        """The probe at addition k: stream in, branch (before g), the sum, and the
        normalised stream when a norm follows the sum."""
        if probe is None:
            return
        if self.placement.norm_stream:
            probe(k, self.layer, sublayer, x, f, s, normed=y)
        else:
            probe(k, self.layer, sublayer, x, f, s)


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


def _materialize(
    module: nn.Module, cfg: ModelConfig, init: InitConfig, layer: int, device, prefix: str = ""
) -> nn.Module:
    """Allocate a meta-built module on ``device`` (uninitialised) and initialise it."""
    module = to_empty(module, device)
    init_weights_(module, cfg, init, layer, prefix)
    return module


def _embedding(rows: int, dim: int, dtype: torch.dtype) -> nn.Embedding:
    """An uninitialised meta-device embedding table. Passing the weight skips
    nn.Embedding.reset_parameters, whose normal_ on a meta tensor would import
    torch._dynamo (seconds of start-up) only to draw numbers that are overwritten."""
    return nn.Embedding(rows, dim, _weight=torch.empty(rows, dim, device="meta", dtype=dtype))


def build_block(cfg: ModelConfig, init: InitConfig, layer: int, device="cpu", dtype=torch.float32) -> Block:
    """Block ``layer`` with its recipe weights, built directly on ``device`` in ``dtype``."""
    with torch.device("meta"):
        block = Block(cfg, layer, seed=init.seed, dtype=dtype, init=init)
    return _materialize(block, cfg, init, layer, device)


class Transformer(nn.Module):
    """The canonical model of docs/design.md §10.

    With ``stream=True`` the blocks are not held: :meth:`iter_blocks` builds each
    on the device just before it runs. Embedding, final norm and head are always
    held (they are one layer's worth of memory).
    """

    def __init__(
        self,
        cfg: ModelConfig,
        init: InitConfig,
        device="cpu",
        dtype: torch.dtype = torch.float32,
        stream: bool = False,
        overlap: bool = True,
    ):
        super().__init__()
        self.cfg, self.init, self.streamed, self.overlap = cfg, init, stream, overlap
        scheme, env = init.scheme, environment(cfg, init, -1)
        message = structure_warning(scheme, cfg)
        if message is not None:
            warnings.warn(message, stacklevel=2)
        self.embed_mult = evaluate(scheme.embed_mult, env, f"{scheme.name} embedding multiplier")
        self.logit_mult = evaluate(scheme.logit_mult, env, f"{scheme.name} logit multiplier")
        self.logit_softcap = _optional(scheme.logit_softcap, env, f"{scheme.name} logit soft-cap")
        self.embed_norm, self.backout = scheme.embed_norm, backout_of(cfg, init)
        self._device, self._dtype = torch.device(device), dtype
        d, L = cfg.d_model, cfg.n_layers
        with torch.device("meta"):
            self.embed = _embedding(cfg.vocab_size, d, dtype)
            self.pos = _embedding(cfg.max_seq_len, d, dtype) if cfg.positions == "learned" else None
            final = cfg.placement.final_norm
            self.final_norm = make_norm(cfg, dtype=dtype, offset=scheme.norm_offset) if final else None
            self.head = (
                None if cfg.tie_embeddings else nn.Linear(d, cfg.vocab_size, bias=cfg.bias, dtype=dtype)
            )
        # the embedding side is "layer -1", the final norm and head "layer L"
        for name, layer in (("embed", -1), ("pos", -1), ("final_norm", L), ("head", L)):
            if getattr(self, name) is not None:
                _materialize(getattr(self, name), cfg, init, layer, self._device, prefix=name)
        blocks = [] if stream else [build_block(cfg, init, i, self._device, dtype) for i in range(L)]
        self.blocks = nn.ModuleList(blocks)
        if cfg.positions == "rope":
            cos, sin = rope_cache(cfg.max_seq_len, cfg.head_dim, cfg.rope_base, self._device, dtype)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        else:
            self.rope_cos = self.rope_sin = None

    @property
    def rope(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None if self.rope_cos is None else (self.rope_cos, self.rope_sin)

    def iter_blocks(self) -> Iterator[Block]:
        """The blocks in order: held ones, or (streamed) each built just in time.

        On CUDA a streamed block is generated on a side stream while the previous
        block computes on the current stream, so weight generation overlaps compute;
        at most two blocks are alive at once.
        """
        if not self.streamed:
            yield from self.blocks
            return
        if self._device.type != "cuda" or not self.overlap:
            for layer in range(self.cfg.n_layers):
                yield build_block(self.cfg, self.init, layer, self._device, self._dtype)
            return
        yield from self._iter_blocks_overlapped()

    def _iter_blocks_overlapped(self) -> Iterator[Block]:
        main = torch.cuda.current_stream(self._device)
        side = torch.cuda.Stream(self._device)

        def build_on_side(layer: int) -> tuple[Block, torch.cuda.Event]:
            side.wait_stream(main)  # allocator reuse on the side stream stays ordered after main's work
            with torch.cuda.stream(side):
                block = build_block(self.cfg, self.init, layer, self._device, self._dtype)
                ready = torch.cuda.Event()
                ready.record(side)
            return block, ready

        pending = build_on_side(0)
        for layer in range(self.cfg.n_layers):
            block, ready = pending
            main.wait_event(ready)
            for p in block.parameters():
                # the weights were allocated on the side stream and are used on main:
                # keep the allocator from recycling them before main is done
                p.record_stream(main)
            if layer + 1 < self.cfg.n_layers:
                pending = build_on_side(layer + 1)
            yield block
            del block

    def embed_tokens(self, tokens: torch.Tensor, probe: Probe | None = None) -> torch.Tensor:
        """x0 = E[tokens] (+ learned positions), times the scheme's embedding multiplier
        (RMS-normalised for nanochat, x = norm(wte(idx))): the stream entering addition 1."""
        x = _times(self.embed_mult, self.embed(tokens))
        if self.pos is not None:
            x = x + self.pos.weight[: tokens.shape[1]]
        if self.embed_norm:
            x = F.rms_norm(x, (x.shape[-1],), eps=self.cfg.norm_eps)
        if probe is not None:
            probe(0, -1, "embed", None, None, x)
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm (not post-norm, whose stream is already normalised, nor the norm-free
        placement), then head, times the scheme's logit multiplier, then its soft-cap
        c tanh(z / c) (Gemma 2's final_logit_softcapping, nanochat's 15)."""
        if self.final_norm is not None:
            x = self.final_norm(x)
        weight = self.embed.weight if self.head is None else self.head.weight
        bias = None if self.head is None else self.head.bias
        z = _times(self.logit_mult, F.linear(x, weight, bias))
        if self.logit_softcap is not None:
            z = self.logit_softcap * torch.tanh(z / self.logit_softcap)
        return z

    def forward_stream(
        self,
        tokens: torch.Tensor,
        probe: Probe | None = None,
        after_block: Callable[[int], None] | None = None,
    ) -> torch.Tensor:
        """The residual stream after the last addition (no final norm, no head).
        ``after_block(layer)`` is called after each block (progress reporting)."""
        x = x0 = self.embed_tokens(tokens, probe)
        mid = None if self.backout is None else self.backout[1]
        x_mid = None
        for block in self.iter_blocks():
            x = block(x, self.rope, probe, x0=x0, x_mid=x_mid)
            if block.layer == mid:
                x_mid = x  # the last block subtracts beta x_mid on its final addition
            if after_block is not None:
                after_block(block.layer)
        return x

    def forward(self, tokens: torch.Tensor, probe: Probe | None = None) -> torch.Tensor:
        return self.logits(self.forward_stream(tokens, probe))
