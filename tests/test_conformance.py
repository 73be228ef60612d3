"""Conformance: every scheme against figures measured from its upstream code.

``tests/data/upstream-init-stds-L12-d768.csv`` is shared/upstream/init-stds-L12-d768.csv
(an independent audit built each upstream model, or read its init, at L = 12, d = 768,
12 heads, d_ff 2048, V 1024, untied head); ``tests/data/gemma-init-stds-L12-d768.csv``
was measured from Hugging Face's own Gemma 2 / Gemma 3 built from configs
(scripts/measure_gemma_init.py). For every row, tinit's resolution of the scheme
(:func:`tinit.model.schemes.resolve`, what ``tinit inits`` prints and tinit's init
draws) must give the same distribution, the formula's std and bound to 1e-6, and the
weights tinit draws (through :func:`tinit.model.init.fill_`, the draw of its own init)
must have the upstream std of the draw to 1%.
"""

import csv
import math
from pathlib import Path

import pytest
import torch

from tinit.model.config import InitConfig, ModelConfig
from tinit.model.init import fill_, generator, role_rule
from tinit.model.scheme_file import load_scheme

DATA = Path(__file__).parent / "data"
SHAPE = ModelConfig(n_layers=12, d_model=768, n_heads=12, d_ff=2048, vocab_size=1024, tie_embeddings=False)
#: The CSV's upstream variant -> tinit's scheme. torchscale as it runs (the CSV's
#: "deepnet") is tinit's deepnet-torchscale; the DeepNet paper is tinit's deepnet;
#: Modalities with std 0.02 is a user scheme written in TOML.
VARIANTS = {
    "deepnet": "deepnet-torchscale",
    "deepnet-paper": "deepnet",
    "scaled-embed@0.02": "scaled-embed-0.02",
}
#: Rows of the shared CSV that its upstream code contradicts, with the code's value.
ERRATA: dict[tuple[str, str, int], dict] = {}
#: Variants whose rows are not upstream's figures: the shared CSV's "mup" rows are
#: tinit's own formula (sigma sqrt(d0/d)), not microsoft/mup's examples/Transformer as it
#: runs (1/sqrt(d), N(0, 1) embedding, zero untied readout). That example is
#: ``mup-example``, tested against figures measured from mup's code in test_mup_example.py.
NOT_UPSTREAM = {"mup"}


def _rows(name: str) -> list[dict]:
    with open(DATA / name, newline="") as f:
        return list(csv.DictReader(f))


def _init(variant: str) -> InitConfig:
    name = VARIANTS.get(variant, variant)
    custom = (load_scheme(DATA / "scaled-embed-0.02.toml"),) if name == "scaled-embed-0.02" else ()
    return InitConfig(scheme=name, sigma=0.02, schemes=custom)


def _drawn_std(init: InitConfig, role: str, layer: int) -> tuple[torch.Tensor, float]:
    """tinit's draw of ``role`` at ``layer``: a tensor of the role's shape filled as
    tinit's init fills it (seeded per role and layer), and its std."""
    draw = role_rule(init, SHAPE, role, layer)
    shape = {"embed": (1024, 768), "head": (1024, 768), "gate": (2048, 768), "up": (2048, 768),
             "down": (768, 2048)}.get(role, (768, 768))  # fmt: skip
    w = torch.empty(shape, dtype=torch.float32)
    fill_(w, draw, generator(7, layer, role, "cpu"))
    return w, float(w.to(torch.float64).std(unbiased=False))


UPSTREAM = [
    r
    for r in _rows("upstream-init-stds-L12-d768.csv")
    if r["distribution"] and r["upstream_variant"] not in NOT_UPSTREAM
]


