"""Issue 30, silent conflicts and misleading messages: each case reproduced.

Options that contradicted each other ran one of them (--norm-position post --pre-norm),
one scheme ran twice under two names (--init gpt2,scaled), a user scheme could be named
``all``; --set K=1 --set K=3 kept 3; --warmup 100 --steps 3 reported lr* at a peak never
reached; lr-sweep dropped --d-ff; a trunc bound of 1e-30 wrote cross_corr = inf. Errors
blamed the wrong option (--layers 100000: --d-model; a preset with a width list: --d-ff;
width 2 with 2 heads: --heads; --out "" read "."). The library took
CoordConfig(param_rules="off") as on, a negative lr or beta1 = 2 until torch failed,
widths=[] or [32, 32], and iterated inits="gpt2" by character. coord-check drew one panel
per step (52 s of plotting at --steps 60). Typer's pydantic wording leaked into messages."""

import json
import math

import pandas as pd
import pytest
import torch
from helpers import assert_one_line_error, figures_built_not_saved, final_result_only
from typer.testing import CliRunner

from tinit.cli import app
from tinit.experiments import memory
from tinit.experiments.audit.loaders import parse_set
from tinit.experiments.measure.variance import run_variance
from tinit.experiments.training.coord_check import CoordConfig, make_grid, run_coord_check
from tinit.experiments.training.grid import grid_specs
from tinit.experiments.training.trainer import TrainConfig
from tinit.model import Transformer
from tinit.model.catalogue import parse_init_list
from tinit.model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from tinit.model.formula import FormulaError
from tinit.model.param_rules import optimizer_groups
from tinit.model.scheme_file import parse_scheme
from tinit.results.plot_coord_check import MAX_STEP_PANELS, panel_steps, plot_coord_layers, plot_coord_width

runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_png(monkeypatch):
    """Every run here is asserted on a finished run's CSVs, config.json, exit code and
    messages: its figures are built, not rendered (tests/test_reader_rules.py draws every
    command's; the step panels are drawn by their plot functions here), and no result so
    far is re-assembled after each unit (tests/test_run_promises.py and
    test_hostile_train.py hold the partial results to their rules)."""
    figures_built_not_saved(monkeypatch)
    final_result_only(monkeypatch)


M = ["--d-model", "32", "--heads", "2", "--seq-len", "16", "--batch", "2", "--vocab", "64"]
QUICK = ["--eval-batches", "1", "--probe-points", "0", "--device", "cpu"]


# --- options that contradict each other -------------------------------------------------


@pytest.mark.parametrize("flag", ["--pre-norm", "--post-norm"])
@pytest.mark.parametrize("command", ["variance", "grad-norms", "depth-sweep", "train"])
def test_norm_position_and_a_placement_flag_conflict(tmp_path, command, flag):
    """--norm-position post --pre-norm ran post only."""
    out = tmp_path / "run"
    res = runner.invoke(
        app, [command, *M, "--layers", "1", "--norm-position", "post", flag, "--out", str(out)]
    )
    assert_one_line_error(res, "--norm-position", out)
    assert flag in res.stderr and "conflicts" in res.stderr


@pytest.mark.parametrize("spec", ["gpt2,scaled", "scaled,gpt2"])
def test_a_scheme_under_its_name_and_its_alias_is_refused(tmp_path, spec):
    """--init gpt2,scaled ran gpt2 twice, as two schemes."""
    out = tmp_path / "run"
    res = runner.invoke(app, ["variance", *M, "--layers", "1", "--init", spec, "--out", str(out)])
    assert_one_line_error(res, "--init", out)
    assert "'gpt2'" in res.stderr and "'scaled'" in res.stderr


def test_all_or_both_with_a_named_scheme_runs_it_once():
    assert parse_init_list("both,gpt2") == ("naive", "scaled")
    assert parse_init_list("gpt2,both") == ("gpt2", "naive")
    every = parse_init_list("all,scaled")
    assert "scaled" not in every and every.count("gpt2") == 1
    assert parse_init_list("gpt2,gpt2") == ("gpt2",)  # the same name twice: one scheme, one name


