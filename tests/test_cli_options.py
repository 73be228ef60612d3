"""Guards the one source of options (config fields' ``flag`` metadata and
tinit.cli.options) and the one list of commands (tinit.cli.registry): every declared
option decides fields a config has, every command built from a row takes each option
under the name its declaration gives, a ConfigError about a field names the option of the
command the user ran, and no command reads its options from ``locals()``."""

import dataclasses
import re
from pathlib import Path
from typing import Annotated

import pytest
from helpers import figures_built_not_saved
from typer.main import get_command
from typer.testing import CliRunner

from tinit.cli import app, options
from tinit.cli.configs import option_for
from tinit.cli.options import DECLARED, GROUPS, Option, Param
from tinit.cli.registry import COMMANDS, SWEEPABLE, options_of
from tinit.experiments.training.claims import ClaimsConfig
from tinit.experiments.training.coord_check import CoordConfig
from tinit.experiments.training.trainer import TrainConfig
from tinit.model.config import InitConfig, ModelConfig, RunConfig
from tinit.model.flags import flag_of

runner = CliRunner()
CONFIGS = (ModelConfig, InitConfig, RunConfig, TrainConfig, ClaimsConfig, CoordConfig)
CONFIG_FIELDS = {f.name for cls in CONFIGS for f in dataclasses.fields(cls)}
CLICK = get_command(app).commands
BUILT = [c for c in COMMANDS if not c.passes_options]
ROOT = Path(__file__).resolve().parent.parent


def test_declared_fields_are_config_fields():
    """An option's fields and the field a flag negates are fields of a config: a typo
    would leave a ConfigError unnamed and a preset field unset."""
    for o in DECLARED:
        for f in (*o.fields, *([o.negates] if o.negates else [])):
            assert f in CONFIG_FIELDS, (o.param, f)


def test_a_flagged_field_is_one_option_of_its_group():
    """Every field with ``flag`` metadata is an option of its config's group, named as
    the metadata says (the field's name, or ``param=`` for a negation)."""
    groups = {ModelConfig: "model", InitConfig: "init", RunConfig: "run", TrainConfig: "train"}
    for cls, name in groups.items():
        taken = {o.param: o for o in GROUPS[name]}
        for f in dataclasses.fields(cls):
            spec = flag_of(f)
            if spec is None:
                continue
            o = taken[spec.param or f.name]
            assert o.flag == spec.decls[0].split("/")[0], (cls.__name__, f.name)
            assert (o.negates or o.fields[0]) == f.name


@pytest.mark.parametrize("command", BUILT, ids=lambda c: c.name)
def test_the_built_command_takes_its_declared_options(command):
    """The click command's parameters carry the declared names and flags, and a row's
    group options are all there but for the ones it leaves out."""
    params = {p.name: p for p in CLICK[command.name].params}
    declared = options_of(command.name)
    for o in declared:
        assert o.flag in params[o.param].opts, (command.name, o.param)
    for name in command.groups:
        for o in GROUPS[name]:
            kept = o.param not in command.skip and (not command.only or o.param in command.only)
            taken = o.many if o.param in command.lists else o
            assert (taken in declared) == kept, (command.name, o.param)


def test_every_command_takes_out_and_quiet_but_sweep():
    for c in COMMANDS:
        taken = {p.name for p in CLICK[c.name].params}
        assert ({"out", "quiet"} <= taken) != c.passes_options, c.name


def test_registry_is_the_app():
    """The app's commands are the registry's, in its order (the order of `tinit --help`),
    and the sweepable ones pass a plan (depth-sweep first, its main use)."""
    assert list(CLICK) == [c.name for c in COMMANDS]
    assert SWEEPABLE[0] == "depth-sweep"
    assert set(SWEEPABLE) == {"depth-sweep", "variance", "grad-norms", "lr-sweep", "coord-check"}


