"""`mup-example` against microsoft/mup's examples/Transformer as it runs.

``tests/data/upstream-shapes/mup-example.csv`` (and ``tests/data/mup-example-C.csv``) hold
every weight's std, measured from
mup's own code (mup@1981497: examples/Transformer/model.py's TransformerModel with
main.py's defaults, then ``set_base_shapes`` against the example's base shapes, d0 =
256), at three shapes: A (4 layers, d 256, tied), B (6 layers, d 384, untied) and C (B
tied, where d != d0 shows the rescale of the shared matrix). tinit builds the same
shapes with ``mup-example`` and every weight is compared with those figures: no figure
here comes from tinit.

Tolerance: the std s of n i.i.d. normal entries has a sampling error of s / sqrt(2n)
(SE(s) = s sqrt((kurtosis - 1) / (4n)), kurtosis 3). tinit's draw and upstream's are
independent, so their difference has a relative standard deviation of
sqrt(2) / sqrt(2n) = 1 / sqrt(n); the test allows 4 of those (a false alarm about once
in 16 000 comparisons), and 4 / sqrt(2n) against the std the upstream code asks for.
Where upstream is zero (q, the untied readout, LayerNorm biases), tinit is exactly zero;
LayerNorm gains are exactly 1 in both.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
from helpers import figures_built_not_saved

from tinit.model.config import InitConfig, ModelConfig
from tinit.model.transformer import Transformer

DATA = Path(__file__).parent / "data"
#: A and B with the other schemes' upstream figures; C (B tied) on its own, since the
#: upstream-shapes folder holds the two shapes every scheme shares (test_upstream_shapes_data.py)
CSVS = (DATA / "upstream-shapes" / "mup-example.csv", DATA / "mup-example-C.csv")


def _rows() -> list[dict]:
    rows = []
    for path in CSVS:
        with open(path, newline="") as f:
            rows += list(csv.DictReader(f))
    return rows


ROWS = _rows()
SHAPES = sorted({r["shape"] for r in ROWS})


def _tinit_weights(first: dict) -> dict[tuple[str, int, str], torch.Tensor]:
    """tinit's mup-example at the CSV row's shape: (role, layer, which) -> tensor;
    ``which`` tells the two LayerNorms of a block apart (norm1 / norm2), else ''."""
    L, d, tied = int(first["n_layers"]), int(first["d_model"]), first["tied"] == "true"
    # the example's model: post-norm LayerNorm blocks, no biases (the scheme builds its
    # ReLU FFN of width d whatever --ffn / --d-ff say)
    cfg = ModelConfig(n_layers=L, d_model=d, n_heads=int(first["n_heads"]), vocab_size=int(first["vocab"]),
                      tie_embeddings=tied, norm="layernorm", norm_position="post", bias=False)  # fmt: skip
    model = Transformer(cfg, InitConfig(scheme="mup-example", base_width=256, seed=3), stream=False)
    out: dict[tuple[str, int, str], torch.Tensor] = {}
    for name, p in model.named_parameters():
        parts = name.split(".")
        if parts[0] == "embed":
            out["embed", -1, ""] = p
            if tied:
                out["head", L, ""] = p
        elif parts[0] == "head":
            out["head", L, ""] = p
        else:
            assert parts[0] == "blocks", name
            layer, owner, leaf = int(parts[1]), parts[-2], parts[-1]
            if owner.startswith("norm"):
                out["norm" if leaf == "weight" else "norm.bias", layer, owner] = p
            else:
                assert leaf == "weight", name  # no biases: the example's default
                out[owner, layer, ""] = p
    return {k: v.detach().to(torch.float64) for k, v in out.items()}


def _key(r: dict) -> tuple[str, int, str]:
    which = next((n for n in ("norm1", "norm2") if f".{n}:" in r["source"]), "")
    return r["role"], int(r["layer"]), which


@pytest.mark.parametrize("shape", SHAPES)
def test_every_weight_has_upstreams_std(shape):
    rows = [r for r in ROWS if r["shape"] == shape]
    weights = _tinit_weights(rows[0])
    assert {_key(r) for r in rows} == set(weights), "tinit builds the example's weights, no more, no fewer"
    for r in rows:
        w = weights[_key(r)]
        what = (shape, *_key(r))
        n = w.numel()
        if r["distribution"] == "zeros":
            assert torch.all(w == 0), what
            assert float(r["std"]) == 0 and float(r["absmax"]) == 0, what
        elif r["distribution"] == "ones":
            assert torch.all(w == 1) and float(r["mean"]) == 1, what
        else:
            assert r["distribution"] == "normal", what
            std = float(w.std(unbiased=False))
            assert std == pytest.approx(float(r["std"]), rel=4 / math.sqrt(n)), (what, std, r["std"])
            assert std == pytest.approx(float(r["formula_std"]), rel=4 / math.sqrt(2 * n)), (what, std)
            assert abs(float(w.mean())) < 4 * std / math.sqrt(n), what


def test_the_figures_cover_the_example():
    """The CSV has the shapes the test relies on: a tied shape at d = d0, an untied one
    and a tied one at d != d0 (where the shared matrix is rescaled by sqrt(d / d0))."""
    shapes = {(r["shape"], r["d_model"], r["tied"]) for r in ROWS}
    assert shapes == {("A", "256", "true"), ("B", "384", "false"), ("C", "384", "true")}
    embed = {r["shape"]: float(r["formula_std"]) for r in ROWS if r["role"] == "embed"}
    assert embed["C"] == pytest.approx(math.sqrt(384 / 256), rel=1e-5)


def test_coord_check_is_width_stable(tmp_path, monkeypatch):
    """mup's README coordinate check, at a size a test affords (widths 64..256, L = 2, 3
    Adam steps at lr 0.01, 2 seeds) with the example's untied head and LayerNorm: the
    untied readout is zero, so the logits are exactly 0 at step 0; the embedding is
    N(0, 1) at every width (RMS slope 0); and every slope stays within the criterion's
    0.25 at every step: width-stable (tinit's `mup` at sigma = 0.02 is not, at the
    default sizes: docs/reference/coord-check.md)."""
    import pandas as pd
    from typer.testing import CliRunner

    from tinit.cli import app

    figures_built_not_saved(monkeypatch)  # (the fit's CSV decides; test_reader_rules draws coord-check)
    out = tmp_path / "run"
    args = ["coord-check", "--init", "mup-example", "--untie", "--norm", "layernorm",
            "--d-model", "64,128,256", "--layers", "2", "--steps", "3", "--seeds", "2",
            "--out", str(out), "-q"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    rows = pd.read_csv(out / "coord_check.csv")
    logits0 = rows[(rows["step"] == 0) & (rows["quantity"] == "logits")]
    assert len(logits0) and (logits0["rms"] == 0).all()
    fit = pd.read_csv(out / "coord_check_fit.csv")
    w = fit[fit["axis"] == "width"]
    assert set(w["norm_position"]) == {"post"}  # the example's placement, presumed by the scheme
    embed0 = w[(w["step"] == 0) & (w["quantity"] == "embed")]["slope"]
    assert abs(float(embed0.iloc[0])) < 0.05
    assert (w["slope"].dropna().abs() <= 0.25).all(), w[["step", "quantity", "slope"]]
    assert w["verdict"].dropna().tolist() == ["width-stable"]


def test_the_structure_the_scheme_presumes_is_the_examples():
    """What the scheme itself sets (placement, its own FFN and width, the attention scale,
    the logit multiplier) against the structure measured from the example's code
    (``mup-example.features.csv``)."""
    from tinit.model.catalogue import get_scheme
    from tinit.model.draws import environment, evaluate, ffn_of

    s = get_scheme("mup-example")
    feats: dict[tuple[str, str], str] = {}
    for path in CSVS:
        with open(path.with_name(path.stem + ".features.csv"), newline="") as f:
            feats |= {(r["shape"], r["feature"]): r["value"] for r in csv.DictReader(f)}
    for shape in SHAPES:
        first = next(r for r in ROWS if r["shape"] == shape)
        cfg = ModelConfig(n_layers=int(first["n_layers"]), d_model=int(first["d_model"]),
                          n_heads=int(first["n_heads"]), vocab_size=int(first["vocab"]))  # fmt: skip
        env = environment(cfg, InitConfig(scheme="mup-example"), -1)
        assert s.placement == feats[shape, "placement"] == "post"
        assert ffn_of(cfg, s) == (feats[shape, "ffn"], int(feats[shape, "d_ff"]))
        assert evaluate(s.attn_scale, env, "") == pytest.approx(float(feats[shape, "attn_scale"]), rel=1e-5)
        assert evaluate(s.logit_mult, env, "") == pytest.approx(float(feats[shape, "logit_mult"]), rel=1e-5)
        assert feats[shape, "bias"] == "false" and feats[shape, "norm"] == "layernorm"  # --no bias; --norm
