"""``tinit audit``: the init of a model tinit did not build, measured.

Three measurements of one model, as built:

1. **Weights** (one row per parameter): its role (told by structure,
   :mod:`tinit.experiments.audit.roles`), measured mean and std, the std (or constant) an init
   scheme expects, the z-score of the measured std against it, and a verdict.
   The z-score uses the sampling standard error of a Gaussian sample's std,
   SE = std * sqrt(1 / (2n)) (n elements); the mean's z uses std / sqrt(n).
   A Gaussian role is ``ok`` when |z_std| <= z_max (or |std/expected - 1| <= rtol,
   so a huge matrix is not failed for a 0.1% difference) and likewise its mean.
   Otherwise, in order: ``non-finite`` (any NaN/inf), ``zero`` (all elements 0),
   ``constant`` (all equal, not 0), ``pytorch-default`` (an ``nn.Linear`` nobody
   re-initialised: uniform with bound 1/sqrt(fan_in), so std 1/sqrt(3 fan_in) and
   no |w| above the bound; an ``nn.Embedding`` left at N(0, 1)), ``off-scheme``.
   Norm gains and biases are constants: ``ok`` when every element equals the value.
   A parameter whose role cannot be told gets ``unchecked`` unless one of the
   scheme-free verdicts (non-finite, zero, constant, pytorch-default) applies.
2. **Stream**: the residual-stream variance at every one of the 2L additions through
   the same :class:`~tinit.experiments.measure.probes.VarianceProbe` and theory columns as
   ``tinit variance``. Hooks give the block input (the stream entering the block) and
   the branch outputs; stream_out = stream_in + branch, checked against the block's
   own output (a disagreement means the sites do not describe the residual: parallel
   residual sums in another order, a scaled residual, a wrong ``--sites``).
3. **Gradients** of the mean next-token cross-entropy: every parameter's gradient
   norm and the stream gradient at every addition, as ``tinit grad-norms``.

The weights are judged here; the stream and gradients are measured through hooks in
:mod:`tinit.experiments.audit.stream`.

With ``scheme`` the same model, re-initialised by tinit's scheme (per role, drawn per
(seed, layer, parameter)), is measured on the same tokens beside it.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn

from ...criteria import DEVIATING
from ...model.catalogue import get_scheme
from ...model.draws import Draw, resolve
from ...model.init import fill_, generator
from ...model.roles import AUDIT_MATRIX_ROLES, ROLE, rule_role, widths_of
from ...model.schemes import Scheme
from ..driver import Meter, Run
from ..measure.grad_norms import stream_frame
from ..measure.grad_norms import summarize as grad_summarize
from ..measure.variance import NOT_APPLICABLE as VARIANCE_NOT_APPLICABLE
from ..measure.variance import SUMMARY_COLUMNS, VARIANCE_COLUMNS, add_theory, summarize
from ..result import ExperimentResult, Progress
from .roles import ParamRole
from .sites import Sites
from .stream import ModelError as ModelError  # (re-exported: the CLI catches it)
from .stream import check_tolerance, measure_grads, measure_stream

WEIGHT_COLUMNS = [
    "param", "role", "layer", "shape", "numel", "mean", "std", "max_abs", "expected", "expected_kind",
    "z_std", "z_mean", "rel_err", "verdict",
]  # fmt: skip
GROUP_COLUMNS = [
    "pattern", "role", "verdict", "count", "layers", "std_min", "std_max", "expected_min", "expected_max",
    "max_abs_z",
]  # fmt: skip
GRAD_COLUMNS = [
    "init", "norm_position", "n_layers", "seed", "layer", "tensor", "param", "role", "grad_norm",
    "param_norm",
]  # fmt: skip
STREAM_COLUMNS = [
    "init", "norm_position", "n_layers", "seed", "k", "layer", "sublayer", "stream_grad_rms",
    "stream_grad_rel", "pred_identity_gain", "pred_stream_grad_rms", "stream_var",
    "branch_back_gain", "grad_cross_corr", "pred_full_gain", "pred_full_stream_grad_rms",
]  # fmt: skip
GRAD_SUMMARY_COLUMNS = [
    "init", "norm_position", "n_layers", "seed", "loss", "down_ratio_first_last", "down_max_min",
    "down_max_layer", "o_ratio_first_last", "o_max_min", "o_max_layer", "stream_grad_ratio",
    "pred_stream_grad_ratio", "stream_grad_ratio_err", "pred_full_stream_grad_ratio",
    "full_stream_grad_ratio_err", "better_path",
]  # fmt: skip
#: The full-path columns, measured where the stream is a plain sum of its branches.
FULL_PATH = {
    "stream_grads": ("branch_back_gain", "grad_cross_corr", "pred_full_gain", "pred_full_stream_grad_rms"),
    "grad_summary": ("pred_full_stream_grad_ratio", "full_stream_grad_ratio_err"),
}

AS_BUILT = "as-built"


def _not_std(df: pd.DataFrame):
    return df["expected_kind"] != "std"


def _no_expectation(df: pd.DataFrame):
    return df["expected_kind"].isna() | (df["expected_kind"] == "-")


#: Cells with no value by design (written empty; any other NaN is written ``nan``): a
#: constant (norm gain, bias) has a value to match, not a std, so no z-scores; a
#: parameter whose role cannot be told has no expectation (written "-" as its kind);
#: and the variance frames'.
AUDIT_NOT_APPLICABLE = {
    "weights": {
        "z_std": _not_std, "z_mean": _not_std, "expected": _no_expectation, "rel_err": _no_expectation,
    },  # fmt: skip
    "weight_groups": {
        # a group judged by equality (a constant, or a matrix whose scheme draws it as exactly 0)
        # has no z
        "max_abs_z": lambda df: ~df["role"].isin(AUDIT_MATRIX_ROLES) | (df["expected_max"] == 0),
        # a group of unknown role has no expectation
        **dict.fromkeys(("expected_min", "expected_max"), lambda df: df["role"] == "unknown"),
    },
    **VARIANCE_NOT_APPLICABLE,
    # the embedding has no branch; a branch that passes nothing back has no correlation
    "stream_grads": {"branch_back_gain": lambda df: df["k"] == 0,
                     "grad_cross_corr": lambda df: (df["k"] == 0) | (df["branch_back_gain"] == 0)},
}  # fmt: skip


def audit_not_applicable(sites: Sites) -> dict:
    """:data:`AUDIT_NOT_APPLICABLE`, and where the stream is not a plain sum of its
    branches (post-norm: the gradient at the sum before each norm is not tapped;
    parallel residual: the MLP's stream_in is a sum the model never forms) no full path."""
    if sites.plain_sum:
        return AUDIT_NOT_APPLICABLE
    out = {k: dict(v) for k, v in AUDIT_NOT_APPLICABLE.items()}
    for stem, cols in FULL_PATH.items():
        out.setdefault(stem, {}).update(dict.fromkeys(cols, True))
    return out


@dataclass(frozen=True)
class Expectation:
    """What the weights are checked against: an init scheme (a catalogue name, or a
    Scheme value such as a tinit model's own) at a base std, and the tolerances of the
    verdict. Every role's expectation comes from :func:`tinit.model.schemes.resolve`,
    the resolution tinit's own init uses."""

    scheme: str | Scheme  # a name ("naive", "gpt2" alias "scaled", "mitchell", ...) or a Scheme
    sigma: float
    embed_std: float
    source: str  # where it came from: "--expect scaled", "declared by the model: ..."
    z_max: float = 5.0
    rtol: float = 0.01
    base_width: int = 256  # d0 of muP-style schemes
    base_depth: int = 1  # L0 of CompleteP / depth-muP
    label: str = ""  # the name it was asked for ("scaled"); default: the scheme's name

    def __post_init__(self) -> None:
        if isinstance(self.scheme, str):
            object.__setattr__(self, "label", self.label or self.scheme)
            object.__setattr__(self, "scheme", get_scheme(self.scheme))

    @property
    def name(self) -> str:
        return self.label or self.scheme.name

    def draw(
        self, role: str, n_layers: int, layer: int = 0, shape: tuple[int, ...] = (), tied: bool = False
    ) -> Draw | None:
        """What the scheme draws ``role`` from, for a parameter of ``shape`` at ``layer``
        (None for roles without a rule). The width variables of a rule (d, d_ff, V) are
        read off the parameter's shape by its role; d_h, which no shape gives, is NaN, so
        a rule that needs it yields NaN (unchecked)."""
        if role not in ROLE:
            return None
        rrole = rule_role(role)
        env = _environment(rrole, shape, layer, n_layers, self.sigma, self.embed_std)
        env.update(d0=float(self.base_width), L0=float(self.base_depth), tied=float(tied))
        with np.errstate(all="ignore"):
            return resolve(self.scheme, rrole, env)

    def expected(
        self, role: str, n_layers: int, norm_offset: float, layer: int = 0, shape: tuple[int, ...] = (),
        tied: bool = False,
    ) -> tuple[str | None, float]:  # fmt: skip
        """(kind, value): ("std", s) for a role drawn with a spread (s the std the draws
        have: a truncated normal's is below its nominal std), ("value", c) for constants,
        norm gains, biases and roles drawn as exactly zero (judged by equality, never by a
        ratio to 0). A norm's gain is compared as its weight: the scheme's gain
        (offset + w) re-expressed in the model's norms (``norm_offset``)."""
        draw = self.draw(role, n_layers, layer, shape, tied)
        if draw is None:
            return None, math.nan
        if role == "norm":
            return "value", draw.std + self.scheme.norm_offset - norm_offset
        if role in AUDIT_MATRIX_ROLES and draw.random:
            return "std", draw.std_drawn
        return "value", 0.0 if draw.dist == "zero" else draw.std


def declared_expectation(config, sites, sigma: float | None = None) -> Expectation:
    """``--expect declared`` for a model that is not tinit's: an HF config's
    ``initializer_range`` plus its family's own rule (``sites.declared_scheme``: GPT-2's
    c_proj / sqrt(2 n_layer); naive otherwise), or naive at 0.02 when the config declares
    nothing. The one rule of ``audit --hf``/``--module`` and ``audit --checkpoint``."""
    rng = getattr(config, "initializer_range", None)
    if isinstance(rng, int | float) and not isinstance(rng, bool):
        scheme = sites.declared_scheme or "naive"
        rule = f" with {sites.declared_rule}" if sites.declared_rule else ""
        s = float(rng) if sigma is None else sigma
        what = f"initializer_range {rng:g}" if sigma is None else f"--sigma {s:g}"
        return Expectation(scheme, s, s, f"the model's declared init ({what}{rule})")
    s = 0.02 if sigma is None else sigma
    return Expectation("naive", s, s, f"naive at sigma {s:g} (the model declares no init)")


def _tied(roles: list[ParamRole]) -> bool:
    """The head is the embedding (audited once, as embed): no parameter has role head."""
    return not any(r.role == "head" for r in roles)


def _environment(
    role: str, shape: tuple[int, ...], layer: int, n_layers: int, sigma: float, embed_std: float
) -> dict[str, float]:
    """The variables of a scheme's rule for one audited parameter (see
    :func:`tinit.model.schemes.environment` for tinit's own models)."""
    shape = tuple(shape)
    if len(shape) >= 2:
        fan_out, fan_in = float(shape[0]), float(shape[1])
    else:
        fan_out = fan_in = float(shape[0]) if shape else 1.0
    return {
        "l": float(max(layer, 0)), "L": float(n_layers), **widths_of(role, shape), "d_h": math.nan,
        "fan_in": fan_in, "fan_out": fan_out,
        "sigma": sigma, "sigma_emb": embed_std, "d0": 256.0, "L0": 1.0,
    }  # fmt: skip


def _close(measured: float, expected: float, se: float, z_max: float, rtol: float) -> tuple[bool, float]:
    z = (measured - expected) / se if se > 0 else (0.0 if measured == expected else math.inf)
    return abs(z) <= z_max or abs(measured - expected) <= rtol * abs(expected), z


def audit_weights(
    model: nn.Module, roles: list[ParamRole], expect: Expectation, sites: Sites
) -> pd.DataFrame:
    """One row per parameter (see the module docstring for the verdicts)."""
    params = dict(model.named_parameters())
    tied = _tied(roles)
    rows = []
    for r in roles:
        p = params[r.name].detach()
        w = p.to(torch.float64)
        n = w.numel()
        finite = bool(torch.isfinite(w).all())
        mean = float(w.mean()) if finite else math.nan
        std = float(w.std(unbiased=False)) if finite else math.nan
        max_abs = float(w.abs().max()) if finite else math.nan
        draw = expect.draw(r.role, sites.n_layers, r.layer, tuple(p.shape), tied)
        kind, exp = expect.expected(r.role, sites.n_layers, sites.norm_offset, r.layer, tuple(p.shape), tied)
        z_std = z_mean = rel = math.nan
        verdict = None
        if not finite:
            verdict = "non-finite"
        elif kind == "value":
            rel = max_abs - exp if exp == 0 else float((w - exp).abs().max()) / abs(exp)
            if bool((w == exp).all()):
                verdict = "ok"
        elif kind == "std":
            rel = std / exp - 1.0
            # the sampling error of a std: s sqrt((kurtosis - 1) / 4n), 1/2n for a normal,
            # 1/5n for a uniform (its std is pinned more tightly)
            se = exp * math.sqrt((draw.kurtosis - 1.0) / (4 * n))
            ok_std, z_std = _close(std, exp, se, expect.z_max, expect.rtol)
            ok_mean, z_mean = _close(mean, 0.0, exp / math.sqrt(n), expect.z_max, expect.rtol)
            ok_mean = ok_mean or abs(mean) <= expect.rtol * exp
            if ok_std and ok_mean:
                verdict = "ok"
        if verdict is None:
            if max_abs == 0:
                verdict = "zero"
            elif std == 0:
                verdict = "constant"
            elif _pytorch_default(r, std, max_abs, n, expect):
                verdict = "pytorch-default"
            else:
                verdict = "off-scheme" if kind is not None else "unchecked"
        rows.append({
            "param": r.name, "role": r.role, "layer": r.layer,
            "shape": "x".join(map(str, p.shape)) or "scalar",
            "numel": n, "mean": mean, "std": std, "max_abs": max_abs, "expected": exp,
            "expected_kind": kind or "-", "z_std": z_std, "z_mean": z_mean, "rel_err": rel,
            "verdict": verdict,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=WEIGHT_COLUMNS)


def _pytorch_default(r: ParamRole, std: float, max_abs: float, n: int, expect: Expectation) -> bool:
    """nn.Linear's reset_parameters: weight and bias uniform(-1/sqrt(fan_in), 1/sqrt(fan_in));
    nn.Embedding's: N(0, 1)."""
    se = math.sqrt(1.0 / (2 * n))
    if r.kind == "linear" and r.fan_in:
        bound = 1.0 / math.sqrt(r.fan_in)
        target = bound / math.sqrt(3.0)
        return (
            max_abs <= bound * (1 + 1e-6) and _close(std, target, target * se, expect.z_max, expect.rtol)[0]
        )
    if r.kind == "embedding":
        return _close(std, 1.0, se, expect.z_max, expect.rtol)[0]
    return False


def block_pattern(name: str, sites: Sites) -> str:
    """``model.layers.3.mlp.down_proj.weight`` -> ``model.layers.*.mlp.down_proj.weight``."""
    for b in sites.blocks:
        if name.startswith(b.block + "."):
            return re.sub(r"\.\d+$", ".*", b.block) + name[len(b.block) :]
    return name


def _layer_span(layers) -> str:
    ls = sorted({int(x) for x in layers})
    if len(ls) > 1 and ls == list(range(ls[0], ls[-1] + 1)):
        return f"{ls[0]}-{ls[-1]}"
    return ",".join(map(str, ls))


def group_weights(weights: pd.DataFrame, sites: Sites) -> pd.DataFrame:
    """Parameters of the same pattern, role and verdict together, in model order."""
    df = weights.assign(pattern=[block_pattern(n, sites) for n in weights["param"]])
    rows = []
    for (pattern, role, verdict), g in df.groupby(["pattern", "role", "verdict"], sort=False):
        z = pd.concat([g["z_std"].abs(), g["z_mean"].abs()]).dropna()
        rows.append({
            "pattern": pattern if len(g) > 1 else g["param"].iloc[0], "role": role, "verdict": verdict,
            "count": len(g),
            "layers": _layer_span(g["layer"]), "std_min": g["std"].min(), "std_max": g["std"].max(),
            "expected_min": g["expected"].min(), "expected_max": g["expected"].max(),
            "max_abs_z": float(z.max()) if len(z) else math.nan,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=GROUP_COLUMNS)


@torch.no_grad()
def reinit_(
    model: nn.Module, roles: list[ParamRole], expect: Expectation, sites: Sites, seed: int
) -> list[str]:
    """Re-initialise ``model`` in place by the scheme ``expect.scheme``: each drawn role
    from the scheme's own distribution (normal, truncated, uniform, zero; the draw
    tinit's init makes, :func:`tinit.model.init.fill_`) per (seed, layer, parameter
    name), norms, biases and gains their constants. Returns the parameters it left as
    built (role unknown)."""
    params = dict(model.named_parameters())
    tied = _tied(roles)
    kept = []
    for r in roles:
        p = params[r.name]
        shape = tuple(p.shape)
        draw = expect.draw(r.role, sites.n_layers, r.layer, shape, tied)
        kind, value = expect.expected(r.role, sites.n_layers, sites.norm_offset, r.layer, shape, tied)
        if kind == "std":
            fill_(p, draw, generator(seed, r.layer, r.name, p.device))
        elif kind == "value":
            p.fill_(value)
        else:
            kept.append(r.name)
    return kept


def run_audit(
    model: nn.Module,
    sites: Sites,
    roles: list[ParamRole],
    tokens: torch.Tensor,
    expect: Expectation,
    scheme: Expectation | None = None,
    seed: int = 0,
    grads: bool = True,
    progress: Progress | None = None,
    meta: dict | None = None,
) -> ExperimentResult:
    """Weights, stream and gradients of ``model`` as built (and re-initialised by
    ``scheme``, when given). Frames: weights, weight_groups, variance, summary,
    grad_norms, stream_grads, grad_summary."""
    meta = dict(meta or {})
    L = sites.n_layers
    device = tokens.device
    configs = [(AS_BUILT, model)]
    weights = audit_weights(model, roles, expect, sites)
    groups = group_weights(weights, sites)
    var_frames, summaries, grad_frames, stream_frames, grad_summaries = [], [], [], [], []

    def frames() -> dict[str, pd.DataFrame]:
        def cat(fs, cols):
            return pd.concat(fs, ignore_index=True)[cols] if fs else pd.DataFrame(columns=cols)

        out = {"weights": weights, "weight_groups": groups}
        out["variance"] = cat(var_frames, VARIANCE_COLUMNS)
        out["summary"] = pd.DataFrame(summaries, columns=SUMMARY_COLUMNS)
        if grads:
            out["grad_norms"] = cat(grad_frames, GRAD_COLUMNS)
            out["stream_grads"] = cat(stream_frames, STREAM_COLUMNS)
            out["grad_summary"] = pd.DataFrame(grad_summaries, columns=GRAD_SUMMARY_COLUMNS)
        return out

    driver = Run(meta, frames, audit_not_applicable(sites), meter=Meter(device), progress=progress,
                 total=1 + (2 if scheme else 1) * (2 if grads else 1))  # fmt: skip
    driver.tick()
    meta.update(
        sites=sites.describe(), family=sites.family, n_layers=L, expect=expect.name,
        expect_source=expect.source,
        sigma=expect.sigma, z_max=expect.z_max, rtol=expect.rtol, seed=seed,
        n_params=len(weights), n_deviating=int(weights["verdict"].isin(DEVIATING).sum()),
        n_unchecked=int((weights["verdict"] == "unchecked").sum()),
        n_unknown=int((weights["role"] == "unknown").sum()),
        batch=int(tokens.shape[0]), seq_len=int(tokens.shape[1]), device=str(device),
        dtype=str(next(model.parameters()).dtype).replace("torch.", ""), stream_check={},
    )  # fmt: skip
    if scheme is not None:
        twin = copy.deepcopy(model)
        meta["scheme"] = scheme.name
        meta["scheme_kept_as_built"] = reinit_(twin, roles, scheme, sites, seed)
        # self-check: the re-initialised twin must pass its own scheme
        check = audit_weights(twin, roles, scheme, sites)["verdict"]
        meta["scheme_weights_deviating"] = int(check.isin(DEVIATING).sum())
        configs.append((scheme.name, twin))
    tol = check_tolerance(model)

    def measure(config: tuple[str, nn.Module]):
        net = config[1]
        raw, rel = measure_stream(net, sites, tokens)
        driver.tick()
        measured = None
        if grads:
            measured = measure_grads(net, sites, tokens, roles)
            driver.tick()
        return raw, rel, measured

    def collect(config: tuple[str, nn.Module], measured) -> None:
        (label, net), (raw, rel, grad) = config, measured
        labels = {"init": label, "norm_position": sites.norm_position, "n_layers": L, "seed": seed}
        worst = int(np.nanargmax(rel)) if not np.all(np.isnan(rel)) else -1
        meta["stream_check"][label] = {
            "max_rel_err": float(np.nanmax(rel)) if worst >= 0 else None, "worst_layer": worst,
            "tolerance": tol, "agrees": bool(worst >= 0 and np.nanmax(rel) <= tol),
        }  # fmt: skip
        df = add_theory(raw, sites.norm_position)
        var_frames.append(df.assign(**labels))
        summaries.append({**labels, **summarize(df)})
        if grads:
            gdf, sq, loss, width, paths = grad
            count = int(tokens.shape[0]) * int(tokens.shape[1]) * width
            eps = getattr(getattr(net, "cfg", None), "norm_eps", 0.0)
            streams = stream_frame(sq, count, df["stream_var"].to_numpy(), sites.norm_position, eps,
                                   paths=paths)  # fmt: skip
            grad_frames.append(gdf.assign(**labels))
            stream_frames.append(streams.assign(**labels))
            grad_summaries.append({**labels, "loss": loss, **grad_summarize(gdf, streams)})

    driver.each(configs, measure, collect, label=lambda c: c[0], span=lambda c: c[0])
    return driver.result()