@pytest.mark.parametrize("command", BUILT, ids=lambda c: c.name)
def test_an_error_names_the_option_of_the_command_run(command):
    """For each field a command's option sets as it is, a ConfigError about that field
    names that option, not another command's nor a list option deciding it too
    (coord-check's --d-model list decides d_ff, but a d_ff error names --d-ff)."""
    params = CLICK[command.name].params
    for o in options_of(command.name):
        field = o.negates or (o.fields[0] if o.fields and o.lists is None else None)
        if field is None or field == "scheme":
            continue
        assert option_for(field, params) == o.flag, (command.name, field)


@pytest.mark.parametrize(
    "argv, option",
    [
        (["variance", "--heads", "3", "--d-model", "16"], "'--heads'"),  # n_heads
        (["params", "--kv-heads", "3", "--heads", "4", "--d-model", "16"], "'--kv-heads'"),  # n_kv_heads
        (["train", "--layers", "0"], "'--layers'"),  # the depth list decides n_layers
        (["depth-sweep", "--layers", "2", "--heads", "3"], "'--heads'"),
        (["coord-check", "--d-model", "30", "--heads", "2", "--layers", "2"], "'--heads'"),  # d_h 15: RoPE
    ],
)
def test_a_config_error_names_the_option(tmp_path, argv, option):
    res = runner.invoke(app, [*argv, "--out", str(tmp_path / "run")])
    assert res.exit_code == 2, res.output
    line = res.stderr.strip()
    assert line.startswith("Error: ") and option in line and "\n" not in line, line
    assert not (tmp_path / "run").exists()


def test_no_command_reads_its_options_from_locals():
    """Commands get an Options value from the generated command, never ``locals()``; the
    CLI does not inspect signatures to decide what to call (runner.py and sweep.py, the
    grid's files, are checked by their own owner)."""
    for path in (ROOT / "tinit" / "cli").glob("*.py"):
        if path.name in ("runner.py", "sweep.py"):
            continue
        text = path.read_text()
        assert "locals()" not in text, path.name
        assert not re.search(r"inspect\.signature\(|_accepts\(", text), path.name


# --- every option declared once ---------------------------------------------------------------------

#: A command's own option that shares a flag with a shared one and means something else:
#: audit's --init names the one scheme to re-draw the audited model with (or none), not
#: the schemes a run measures.
OWN_MEANING = {"--init": "audit"}


def _flags(info) -> set[str]:
    decls = [d for d in (info.default, *(info.param_decls or ())) if isinstance(d, str)]
    return {f for d in decls for f in d.split("/") if f.startswith("--")}


def declarations(rows=COMMANDS) -> dict[str, list[str]]:
    """Every declaration of an option and its flags: a config field's ``flag`` metadata
    (its list form included), an option of tinit.cli.options, a command's own (its
    module's OPTIONS that are not shared ones): flag -> the declarations naming it."""
    out: dict[str, list[str]] = {}
    for cls in CONFIGS:
        for f in dataclasses.fields(cls):
            if (spec := flag_of(f)) is not None:
                for flag in {x for d in spec.decls for x in d.split("/") if x.startswith("--")}:
                    out.setdefault(flag, []).append(f"{cls.__name__}.{f.name}")
    for name, value in vars(options).items():
        if isinstance(value, Option):
            for flag in _flags(value.info):
                out.setdefault(flag, []).append(f"tinit.cli.options.{name}")
    shared = [*DECLARED, *(v for v in vars(options).values() if isinstance(v, Option))]
    for c in rows:
        for o in c.options:
            if any(o is d for d in shared):
                continue
            info = o.info if isinstance(o, Option) else o.annotation.__metadata__[0]
            for flag in _flags(info):
                out.setdefault(flag, []).append(f"{c.name}'s {o.param}")
    return out


def test_no_option_is_declared_twice():
    """An option is one declaration: a command takes a shared option by its registry row
    (its groups, its defaults and help there) or by naming the declaration in its
    OPTIONS, never by declaring the flag again (--seeds was declared five times, --lr
    four, --param-rules twice with two types)."""
    twice = {flag: where for flag, where in declarations().items() if len(where) > 1}
    for flag, command in OWN_MEANING.items():
        assert f"{command}'s" in " ".join(twice.pop(flag, [])), flag  # (the exception still exists)
    assert not twice, f"declared more than once (take the shared declaration instead): {twice}"


