"""A user's scheme travels with the run's config: it pickles, equals itself after the
trip, and `tinit sweep variance --init-file` (points in spawned workers, which share no
memory with the command) writes the same CSVs as `tinit variance --init-file`."""

import pickle
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tinit.cli import app
from tinit.model.catalogue import CATALOGUE
from tinit.model.config import InitConfig
from tinit.model.formula import FormulaError
from tinit.model.scheme_file import load_scheme, parse_scheme

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _readme_toml(tmp_path) -> Path:
    """The reference page's own --init-file example."""
    page = (ROOT / "docs" / "reference" / "inits.md").read_text()
    toml = re.search(r"```toml\n(.*?)```", page, flags=re.S).group(1)
    path = tmp_path / "my.toml"
    path.write_text(toml)
    return path


def test_schemes_and_configs_pickle(tmp_path):
    custom = load_scheme(_readme_toml(tmp_path))
    init = InitConfig(scheme=custom.name, schemes=(custom,))
    back = pickle.loads(pickle.dumps(init))
    assert back == init and back.definition == custom
    assert back.definition.rules["down"].bound.text == "3 * std"
    for s in CATALOGUE.values():  # every catalogue scheme too (its formulas travel as text)
        assert pickle.loads(pickle.dumps(s)) == s
    with pytest.raises(ValueError, match="is not one of"):  # a name nobody carries is refused
        InitConfig(scheme=custom.name)


def test_toml_errors_are_the_librarys_own_type(tmp_path):
    with pytest.raises(FormulaError, match="role o: .*unknown variable 'depth'"):
        parse_scheme({"name": "x", "roles": {"o": "sigma * depth"}}, "x.toml")
    with pytest.raises(FormulaError, match="taken by the catalogue"):
        parse_scheme({"name": "gpt2"}, "x.toml")
    with pytest.raises(FormulaError, match="no such file"):
        load_scheme(tmp_path / "missing.toml")


def test_sweep_with_an_init_file_equals_the_command(tmp_path):
    path = _readme_toml(tmp_path)
    shape = ["--layers", "3", "--d-model", "32", "--heads", "2", "--seq-len", "8", "--batch", "2",
             "--vocab", "64",
             "--init-file", str(path), "--init", "per-layer-gpt2,naive"]  # fmt: skip
    sw = runner.invoke(
        app, ["sweep", "variance", "--workers", "1", *shape, "-q", "--out", str(tmp_path / "s")]
    )
    assert sw.exit_code == 0, sw.output
    one = runner.invoke(app, ["variance", *shape, "-q", "--out", str(tmp_path / "v")])
    assert one.exit_code == 0, one.output
    for stem in ("variance", "summary"):
        assert (tmp_path / "s" / f"{stem}.csv").read_bytes() == (tmp_path / "v" / f"{stem}.csv").read_bytes()
