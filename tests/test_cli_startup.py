"""The CLI's start: --help and --version without torch, pandas or matplotlib; a Ctrl-C
while Python imports them is one line; help that reads at 80 columns.

(Start-up *time* is measured by benchmarks/bench_startup.py, not asserted here.)"""

import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import torch
from typer.main import get_command
from typer.testing import CliRunner

from tinit.cli import app

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "pandas", "matplotlib", "numpy")
COMMANDS = list(get_command(app).commands)


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=120
    )


# Runs the CLI as the console script does, then reports which heavy modules were imported.
_REPORT = f"""
import sys
sys.argv = ["tinit", *sys.argv[1:]]
from tinit.__main__ import main
try:
    main()
except SystemExit:
    pass
print("HEAVY:", ",".join(m for m in {HEAVY!r} if m in sys.modules))
"""


@pytest.mark.parametrize("argv", [["--help"], ["variance", "-h"], ["check", "-h"], ["--version"]])
def test_help_and_version_import_no_heavy_module(argv):
    out = _python(_REPORT, *argv)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("HEAVY:"), out.stdout[-300:]


def test_version_names_tinit_and_torch():
    out = _python(_REPORT, "--version")
    first = out.stdout.splitlines()[0]
    # the expected values come from the installed metadata and the imported torch here
    assert first.startswith(f"tinit {version('tinit')} ")
    assert f"torch {torch.__version__}" in first


# A finder that raises KeyboardInterrupt when torch is imported: the Ctrl-C arrives
# exactly while the command imports its dependencies.
_CTRL_C_AT_IMPORT = """
import sys
class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            raise KeyboardInterrupt
sys.meta_path.insert(0, CtrlC())
sys.argv = ["tinit", "variance", "-L", "1", "--d-model", "8", "--heads", "1", "--out", sys.argv[1]]
from tinit.__main__ import main
main()
"""


def test_ctrl_c_during_imports_is_one_line_exit_130(tmp_path):
    out = _python(_CTRL_C_AT_IMPORT, str(tmp_path / "run"))
    assert out.returncode == 130
    assert out.stderr == "Interrupted.\n"
    assert out.stdout == ""


def _help(command: list[str], monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "80")
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    return result.output


def _squash(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("command", COMMANDS)
def test_help_reads_at_80_columns(command, monkeypatch):
    text = _help([command], monkeypatch)
    assert max(map(len, text.splitlines())) <= 80
    assert "<bool>" not in text and "range>" not in text
    flat = _squash(text)
    cmd = get_command(app).commands[command]
    for param in cmd.params:
        # every help text appears whole: a word split across lines would read "floa t64"
        if param.help:
            assert _squash(param.help) in flat, (param.name, param.help)
        # an option by its names; an argument (inits NAME, sweep COMMAND) by its metavar
        option = param.param_type_name == "option"
        shown = (*param.opts, *param.secondary_opts) if option else (param.metavar,)
        for decl in shown:
            assert re.search(rf"(^|[\s,/]){re.escape(decl)}([\s,]|$)", text, re.M), decl
    # the choice lists (e.g. <float32|bfloat16|float64>) are never broken
    for choices in re.findall(r"<[^<>\s]+>", text):
        assert "|" in choices or choices in ("<str>",), choices
    for needle in ("<float32|bfloat16|float64>", "<causal|bidirectional>") if command == "variance" else ():
        assert needle in text
    # a flag takes no value: nothing follows it in the option column (no <bool> metavar)
    flags = [p for p in cmd.params if getattr(p, "is_flag", False)]
    assert flags
    for param in flags:
        decl = max(param.opts, key=len)
        row = re.search(rf"^  (?:-\w, )?{re.escape(decl)}(?: / [\w-]+)?( \S+)?", text, re.M)
        assert row is not None and row.group(1) is None, (decl, row and row.group(0))


def test_root_help_lists_every_command_and_version(monkeypatch):
    text = _help([], monkeypatch)
    assert "--version" in text
    for command in COMMANDS:
        assert re.search(rf"^\s+{command}\s", text, re.M), command


def test_a_table_column_has_one_number_format():
    from tinit.results.tables import fmt_column

    # all within 0.01 .. 10^4: plain, 4 significant digits
    assert fmt_column([0.5, 1.0, 9999.0, float("nan")]) == ["0.5", "1", "9999", "-"]
    # one value needs an exponent, so every value gets one (3 significant digits: as narrow as plain)
    assert fmt_column([5.94e-4, 0.99445, 1.0, 0.0]) == ["5.94e-4", "9.94e-1", "1.00e0", "0"]
    assert fmt_column([65536.0, 2.62144e8]) == ["6.55e4", "2.62e8"]  # never 6.554e+04 beside 2.62e8


def test_cost_line_breaks_between_values_only():
    from tinit.results.tables import cost_line

    meta = {
        "seconds": {"naive/pre": 0.58, "scaled/pre": 0.02}, "device": "cuda:0",
        "device_name": "NVIDIA H200", "run": {"dtype": "bfloat16"}, "peak_gpu_memory_gib": {"a": 6.25},
        "peak_rss_mib": 345.2,
    }  # fmt: skip
    values = ["0.6 s", "(longest: naive/pre 0.58 s)", "peak GPU memory 6.25 GiB"]
    values.append("peak process memory 345 MiB")
    one = cost_line(meta, width=300)
    assert "\n" not in one and all(v in one for v in values)
    for width in (80, 60, 45):
        text = cost_line(meta, width=width)
        assert max(map(len, text.splitlines())) <= width
        assert all(v in text for v in values), text  # each value on one line
        assert _squash(text) == _squash(one)


def test_tinit_alone_prints_the_help_and_exits_0(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    alone = CliRunner().invoke(app, [])
    assert alone.exit_code == 0
    assert alone.stdout == _help([], monkeypatch) and "Error" not in alone.output


def test_variance_summary_fits_80_columns_without_cutting_a_number():
    """The summary table of the README's main job, with numbers spanning decades as they
    do there (v_2L 3.3e-3 beside 0.79 and 1.0), renders at 80 columns with every cell
    whole: rich cuts a cell that does not fit with '…', which would hide digits."""
    import pandas as pd
    from rich.console import Console

    from tinit.results.tables import variance_table

    rows = []
    for init, pos, v, s2 in (
        ("naive", "pre", 0.7937, 5.14e-3),
        ("scaled", "pre", 3.305e-3, 1.89e-5),
        ("naive", "post", 1.001, 7.82e-4),
        ("scaled", "post", 1.0, 3.95e-6),
    ):
        rows.append({"init": init, "norm_position": pos, "v0": 3.97e-4, "branch_var_mean": s2,
                     "v_final": v, "pred_closed_final": v * 1.036, "rel_err_closed": -0.0352,
                     "pred_cumulative_final": v * 1.036, "rel_err_cumulative": -0.0352,
                     "max_abs_cross_corr": 0.0763})  # fmt: skip
    console = Console(width=80, record=True, color_system=None)
    console.print(variance_table(pd.DataFrame(rows), "Residual-stream variance (L=80, d=256, heads=4, ...)"))
    text = console.export_text()
    assert "…" not in text, text
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "7.94e-1" in text and "3.31e-3" in text  # one exponent format in the column