@pytest.mark.parametrize("name", ["all", "both", "ALL", "scaled", "gpt2"])
def test_a_user_scheme_may_not_take_a_reserved_or_catalogue_name(name):
    """A TOML scheme named `all` or `both` could never be chosen by --init (it means a list)."""
    with pytest.raises(FormulaError) as exc:
        parse_scheme({"name": name, "roles": {"o": "sigma"}}, "mine.toml")
    assert "mine.toml" in str(exc.value) and repr(name) in str(exc.value)


def test_a_user_scheme_named_all_is_refused_on_the_command_line(tmp_path):
    f = tmp_path / "all.toml"
    f.write_text('name = "all"\n[roles]\no = "sigma"\n')
    out = tmp_path / "run"
    res = runner.invoke(app, ["variance", *M, "--layers", "1", "--init-file", str(f), "--out", str(out)])
    assert_one_line_error(res, "--init-file", out)
    assert "'all'" in res.stderr


def test_a_set_key_given_twice_is_refused():
    """audit --set K=1 --set K=3 kept 3."""
    with pytest.raises(ConfigError) as exc:
        parse_set(["num_hidden_layers=1", "num_hidden_layers=3"])
    assert exc.value.field == "--set" and "num_hidden_layers" in exc.value.message
    assert parse_set(["a=1", "b=2"]) == {"a": 1, "b": 2}


# --- warmup and steps ---------------------------------------------------------------------


@pytest.mark.parametrize("command", ["train", "lr-sweep", "claims"])
def test_a_warmup_longer_than_the_run_is_refused(tmp_path, command):
    """--warmup 100 --steps 3: the lr* reported was a peak the schedule never reached."""
    out = tmp_path / "run"
    layers = [] if command == "claims" else ["--layers", "1"]
    res = runner.invoke(
        app, [command, *M, *layers, *QUICK, "--steps", "3", "--warmup", "100", "--out", str(out)]
    )
    assert_one_line_error(res, "--warmup", out)
    assert "--steps 3" in res.stderr