@pytest.mark.parametrize("variant", sorted({r["upstream_variant"] for r in UPSTREAM}))
def test_every_upstream_row_is_reproduced(variant):
    init = _init(variant)
    rows = [r for r in UPSTREAM if r["upstream_variant"] == variant]
    # embed, q k v o gate up down at layers 0 and 11, head (the paper's and ReZero's embed
    # and head are blank: test_rows_upstream_leaves_open_have_a_rule)
    assert len(rows) == (14 if variant in ("deepnet-paper", "rezero") else 16), variant
    for r in rows:
        role, layer = r["role"], int(r["layer"])
        fact = {**r, **ERRATA.get((variant, role, layer), {})}
        draw = role_rule(init, SHAPE, role, layer)
        what = (variant, role, layer, draw)
        assert draw.dist == fact["distribution"], what
        assert draw.std == pytest.approx(float(fact["std"]), rel=1e-6, abs=1e-12), what
        if fact["bound"]:
            assert draw.bound == pytest.approx(float(fact["bound"]), rel=1e-6), what
        else:
            assert draw.bound is None, what
        assert draw.std_drawn == pytest.approx(float(fact["std_drawn"]), rel=1e-6, abs=1e-12), what
        w, std = _drawn_std(init, role, layer)
        if fact["distribution"] == "zero":
            assert torch.all(w == 0), what
            continue
        assert std == pytest.approx(float(fact["std_drawn"]), rel=0.01), (what, std)
        if draw.bound is not None:
            assert float(w.abs().max()) <= draw.bound * (1 + 1e-6), what
        if draw.dist == "uniform":  # flat to the edge sqrt(3) std, nothing beyond
            edge = math.sqrt(3) * draw.std
            assert 0.999 * edge < float(w.abs().max()) <= edge * (1 + 1e-6), what


def test_the_errata_are_still_needed():
    """Each erratum overrides a row the shared CSV really has (so it is not stale)."""
    rows = {(r["upstream_variant"], r["role"], int(r["layer"])): r for r in UPSTREAM}
    for key, fixed in ERRATA.items():
        assert key in rows and rows[key]["distribution"] != fixed["distribution"], key


def test_rows_upstream_leaves_open_have_a_rule():
    """The CSV's blank rows (the DeepNet paper's embedding and head, ReZero's: not in
    their code) get tinit's stated choice, a rule that resolves."""
    blank = [r for r in _rows("upstream-init-stds-L12-d768.csv") if not r["distribution"]]
    assert {(r["upstream_variant"], r["role"]) for r in blank} == {
        ("deepnet-paper", "embed"),
        ("deepnet-paper", "head"),
        ("rezero", "embed"),
        ("rezero", "head"),
    }
    for r in blank:
        assert role_rule(_init(r["upstream_variant"]), SHAPE, r["role"], int(r["layer"])).std > 0


def test_depth_init_with_a_tied_head_is_the_output_layer():
    """torchtitan's tied llama3 models skip the embedding's init (_EMBEDDING_SKIP_INIT):
    the shared matrix is the output layer's TN(0, d^-1/2, +-3 d^-1/2), not N(0, 1)."""
    import dataclasses

    tied = dataclasses.replace(SHAPE, tie_embeddings=True)
    draw = role_rule(InitConfig(scheme="depth-init"), tied, "embed", -1)
    s = 768**-0.5
    assert (draw.dist, draw.std, draw.bound) == ("trunc", pytest.approx(s), pytest.approx(3 * s))
    untied = role_rule(InitConfig(scheme="depth-init"), SHAPE, "embed", -1)
    assert (untied.dist, untied.std) == ("normal", 1.0)


GEMMA = _rows("gemma-init-stds-L12-d768.csv")


@pytest.mark.parametrize("scheme", ["gemma2", "gemma3"])
def test_gemma_rows_measured_from_hugging_face_are_reproduced(scheme):
    """The weights HF's Gemma 2 / 3 draws (N(0, 0.02); the embedding's padding row is
    zero) have tinit's std within 1%, and its norm gains are w = 0 (applied as 1 + w),
    which tinit's rule for the scheme's (1 + w) norms gives exactly."""
    init = InitConfig(scheme=scheme)
    rows = [r for r in GEMMA if r["scheme"] == scheme]
    # embed; q k v o gate up down, input and post-attention norm (Gemma 3: q_norm) at 0 and 11; head
    assert len(rows) == (22 if scheme == "gemma3" else 20)
    for r in rows:
        role, layer = r["role"], int(r["layer"])
        draw = role_rule(init, SHAPE, role, layer, (768,) if role == "norm" else None)
        if r["distribution"] == "const":
            assert draw.dist == "const" and draw.std == float(r["value"]) == 0.0, r
            continue
        assert draw.dist == "normal", r
        assert draw.std == pytest.approx(float(r["std"]), rel=0.01), r
        assert _drawn_std(init, role, layer)[1] == pytest.approx(float(r["std"]), rel=0.01), r
