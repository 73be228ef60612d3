"""Every catalogue entry against its upstream code as that code runs, at two shapes.

``tests/data/upstream-shapes/<scheme>.csv`` holds every weight's std, mean and largest
magnitude measured from the upstream's own code (built on the CPU, or its init calls run
with its arguments; ``README.md`` there says how, per scheme), at shape A (4 layers,
d 256, 4 heads, vocab 512, tied where the upstream can tie) and shape B (6 layers, d 384,
6 heads, vocab 1024, untied); ``<scheme>.features.csv`` the structure its init-time
forward depends on (tying, placement, norm, biases, embedding scale and normalisation,
QK-norm, soft-caps) and two numbers measured from the upstream's forward (the std of the
embedding output and of the logits).

tinit's model is built from the scheme's name, as a user would
(``ModelConfig.from_scheme(name, <shape>)``). Where the scheme leaves a field open (an
init rule its upstreams apply to several architectures: gpt2, megatron, mitchell, ...),
the test sets it to what that upstream ran (biases, LayerNorm, learned positions, a
two-matrix FFN), as a user reproducing that codebase would; where the scheme fixes it,
the scheme's value is checked against the upstream's (``test_structure_...``).

- A drawn tensor's std agrees with the upstream's measured one within 6 standard errors
  of the difference of two sample stds (sd(s)/sigma = sqrt((kurtosis - 1) / 4n):
  kurtosis 3 normal, 1.8 uniform; a truncated normal lies between): 1-4% at these
  sizes, where a wrong fan, a missing sqrt(2L) or a wrong embedding std is 20% or more.
- An exact zero or constant upstream is the same constant in tinit.
- The forward's embedding-output and logit stds agree within 10%: two models drawn from
  different seeds differ by 1-3% here (the data README's seed spread), while a wrong
  tying, embedding scale or normalisation is a factor of 2 to 1000.

Upstream parameters tinit's model has no counterpart for are named in ``NOT_MODELLED``
with the reason (each also on the scheme's page, its ``not modelled`` column); a new one
in the data fails the test until it is declared.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from tinit.model.catalogue import get_scheme
from tinit.model.config import InitConfig, ModelConfig, swiglu_hidden
from tinit.model.init import role_rule
from tinit.model.structure import scheme_structure
from tinit.model.transformer import Transformer

DATA = Path(__file__).parent / "data" / "upstream-shapes"
KURTOSIS = {"normal": 3.0, "trunc_normal": 3.0, "uniform": 1.8}
SE_LIMIT = 6.0
FORWARD_RTOL = 0.10

#: a data file measured from a second upstream of a catalogue entry
ENTRY = {"gpt2-hf": "gpt2"}

#: nanochat's parameters beyond tinit's model (zero-out's upstream file is nanochat's too)
NANOCHAT_EXTRAS = ("value_embed", "ve_gate", "smear_gate", "smear_lambda", "resid_lambda", "x0_lambda",
                   "backout_lambda")  # fmt: skip

#: (scheme, upstream role) tinit's model does not have -> why
NOT_MODELLED = {
    **{
        ("nanochat", r): "nanochat's value embeddings, smear gate, per-layer lambdas and backout "
        "scalar are not modelled as parameters (the x0 mix and backout are fixed multipliers)"
        for r in NANOCHAT_EXTRAS
    },
    **{
        ("zero-out", r): "zero-out's upstream file is nanochat's; its extra scalars as nanochat's"
        for r in NANOCHAT_EXTRAS
    },
    ("olmo-normalized", "scale"): "nGPT's learned scales: the nGPT forward is not modelled",
    **{
        (s, "norm.bias"): "LayerNorm biases: tinit's LayerNorm has none (0 at init upstream)"
        for s in (
            "gpt2",
            "gpt2-hf",
            "completep",
            "depth-mup",
            "deepnet",
            "deepnet-torchscale",
            "magneto",
            "megatron",
            "megatron-mup",
            "small-wang",
            "scaled-embed",
            "rezero",
            "t-fixup",
            "mup-example",
        )
    },
}

#: schemes whose weights are tinit's reading of a paper rather than the measured code
#: (the code is another entry): only the roles both share are compared
PAPER = {
    "deepnet": "the DeepNet paper's Xavier-normal init (torchscale's code is deepnet-torchscale)",
}
#: zero-out's upstream is nanochat's file; the entry is only its zero o and down, applied
#: to any model (its structure and forward are not nanochat's, by design)
ONLY_ROLES = {"zero-out": {"o", "down"}}
#: entries that are an upstream's init *formula* without a step its code runs after it:
#: their stds are compared with the upstream's ``formula_std`` (to 1e-6), not its result
FORMULA_ONLY = {
    "olmo-normalized": "OLMo-core's NormalizedTransformer.init_weights unit-normalises every "
    "matrix after InitMethod.normalized's draw (and runs the nGPT forward); tinit models neither "
    "(the entry's 'not modelled')",
}
#: a known, explained difference: (scheme, role) -> tinit's std over the upstream's, as a
#: closed form of the model; the measured ratio must be that one (so the explanation is tested)
KNOWN_RATIO = {
    # the mup library scales a hidden matrix by its fan_in's width multiplier; for W_down that
    # is d_ff / d_ff0 (1024 / 704 at d 384, FFN widths rounded to 64), while tinit's mup uses
    # d / d0 for every matrix (equal when d_ff grows exactly with d)
    ("mup", "down"): lambda cfg: math.sqrt((256 / cfg.d_model) / (swiglu_hidden(256) / cfg.d_ff)),
}
#: forward figures that depend on something the entry lists as not modelled
FORWARD_NOT_MODELLED = {
    ("mup-example", "x0_std"): "the example adds fixed sinusoidal positions (variance 1/2 a coordinate) "
    "to the embedding; tinit runs --positions",
}


def _frame(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, keep_default_na=False, dtype=str)


def _features(stem: str, shape: str) -> dict[str, str]:
    path = DATA / f"{stem}.features.csv"
    if not path.exists():
        return {}
    f = _frame(path)
    f = f[f["shape"] == shape]
    return dict(zip(f["feature"], f["value"], strict=True))


def _model(stem: str, rows: pd.DataFrame, feats: dict[str, str]) -> ModelConfig:
    """tinit's model for the upstream's shape: the scheme's structure, the shape, and
    the upstream's architecture on the fields the scheme leaves open."""
    scheme, row = ENTRY.get(stem, stem), rows.iloc[0]
    shape = {
        "n_layers": int(row["n_layers"]),
        "d_model": int(row["d_model"]),
        "n_heads": int(row["n_heads"]),
        "vocab_size": int(row["vocab"]),
        "max_seq_len": 64,
    }
    if row["tied"] in ("true", "false"):
        shape["tie_embeddings"] = row["tied"] == "true"
    fixed = scheme_structure(scheme, ModelConfig(**{k: v for k, v in shape.items() if k != "tie_embeddings"}))
    if "d_ff" not in fixed:
        shape["d_ff"] = int(row["d_ff"])
    open_fields = {}
    if feats.get("norm") in ("rmsnorm", "layernorm"):
        open_fields["norm"] = feats["norm"]
    if feats.get("bias") in ("true", "false"):
        open_fields["bias"] = feats["bias"] == "true"
    if feats.get("ffn") in ("swiglu", "geglu", "gelu", "relu2"):
        open_fields["ffn"] = feats["ffn"]
    elif feats.get("ffn") == "relu":  # a two-matrix FFN: the same weights as GELU's
        open_fields["ffn"] = "gelu"
    if (rows["role"] == "pos").any():
        open_fields["positions"] = "learned"
    shape.update({k: v for k, v in open_fields.items() if k not in fixed})
    return ModelConfig.from_scheme(scheme, **shape)


