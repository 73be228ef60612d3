"""Criteria and texts that both the experiments (which apply them) and the results
layer (which reports them) need, so that tinit.results never imports tinit.experiments."""

from __future__ import annotations

from statistics import NormalDist

#: The audit's verdicts that fail it (exit code 3; ``ok`` and ``unchecked`` do not): a
#: std or constant other than the scheme's, PyTorch's default left in place, all zeros,
#: one constant, a NaN or inf (tinit.experiments.audit.audit applies them,
#: tinit.results.report_audit explains them).
DEVIATING = ("off-scheme", "pytorch-default", "zero", "constant", "non-finite")

#: The columns that name a configuration of a training run, first in every frame of one
#: (tinit.experiments.training.trainer); the results layer labels runs by those that vary.
TRAIN_CONFIG_COLUMNS = ["init", "norm_position", "norm", "ffn", "tied", "n_layers", "d_model", "d_ff", "seed",
                        "peak_lr", "warmup"]  # fmt: skip

#: Statistical difference: |v(L_max) - v(L_min)| > SPREAD_K * sqrt(se_max^2 + se_min^2)
#: ("within_spread" is its negation). A difference the seeds resolve, however small.
SPREAD_K = 2.0
#: The practical criterion: the scheme transfers from depth L_from to L_to when v_2L
#: changes by at most TRANSFER_TOL (relative), with its 2-s.e. interval inside the band.
TRANSFER_TOL = 0.10
#: The per-depth law v_2L = v0 + 2L mean(s^2) (pre-norm; post-norm 1 + mean(s^2)) holds
#: when every depth's mean v_2L is within LAW_TOL of it.
LAW_TOL = 0.10
#: The default reference depth of the transfer check (when swept and not the deepest).
TRANSFER_FROM = 12

#: The check's default sizes, for the library and ``tinit check`` alike: small enough
#: that the whole check runs in well under a minute on a 2-core CPU (5 forward passes of
#: 12 + 12 + 12 + 80 + 80 layers of 4 x 64 tokens at d = 64, two 12-layer backward
#: passes and a few unit-q,k draws). Everything else is ModelConfig's, InitConfig's and
#: RunConfig's default.
CHECK_MODEL = {"n_layers": 12, "d_model": 64, "n_heads": 4, "max_seq_len": 64}
CHECK_RUN = {"batch": 4, "seq_len": 64}
#: The long depth of (b), the head sizes of (e) and the level of every test.
CHECK_DEEP_LAYERS, CHECK_HEAD_DIMS, CHECK_ALPHA = 80, (16, 64, 256), 0.01

#: Item -> (title, the one-paragraph explanation check.md prints).
ITEMS: dict[str, tuple[str, str]] = {
    "a": (
        "v_2L = 1 + 2L sigma^2, and the independence assumption behind it",
        "A pre-norm block adds its branch output F_k to the stream x_{k-1}. Pooled variances add "
        "exactly up to the cross term: var(x + F) = var x + var F + 2 Cov(x, F). The law v_2L = v0 + "
        "sum_k s_k^2 (in units of v0, 1 + 2L sigma^2) is therefore precisely the claim that the 2L "
        "covariances vanish. They do in expectation, because the last matrix of every branch is drawn "
        "independently of the stream; in one draw each covariance is a Gaussian with a standard error "
        "the run computes exactly (module docstring). The check measures the relative error of v_2L "
        "against the law and the largest stream/branch correlation, and tests both against those "
        "standard errors, at both depths the check runs (the law speaks of any L). The Gaussian-branch "
        "run replaces every branch by independent N(0, S2) noise, the one model in which the law is "
        "exact (every branch independent of the stream by construction), where v_2L = v0 + 2L S2 must "
        "hold to sampling precision: it checks the measuring code itself.",
    ),
    "b": (
        "Depth-scaled init makes v_2L independent of L",
        "Multiplying the init std of W_O and W_down by 1/sqrt(2L) divides every branch variance by "
        "2L, so v_2L = v0 + s^2 at any depth, while the naive init gives v0 + 2L s^2. The check runs "
        "the same stack (shared draws) at a short and a long depth, both schemes, and predicts the long "
        "run from the short run's measured branch variances. The tolerance treats the per-layer branch "
        "variances as exchangeable draws (the primer's equal-branch assumption, with the observed "
        "layer-to-layer spread as noise, separately for attention and FFN) plus the covariance terms "
        "of (a); a systematic drift of the branch variance with depth is *not* noise and fails the check.",
    ),
    "c": (
        "Pre-norm keeps an unattenuated gradient path; post-norm does not",
        "In pre-norm, d x_out / d x = I + dF/dx: along the identity the gradient leaving the last "
        "addition reaches every earlier stream unchanged, and the branch paths only add to it (their "
        "cross term with the identity path has mean zero), so the stream-gradient RMS relative to the "
        "top must not fall below 1 beyond sampling noise (tolerance 1 - z^2/T from the T tokens, "
        "Bonferroni over the 2L additions). In post-norm every addition is followed by a norm whose "
        "Jacobian multiplies the backward signal by about 1/sqrt(var(s)), s the sum before the norm; "
        "the identity-path gain is the product of these factors, not 1. The check judges it in two "
        "parts, so that no pass rests on what it does not test: from k = 1 to 2L (after the first "
        "norm) the measured gain against the product over j >= 2, within the pre-norm row's allowance; "
        "and the first norm alone, whose factor 1/sqrt(var s_1) is the embedding's scale (x50 for a "
        "0.02 embedding), not a compounding over depth. With small branches every later sum has "
        "variance ~1, the product from k = 1 is ~1 and post-norm attenuates nothing at that sigma: the "
        "row then passes on the mechanism and its caveat says so. The branch paths are left out of the "
        "prediction: where they dominate (large branches, e.g. sigma = 1/sqrt(d)) the measurement can "
        "leave it, and the check says so.",
    ),
    "d": (
        "Tying the head to the embedding saves V*d parameters",
        "A tied head computes its logits with the embedding matrix E (V x d) instead of its own, so the "
        "untied model has exactly V*d more parameters (plus the head's V biases when linear layers have "
        "biases). The counts are exact (tinit.model.params, tested against the built modules); for the "
        "primer's V = 128000, d = 2048 the saving is 262,144,000, and the claim 'about 17.5% of a "
        "1.5B model' is checked to the precision it is stated in (0.1 percentage point).",
    ),
    "e": (
        "The 1/sqrt(d_h) factor keeps the attention logits at unit variance",
        "A dot product q.k of two d_h-dimensional vectors with independent unit-variance components has "
        "variance d_h; dividing by sqrt(d_h) brings it to 1, so the softmax neither saturates (large "
        "d_h, no scale) nor depends on the head size. The check draws unit q, k for several head sizes "
        "(tinit.experiments.measure.attention_scale), measures the logit variance with and without the "
        "scale, "
        "and tests each against d_h and 1 with the standard error from the spread over independent "
        "(sequence, head) units (Student t with units - 1 degrees of freedom).",
    ),
}