def test_the_default_warmup_of_a_short_run_ends_at_its_last_step(tmp_path):
    """--steps 3 and the default warmup (30): the runs record a warmup of 3, whose peak
    the last step reaches (lr_factor: (step + 1) / warmup = 1 at step 2)."""
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", *M, "--layers", "1", *QUICK, "--steps", "3", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    runs = pd.read_csv(out / "runs.csv")
    assert set(runs["warmup"]) == {3}
    res = runner.invoke(
        app,
        [
            "train",
            *M,
            "--layers",
            "1",
            *QUICK,
            "--steps",
            "3",
            "--warmup",
            "3",
            "--out",
            str(tmp_path / "exact"),
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output


# --- lr-sweep's FFN width ----------------------------------------------------------------


def test_one_width_keeps_its_d_ff():
    """lr-sweep --d-model 32 --d-ff 64 trained with d_ff 128 (each width's default)."""
    model = ModelConfig(n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=64)
    specs = grid_specs(model, InitConfig(), ["naive"], ["pre"], [1], [0], [1e-2], [0], widths=[32])
    assert {s.model.d_ff for s in specs} == {64}
    several = grid_specs(model, InitConfig(), ["naive"], ["pre"], [1], [0], [1e-2], [0], widths=[32, 64])
    assert [s.model.d_ff for s in several] == [128, 192]  # 8d/3 rounded up to 64: 85.3 -> 128, 170.7 -> 192


def test_lr_sweep_trains_the_d_ff_given(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(
        app,
        [
            "lr-sweep",
            *M,
            "--d-ff",
            "64",
            "--layers",
            "1",
            *QUICK,
            "--steps",
            "1",
            "--lr",
            "1e-2",
            "--init",
            "naive",
            "--norm-position",
            "pre",
            "--out",
            str(out),
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    assert set(pd.read_csv(out / "runs.csv")["d_ff"]) == {64}


def test_a_preset_with_a_width_list_is_not_blamed_on_d_ff(tmp_path):
    """--preset gpt2-small --d-model 48,96: "--d-ff: leave --d-ff out" (never given). Each
    width takes its default FFN width (gelu: 4d); the preset's other fields stay."""
    out = tmp_path / "run"
    preset = ["--preset", "gpt2-small", "--d-model", "48,96", "--heads", "2", "--vocab", "64"]
    run = ["--layers", "1", "--seq-len", "8", "--batch", "2", *QUICK, "--steps", "1", "--lr", "1e-2"]
    grid = ["--init", "naive", "--norm-position", "pre", "--out", str(out), "-q"]
    res = runner.invoke(app, ["lr-sweep", *preset, *run, *grid])
    assert res.exit_code == 0, res.output
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs["d_ff"]) == [4 * 48, 4 * 96] and set(runs["norm"]) == {"layernorm"}
    res = runner.invoke(
        app, ["lr-sweep", *M[2:], "--d-model", "32,64", "--d-ff", "64", "--layers", "1", "--out", str(out)]
    )
    assert_one_line_error(res, "--d-ff")


# --- a branch too small for its variance --------------------------------------------------


def _variance_pre(out, *args):
    """``tinit variance`` at $M, pre-norm, on the CPU, quietly into ``out``."""
    return runner.invoke(app, ["variance", *M, *args, "--norm-position", "pre", "--device", "cpu",
                               "--out", str(out), "-q"])  # fmt: skip


@pytest.mark.parametrize("role", ["o", "down"])
def test_a_tiny_trunc_bound_writes_no_infinite_correlation(tmp_path, role):
    """bound = 1e-30: the branch's float32 variance underflowed to 0 while its covariance
    did not, and cross_corr was written inf (and not counted as not finite)."""
    f = tmp_path / "tiny.toml"
    f.write_text(f'name = "tiny"\n[roles]\n{role} = {{ std = "sigma", dist = "trunc", bound = "1e-30" }}\n')
    out = tmp_path / "run"
    res = _variance_pre(out, "--layers", "2", "--init-file", str(f))
    assert res.exit_code == 0, res.output
    text = (out / "variance.csv").read_text()
    assert "inf" not in text
    rows = pd.read_csv(out / "variance.csv")
    sub = rows[rows["sublayer"] == ("attn" if role == "o" else "ffn")]
    assert sub["cross_corr"].isna().all() and sub["branch_var"].isna().all()
    assert "not finite" in res.stderr  # flagged, not silent


def test_a_zero_branch_still_has_no_correlation_by_design(tmp_path):
    out = tmp_path / "run"
    res = _variance_pre(out, "--layers", "1", "--init", "zero-out")
    assert res.exit_code == 0, res.output
    rows = pd.read_csv(out / "variance.csv", keep_default_na=False)
    adds = rows[rows["k"] > 0]
    assert (adds["branch_var"].astype(float) == 0).all() and (adds["cross_corr"] == "").all()
    assert "not finite" not in res.stderr


# --- the option an error names --------------------------------------------------------------


def test_a_deep_model_that_does_not_fit_blames_layers(tmp_path, monkeypatch):
    """lr-sweep --layers 100000 (d=32): "Invalid value for '--d-model'"."""
    monkeypatch.setattr(memory, "available_memory", lambda device: 2**30)  # (the one pre-check)
    out = tmp_path / "run"
    res = runner.invoke(app, ["lr-sweep", *M, "--layers", "100000", *QUICK, "--out", str(out)])
    assert_one_line_error(res, "--layers", out)
    wide = ["--d-model", "20000", "--heads", "2", "--seq-len", "16", "--batch", "2", "--vocab", "64"]
    res = runner.invoke(app, ["lr-sweep", *wide, "--layers", "2", *QUICK, "--out", str(out)])
    assert_one_line_error(res, "--d-model", out)


@pytest.mark.parametrize("command", ["variance", "lr-sweep"])
def test_a_width_too_narrow_for_its_heads_blames_d_model(tmp_path, command):
    """--d-model 2 --heads 2 (head size 1, RoPE needs an even one) blamed --heads."""
    out = tmp_path / "run"
    res = runner.invoke(app, [command, "--d-model", "2", "--heads", "2", "--layers", "1", "--out", str(out)])
    assert_one_line_error(res, "--d-model", out)
    assert "head size" in res.stderr


@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_out_is_refused_not_read_as_here(tmp_path, monkeypatch, value):
    """--out "" wrote into (or complained about) the current folder."""
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["variance", *M, "--layers", "1", "--out", value])
    assert_one_line_error(res, "--out")
    assert "empty" in res.stderr and list(tmp_path.iterdir()) == []


# --- the library refuses what torch would only later --------------------------------------


def test_coord_config_param_rules_off_means_off():
    """CoordConfig(param_rules="off") applied the rules (a non-empty string is true)."""
    assert CoordConfig(param_rules="off").param_rules is False
    assert CoordConfig(param_rules="on").param_rules is True
    with pytest.raises(ConfigError) as exc:
        CoordConfig(param_rules="no")
    assert exc.value.field == "param_rules"


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"lr": -1.0}, "lr"),
        ({"lr": math.nan}, "lr"),
        ({"lr": math.inf}, "lr"),
        ({"lr": 1e-3, "eps": 0.0}, "eps"),
        ({"lr": 1e-3, "weight_decay": -0.1}, "weight_decay"),
        ({"lr": 1e-3, "rules": "off"}, "param_rules"),
    ],
)
def test_optimizer_groups_refuses_what_torch_would_not_run(kw, field):
    model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, vocab_size=32), InitConfig())
    with pytest.raises(ConfigError) as exc:
        optimizer_groups(model, **kw)
    assert exc.value.field == field


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"beta1": 2.0}, "beta1"),
        ({"beta1": -0.1}, "beta1"),
        ({"beta2": 1.0}, "beta2"),
        ({"beta2": math.nan}, "beta2"),
        ({"lr": -1.0}, "lr"),
        ({"lr": math.nan}, "lr"),
        ({"eps": 0.0}, "eps"),
        ({"weight_decay": "0.1"}, "weight_decay"),
    ],
)
def test_train_config_refuses_betas_outside_0_1(kw, field):
    with pytest.raises(ConfigError) as exc:
        TrainConfig(**kw)
    assert exc.value.field == field
    # and torch agrees that beta1 = 2 is no Adam (it would have said so only at the first step)
    if field == "beta1" and kw["beta1"] == 2.0:
        with pytest.raises(ValueError):
            torch.optim.AdamW([torch.zeros(1, requires_grad=True)], betas=(2.0, 0.95))