def _tinit_params(model: Transformer) -> dict[tuple[str, int], list[torch.Tensor]]:
    """(role, layer) -> tensors in the data's naming: biases ``<owner>.bias``, norm gains
    ``norm``, ReZero's gain ``resweight``; layer -1 the embedding side, L the head side."""
    L = model.cfg.n_layers
    out: dict[tuple[str, int], list[torch.Tensor]] = {}
    for name, p in model.named_parameters():
        parts = name.split(".")
        layer = int(parts[1]) if parts[0] == "blocks" else (-1 if parts[0] in ("embed", "pos") else L)
        owner, leaf = (parts[-2] if len(parts) > 1 else ""), parts[-1]
        if "norm" in owner:
            role = "norm.bias" if leaf == "bias" else "norm"
        elif leaf == "gain":
            role = "resweight"
        elif leaf == "bias":
            role = f"{owner}.bias"
        else:
            role = owner
        out.setdefault((role, layer), []).append(p.detach())
    return out


def _cases():
    for path in sorted(DATA.glob("*.csv")):
        if path.name.endswith(".features.csv"):
            continue
        for shape in sorted(set(_frame(path)["shape"])):
            yield pytest.param(path.stem, shape, id=f"{path.stem}-{shape}")


CASES = list(_cases())


def test_every_catalogue_entry_has_upstream_figures():
    from tinit.model.catalogue import CATALOGUE_LIST

    measured = {ENTRY.get(stem, stem) for stem, _shape in (c.values for c in CASES)}
    # the -lm entries are deepnet-torchscale / magneto with the LM example's embedding
    # scale: the same weights (checked below through their base entries)
    missing = {s.name for s in CATALOGUE_LIST} - measured - {"deepnet-torchscale-lm", "magneto-lm"}
    assert not missing, f"no upstream figures for {sorted(missing)}"


