"""Guards the numbers of every placement: ``tinit variance`` and ``tinit grad-norms``
write the numbers of the CSVs that the code before placements became values wrote
(redesign branch at c855d30, where ``Block._add`` branched on the placement's name).

Every placement runs with schemes that bring their own architecture: nanochat (x0 mix,
backout, RMS-normed embedding, relu^2, q/k gain, soft-cap), gemma2 ((1 + w) norms,
soft-caps, GeGLU), magneto (sub-LN), rezero (learned gain), deepnet (stream multiplier),
olmo2 and gpt2; a second shape runs LayerNorm with biases, an untied head, learned
positions, GELU, QK-norm and GQA, streamed; a third puts nanochat's backout on the last
block's own output (L = 2); a fourth replaces the branches by Gaussian noise. The CSVs
are what the CLI writes (:func:`tinit.results.rundir.write_csvs`: not-applicable cells
empty, floats in round-trip precision), less the large-width prediction's ``mf_*`` columns
of variance's CSVs, added after the references were written (tests/test_mf.py holds them
to independent computations and to the measurement). Their ``closed_form`` text cells were
rewritten once since (issue 43: the text follows the row's placement,
``tinit.theory.closed_form_text``, where every row had said its scheme's pre-norm text);
no number changed.

The reference files were written by ``python tests/test_placement_numbers.py --write``
at c855d30 (torch 2.13.0+cpu, CPU capability AVX512, one thread). torch's reductions sum
in an order that depends on the machine (vector width, kernel choice), so another machine
of the same kind differs in the 7th digit (``0.44799429178237915`` against
``0.4479942321777344``): the CSVs are compared cell by cell, text and not-applicable
cells exactly, numbers within ``RTOL`` of the reference plus ``ATOL`` of the column's
largest magnitude. float32 rounding moves a cell by about 1e-7 relative; a wrong
multiplier, std or placement moves it by a percent or more, which the tolerance catches
(``test_the_tolerance_catches_a_real_error``).
"""

from __future__ import annotations

import dataclasses
import io
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tinit.experiments.measure.grad_norms import run_grad_norms
from tinit.experiments.measure.variance import MF_SUMMARY_COLUMNS, MF_VARIANCE_COLUMNS, run_variance
from tinit.model.config import InitConfig, ModelConfig, RunConfig
from tinit.results.rundir import not_applicable_mask

DATA = Path(__file__).parent / "data" / "placements"
ALL = ("pre", "post", "sandwich", "reordered", "none")
SCHEMES = ("naive", "gpt2", "olmo2", "deepnet", "rezero", "nanochat", "gemma2", "magneto")
RUN = RunConfig(batch=2, seq_len=16, device="cpu")
TINY = {"d_model": 32, "vocab_size": 64, "max_seq_len": 16}

#: name -> (model, init, run, schemes)
CASES = {
    "schemes": (ModelConfig(n_layers=3, n_heads=2, **TINY),
                InitConfig(seed=3, sigma=0.05), RUN, SCHEMES),
    "layernorm": (ModelConfig(n_layers=3, n_heads=4, n_kv_heads=2, **TINY,
                              norm="layernorm", ffn="gelu", bias=True, tie_embeddings=False,
                              positions="learned", qk_norm=True),
                  InitConfig(seed=1, sigma="inv-sqrt-d"), dataclasses.replace(RUN, stream=True),
                  ("naive", "gpt2")),
    "backout-last": (ModelConfig(n_layers=2, n_heads=2, **TINY),
                     InitConfig(seed=2), RUN, ("nanochat",)),
    "gaussian": (ModelConfig(n_layers=3, n_heads=2, **TINY, branch="gaussian", branch_var=0.5),
                 InitConfig(seed=4), RUN, ("naive", "rezero")),
}  # fmt: skip


#: float32 rounding across machines stays orders of magnitude below these; a real error does
#: not. RTOL relative for every number; besides, ATOL absolute in the dimensionless columns
#: near zero (relative errors, correlations, cosines: differences of O(1) quantities), and
#: ATOL times the largest magnitude of the column within the same configuration (init,
#: placement) elsewhere: a quantity that is zero in exact arithmetic (a gradient through a
#: norm's mean direction) is rounding noise of that size, 1e-16 to 1e-8 of its neighbours.
RTOL, ATOL = 1e-4, 1e-5


def _near_zero_column(col: str) -> bool:
    return col.endswith("_err") or col.startswith("rel_err") or "corr" in col or "cos" in col


