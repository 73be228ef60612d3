"""Guards the GPU scripts (a session lent the device machine has minutes, not hours):
`benchmarks/device_check.sh`, which runs every GPU check in one call, must run end to
end here too, where it falls back to tiny sizes on the CPU, and bring back its files;
`benchmarks/bench_gpu.py` inside it must print and write its whole table."""

import csv
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACK = {  # what device_check.sh leaves under $OUT: at most 8 files come back from the device
    "device_check.log", "device_table.csv", "gpu_tests.txt", "bench_gpu.csv", "norms.png",
    "train_runs.csv", "audit_config.json", "coord_check.png",
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
    "table",
}


def test_device_check_runs_every_step_small(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    script = ROOT / "benchmarks" / "device_check.sh"
    cmd = ["bash", str(script)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "every step passed" in res.stdout and "!!!" not in res.stdout
    assert "NO CUDA: tiny sizes" in res.stdout  # here it must say its figures are not GPU figures
    back = {p.name for p in tmp_path.iterdir()}
    assert back <= BACK and len(BACK) <= 8
    # the coordinate check's figure comes back where the command exists; audit needs transformers
    assert BACK - back <= {"coord_check.png", "audit_config.json"}, BACK - back
    table = list(csv.DictReader(open(tmp_path / "device_table.csv")))
    whole = {r["step"]: r["verdict"] for r in table if r["figure"].endswith(": whole step")}
    assert set(whole) == STEPS - {"table"} and set(whole.values()) <= {"meets", "skipped"}, whole
    figures = {r["figure"] for r in table}
    assert "train tokens/s (drawing the data included)" in figures
    assert any(f.startswith("LayerNorm / RMSNorm time") for f in figures)
    assert "FAILED" not in (tmp_path / "bench_gpu.csv").read_text()
    lines = (tmp_path / "bench_gpu.csv").read_text().splitlines()
    assert lines[0] == "case,value,peak_gib,target"
    assert len(lines) == 1 + 2 + 4 + 2 + 1  # variance x2, forward x4, two ratios, grad-norms