@pytest.fixture(scope="module", params=[c.values for c in CASES], ids=[c.id for c in CASES])
def built(request):
    """(stem, shape, cfg, model): tinit's model at the upstream's shape, built once for
    both tests of a case (module scope: one case's model alive at a time)."""
    stem, shape = request.param
    rows = _frame(DATA / f"{stem}.csv")
    rows = rows[rows["shape"] == shape]
    cfg = _model(stem, rows, _features(stem, shape))
    return stem, shape, cfg, Transformer(cfg, InitConfig(ENTRY.get(stem, stem), seed=0))


def test_every_weight_matches_its_upstream(built):
    stem, shape, cfg, model = built
    rows = _frame(DATA / f"{stem}.csv")
    rows = rows[rows["shape"] == shape]
    scheme = ENTRY.get(stem, stem)
    params = _tinit_params(model)
    problems = []
    for _, r in rows.iterrows():
        role, layer = r["role"], int(r["layer"])
        if stem in ONLY_ROLES and role not in ONLY_ROLES[stem]:
            continue
        if stem in PAPER and role not in ("embed", "pos", "head", "norm"):
            continue
        if role == "head" and cfg.tie_embeddings:
            role, layer = "embed", -1
        found = params.get((role, layer))
        if found is None:
            if (stem, r["role"]) not in NOT_MODELLED:
                problems.append(f"{r['role']}[{layer}]: upstream has it, tinit does not")
            continue
        w = torch.cat([t.flatten() for t in found]).double()
        if r["distribution"] in ("zeros", "ones", "constant"):
            value = float(r["mean"])
            if not torch.allclose(w, torch.full_like(w, value), atol=1e-7):
                problems.append(f"{role}[{layer}]: upstream constant {value}, tinit {float(w.mean()):.4g} "
                                f"+- {float(w.std()):.3g}")  # fmt: skip
            continue
        if stem in FORMULA_ONLY:
            asked = role_rule(InitConfig(scheme, seed=0), cfg, role, layer, tuple(found[0].shape)).std
            if r["formula_std"] and not math.isclose(asked, float(r["formula_std"]), rel_tol=1e-6):
                problems.append(f"{role}[{layer}]: upstream asks std {r['formula_std']}, tinit {asked:.6g}")
            continue
        want, got = float(r["std"]), float(w.std())
        want *= KNOWN_RATIO.get((stem, role), lambda _cfg: 1.0)(cfg)
        se = math.sqrt(2 * (KURTOSIS.get(r["distribution"], 3.0) - 1) / (4 * w.numel())) * want
        if abs(got - want) > SE_LIMIT * se:
            change = f"{got / want - 1:+.1%}"
            problems.append(f"{role}[{layer}]: upstream std {want:.5g}, tinit {got:.5g} ({change})")
    assert not problems, f"{stem} shape {shape}, tinit {cfg}:\n" + "\n".join(problems[:20])


