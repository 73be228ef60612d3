"""Issue 22, user schemes: each hostile --init-file of the issue reproduced (case 5:
qk_norm = "false"; case 7: a name with path parts or a newline; case 13: 10^400,
max(sigma), a bound 1e-30, a 20,000-term sum, log(0) found only mid-run, 9^9^9), now a
one-line error before anything runs, or (a narrow bound) a correct draw."""

import itertools
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import ROOT, TINY, assert_one_line_error
from typer.testing import CliRunner

from tinit.cli import app
from tinit.model.draws import effective_std
from tinit.model.formula import MAX_DEPTH, MAX_NODES, Formula, FormulaError
from tinit.model.init import draw_

runner = CliRunner()
M = TINY  # the tiny model


_names = itertools.count()


def scheme_file(tmp_path, body: str, name: str | None = None) -> str:
    """A scheme file with a name no other test registered (schemes are process-wide)."""
    name = name or f"hostile{next(_names)}"
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\n{body}\n')
    return str(path)


def roles(formula: str) -> str:
    return f'[roles]\no = "{formula}"'


# --- case 13: formulas bounded in size and cost -------------------------------------


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (roles("10^400"), "overflows"),
        (roles("max(sigma)"), "two or more arguments"),
        (roles("+".join(["sigma"] * 20_000)), "characters"),
        (roles("+".join(["(l+l+l+l)"] * 40)), f"over {MAX_NODES} terms"),
        (roles("sqrt(" * 70 + "sigma" + ")" * 70), f"nested over {MAX_DEPTH} deep"),
        (roles("9^9^9"), "overflows"),
        (roles("(0 - 8)^(1/3) * sigma"), "not a real number"),
        (roles("1" + "0" * 400), "too large"),
    ],
)
def test_hostile_formulas_are_one_line_errors(tmp_path, body, words):
    out = tmp_path / "run"
    res = runner.invoke(
        app, ["variance", *M, "--layers", "2", "--init-file", scheme_file(tmp_path, body), "--out", str(out)]
    )
    assert_one_line_error(res, "--init-file", out)
    assert words in res.stderr


