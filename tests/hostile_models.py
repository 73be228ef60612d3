"""Hostile `tinit audit --module` factories (issue 22 cases 6 and 10): a forward that
returns None, a dict or logits of the wrong shape, one that fails only beyond 4 tokens,
one that calls sys.exit, a factory that exits, a model left on the meta device, and a
model with a parameter whose role cannot be told. Each audit must be one line naming
--module (exit 2), or, for the last, a PASS that counts only what it checked."""

import sys

import torch
from audit_models import TinyLM, good_model
from torch import nn


class Wrapped(nn.Module):
    """good_model() whose forward misbehaves as ``kind`` says."""

    def __init__(self, kind: str):
        super().__init__()
        self.inner, self.kind = good_model(), kind

    def forward(self, tokens):
        if self.kind == "exit":
            sys.exit(0)
        if self.kind == "long" and tokens.shape[1] > 4:
            raise RuntimeError("my cache holds 4 positions")
        out = self.inner(tokens)
        bad = {"none": None, "dict": {"logits": out}, "narrow": out[..., :5], "flat": out.reshape(-1)}
        return bad.get(self.kind, out)


def returns_none():
    return Wrapped("none")


def returns_dict():
    return Wrapped("dict")


def returns_narrow_logits():
    return Wrapped("narrow")


def returns_flat_logits():
    return Wrapped("flat")


def fails_beyond_four_tokens():
    return Wrapped("long")


def exits_in_forward():
    return Wrapped("exit")


def exits_0():
    sys.exit(0)


def exits_3():
    sys.exit(3)


def on_meta_device():
    with torch.device("meta"):
        return TinyLM()


def with_unknown_parameter():
    """good_model() with a matrix outside the blocks that is neither an embedding nor the
    head: its role is unknown, so it is unchecked."""
    model = good_model()
    model.side = nn.Linear(16, 5, bias=False)
    with torch.no_grad():
        model.side.weight.copy_(torch.randn(5, 16, generator=torch.Generator().manual_seed(3)) * 0.02)
    return model
