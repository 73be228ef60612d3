"""Closed forms of the init primer, as small documented functions.

Variance law (docs/design.md §1): if the stream enters an addition with variance
v and the branch adds an uncorrelated contribution of variance s^2, then
v' = v + s^2. After 2L additions from v0: v_2L = v0 + sum_k s_k^2, and for equal
branches v0 + 2L s^2 -- in units of v0 the primer's ``v_2L = 1 + 2L sigma^2``. With W_O
and W_down scaled by 1/sqrt(2L) (GPT-2), every s_k^2 drops by 2L and
v_2L = v0 + s^2, independent of L.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from .model.placements import Placement, get_placement


def pred_cumulative_pre(v0: float, branch_vars: np.ndarray) -> np.ndarray:
    """Pre-norm: v_k = v0 + sum_{j<=k} s_j^2, from the measured branch variances."""
    return v0 + np.cumsum(np.asarray(branch_vars, dtype=np.float64))


def pred_cumulative_post(stream_in_vars: np.ndarray, branch_vars: np.ndarray) -> np.ndarray:
    """Post-norm: the sum at addition k has variance var(x_{k-1}) + s_k^2, where
    x_{k-1} is the (normalised) stream entering it. The norm then resets the scale,
    so nothing accumulates."""
    return np.asarray(stream_in_vars, dtype=np.float64) + np.asarray(branch_vars, dtype=np.float64)


def pred_closed_pre(v0: float, k: np.ndarray | int, mean_branch_var: float) -> np.ndarray:
    """The primer's closed form v_k = v0 + k * mean(s^2) (equal branches)."""
    return v0 + np.asarray(k, dtype=np.float64) * mean_branch_var


def pred_closed_post(
    v0: float, k: np.ndarray | int, mean_branch_var: float, normed_var: float = 1.0
) -> np.ndarray:
    """Post-norm analogue of the closed form: addition 1 sees the embedding (v0),
    every later addition a normalised stream of variance ``normed_var`` (1 for a
    norm with unit gain on zero-mean input), so v_k = 1 + mean(s^2) for k >= 2."""
    k = np.asarray(k, dtype=np.float64)
    return np.where(k <= 1, v0 + k * mean_branch_var, normed_var + mean_branch_var)


def gaussian_branch_final(v0: float, n_layers: int, branch_var: float) -> float:
    """The law's exact case (Gaussian branches): E[v_2L] = v0 + 2L * S2."""
    return v0 + 2 * n_layers * branch_var


def pooled_variance_se(variance: float, n_elements: int) -> float:
    """Standard error of a pooled variance estimate of n i.i.d. Gaussian elements:
    var * sqrt(2 / (n - 1))."""
    return variance * math.sqrt(2.0 / max(n_elements - 1, 1))


def identity_gain_pre(n_additions: int) -> np.ndarray:
    """Pre-norm backward identity path: d x_out / d x = I + dF/dx, so along the
    identity alone the gradient reaching addition k is the one leaving the last
    addition, unchanged: a gain of 1 at every k = 0..2L (length 2L + 1)."""
    return np.ones(n_additions + 1)


def identity_gain_post(sum_vars: np.ndarray, eps: float = 0.0) -> np.ndarray:
    """Post-norm backward identity path: stream y_k = Norm(s_k), s_k = y_{k-1} + F_k.
    Along the identity, d y_k / d y_{k-1} is the norm's Jacobian at s_k, whose gain
    (ignoring the rank-one projection and with unit gain g) is 1 / sqrt(var(s_k) + eps).
    So the gradient at the stream of addition k, relative to the last (k = 2L), is the
    product of 1 / sqrt(var(s_j) + eps) over the additions j = k+1..2L above it.

    ``sum_vars`` are var(s_1) .. var(s_2L) (the sums before the norm, measured in the
    forward pass); returns the gains for k = 0..2L (length 2L + 1; the last is 1)."""
    v = np.asarray(sum_vars, dtype=np.float64)
    log_gain = -0.5 * np.log(v + eps)
    # gain_k = exp(sum_{j>k} log_gain_j): reversed cumulative sum, with 0 for k = 2L
    tail = np.concatenate([np.cumsum(log_gain[::-1])[::-1], [0.0]])
    return np.exp(tail)