def test_a_command_declaring_a_shared_option_again_is_seen():
    """The check above sees a command's own --seeds beside the shared one."""
    import typer

    again = Param("seeds", Annotated[int, typer.Option("--seeds", help="Seeds.")], 1)
    rows = [
        dataclasses.replace(c, options=(*c.options, again)) if c.name == "variance" else c for c in COMMANDS
    ]
    assert declarations(rows)["--seeds"] == ["tinit.cli.options.SEEDS", "variance's seeds"]


# --- --adam-eps: declared once (TrainConfig.eps), taken by every training command ---


def test_adam_eps_is_taken_by_the_training_commands():
    for name in ("train", "lr-sweep", "claims", "coord-check"):
        params = {p.name: p for p in CLICK[name].params}
        assert "--adam-eps" in params["eps"].opts and params["eps"].default == 1e-8, name
    for name in ("variance", "grad-norms", "depth-sweep", "check", "inits"):
        assert "eps" not in {p.name for p in CLICK[name].params}, name


def _adamw_groups(monkeypatch) -> list:
    """The param groups of every AdamW built while the test runs (what the optimizer
    steps with, not what config.json says)."""
    import torch

    built = []

    class Recording(torch.optim.AdamW):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            built.append(self.param_groups)

    monkeypatch.setattr(torch.optim, "AdamW", Recording)
    return built


@pytest.mark.parametrize("command", ["train", "coord-check"])
def test_adam_eps_reaches_the_optimizer_and_config_json(tmp_path, monkeypatch, command):
    """megatron-mup divides the hidden matrices' eps by m = d / d0 (its optimizer rules,
    Megatron-LM get_mup_config_overrides): at d = 32, d0 = 16 they step with eps / 2, the
    other groups with eps itself; config.json records the value given."""
    import json

    figures_built_not_saved(monkeypatch)  # (the optimizer and config.json; the figures: test_train)
    built = _adamw_groups(monkeypatch)
    eps, out = 3e-6, tmp_path / "run"
    shape = ["--d-model", "32", "--heads", "2", "--seq-len", "8", "--batch", "2", "--vocab", "16",
             "--layers", "1", "--steps", "1", "--init", "megatron-mup", "--base-width", "16"]  # fmt: skip
    extra = ["--seeds", "1"] if command == "coord-check" else ["--eval-batches", "1"]
    res = runner.invoke(app, [command, *shape, *extra, "--adam-eps", str(eps), "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    assert built, "no AdamW was built"
    for groups in built:
        got = {g["name"]: g["eps"] for g in groups}
        assert got["hidden_matrix"] == pytest.approx(eps / 2, rel=1e-12)
        assert all(v == pytest.approx(eps, rel=1e-12) for k, v in got.items() if k != "hidden_matrix"), got
    config = json.loads((out / "config.json").read_text())
    recorded = config["train"]["eps"] if command == "train" else config["coord"]["eps"]
    assert recorded == eps


def test_adam_eps_must_be_positive(tmp_path):
    res = runner.invoke(app, ["lr-sweep", "--adam-eps", "0", "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and "'--adam-eps'" in res.stderr and "\n" not in res.stderr.strip()
    assert not (tmp_path / "run").exists()


def test_options_page_lists_every_shared_option():
    """docs/reference/options.md's table has a row for every shared option (each declared
    on a config field or in tinit.cli.options), under each of its flags: an option added
    without rewriting the page fails here (and tests/test_docs.py names the command that
    rewrites it)."""
    page = (ROOT / "docs" / "reference" / "options.md").read_text()
    rows = {m.group(1) for m in re.finditer(r"^\| (`[^|]*`) \|", page, re.M)}
    listed = {f for row in rows for f in re.findall(r"`([^`]+)`", row)}
    for o in DECLARED:
        assert o.flag in " ".join(listed), f"{o.flag} is not on docs/reference/options.md"
