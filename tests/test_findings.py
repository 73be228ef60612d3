"""Every number the README and the reference pages quote comes from a script in
docs/findings/ (issue 43): each script still runs (at a reduced size: its `--small`),
writes the same quantities its committed JSON holds, and the text quotes that JSON:
each finding's `quotes(data)` (the strings the docs must hold, formatted from the
committed JSON) is found in the page it names. A number changed by hand in the README,
or a script whose output the README no longer matches after a regeneration, fails here."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FINDINGS = ROOT / "docs" / "findings"
#: The findings with a reduced size and a quotes() function.
QUOTED = ("readme", "training", "mf_depth", "coord_check")


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"finding_{name}", FINDINGS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (a dataclass looks its module up there)
    spec.loader.exec_module(mod)
    return mod


def _keys(x, depth: int = 2) -> set:
    """The structure of a JSON value down to ``depth`` levels (its keys' paths)."""
    if not isinstance(x, dict) or depth == 0:
        return set()
    out = set()
    for k, v in x.items():
        out.add(k)
        out |= {f"{k}.{sub}" for sub in _keys(v, depth - 1)}
    return out


@pytest.mark.parametrize("name", QUOTED)
def test_the_docs_quote_the_committed_numbers(name):
    mod = _module(name)
    data = json.loads((FINDINGS / f"{name}.json").read_text())
    for page, strings in mod.quotes(data).items():
        text = (ROOT / page).read_text()
        missing = [s for s in strings if s not in text]
        assert not missing, f"{page} does not quote docs/findings/{name}.json: {missing}"


@pytest.mark.parametrize("name", ["readme", "training", "coord_check"])
def test_each_finding_runs_at_a_reduced_size(name, tmp_path):
    """The script runs end to end (its commands, its reading of their CSVs, its figure)
    and writes the quantities the committed JSON holds."""
    cmd = [sys.executable, str(FINDINGS / f"{name}.py"), "--small", "--work", str(tmp_path / "work"),
           "--out", str(tmp_path / "out")]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    got = json.loads((tmp_path / "out" / f"{name}.json").read_text())
    committed = json.loads((FINDINGS / f"{name}.json").read_text())
    assert _keys(got) == _keys(committed)