# --- Attention-logit scale (docs/design.md §1; Vaswani et al. 2017, footnote 4) ---


def qk_component_var(d_model: int, sigma: float, input_ms: float = 1.0) -> float:
    """Variance of one component of q = W_Q x (or k) at init: W_Q ~ N(0, sigma^2) and x
    the normalised stream (mean square ``input_ms``, 1 after RMSNorm) give d sigma^2."""
    return d_model * sigma**2 * input_ms


def logit_var_unit(head_dim: int, scaled: bool) -> float:
    """q.k of two d_h-dimensional vectors with i.i.d. unit-variance components has
    variance d_h; divided by sqrt(d_h) it has variance 1."""
    return 1.0 if scaled else float(head_dim)


def logit_var_model(head_dim: int, d_model: int, sigma: float, scaled: bool) -> float:
    """Logit variance of the real projections at init: every component of q and of k has
    variance d sigma^2 (independent W_Q, W_K), so q.k has d_h (d sigma^2)^2, and
    (d sigma^2)^2 with the 1/sqrt(d_h) scale. With sigma = 1/sqrt(d) this is the unit case."""
    var = head_dim * qk_component_var(d_model, sigma) ** 2
    return var / head_dim if scaled else var


# --- RMSNorm vs LayerNorm ---


def norm_params(norm: str, d_model: int) -> int:
    """Parameters of one norm: RMSNorm has a gain (d), LayerNorm a gain and a bias (2d)."""
    return {"rmsnorm": d_model, "layernorm": 2 * d_model}[norm]


# --- Parameter counts (docs/design.md §1) ---


def tied_embedding_saving(vocab_size: int, d_model: int) -> int:
    """A head tied to the embedding E (V x d) reuses it instead of holding its own
    V x d matrix: V * d fewer parameters (V=128000, d=2048: 262,144,000, about 17.5%
    of a 1.5B model)."""
    return vocab_size * d_model


def swiglu_matching_d_ff(d_model: int) -> float:
    """The gated FFN's hidden size at which its three matrices, 3 d d_ff, hold as many
    weights as the classic FFN's two at 4d, 2 d (4d) = 8 d^2: d_ff = 8d/3 (a whole
    number only when 3 divides d)."""
    return 8 * d_model / 3


# --- Depth sweep ---


# --- Init schemes (tinit.model.schemes): every addition, every placement ---
#
# Addition k (k = 2l+1 attention, 2l+2 FFN of block l) computes, with the scheme's
# stream multiplier a_k and branch multiplier g_k, y = a_k x + g_k f_k (pre, sandwich,
# reordered, none) or the sum a_k x + g_k f_k before the norm (post). A scheme with an
# x0 mix first sets x <- lambda_l x + mu_l x0 at the start of block l. The stream is
# tracked as c_k x0 + u_k with u_k uncorrelated with x0 (and the branches uncorrelated
# with everything before them):  v_k = c_k^2 v0 + u_k,
#   mix:       c <- lambda c + mu,   u <- lambda^2 u
#   addition:  c <- a c,             u <- a^2 u + g^2 s_k^2
# which for a = 1, g = 1 and no mix is the variance law v_k = v_{k-1} + s_k^2.


@dataclass(frozen=True)
class AdditionMultipliers:
    """Per addition k = 1..2L (index k - 1): the stream multiplier ``a``, the branch
    multiplier ``g``, the x0 mix ``lam``, ``mu`` (1 and 0 where there is none, and at
    every FFN addition) and the depth factor ``r`` of the branch variance (NaN when the
    scheme has none; 1 for Gaussian branches, which ignore the init); ``backout``:
    (beta, i_mid) when the last addition's identity path carries x - beta x_mid
    (nanochat), x_mid the stream after addition index i_mid (0-based), else None."""

    a: np.ndarray
    g: np.ndarray
    lam: np.ndarray
    mu: np.ndarray
    r: np.ndarray
    backout: tuple[float, int] | None = None

    @classmethod
    def plain(cls, n_additions: int) -> AdditionMultipliers:
        """A plain residual stack (a = g = 1, no x0 mix, depth factor 1): the variance
        law v_k = v_{k-1} + s_k^2."""
        ones = np.ones(n_additions)
        return cls(a=ones, g=ones.copy(), lam=ones.copy(), mu=np.zeros(n_additions), r=ones.copy())


