"""Guards the one source of options (tinit.cli.options) and the one list of commands
(tinit.cli.registry): a command's parameter carrying a shared option is named as the
option's declaration says (configs are built from the values by that name, so a
misnamed one would silently leave its field at the config's default), the fields an
option declares it decides exist in a config, and a ConfigError about a field names
the option the running command offers for it."""

import dataclasses
import importlib
import typing

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from tinit.cli import app
from tinit.cli.options import FIELDS, NEGATED, OPTION_OF
from tinit.cli.registry import COMMANDS, SWEEPABLE
from tinit.experiments.training.claims import ClaimsConfig
from tinit.experiments.training.trainer import TrainConfig
from tinit.model.config import InitConfig, ModelConfig, RunConfig

runner = CliRunner()
CONFIG_FIELDS = {f.name for cls in (ModelConfig, InitConfig, RunConfig, TrainConfig, ClaimsConfig)
                 for f in dataclasses.fields(cls)}  # fmt: skip


def _shared(command) -> dict[str, str]:
    """The command's parameters that carry a shared option: parameter -> the name its
    declaration gives (the last item of the Annotated alias)."""
    fn = getattr(importlib.import_module(f"tinit.cli.{command.module}"), command.function)
    out = {}
    for param, hint in typing.get_type_hints(fn, include_extras=True).items():
        extra = getattr(hint, "__metadata__", ())
        if len(extra) == 2 and isinstance(extra[1], str):
            out[param] = extra[1]
    return out


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_shared_options_are_taken_under_their_declared_name(command):
    for param, declared in _shared(command).items():
        assert param == declared, (command.name, param, declared)


def test_every_command_takes_shared_options_but_sweep():
    """sweep passes its options on; every other command takes at least --out and --quiet."""
    for c in COMMANDS:
        taken = set(_shared(c))
        assert ({"out", "quiet"} <= taken) != c.passes_options, c.name


def test_declared_fields_are_config_fields():
    """An option's declared fields (besides its own name) and the fields flags negate are
    fields of a config: a typo would leave a ConfigError unnamed and a preset field unset."""
    for name, fields in FIELDS.items():
        for f in fields:
            assert f == name or f in CONFIG_FIELDS, (name, f)
    assert set(NEGATED) <= CONFIG_FIELDS and set(NEGATED.values()) <= set(OPTION_OF)


def test_registry_is_the_app():
    """The app's commands are the registry's, in its order (the order of `tinit --help`),
    and the sweepable ones pass a plan (depth-sweep first, its main use)."""
    assert list(get_command(app).commands) == [c.name for c in COMMANDS]
    assert SWEEPABLE[0] == "depth-sweep"
    assert set(SWEEPABLE) == {"depth-sweep", "variance", "grad-norms", "lr-sweep", "coord-check"}


@pytest.mark.parametrize(
    "argv, option",
    [
        (["variance", "--heads", "3", "--d-model", "16"], "'--heads'"),  # n_heads
        (["params", "--kv-heads", "3", "--heads", "4", "--d-model", "16"], "'--kv-heads'"),  # n_kv_heads
        (["train", "--layers", "0"], "'--layers'"),  # the depth list decides n_layers
        (["depth-sweep", "--layers", "2", "--heads", "3"], "'--heads'"),
    ],
)
def test_a_config_error_names_the_option(tmp_path, argv, option):
    res = runner.invoke(app, [*argv, "--out", str(tmp_path / "run")])
    assert res.exit_code == 2, res.output
    line = res.stderr.strip()
    assert line.startswith("Error: ") and option in line and "\n" not in line, line
    assert not (tmp_path / "run").exists()