def test_a_tower_of_powers_overflows_in_floats():
    """9^9^9 hung at 100% CPU: Python built a 370-million-digit integer. In floats it
    overflows (an integer power never does: the message says floats were used), in a fresh
    process whose timeout guards against a hang."""
    code = (
        "from tinit.model.formula import Formula, FormulaError\n"
        "try:\n    Formula('9^9^9')()\nexcept FormulaError as e:\n    print(e)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert "overflows" in res.stdout, res.stdout + res.stderr


def test_formula_values_over_layers_agree_with_the_scalar_rule():
    """The array evaluation that checks every layer before a run gives the scalar
    evaluation's numbers where both are defined, and inf/nan where the scalar one fails."""
    f = Formula("sigma / sqrt(2 * (l + 1)) * max(1, l - 2) + log(L) / 8")
    layers = np.arange(7)
    got = f.values(sigma=0.02, l=layers, L=7.0)
    want = [0.02 / math.sqrt(2 * (i + 1)) * max(1, i - 2) + math.log(7) / 8 for i in layers]
    np.testing.assert_allclose(got, want, rtol=1e-15)
    bad = Formula("log(l) + 1 / (l - 3)").values(l=layers)
    assert not np.isfinite(bad[0]) and not np.isfinite(bad[3]) and np.isfinite(bad[[1, 2, 4, 5, 6]]).all()
    for i in (0, 3):
        with pytest.raises(FormulaError):
            Formula("log(l) + 1 / (l - 3)")(l=i)


@pytest.mark.parametrize(
    ("body", "command"),
    [
        ('branch_mult = "log(l)"', ["variance", "--layers", "2"]),  # every layer but block 0
        (roles("sigma / (L - 7)^2"), ["depth-sweep", "--layers", "8,7", "--no-grads", "--seeds", "1"]),
        (roles("sigma / (L - 7)^2"), ["train", "--layers", "7", "--steps", "1"]),
        (roles("sigma / (L - 7)^2"), ["inits", "NAME", "--layers", "7"]),
        ('stream_mult = "1 / (l - 1)"', ["grad-norms", "--layers", "3"]),
    ],
)
def test_an_undefined_rule_anywhere_in_the_run_is_found_before_it(tmp_path, body, command):
    """log(0) was found only mid-run (a traceback, config.json complete: false, error
    null): the load-time probe looks at a few shapes, the run at every layer of its own."""
    out, name = tmp_path / "run", f"hostile{next(_names)}"
    path = scheme_file(tmp_path, body, name)
    args = [*command, *M, "--init-file", path, "--out", str(out)]
    if command[0] == "inits":
        args = [
            "inits",
            name,
            *command[2:],
            "--d-model",
            "16",
            "--heads",
            "2",
            "--init-file",
            path,
            "--out",
            str(out),
        ]
    res = runner.invoke(app, args)
    assert_one_line_error(res, "--init-file", out)
    assert "layer" in res.stderr and name in res.stderr


def test_a_catalogue_rule_that_overflows_is_refused_before_the_run(tmp_path):
    """mup's hidden std sigma * sqrt(d0 / d) at --sigma 1e308 and d = 16 is inf: a
    one-line error naming the scheme, not a traceback when the block is built."""
    out = tmp_path / "run"
    res = runner.invoke(
        app, ["variance", *M, "--layers", "2", "--init", "mup", "--sigma", "1e308", "--out", str(out)]
    )
    assert_one_line_error(res, "--init", out)
    assert "mup: role" in res.stderr and "inf" in res.stderr


def test_a_bound_far_inside_one_std_draws_a_truncated_normal_at_once():
    """bound = 1e-30 was a math domain error in effective_std and, past it, a redraw loop
    that could not end (an acceptance of 8e-31 per draw). Below 1 std the draw maps the
    normal through its CDF into [-c, c]: no redraws, every |w| inside, and the std of a
    normal truncated at c, computed here by numerical integration."""
    gen = torch.Generator().manual_seed(0)
    for c in (1e-30, 0.05, 0.5, 0.9):
        w = torch.empty(200_000, dtype=torch.float64)
        once = torch.Generator().set_state(gen.get_state())
        torch.empty(200_000, dtype=torch.float64).normal_(0.0, 1.0, generator=once)
        draw_(w, "trunc", 1.0, c, gen)
        assert torch.equal(gen.get_state(), once.get_state())  # one draw of 200,000: no redraw
        assert float(w.abs().max()) <= c
        z = np.linspace(-c, c, 200_001)
        dens = np.exp(-z * z / 2)
        want = math.sqrt(np.trapezoid(z * z * dens, z) / np.trapezoid(dens, z))
        assert effective_std("trunc", 1.0, c) == pytest.approx(want, rel=1e-6)
        assert float(w.std()) == pytest.approx(want, rel=0.01)  # 200k draws: s.e. 0.16%


def test_a_bound_of_1e_30_runs_end_to_end(tmp_path):
    """W_O drawn inside +-1e-30 runs to the end: the attention branch is too small for its
    variance to be a float32 number, so its branch_var and cross_corr are NaN, flagged as
    measured values that are not finite (not a silent 0), and the stream passes each
    attention addition unchanged; the FFN additions stay finite numbers."""
    out = tmp_path / "run"
    body = '[roles]\no = { std = "sigma", dist = "trunc", bound = "1e-30" }'
    res = runner.invoke(
        app,
        [
            "variance",
            *M,
            "--layers",
            "2",
            "--init-file",
            scheme_file(tmp_path, body),
            "--out",
            str(out),
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    assert "not finite" in res.output and "variance.csv" in res.output
    df = pd.read_csv(out / "variance.csv")
    pre = df[df["norm_position"] == "pre"].set_index("k")
    attn = pre[pre["sublayer"] == "attn"]
    assert len(attn) == 2 and attn["branch_var"].isna().all() and attn["cross_corr"].isna().all()
    for k in attn.index:  # an addition of ~1e-32 to entries ~0.02: the float32 stream is unchanged
        assert pre.loc[k, "stream_var"] == pytest.approx(pre.loc[k - 1, "stream_var"], rel=1e-6)
    ffn = pre[pre["sublayer"] == "ffn"]
    assert len(ffn) == 2 and (ffn["branch_var"] > 0).all() and np.isfinite(ffn["cross_corr"]).all()


# --- case 5: strict booleans ----------------------------------------------------------


@pytest.mark.parametrize("value", ['"false"', '"true"', "0", "1"])
def test_qk_norm_must_be_a_toml_boolean(tmp_path, value):
    """qk_norm = "false" turned QK-norm on (bool("false") is True)."""
    out = tmp_path / "run"
    res = runner.invoke(
        app,
        [
            "variance",
            *M,
            "--layers",
            "1",
            "--init-file",
            scheme_file(tmp_path, f"qk_norm = {value}"),
            "--out",
            str(out),
        ],
    )
    assert_one_line_error(res, "--init-file", out)
    assert "qk_norm" in res.stderr


def test_qk_norm_false_is_off_and_true_is_on(tmp_path):
    from tinit.cli.init_file import load_init_file

    for value, want in (("false", False), ("true", True)):
        name = f"qk{value}"
        assert load_init_file(scheme_file(tmp_path, f"qk_norm = {value}", name)).qk_norm is want


# --- case 7: names that would leave the run folder or break a CSV cell ------------------


@pytest.mark.parametrize(
    "name", ["x/../../../../ESCAPED", "a\\nb", "../up", ".hidden", "two words", "x" * 65]
)
def test_scheme_names_are_safe_for_folders_and_cells(tmp_path, name):
    out = tmp_path / "run"
    path = tmp_path / "s.toml"
    path.write_text(f'name = "{name}"\n')
    res = runner.invoke(
        app, ["sweep", "variance", *M, "--layers", "1", "--init-file", str(path), "--out", str(out)]
    )
    assert_one_line_error(res, "--init-file", out)
    assert not list(tmp_path.parent.glob("**/ESCAPED"))


def test_point_folder_names_stay_inside_points_whatever_a_label_holds():
    from tinit.experiments.points import Point

    plain = Point("variance", {"n_layers": 4, "seed": 0, "init": "depth-init", "norm_position": "pre"}, {})
    assert plain.name == "L4-seed0-depth-init-pre"  # unchanged for every catalogue name
    names = set()
    for bad in ("x/../../ESCAPED", "x/../../ESCAPEE", "a\nb", "..", ".hidden"):
        p = Point("variance", {"n_layers": 4, "seed": 0, "init": bad, "norm_position": "pre"}, {})
        assert "/" not in p.name and "\n" not in p.name and not p.name.startswith(".")
        names.add(p.name)
    assert len(names) == 5  # still one folder per point