def platform() -> dict:
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def csv_mismatches(want: str, got: str, label: str = "") -> list[str]:
    """Cells where CSV text ``got`` differs from ``want``: columns, rows and text cells
    exactly, empty (not-applicable) cells exactly, numbers within ``RTOL`` relative (plus
    ``ATOL`` absolute in the dimensionless columns near zero)."""
    a = pd.read_csv(io.StringIO(want), keep_default_na=False, dtype=str)
    b = pd.read_csv(io.StringIO(got), keep_default_na=False, dtype=str)
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        shape = f"{list(a.columns)} x {len(a)} vs {list(b.columns)} x {len(b)}"
        return [f"{label}: columns or rows differ: {shape}"]
    out = []
    for col in a.columns:
        x, y = a[col], b[col]
        try:
            fx = np.array([np.nan if v == "" else float(v) for v in x])
            fy = np.array([np.nan if v == "" else float(v) for v in y])
        except ValueError:
            pairs = enumerate(zip(x, y, strict=True))
            out += [f"{label} {col}[{i}]: {u!r} != {v!r}" for i, (u, v) in pairs if u != v]
            continue
        same_na = (x == "").to_numpy() == (y == "").to_numpy()
        if _near_zero_column(col):
            atol = ATOL
        else:
            keys = [k for k in ("init", "norm_position") if k in a.columns]
            mag = pd.Series(np.where(np.isfinite(fx), np.abs(fx), 0.0))
            atol = ATOL * (mag.groupby([a[k] for k in keys]).transform("max") if keys else mag.max())
            atol = np.asarray(atol, dtype=float)
        with np.errstate(invalid="ignore"):
            close = np.isclose(fy, fx, rtol=RTOL, atol=atol, equal_nan=True)
        bad = ~(same_na & (close | (fx == fy)))
        out += [f"{label} {col}[{i}]: reference {x[i]}, got {y[i]}" for i in np.flatnonzero(bad)]
    return out


def exact_csv(df, rules) -> str:
    """``df`` as CSV text: floats as ``repr`` (round-trip exact), a not-applicable NaN empty."""
    out, na = df.copy(), not_applicable_mask(df, rules)
    for col in df.columns:
        if df[col].dtype.kind == "f":
            out[col] = ["" if b else repr(float(v)) for v, b in zip(df[col], na[col], strict=True)]
    return out.to_csv(index=False)


def write_case(name: str, out: Path) -> list[Path]:
    """Run variance and grad-norms for case ``name`` in every placement; write their CSVs
    under ``out`` (``variance/`` and ``grad_norms/``) as the CLI does."""
    model, init, run, schemes = CASES[name]
    torch.set_num_threads(1)
    written = []
    for command, result in (
        ("variance", run_variance(model, init, run, schemes, ALL)),
        ("grad_norms", run_grad_norms(model, init, run, schemes, ALL)),
    ):
        folder = out / name / command
        folder.mkdir(parents=True, exist_ok=True)
        for stem, df in result.frames.items():
            df = df.drop(columns=[*MF_VARIANCE_COLUMNS, *MF_SUMMARY_COLUMNS], errors="ignore")
            path = folder / f"{stem}.csv"
            path.write_text(exact_csv(df, result.not_applicable.get(stem)))
            written.append(path)
    return written


@pytest.mark.parametrize("name", list(CASES))
def test_every_placement_writes_the_reference_numbers(name, tmp_path):
    files = sorted(write_case(name, tmp_path))
    expected = sorted((DATA / name).rglob("*.csv"))
    assert [p.relative_to(tmp_path) for p in files] == [p.relative_to(DATA) for p in expected]
    bad = []
    for got, want in zip(files, expected, strict=True):
        bad += csv_mismatches(want.read_text(), got.read_text(), str(want.relative_to(DATA)))
    assert not bad, f"{len(bad)} cells differ (platform {platform()}):\n" + "\n".join(bad[:12])


def test_the_tolerance_catches_a_real_error():
    """The comparison passes the reference against itself, and fails it against the same
    file with one stream variance off by 0.1% or a correlation off by 1e-3 (far below any
    scheme or placement error), a cross-machine 7th-digit change passing."""
    want = (DATA / "schemes" / "variance" / "variance.csv").read_text()
    assert csv_mismatches(want, want) == []
    df = pd.read_csv(io.StringIO(want), keep_default_na=False, dtype=str)
    v = float(df.loc[5, "stream_var"])
    rounded, wrong = df.copy(), df.copy()
    rounded.loc[5, "stream_var"] = repr(v * (1 + 2e-7))
    wrong.loc[5, "stream_var"] = repr(v * 1.001)
    assert csv_mismatches(want, rounded.to_csv(index=False)) == []
    assert len(csv_mismatches(want, wrong.to_csv(index=False))) == 1
    corr = df.copy()
    corr.loc[5, "cross_corr"] = repr(float(df.loc[5, "cross_corr"]) + 1e-3)
    assert len(csv_mismatches(want, corr.to_csv(index=False))) == 1
    na = df.copy()
    na.loc[0, "branch_var"] = "0.0"
    assert csv_mismatches(want, na.to_csv(index=False)), "an empty (not-applicable) cell must stay empty"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_placement_numbers.py --write  (rewrites tests/data/placements)")
    for case in CASES:
        for path in write_case(case, DATA):
            print(path.relative_to(DATA.parent.parent.parent))
    (DATA / "platform.json").write_text(json.dumps(platform(), indent=1) + "\n")