def addition_multipliers(scheme, cfg, init) -> AdditionMultipliers:
    """The scheme's :class:`AdditionMultipliers` in model ``cfg`` under ``init``."""
    from .model.draws import environment, evaluate

    L = cfg.n_layers
    a, g, lam, r = np.ones(2 * L), np.ones(2 * L), np.ones(2 * L), np.ones(2 * L)
    mu = np.zeros(2 * L)
    for layer in range(L):
        env = environment(cfg, init, layer)
        for j in range(2):
            k = 2 * layer + j
            a[k] = evaluate(scheme.stream_mult, env, scheme.name)
            g[k] = evaluate(scheme.branch_mult, env, scheme.name)
            factor = scheme.depth_factor
            if getattr(cfg, "branch", "model") == "gaussian":  # noise branches: S2 whatever the init
                r[k] = 1.0
            else:
                r[k] = math.nan if factor is None else evaluate(factor[j], env, scheme.name)
        if scheme.x0_mix is not None:
            lam[2 * layer] = evaluate(scheme.x0_mix[0], env, scheme.name)
            mu[2 * layer] = evaluate(scheme.x0_mix[1], env, scheme.name)
    backout = None
    if getattr(scheme, "backout", None) is not None:
        beta = evaluate(scheme.backout, environment(cfg, init, L), scheme.name)
        backout = (beta, 2 * (L // 2) + 1)
    return AdditionMultipliers(a=a, g=g, lam=lam, mu=mu, r=r, backout=backout)


def _recursion(v0: float, mult: AdditionMultipliers, branch_var) -> np.ndarray:
    """v_k, k = 1..2L, of the stream c_k x0 + u_k (u uncorrelated with x0; each branch
    uncorrelated with what came before): at the x0 mix c <- lambda c + mu, U <- lambda^2 U;
    at an addition c <- a c, U <- a^2 U + g^2 s_k^2, s_k^2 = ``branch_var(k, v_in)`` (v_in
    the variance of the stream entering). The backout x - beta x_mid before the last
    addition: c <- c - beta c_mid and, u = p u_mid + w with w uncorrelated with u_mid,
    U <- U - p^2 U_mid + (p - beta)^2 U_mid; when x_mid is the last block's own output
    (L <= 2), the addition is scaled by 1 - beta as a whole."""
    n = len(mult.a)
    a, g, lam, mu, back = mult.a, mult.g, mult.lam, mult.mu, mult.backout
    c, u, p, c_mid, u_mid = 1.0, 0.0, 0.0, 0.0, 0.0
    out = np.empty(n)
    for k in range(n):
        c, u, p = lam[k] * c + mu[k], lam[k] ** 2 * u, lam[k] * p
        if back is not None and k == n - 1:
            beta, i_mid = back
            if i_mid < n - 1:
                c, u = c - beta * c_mid, u - p * p * u_mid + (p - beta) ** 2 * u_mid
            else:
                c, u = (1 - beta) * c, (1 - beta) ** 2 * u
        s2 = branch_var(k, c * c * v0 + u)
        c, u, p = a[k] * c, a[k] ** 2 * u + g[k] ** 2 * s2, a[k] * p
        if back is not None and k == back[1]:
            c_mid, u_mid, p = c, u, 1.0
        out[k] = c * c * v0 + u
    return out


def pred_cumulative_scheme(
    v0: float,
    branch_vars: np.ndarray,
    mult: AdditionMultipliers,
    placement: Placement | str,
    stream_in_vars: np.ndarray | None = None,
) -> np.ndarray:
    """Predicted v_k, k = 1..2L, from the *measured* branch variances s_k^2 (of F
    before g; after the branch's own norm in sandwich and reordered) and the scheme's
    multipliers, by the placement's stream law (:class:`tinit.model.placements.Placement`):
    ``sum``, the recursion v_k = a^2 v_{k-1} + g^2 s_k^2 from v0; ``reset`` (post-norm),
    the sum's variance a^2 var(x_in) + g^2 s^2 from the measured (normalised, mixed)
    stream entering each addition: nothing accumulates."""
    s2 = np.asarray(branch_vars, dtype=np.float64)
    a, g = mult.a, mult.g
    if get_placement(placement).resets:
        return a**2 * np.asarray(stream_in_vars, dtype=np.float64) + g**2 * s2
    return _recursion(v0, mult, lambda k, _v_in: s2[k])


def reference_branch_vars(
    branch_vars: np.ndarray, mult: AdditionMultipliers, placement: Placement | str,
    stream_in_vars: np.ndarray,
) -> tuple[float, float]:  # fmt: skip
    """The L-independent reference branch variance per sublayer (attention, FFN):
    mean of s_k^2 / r_k over the additions with r_k > 0, where r_k is the scheme's
    depth factor (branch law ``unit``, a normed branch output as in sandwich and
    reordered: r = 1 whenever the branch is not exactly zero). Branch law ``input``
    (no norm before or after the branch, ``none``): the branch scales with its input,
    so the reference is s_k^2 / (r_k var(x_in))."""
    law = get_placement(placement).branch_law
    s2 = np.asarray(branch_vars, dtype=np.float64)
    r = _depth_factor(mult.r, law)
    scale = np.asarray(stream_in_vars, dtype=np.float64) if law == "input" else np.ones_like(s2)
    refs = []
    for j in range(2):
        rj, sj, vj = r[j::2], s2[j::2], scale[j::2]
        ok = np.isfinite(rj) & (rj > 0) & np.isfinite(sj) & (vj > 0)
        refs.append(float(np.mean(sj[ok] / (rj[ok] * vj[ok]))) if ok.any() else math.nan)
    return refs[0], refs[1]


def _depth_factor(r: np.ndarray, branch_law: str) -> np.ndarray:
    r = np.asarray(r, dtype=np.float64)
    if branch_law == "unit":
        return np.where(r > 0, 1.0, r)  # a normed branch has variance ~ its gain^2, whatever the init
    return r


def pred_closed_scheme(
    v0: float, refs: tuple[float, float], mult: AdditionMultipliers, placement: Placement | str,
    normed_var: float = 1.0,
) -> np.ndarray:  # fmt: skip
    """The scheme's closed form at every addition k = 1..2L: the recursion of
    :func:`pred_cumulative_scheme` with the *modelled* branch variances
    s_k^2 = ref_sublayer * r_k (times the stream entering, branch law ``input``; r_k = 1,
    ``unit``), so its last value is v_2L(L): naive v0 + 2L s^2, gpt2 v0 + s^2,
    depth-init v0 + s_a^2 H_L / 2 + s_f^2 H2_L / 4, completep v0 + 2 s^2 L0^2 / L,
    zero-out and rezero v0, reordered v0 + 2L (unit normed branches), nanochat
    c_L^2 v0. Stream law ``reset`` (post-norm): the sum before the norm,
    a^2 v_in + g^2 s_k^2 with v_in = v0 at k = 1 and ``normed_var`` after."""
    p = get_placement(placement)
    r = _depth_factor(mult.r, p.branch_law)
    n = len(r)
    ref = np.array([refs[k % 2] for k in range(n)], dtype=np.float64)
    modelled = np.where(r == 0, 0.0, ref * r)
    a, g = mult.a, mult.g
    if p.resets:
        v_in = np.full(n, normed_var)
        v_in[0] = mult.lam[0] ** 2 * v0 if n else v0
        return a**2 * v_in + g**2 * (modelled * v_in if p.branch_law == "input" else modelled)
    if p.branch_law == "input":  # no norm before the branch: it scales with the stream entering
        return _recursion(v0, mult, lambda k, v_in: modelled[k] * v_in)
    return _recursion(v0, mult, lambda k, _v_in: modelled[k])


def closed_form_text(scheme, placement: Placement | str) -> str:
    """The text of ``scheme``'s closed form v_2L(L) in ``placement``, for summary.csv's
    ``closed_form``: what :func:`pred_closed_scheme`'s last value is, in words.

    A scheme's own text (``Scheme.closed_form``) is written for a running sum: for the
    placement the scheme presumes, or, presuming none, for pre-norm's laws (branches that
    read a normalised input). Elsewhere the text follows the placement's laws
    (:class:`tinit.model.placements.Placement`): a stream that resets (post-norm: always
    this text, whatever the scheme presumes) ends in the last sum, a normalised stream of
    variance 1 plus one branch, ``1 + s^2`` (with the scheme's stream multiplier a,
    branch multiplier g and the last branch's depth factor r where they are not 1), and
    nothing accumulates; a running sum of normed branches (sandwich, reordered) adds
    ``s^2`` per addition whatever the init; with no norm each branch scales with the
    stream it reads; a branch that is 0 at init (g = 0, r = 0) adds nothing. Empty where
    the scheme has no closed form (no depth factor)."""
    p = get_placement(placement)
    own = scheme.closed_form
    if not own or scheme.depth_factor is None:
        return own
    pre_laws = (p.stream_law, p.branch_law) == ("sum", "init")
    if not p.resets and (p.name == scheme.placement or (scheme.placement is None and pre_laws)):
        return own
    a, g = scheme.stream_mult.text, scheme.branch_mult.text
    has_a, has_g = a != "1", g != "1" or scheme.branch_learned
    plain = not (has_a or has_g) and scheme.x0_mix is None and scheme.backout is None
    defs = [f"a = {a}"] * has_a + [f"g = {g}"] * has_g
    defs += ["and the scheme's x0 mix"] * (scheme.x0_mix is not None and not p.resets)
    defs += ["and its backout"] * (scheme.backout is not None and not p.resets)
    a2, g2 = "a^2 " * has_a, "g^2 " * has_g

    def at_last(f: str) -> str:  # a rule of the layer l, at the last block
        return f"{f} at l = L - 1" if re.search(r"\bl\b", f) else f

    r_attn, r_ffn = (f.text for f in scheme.depth_factor)
    if p.resets and (g == "0" or r_ffn == "0"):  # the last branch adds nothing at init
        what = f"{p.label}: the last sum, a normalised stream plus a branch that is 0 at init"
        return f"{'a^2' if has_a else '1'} ({'; '.join([what, *defs, *[f'r = {r_ffn}'] * (g != '0')])})"
    if not p.resets and (g == "0" or r_attn == r_ffn == "0"):  # nor does any branch
        law = "v0" if not has_a and scheme.x0_mix is None else f"v_k = {a2}v_(k-1) from v0"
        what = f"{p.label}: every branch is 0 at init"
        return f"{law} ({'; '.join([what, *defs, *[f'r_k = {r_ffn}'] * (g != '0')])})"
    if p.resets:
        unit = p.branch_law == "unit" or r_ffn == "1"
        law = ("a^2" if has_a else "1") + f" + {g2}" + ("s^2" if unit else "s^2 r")
        what = f"{p.label}: the last sum, a normalised stream plus one branch; nothing accumulates"
        return f"{law} ({'; '.join([what, *defs, *([] if unit else [f'r = {at_last(r_ffn)}'])])})"
    if p.branch_law == "unit" or r_attn == r_ffn == "1":
        r_def = []
    elif r_attn == r_ffn:
        r_def = [f"r_k = {r_attn}"]
    else:
        r_def = [f"r_k = {r_attn} (attention), {r_ffn} (FFN)"]
    r_k = " r_k" if r_def else ""
    if p.branch_law == "unit":
        law = "v0 + 2L s^2" if plain else f"v_k = {a2}v_(k-1) + {g2}s^2 from v0"
        what = f"{p.label}: each branch normed, s^2 whatever the init"
    elif p.branch_law == "input":
        law = ("v0 (1 + s^2)^(2L)" if not r_def else "v0 prod_k (1 + s^2 r_k)") if plain else (
            f"v_k = ({a2 or '1 '}+ {g2}s^2{r_k}) v_(k-1) from v0")  # fmt: skip
        what = f"{p.label}: each branch scales with the stream it reads"
    else:
        law = ("v0 + 2L s^2" if not r_def else "v0 + s^2 sum_k r_k") if plain else (
            f"v_k = {a2}v_(k-1) + {g2}s^2{r_k} from v0")  # fmt: skip
        what = f"{p.label}: a running sum of branches that read a normalised input"
    return f"{law} ({'; '.join([what, *defs, *r_def])})"