def test_structure_and_forward_match_the_upstream(built):
    """The features a scheme fixes (tying refused, placement, norm, biases, QK-norm and its
    span, embedding scale and normalisation, soft-caps) are the upstream's, from the name
    alone; the forward's x0 and logit stds agree within FORWARD_RTOL."""
    stem, shape, cfg, model = built
    feats = _features(stem, shape)
    if not feats:
        pytest.skip(f"{stem}: no features measured")
    if stem in ONLY_ROLES or stem in FORMULA_ONLY:
        pytest.skip(f"{stem}: {(ONLY_ROLES | FORMULA_ONLY)[stem]}")
    scheme = ENTRY.get(stem, stem)
    rows = _frame(DATA / f"{stem}.csv")
    rows = rows[rows["shape"] == shape]
    bare = ModelConfig.from_scheme(scheme, n_layers=int(rows.iloc[0]["n_layers"]),
                                   d_model=int(rows.iloc[0]["d_model"]), n_heads=int(rows.iloc[0]["n_heads"]),
                                   vocab_size=int(rows.iloc[0]["vocab"]), max_seq_len=64)  # fmt: skip
    fixed = scheme_structure(scheme, bare)
    problems = []
    has_head = (rows["role"] == "head").any() or (rows["role"] == "embed").any()
    if feats.get("tied") == "refused" and has_head and bare.tie_embeddings:
        problems.append("the upstream never ties; from_scheme ties")
    if feats.get("placement") not in (None, "ngpt") and feats["placement"] != bare.norm_position:
        problems.append(f"placement: upstream {feats['placement']}, tinit {bare.norm_position}")
    for f in ("norm", "bias"):
        if f in fixed and feats.get(f) not in (None, ""):
            up = feats[f] == "true" if f == "bias" else feats[f]
            if up != fixed[f]:
                problems.append(f"{f}: upstream {feats[f]}, tinit {fixed[f]}")
    entry = get_scheme(scheme)
    ours_qk = entry.qk_norm_span if entry.qk_norm else "none"
    if feats.get("qk_norm") in ("none", "head", "full") and feats["qk_norm"] != ours_qk:
        problems.append(f"QK-norm: upstream {feats['qk_norm']}, tinit {ours_qk}")
    for name, ours in (
        ("embed_mult", model.embed_mult),
        ("logit_softcap", model.logit_softcap),
        ("logit_mult", model.logit_mult),
    ):
        if name not in feats:  # not measured (an empty value is measured: none)
            continue
        up = feats[name]
        up_v = None if up == "" else float(up)
        if (up_v is None) != (ours is None) or (
            up_v is not None and not math.isclose(float(ours), up_v, rel_tol=1e-6)
        ):
            problems.append(f"{name}: upstream {up or 'none'}, tinit {ours}")
    if feats.get("embed_norm") in ("true", "false") and (feats["embed_norm"] == "true") != model.embed_norm:
        problems.append(f"embed_norm: upstream {feats['embed_norm']}, tinit {model.embed_norm}")
    vocab = int(rows.iloc[0]["vocab"])
    tokens = torch.randint(0, vocab, (4, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        x0 = model.embed_tokens(tokens)
        logits = model(tokens)
    for name, ours in (("x0_std", float(x0.std())), ("logits_std", float(logits.std()))):
        if feats.get(name, "") == "" or (stem, name) in FORWARD_NOT_MODELLED:
            continue
        up = float(feats[name])
        if up == 0.0:
            if ours != 0.0:
                problems.append(f"{name}: upstream exactly 0, tinit {ours:.4g}")
        elif abs(ours / up - 1) > FORWARD_RTOL:
            problems.append(f"{name}: upstream {up:.4g}, tinit {ours:.4g} ({ours / up - 1:+.1%})")
    assert not problems, f"{stem} shape {shape}:\n" + "\n".join(problems)
