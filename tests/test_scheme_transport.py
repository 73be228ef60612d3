"""A user's scheme travels with the run's config: it pickles and equals itself after the
trip. (That `tinit sweep COMMAND --init-file` (points in worker processes, which share no
memory with the command) writes the same CSVs as `tinit COMMAND --init-file`, with the
reference page's example scheme: tests/test_sweep_equals_run.py, every sweepable command.)"""

import pickle
import re
from pathlib import Path

import pytest

from tinit.model.catalogue import CATALOGUE
from tinit.model.config import InitConfig
from tinit.model.formula import FormulaError
from tinit.model.scheme_file import load_scheme, parse_scheme

ROOT = Path(__file__).resolve().parents[1]


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


# `tinit sweep --init-file` equal to the command with the same file (the reference page's
# example scheme, through real worker processes and a SLURM task): tests/test_sweep_equals_run.py
