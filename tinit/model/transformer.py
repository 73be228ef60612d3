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
models give identical numbers. The block is :mod:`tinit.model.block`; how modules
are built on the meta device, materialised and rebuilt is :mod:`tinit.model.build`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from .block import Block, Probe, backout_of, block_multipliers, times
from .build import build_block, materialize, meta_embedding, stream_blocks, to_empty
from .config import InitConfig, ModelConfig
from .draws import environment, evaluate, evaluate_optional
from .layers import make_norm, rope_cache
from .structure import structure_warning

#: The block's names and the start-up's stay importable from here (their modules are
#: :mod:`tinit.model.block` and :mod:`tinit.model.build`).
__all__ = ["Block", "Probe", "Transformer", "backout_of", "block_multipliers", "build_block", "to_empty"]


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
        drawn: bool = True,
    ):
        """``drawn=False``: the embedding, final norm and head are allocated but not drawn
        (a caller that fills them from stored weights: audit --checkpoint)."""
        super().__init__()
        self.cfg, self.init, self.streamed, self.overlap = cfg, init, stream, overlap
        scheme, env = init.definition, environment(cfg, init, -1)
        message = structure_warning(scheme, cfg)
        if message is not None:
            warnings.warn(message, stacklevel=2)
        self.embed_mult = evaluate(scheme.embed_mult, env, f"{scheme.name} embedding multiplier")
        self.logit_mult = evaluate(scheme.logit_mult, env, f"{scheme.name} logit multiplier")
        self.logit_softcap = evaluate_optional(scheme.logit_softcap, env, f"{scheme.name} logit soft-cap")
        self.embed_norm, self.backout = scheme.embed_norm, backout_of(cfg, init)
        self._device, self._dtype = torch.device(device), dtype
        d, L = cfg.d_model, cfg.n_layers
        with torch.device("meta"):
            self.embed = meta_embedding(cfg.vocab_size, d, dtype)
            self.pos = meta_embedding(cfg.max_seq_len, d, dtype) if cfg.positions == "learned" else None
            final = cfg.placement.final_norm
            self.final_norm = make_norm(cfg, dtype=dtype, offset=scheme.norm_offset) if final else None
            self.head = (
                None if cfg.tie_embeddings else nn.Linear(d, cfg.vocab_size, bias=cfg.bias, dtype=dtype)
            )
        # the embedding side is "layer -1", the final norm and head "layer L"
        for name, layer in (("embed", -1), ("pos", -1), ("final_norm", L), ("head", L)):
            if getattr(self, name) is not None and drawn:
                materialize(getattr(self, name), cfg, init, layer, self._device, prefix=name)
            elif getattr(self, name) is not None:
                setattr(self, name, to_empty(getattr(self, name), self._device))
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
        """The blocks in order: held ones, or (streamed) each built just in time
        (:func:`tinit.model.build.stream_blocks`: on CUDA the next block is generated on
        a side stream while this one computes)."""
        if not self.streamed:
            yield from self.blocks
            return
        yield from stream_blocks(self.cfg, self.init, self._device, self._dtype, self.overlap)

    def embed_tokens(self, tokens: torch.Tensor, probe: Probe | None = None) -> torch.Tensor:
        """x0 = E[tokens] (+ learned positions), times the scheme's embedding multiplier
        (RMS-normalised for nanochat, x = norm(wte(idx))): the stream entering addition 1."""
        x = times(self.embed_mult, self.embed(tokens))
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
        z = times(self.logit_mult, F.linear(x, weight, bias))
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
