"""Exact parameter accounting of a configuration: components, tied vs untied head,
the saving V*d, and the gated-FFN check 3 d (8d/3) = 2 d (4d).

Counting only; nothing is built (:mod:`tinit.model.params` holds the formulas, and
the tests check them against built modules).
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import pandas as pd

from ... import theory
from ...model.config import ConfigError, InitConfig, ModelConfig, RunConfig, swiglu_hidden
from ...model.params import BLOCK_COMPONENTS, COMPONENTS, count_params, ffn_params, gqa_attention_saving
from ..driver import Run
from ..result import ExperimentResult, Partial, Progress

PARAMS_COLUMNS = ["tying", "component", "per_block", "n_blocks", "count", "fraction"]
FFN_COLUMNS = ["variant", "ffn", "d_ff", "weights", "classic_weights", "ratio", "equal"]
SUMMARY_COLUMNS = [
    "n_layers", "d_model", "n_heads", "d_ff", "vocab_size", "ffn", "norm", "norm_position", "positions",
    "bias", "tying", "per_block", "total_tied", "total_untied", "total", "saved", "saved_theory",
    "saved_frac_untied", "saved_frac_tied", "reference_total", "saved_frac_reference",
    "n_kv_heads", "gqa_saving", "total_gqa", "n_kv_heads_model",
]  # fmt: skip


def component_rows(model: ModelConfig) -> list[dict]:
    """params rows of the model with a tied and with an untied head."""
    rows = []
    for tying, tied in (("tied", True), ("untied", False)):
        count = count_params(dataclasses.replace(model, tie_embeddings=tied))
        total = count.total
        for name, n in count.components().items():
            block = name in BLOCK_COMPONENTS
            rows.append({
                "tying": tying, "component": name,
                "per_block": getattr(count, name) if block else pd.NA,
                "n_blocks": count.n_layers if block else pd.NA,
                "count": n, "fraction": n / total,
            })  # fmt: skip
    return rows


def ffn_rows(model: ModelConfig) -> list[dict]:
    """The gated FFN at d_ff = 8d/3 against the classic FFN at 4d (weights only, no
    biases): exact at the unrounded 8d/3, and what whole-number d_ff give."""
    d = model.d_model
    classic = 2 * d * (4 * d)
    exact = theory.swiglu_matching_d_ff(d)
    exact_weights = 3 * d * Fraction(8 * d, 3)  # exact rational arithmetic: no float rounding
    variants = [
        ("classic FFN at 4d", "gelu", 4 * d, Fraction(ffn_params(d, 4 * d, "gelu"))),
        ("SwiGLU at 8d/3 (unrounded)", "swiglu", exact, exact_weights),
        ("SwiGLU at round(8d/3)", "swiglu", round(exact), Fraction(ffn_params(d, round(exact), "swiglu"))),
        (
            "SwiGLU at 8d/3 rounded up to 64 (tinit default)",
            "swiglu",
            swiglu_hidden(d),
            Fraction(ffn_params(d, swiglu_hidden(d), "swiglu")),
        ),
        ("this model's FFN", model.ffn, model.d_ff, Fraction(ffn_params(d, model.d_ff, model.ffn))),
    ]
    return [
        {
            "variant": name,
            "ffn": kind,
            "d_ff": float(d_ff),
            "weights": float(w),
            "classic_weights": classic,
            "ratio": float(w / classic),
            "equal": w == classic,
        }  # fmt: skip
        for name, kind, d_ff, w in variants
    ]


def _no_reference(df: pd.DataFrame):
    return df["reference_total"].isna()


#: Cells with no value by design (written empty): no --reference-total, no fraction of it.
NOT_APPLICABLE = {"reference_total": True, "saved_frac_reference": _no_reference}


def run_params(
    model: ModelConfig | None = None,
    init: InitConfig | None = None,
    run: RunConfig | None = None,
    reference_total: float | None = None,
    n_kv_heads: int | None = None,
    progress: Progress | None = None,
    on_partial: Partial | None = None,
) -> ExperimentResult:
    """Count every parameter of ``model``, with a tied and with an untied head.

    Frames: ``params`` (one row per tying and component), ``ffn`` (the 8d/3 vs 4d
    check) and ``summary`` (one row: totals, the saving V*d and its fractions).
    ``reference_total`` adds the saving's fraction of that many parameters (the
    primer's "17.5% of a 1.5B model"). ``n_kv_heads`` (for presets of GQA models)
    adds what the real model, with grouped-query attention, would count. ``init``
    and ``run`` are accepted for a uniform signature; counts do not depend on them.

    >>> res = run_params(ModelConfig(vocab_size=128000, d_model=2048), reference_total=1.5e9)
    >>> int(res["summary"].loc[0, "saved"])
    262144000
    """
    model = model or ModelConfig()
    if reference_total is not None and not (math.isfinite(reference_total) and reference_total > 0):
        raise ConfigError("reference_total", f"must be a positive number, got {reference_total!r}")
    tied = count_params(dataclasses.replace(model, tie_embeddings=True))
    untied = count_params(dataclasses.replace(model, tie_embeddings=False))
    total = untied.total if not model.tie_embeddings else tied.total
    saved = untied.total - tied.total
    gqa = gqa_attention_saving(model, n_kv_heads) if n_kv_heads else None
    summary = {
        "n_layers": model.n_layers, "d_model": model.d_model, "n_heads": model.n_heads,
        "d_ff": model.d_ff, "vocab_size": model.vocab_size, "ffn": model.ffn, "norm": model.norm,
        "norm_position": model.norm_position, "positions": model.positions, "bias": model.bias,
        "tying": "tied" if model.tie_embeddings else "untied", "per_block": tied.per_block,
        "total_tied": tied.total, "total_untied": untied.total, "total": total,
        "saved": saved, "saved_theory": theory.tied_embedding_saving(model.vocab_size, model.d_model),
        "saved_frac_untied": saved / untied.total, "saved_frac_tied": saved / tied.total,
        "reference_total": reference_total,
        "saved_frac_reference": saved / reference_total if reference_total else math.nan,
        "n_kv_heads": n_kv_heads, "gqa_saving": gqa, "total_gqa": total - gqa if gqa is not None else None,
        "n_kv_heads_model": model.n_kv_heads if model.n_kv_heads not in (None, model.n_heads) else None,
    }  # fmt: skip
    frames = {
        "params": pd.DataFrame(component_rows(model), columns=PARAMS_COLUMNS),
        "ffn": pd.DataFrame(ffn_rows(model), columns=FFN_COLUMNS),
        "summary": pd.DataFrame([summary], columns=SUMMARY_COLUMNS),
    }
    meta = {
        "model": model.to_dict(),
        "reference_total": reference_total,
        "n_kv_heads": n_kv_heads,
        "components": list(COMPONENTS),
        "run": run.to_dict() if run is not None else None,
    }
    driver = Run(meta, lambda: frames, {"summary": NOT_APPLICABLE}, progress=progress)
    driver.tick()  # one unit: counted, not measured (nothing to keep on a failure)
    return driver.result()