TINY = ModelConfig(n_layers=1, d_model=16, n_heads=2, vocab_size=32)


@pytest.mark.parametrize(("widths", "word"), [([], "no widths"), ([32, 32], "twice"), ([0], "not a width")])
def test_run_coord_check_refuses_an_empty_or_repeated_width_axis(widths, word):
    with pytest.raises(ConfigError, match=word) as exc:
        run_coord_check(
            TINY,
            InitConfig(),
            RunConfig(device="cpu"),
            CoordConfig(steps=1),
            ["naive"],
            None,
            widths,
            [1],
            seeds=1,
        )
    assert exc.value.field == "d_model"


def test_make_grid_refuses_a_repeated_depth():
    with pytest.raises(ConfigError) as exc:
        make_grid(TINY, InitConfig(), RunConfig(), ["naive"], None, [16], [1, 1], 1)
    assert exc.value.field == "n_layers"


def test_a_single_scheme_string_is_one_scheme_not_its_characters():
    """run_variance(inits="gpt2") ran the schemes 'g', 'p', '2' (or failed on 'g')."""
    run = RunConfig(batch=2, seq_len=8, device="cpu")
    res = run_variance(TINY, InitConfig(), run, "gpt2", "pre")
    assert set(res["variance"]["init"]) == {"gpt2"} and set(res["variance"]["norm_position"]) == {"pre"}
    listed = run_variance(TINY, InitConfig(), run, ["gpt2"], ["pre"])
    pd.testing.assert_frame_equal(res["variance"], listed["variance"])
    with pytest.raises(ConfigError) as exc:
        run_variance(TINY, InitConfig(), run, ["gpt2", "scaled"], ["pre"])
    assert exc.value.field == "init"


@pytest.mark.parametrize(
    ("axes", "field"),
    [
        ({"schemes": "g"}, "init"),
        ({"lrs": "1e-2"}, "lr"),
        ({"lrs": [-1.0]}, "lr"),
        ({"lrs": [math.nan]}, "lr"),
        ({"warmups": [-1]}, "warmup"),
        ({"seeds": [0.5]}, "seed"),
        ({"depths": []}, "n_layers"),
        ({"norm_positions": "middle"}, "norm_position"),
        ({"widths": [16, 16]}, "d_model"),
    ],
)
def test_a_training_grid_checks_its_axes(axes, field):
    kw = {
        "schemes": ["naive"],
        "norm_positions": ["pre"],
        "depths": [1],
        "seeds": [0],
        "lrs": [1e-2],
        "warmups": [0],
        **axes,
    }
    with pytest.raises(ConfigError) as exc:
        grid_specs(TINY, InitConfig(), **kw)
    assert exc.value.field == field


