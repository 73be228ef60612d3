"""Blocks with explicit residual additions, and the stack, built whole or streamed.

Placements (``cfg.norm_position``), each addition x <- a x + g F with the init
scheme's stream multiplier a and branch multiplier g (1 and 1 for most schemes):

pre (GPT-2 onwards):      x <- a x + g Attn(Norm1(x));          x <- a x + g FFN(Norm2(x))
post (Vaswani 2017):      x <- Norm1(a x + g Attn(x));          x <- Norm2(a x + g FFN(x))
sandwich (Gemma 2, Peri-LN): x <- a x + g Norm1o(Attn(Norm1(x))); likewise for the FFN
reordered (OLMo 2):       x <- a x + g Norm1(Attn(x));          x <- a x + g Norm2(FFN(x))
none (ReZero, T-Fixup):   x <- a x + g Attn(x);                 x <- a x + g FFN(x)

A scheme with an x0 mix (nanochat) first sets x <- lambda_l x + mu_l x0 before block l;
one with a backout (nanochat) subtracts beta x_mid (the stream after block L // 2) on
the last addition's identity path, so the probe's ``stream_in`` there is x - beta x_mid
(at L <= 2 the middle block is the last: its output is scaled by 1 - beta). The rest of
a scheme's architecture lives in the layers: Gemma's (1 + w) norms, soft-caps and
attention scale, nanochat's q/k gain and relu^2 MLP, torchscale's sub-LN.

An L-layer stack performs 2L additions, k = 1..2L (attention k = 2l+1, FFN
k = 2l+2); k = 0 is the embedding output. Each addition, in every placement, calls
the optional probe with (k, layer, sublayer, stream_in, branch, stream_out) and,
for post-norm, the normalised stream as ``normed``; ``branch`` is F's output before
the multiplier g (after the branch's own output norm in sandwich and reordered), and
``stream_in`` the stream entering the addition (after the x0 mix). With no probe
the model is a plain model.

A block's weights depend only on (seed, layer, role), so a model can be
*streamed*: each block is built on the device just before it runs and dropped
right after, and memory does not grow with depth. Streamed and fully built
models give identical numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .config import InitConfig, ModelConfig
from .init import init_weights_
from .layers import Attention, GaussianBranch, make_ffn, make_norm, rope_cache
from .schemes import Scheme, environment, evaluate, ffn_of


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


#: Placements with a final norm before the head (post-norm's stream is already normed).
FINAL_NORM_PLACEMENTS = ("pre", "sandwich", "reordered")


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
    """One layer: an attention addition and an FFN addition, in one of five placements."""

    def __init__(self, cfg: ModelConfig, layer: int, seed: int = 0, device=None, dtype=None,
                 init: InitConfig | None = None):  # fmt: skip
        super().__init__()
        self.layer = layer
        init = init if init is not None else InitConfig()
        scheme = init.scheme
        m = block_multipliers(cfg, scheme, init, layer)
        self.placement = cfg.norm_position
        self.post_norm = self.placement == "post"
        self.a, self.mix = m["a"], m["mix"]
        back = backout_of(cfg, init)
        # the last block carries the backout onto its final addition's identity path
        self.backout = back if back is not None and layer == cfg.n_layers - 1 else None
        # ReZero trains its gain: a parameter (role "gain"), valued by init_weights_
        learned = scheme.branch_learned
        self.gain = nn.Parameter(torch.empty((), device=device, dtype=dtype)) if learned else None
        self.g = m["g"]
        off = scheme.norm_offset
        has_norms = self.placement != "none"
        self.norm1 = make_norm(cfg, device, dtype, offset=off) if has_norms else None
        self.norm2 = make_norm(cfg, device, dtype, offset=off) if has_norms else None
        sandwich = self.placement == "sandwich"
        self.norm1o = make_norm(cfg, device, dtype, offset=off) if sandwich else None
        self.norm2o = make_norm(cfg, device, dtype, offset=off) if sandwich else None
        qk_norm = scheme.qk_norm if cfg.qk_norm is None else cfg.qk_norm
        if cfg.branch == "gaussian":
            self.attn = GaussianBranch(cfg.branch_var, seed, layer, "attn")
            self.ffn = GaussianBranch(cfg.branch_var, seed, layer, "ffn")
        else:
            self.attn = Attention(cfg, device=device, dtype=dtype, scale=m["attn_scale"], qk_norm=qk_norm,
                                  qk_gain=m["qk_gain"], softcap=m["attn_softcap"], norm_offset=off,
                                  subln=scheme.subln)  # fmt: skip
            kind, d_ff = ffn_of(cfg, scheme)
            self.ffn = make_ffn(cfg, device, dtype, kind, d_ff, subln=scheme.subln, norm_offset=off)

    def _add(self, k, sublayer, x, branch_fn, norm, norm_out, rope, probe, x_mid=None):
        """One residual addition; each placement's sum written out. ``x_mid`` (the last
        addition of a scheme with a backout): the identity path carries x - beta x_mid
        (x_mid None: the middle block is this one, and its output is scaled by 1 - beta)."""
        a, g = self.a, (self.gain if self.gain is not None else self.g)
        inner = x  # what the branch reads
        scale = 1.0
        if self.backout is not None and sublayer == "ffn":
            beta = self.backout[0]
            if x_mid is not None:
                x = x - beta * x_mid
            else:
                scale = 1.0 - beta
                x = scale * x
        if self.placement == "post":
            f = _times(scale, branch_fn(inner, rope))
            s = _times(a, x) + _times(g, f)
            y = norm(s)
            if probe is not None:
                probe(k, self.layer, sublayer, x, f, s, normed=y)
            return y
        if self.placement == "pre":
            f = branch_fn(norm(inner), rope)
        elif self.placement == "sandwich":
            f = norm_out(branch_fn(norm(inner), rope))
        elif self.placement == "reordered":
            f = norm(branch_fn(inner, rope))
        else:  # none
            f = branch_fn(inner, rope)
        f = _times(scale, f)
        y = _times(a, x) + _times(g, f)
        if probe is not None:
            probe(k, self.layer, sublayer, x, f, y)
        return y

    def forward(
        self, x: torch.Tensor, rope=None, probe: Probe | None = None, x0: torch.Tensor | None = None,
        x_mid: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        k = 2 * self.layer + 1
        if self.mix is not None:
            if x0 is None:
                raise ValueError("this scheme mixes the embedding x0 into every block: pass x0")
            x = self.mix[0] * x + self.mix[1] * x0
        x = self._add(k, "attn", x, self.attn, self.norm1, self.norm1o, rope, probe)
        return self._add(k + 1, "ffn", x, self.ffn, self.norm2, self.norm2o, rope, probe, x_mid)


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
        self.embed_mult = evaluate(scheme.embed_mult, env, f"{scheme.name} embedding multiplier")
        self.logit_mult = evaluate(scheme.logit_mult, env, f"{scheme.name} logit multiplier")
        self.logit_softcap = _optional(scheme.logit_softcap, env, f"{scheme.name} logit soft-cap")
        self.embed_norm, self.backout = scheme.embed_norm, backout_of(cfg, init)
        self._device, self._dtype = torch.device(device), dtype
        d, L = cfg.d_model, cfg.n_layers
        with torch.device("meta"):
            self.embed = _embedding(cfg.vocab_size, d, dtype)
            self.pos = _embedding(cfg.max_seq_len, d, dtype) if cfg.positions == "learned" else None
            final = cfg.norm_position in FINAL_NORM_PLACEMENTS
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