def z_quantile(alpha: float, m: int = 1, two_sided: bool = True) -> float:
    """Normal quantile of a test at level alpha, Bonferroni-corrected over m tests."""
    tail = alpha / m / (2 if two_sided else 1)
    return NormalDist().inv_cdf(1.0 - tail)


#: Coordinate check (``tinit coord-check``): a quantity is width-stable (depth-stable) when
#: the log-log slope of its RMS against width (depth) is within COORD_SLOPE_TOL of 0 at
#: every recorded step. The anchors: muP claims Theta(1) coordinates (slope 0); the
#: smallest growth the standard parametrization shows is width^(1/2) (a sum of d
#: independent terms, e.g. tied logits at init; a step of Adam at a fixed lr gives width^1
#: in the logits and attention), and along depth L^(1/2) (L uncorrelated branch writes).
#: 0.25 is halfway between 0 and that smallest anomalous exponent: over the default
#: widths 64..512 (3 octaves) it allows a change of 2^0.75 = 1.7x. The point estimate is
#: compared (its standard error over seeds is printed beside it).
COORD_SLOPE_TOL = 0.25
#: Quantities held to O(1) (slope <= tol; every other one is held to Theta(1), |slope| <= tol):
#: the logits may vanish with width (Tensor Programs V's desiderata: "every (pre)activation
#: Theta(1)", "the output O(1)"; muP's readout starts at or near zero).
COORD_O1 = ("logits",)

#: Learning-rate transfer (``tinit lr-sweep``): the optimum transfers along an axis
#: (width or depth) when its drift d log2 lr* / d log2 x is under LR_DRIFT_TOL octaves per
#: doubling and its 95% interval lies inside +-LR_RESOLVE_TOL (narrow enough to tell); it
#: drifts when the interval excludes 0 and the drift is LR_DRIFT_TOL or more; otherwise
#: the seeds given do not resolve it.
LR_DRIFT_TOL, LR_RESOLVE_TOL, LR_LEVEL = 0.25, 0.5, 0.95
LR_CRITERION = (f"transfers: |drift| < {LR_DRIFT_TOL:g} octave per doubling and the {LR_LEVEL:.0%} "
                f"interval inside ±{LR_RESOLVE_TOL:g}; drifts: the interval excludes 0 and |drift| >= "
                f"{LR_DRIFT_TOL:g}; otherwise not resolved")  # fmt: skip

#: ``tinit train`` with two or more schemes: each scheme against the first, paired by seed
#: (same seed, same data and batch order). The verdict is read off the Student-t interval
#: of the mean paired difference of final held-out loss at TRAIN_COMPARE_LEVEL.
TRAIN_COMPARE_LEVEL = 0.95
TRAIN_COMPARE_CRITERION = (f"lower/higher: the {TRAIN_COMPARE_LEVEL:.0%} t interval of the paired difference "
                           "(scheme - baseline, over the seeds neither diverged on) excludes 0; otherwise "
                           "no difference resolved; fewer than 2 pairs: too few seeds")  # fmt: skip
