"""Guards the GPU scripts (a session lent the device machine has minutes, not hours):
`benchmarks/device_check.sh`, which runs every GPU check in one call, must run end to
end here too, where it falls back to tiny sizes on the CPU, and bring back its files;
`benchmarks/bench_gpu.py` inside it must print and write its whole table.

Each step's `python` is a fork of one interpreter that imported torch, pandas,
matplotlib, pytest and transformers once (tests/forkserver.py): nine imports of torch
were 27 of the 45 s CPU this test took. The script, its steps, their arguments, exit
codes, timeouts and files are the script's own; single-threaded torch, as every test
here runs (tests/conftest.py: two OpenMP threads on the two cores cost bench_gpu.py's
tiny cases 7 s CPU instead of 0.6)."""

import csv
import os
import subprocess
from pathlib import Path

from forkserver import forkserver

ROOT = Path(__file__).resolve().parents[1]
BACK = {  # what device_check.sh leaves under $OUT: at most 8 files come back from the device
    "device_check.log", "device_table.csv", "gpu_tests.txt", "bench_gpu.csv", "norms.png",
    "train_runs.csv", "audit_config.json", "ckpt_audit_config.json",
}  # fmt: skip
#: every command's GPU path is a step of the script (issue 25), each with its own row
STEPS = {
    "versions",
    "gpu-tests",
    "bench-gpu",
    "variance-70b",
    "norms",
    "train",
    "audit-7b",
    "coord-check",
    "ckpt-write",
    "ckpt-audit",
    "ckpt-peer",
    "table",
}


#: Every figure a step makes is built, its file made empty, not rendered (coord-check's
#: and audit's PNGs were 9 of the 16 s CPU left): the figures are drawn under the
#: reader's rules by tests/test_reader_rules.py and rendered by their commands' tests
#: (norms.png: test_norms.py, coord_check.png: test_cli_fuzz_commands.py, audit's:
#: test_audit_module.py); here the script's steps, exit codes and files are the subject.
BUILT_NOT_SAVED = f"""
import sys
sys.path.insert(0, {str(ROOT / "tests")!r})
import pytest
from helpers import figures_built_not_saved
figures_built_not_saved(pytest.MonkeyPatch())
"""


def test_device_check_runs_every_step_small(tmp_path):
    out = tmp_path / "out"
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    same = {"OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
    with forkserver(tmp_path / "python", same, setup=BUILT_NOT_SAVED) as python:
        env = {**os.environ, **same, "OUT": str(out), "PYTHON": str(python)}
        cmd = ["bash", str(ROOT / "benchmarks" / "device_check.sh")]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "every step passed" in res.stdout and "!!!" not in res.stdout
    assert "NO CUDA: tiny sizes" in res.stdout  # here it must say its figures are not GPU figures
    back = {p.name for p in out.iterdir()}
    assert back <= BACK and len(BACK) <= 8
    # the coordinate check's figure comes back where the command exists; audit needs transformers
    assert BACK - back <= {"coord_check.png", "audit_config.json"}, BACK - back
    table = list(csv.DictReader(open(out / "device_table.csv")))
    whole = {r["step"]: r["verdict"] for r in table if r["figure"].endswith(": whole step")}
    assert set(whole) == STEPS - {"table"} and set(whole.values()) <= {"meets", "skipped"}, whole
    figures = {r["figure"] for r in table}
    assert "train tokens/s (drawing the data included)" in figures
    assert any(f.startswith("LayerNorm / RMSNorm time") for f in figures)
    assert "FAILED" not in (out / "bench_gpu.csv").read_text()
    lines = (out / "bench_gpu.csv").read_text().splitlines()
    assert lines[0] == "case,value,peak_gib,target"
    assert len(lines) == 1 + 2 + 4 + 2 + 1  # variance x2, forward x4, two ratios, grad-norms