def test_a_training_grid_reads_a_scheme_string_as_init_does():
    specs = grid_specs(TINY, InitConfig(), "naive,gpt2", "pre", [1], [0], [1e-2], [0])
    assert [s.init.scheme for s in specs] == ["naive", "gpt2"]


# --- coord-check's figures: plotting does not grow with --steps ------------------------------


def test_panel_steps_are_bounded_and_keep_the_ends():
    assert panel_steps(range(5)) == [0, 1, 2, 3, 4]
    drawn = panel_steps(range(61))
    assert len(drawn) == MAX_STEP_PANELS and drawn[0] == 0 and drawn[-1] == 60
    assert drawn == sorted(set(drawn))
    assert panel_steps(range(301)) == [0, 60, 120, 180, 240, 300]


def _rows(steps: int) -> pd.DataFrame:
    rows = [
        {
            "init": "naive",
            "norm_position": "pre",
            "d_model": d,
            "n_layers": 1,
            "seed": 0,
            "step": s,
            "layer": layer,
            "quantity": q,
            "rms": 1.0 + 0.01 * s,
        }
        for s in range(steps + 1)
        for d in (16, 32)
        for layer, q in ((-1, "embed"), (0, "attn"))
    ]
    return pd.DataFrame(rows)


def _step_panels(fig) -> list[str]:
    return [ax.get_title() for ax in fig.get_axes() if ax.get_title().startswith("step ")]


def test_coord_check_figures_draw_at_most_six_step_panels_and_say_which():
    """--steps 60 drew 61 panels per row (52 s of plotting for 1 s of measuring)."""
    rows = _rows(60)
    fit = pd.DataFrame(columns=["init", "norm_position", "axis", "verdict"])
    for fig in (plot_coord_width(rows, fit), plot_coord_layers(rows, fit, "naive", "pre", 1)):
        titles, drawn = _step_panels(fig), [f"step {s}" for s in (0, 12, 24, 36, 48, 60)]
        assert titles == drawn * (len(titles) // len(drawn)) and titles  # each row: the same six
        texts = " ".join(t.get_text() for t in fig.texts)
        assert "0, 12, 24, 36, 48, 60 of 0..60" in " ".join(texts.split())
    few = plot_coord_width(_rows(3), fit)
    assert len(_step_panels(few)) == 4 and "Panels at steps" not in " ".join(t.get_text() for t in few.texts)


# --- messages in tinit's words --------------------------------------------------------------


def test_a_bad_number_is_echoed():
    """--layers 8O: "Input should be a valid integer, unable to parse string as an integer"."""
    res = runner.invoke(app, ["variance", *M, "--layers", "8O"])
    assert_one_line_error(res, "--layers")
    assert "'8O'" in res.stderr and "Input should" not in res.stderr


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--norm", "foo"], "--norm"),
        (["--device", "tpu"], "--device"),
        (["--batch", "1.5"], "--batch"),
        (["--seed", "-1"], "--seed"),
    ],
)
def test_no_pydantic_wording_leaks(args, option):
    res = runner.invoke(app, ["variance", *M, "--layers", "1", *args])
    assert_one_line_error(res, option)
    assert "Value error" not in res.stderr and "Input should" not in res.stderr
    assert repr(args[1]) in res.stderr


@pytest.mark.parametrize(
    ("command", "args", "option", "joined"),
    [
        ("variance", ["--d-model", "64,", "128"], "--d-model", "64,128"),
        ("lr-sweep", ["--d-model", "64,", "128,", "256"], "--d-model", "64,128,256"),
        ("variance", ["--init", "gpt2,", "naive"], "--init", "gpt2,naive"),
    ],
)
def test_a_list_with_a_space_after_a_comma_names_its_option(command, args, option, joined):
    """--d-model 64, 128: "Got unexpected extra argument(s) (128)", no option named."""
    res = runner.invoke(app, [command, *args, "--layers", "1"])
    assert_one_line_error(res, option)
    assert f"{option} {joined}" in res.stderr


def test_the_config_records_the_warmup_run(tmp_path):
    """config.json's grid says the warmup that ran (the default cut to --steps)."""
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", *M, "--layers", "1", *QUICK, "--steps", "2", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    cfg = json.loads((out / "config.json").read_text())
    assert json.dumps(cfg).count('"warmups": [2]') == 1
