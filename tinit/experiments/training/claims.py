"""The init primer's claims about *training*, each as a seeded test with a verdict.

Every claim compares the final held-out loss of two sets of runs that differ in one
thing, over the same seeds. With d = mean difference and SE = sqrt(SE_a^2 + SE_b^2)
(each the sample standard error over seeds) and ``tol`` the smallest difference in
nats that counts:

- *A beats B* (superiority), advantage d = mean(B) - mean(A):
  holds if d - 2 SE > 0; fails if d + 2 SE < tol (A's advantage is, at ~2 SE, smaller
  than what counts, or A is worse); inconclusive otherwise (the seed spread is too wide).
- *A loses nothing against B* (non-inferiority), loss d = mean(A) - mean(B):
  holds if d + 2 SE <= tol; fails if d - 2 SE > tol; inconclusive otherwise.
- *A trains*: every seed of A ends without diverging and closes at least half of the
  gap between its initial loss and a reference (the entropy floor when the data has
  one, else the shallow baseline's mean final loss): holds if every seed does, fails
  if at most half do, inconclusive in between.

A diverged run scores its initial held-out loss (it learned nothing it kept); this is
stated beside every verdict that meets one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...model.checks import MAX_SEEDS, check_count, check_lr
from ...model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from ..driver import extended
from ..result import ExperimentResult, Partial, Progress
from .data import TrainData
from .saving import parse_save_steps
from .train import run_specs, standard_error
from .trainer import OnCheckpoint, RunSpec, TrainConfig, checkpoint_labels

CLAIM_COLUMNS = [
    "claim",
    "statement",
    "test",
    "a",
    "b",
    "a_mean",
    "a_se",
    "a_diverged",
    "b_mean",
    "b_se",
    "b_diverged",
    "difference",
    "difference_se",
    "tol",
    "verdict",
    "criterion",
]


@dataclass(frozen=True)
class ClaimsConfig:
    """What the claims compare; the CPU defaults finish in minutes on a 2-core CPU."""

    shallow: int = 4  # layers of the small model (norm, FFN, tying claims; transfer's short end)
    deep: int = 24  # layers of the deep stacks (warmup, pre-norm, depth-scaling claims)
    seeds: int = 5  # seeds per configuration (init and batch order re-drawn)
    high_lr: float = 1.5e-2  # the deliberately unstable peak lr (post-norm, deep, no warmup)
    warmup: int = 50  # the warmup that the unstable setting is compared with
    tol: float = 0.02  # nats: the smallest final-loss difference that counts

    def __post_init__(self) -> None:
        for name in ("shallow", "deep", "warmup"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "warmup" else 1):
                raise ConfigError(
                    name, f"must be a whole number >= {0 if name == 'warmup' else 1}, got {v!r}"
                )
        check_count("seeds", self.seeds, MAX_SEEDS, 2, " (a standard error needs two)")
        check_lr("high_lr", self.high_lr)
        if not (math.isfinite(self.tol) and self.tol > 0):
            raise ConfigError("tol", f"must be a positive number, got {self.tol!r}")
        # each claim compares two different configurations: equal depths, or no warmup
        # at all, would make its two sides one configuration, trained twice
        if self.deep <= self.shallow:
            raise ConfigError("deep", f"must be larger than --shallow ({self.shallow}), got {self.deep}")
        if self.warmup < 1:
            raise ConfigError("warmup", "must be >= 1: the warmup claim compares a warmup with none")


def superiority(a: np.ndarray, b: np.ndarray, tol: float) -> tuple[float, float, str]:
    """(advantage of a over b, its SE, verdict) for the claim "a ends lower than b"."""
    d = float(np.mean(b) - np.mean(a))
    se = math.hypot(standard_error(a), standard_error(b))
    if not math.isfinite(se):
        return d, se, "inconclusive"
    if d - 2 * se > 0:
        return d, se, "holds"
    if d + 2 * se < tol:
        return d, se, "fails"
    return d, se, "inconclusive"


def non_inferiority(a: np.ndarray, b: np.ndarray, tol: float) -> tuple[float, float, str]:
    """(loss of a against b, its SE, verdict) for the claim "a is no worse than b"."""
    d = float(np.mean(a) - np.mean(b))
    se = math.hypot(standard_error(a), standard_error(b))
    if not math.isfinite(se):
        return d, se, "inconclusive"
    if d + 2 * se <= tol:
        return d, se, "holds"
    if d - 2 * se > tol:
        return d, se, "fails"
    return d, se, "inconclusive"


SUPERIORITY = "holds if d - 2SE > 0; fails if d + 2SE < tol; else inconclusive (d = mean(B) - mean(A))"
NON_INFERIORITY = "holds if d + 2SE <= tol; fails if d - 2SE > tol; else inconclusive (d = mean(A) - mean(B))"
TRAINS = (
    "holds if every seed ends undiverged having closed >= 1/2 of the gap from its initial loss to "
    "{ref}; fails if at most half do; else inconclusive"
)


def claim_specs(
    model: ModelConfig, init: InitConfig, train: TrainConfig, claims: ClaimsConfig, seed: int = 0
) -> dict[str, list[RunSpec]]:
    """The configurations the claims need, by name, each over the seeds. ``model`` is
    the base shape (its norm, FFN and tying are the baseline's); ``train.lr`` is the
    ordinary peak lr, ``claims.high_lr`` the unstable one."""
    seeds = range(seed, seed + claims.seeds)
    d = model.d_model
    base = dataclasses.replace(
        model,
        norm_position="pre",
        n_layers=claims.shallow,
        ffn="swiglu",
        d_ff=round(8 * d / 3),
        norm="rmsnorm",
        tie_embeddings=True,
    )

    def specs(m: ModelConfig, scheme: str, lr: float, warmup: int) -> list[RunSpec]:
        return [RunSpec(m, dataclasses.replace(init, scheme=scheme, seed=s), lr, warmup) for s in seeds]

    deep_post = dataclasses.replace(base, n_layers=claims.deep, norm_position="post")
    deep_pre = dataclasses.replace(base, n_layers=claims.deep)
    lr, w = train.lr, train.warmup
    return {
        "post-norm deep, high lr, no warmup": specs(deep_post, "naive", claims.high_lr, 0),
        "post-norm deep, high lr, warmup": specs(deep_post, "naive", claims.high_lr, claims.warmup),
        "pre-norm deep, high lr, no warmup": specs(deep_pre, "naive", claims.high_lr, 0),
        "naive pre-norm deep": specs(deep_pre, "naive", lr, w),
        "scaled pre-norm deep": specs(deep_pre, "scaled", lr, w),
        "scaled pre-norm shallow (baseline)": specs(base, "scaled", lr, w),
        "LayerNorm shallow": specs(dataclasses.replace(base, norm="layernorm"), "scaled", lr, w),
        "GELU FFN 4d shallow": specs(dataclasses.replace(base, ffn="gelu", d_ff=4 * d), "scaled", lr, w),
        "untied shallow": specs(dataclasses.replace(base, tie_embeddings=False), "scaled", lr, w),
    }


def _scores(runs: pd.DataFrame, n_specs: int, start: int) -> tuple[np.ndarray, int]:
    g = runs.iloc[start : start + n_specs]
    diverged = g["diverged"].astype(bool).to_numpy()
    scores = np.where(diverged, g["initial_eval_loss"], g["final_eval_loss"]).astype(float)
    return scores, int(diverged.sum())


def evaluate_claims(
    runs: pd.DataFrame,
    names: Sequence[str],
    n_seeds: int,
    floor: float | None,
    claims: ClaimsConfig,
    params: dict[str, int],
) -> pd.DataFrame:
    """The verdict table from the runs (in the order of ``names``, ``n_seeds`` each). A
    run stopped part-way leaves the later configurations without runs: only the claims
    whose configurations all finished are judged."""
    done = [n for i, n in enumerate(names) if len(runs) >= (i + 1) * n_seeds]
    score = {n: _scores(runs, n_seeds, i * n_seeds) for i, n in enumerate(names) if n in done}
    initial = {
        n: runs.iloc[i * n_seeds : (i + 1) * n_seeds]["initial_eval_loss"].to_numpy(float)
        for i, n in enumerate(names)
        if n in done
    }
    rows = []

    def compare(claim, statement, a, b, kind, note=""):
        if a not in score or b not in score:
            return
        (sa, da), (sb, db) = score[a], score[b]
        test = superiority if kind == "superiority" else non_inferiority
        d, se, verdict = test(sa, sb, claims.tol)
        crit = (SUPERIORITY if kind == "superiority" else NON_INFERIORITY) + f"; tol = {claims.tol:g} nats"
        if da or db:
            crit += "; a diverged run scores its initial loss"
        rows.append(
            {
                "claim": claim,
                "statement": statement,
                "test": kind + (f" ({note})" if note else ""),
                "a": a,
                "b": b,
                "a_mean": float(np.mean(sa)),
                "a_se": standard_error(sa),
                "a_diverged": da,
                "b_mean": float(np.mean(sb)),
                "b_se": standard_error(sb),
                "b_diverged": db,
                "difference": d,
                "difference_se": se,
                "tol": claims.tol,
                "verdict": verdict,
                "criterion": crit,
            }
        )

    compare(
        "post-norm needs warmup",
        f"post-norm at L={claims.deep} and the high lr trains better with a {claims.warmup}-step warmup "
        "than without",
        "post-norm deep, high lr, warmup",
        "post-norm deep, high lr, no warmup",
        "superiority",
    )
    # pre-norm trains deep stacks without heroics: the unstable setting, in pre-norm
    name = "pre-norm deep, high lr, no warmup"
    baseline = "scaled pre-norm shallow (baseline)"
    if name in score and (floor is not None or baseline in score):
        rows.append(_trains(runs, names, n_seeds, floor, claims, score, initial, name, baseline))
    _compare_rest(compare, claims, params)
    return pd.DataFrame(rows, columns=CLAIM_COLUMNS)


def _trains(runs, names, n_seeds, floor, claims, score, initial, name, baseline) -> dict:
    """The row of "pre-norm trains deep stacks" (see the module docstring)."""
    sa, da = score[name]
    ref = floor if floor is not None else float(np.mean(score[baseline][0]))
    ref_name = f"the entropy floor {floor:.4g}" if floor is not None else f"the shallow baseline's {ref:.4g}"
    closed = (initial[name] - sa) / (initial[name] - ref)
    ok = int(
        (
            (closed >= 0.5)
            & ~runs.iloc[names.index(name) * n_seeds :][:n_seeds]["diverged"].astype(bool).to_numpy()
        ).sum()
    )
    verdict = "holds" if ok == n_seeds else "fails" if ok <= n_seeds / 2 else "inconclusive"
    return {
        "claim": "pre-norm trains deep stacks",
        "statement": f"pre-norm at L={claims.deep}, the high lr and no warmup trains",
        "test": f"trains ({ok}/{n_seeds} seeds closed >= 1/2 of the gap)",
        "a": name,
        "b": "",
        "a_mean": float(np.mean(sa)),
        "a_se": standard_error(sa),
        "a_diverged": da,
        "b_mean": ref,
        "b_se": math.nan,
        "b_diverged": 0,
        "difference": float(np.mean(closed)),
        "difference_se": standard_error(closed),
        "tol": 0.5,
        "verdict": verdict,
        "criterion": TRAINS.format(ref=ref_name) + "; difference = mean fraction of the gap closed",
    }


def _compare_rest(compare, claims: ClaimsConfig, params: dict[str, int]) -> None:
    """The comparisons after "pre-norm trains deep stacks", in the table's order."""
    compare(
        "naive init fails with depth",
        f"at L={claims.deep} (pre-norm, ordinary lr and warmup) the depth-scaled init ends lower than naive",
        "scaled pre-norm deep",
        "naive pre-norm deep",
        "superiority",
    )
    compare(
        "depth-scaled init transfers",
        f"the depth-scaled init with the same hyperparameters is no worse at L={claims.deep} than at "
        f"L={claims.shallow}",
        "scaled pre-norm deep",
        "scaled pre-norm shallow (baseline)",
        "non-inferiority",
    )
    compare(
        "RMSNorm loses nothing",
        "RMSNorm is no worse than LayerNorm",
        "scaled pre-norm shallow (baseline)",
        "LayerNorm shallow",
        "non-inferiority",
    )
    compare(
        "SwiGLU beats GELU at equal parameters",
        f"SwiGLU (d_ff = 8d/3, {params.get('scaled pre-norm shallow (baseline)')} parameters) ends lower "
        "than GELU "
        f"(d_ff = 4d, {params.get('GELU FFN 4d shallow')} parameters)",
        "scaled pre-norm shallow (baseline)",
        "GELU FFN 4d shallow",
        "superiority",
    )
    compare(
        "tying regularises small models",
        "a small model with a tied head ends lower than untied "
        "(the large-model half of the claim is not tested here)",
        "scaled pre-norm shallow (baseline)",
        "untied shallow",
        "superiority",
    )


def run_claims(
    model: ModelConfig,
    init: InitConfig,
    run: RunConfig,
    train: TrainConfig,
    data: TrainData,
    claims: ClaimsConfig,
    progress: Progress | None = None,
    on_partial: Partial | None = None,
    on_checkpoint: OnCheckpoint | None = None,
    save_steps: str | Sequence[int | str] | None = None,
) -> ExperimentResult:
    """Train every configuration the claims need and judge each claim. Frames: those of
    :func:`tinit.experiments.training.train.run_specs` plus ``claims`` (one row per claim) and
    ``claim_runs`` (the runs' configuration names and scores). ``on_checkpoint``,
    ``save_steps``: each run's checkpoints, as ``tinit train`` saves them (config.json's
    ``checkpoint_configurations`` names each run's claim configuration)."""
    named = claim_specs(model, init, train, claims, init.seed)
    names = list(named)
    specs = [s for n in names for s in named[n]]

    def judged(result: ExperimentResult) -> ExperimentResult:
        """The result with its runs named and the claims whose runs all finished judged."""
        runs = result["runs"]
        configs = [n for n in names for _ in range(claims.seeds)]
        result.frames["runs"] = runs.assign(configuration=configs[: len(runs)])
        params = {n: int(runs.iloc[i * claims.seeds]["params"]) for i, n in enumerate(names)
                  if len(runs) > i * claims.seeds}  # fmt: skip
        table = evaluate_claims(runs, names, claims.seeds, data.floor, claims, params)
        if len(table):
            result.frames["claims"] = table
            # a one-configuration claim ("pre-norm trains") has no second configuration b
            result.not_applicable["claims"] = {"b_se": lambda df: df["b"].isna() | (df["b"] == "")}
        return result

    meta = {"claims": dataclasses.asdict(claims)}
    saves = parse_save_steps(save_steps, train.steps) if on_checkpoint is not None else []
    if saves:
        labels = checkpoint_labels(specs)
        meta["checkpoint_configurations"] = {
            labels[i]: n for i, n in enumerate(x for x in names for _ in range(claims.seeds))
        }
    return extended(
        lambda partial: run_specs(specs, train, data, run, progress, meta, partial,
                                  on_checkpoint=on_checkpoint if saves else None, save_steps=saves),
        judged, on_partial,
    )  # fmt: skip
