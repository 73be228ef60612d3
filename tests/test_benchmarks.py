"""Guards the GPU scripts (a session lent the device machine has minutes, not hours):
`benchmarks/device_check.sh`, which runs every GPU check in one call, must run end to
end here too, where it falls back to tiny sizes on the CPU, and bring back its files;
`benchmarks/bench_gpu.py` inside it must print and write its whole table."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACK = {  # what device_check.sh leaves under $OUT: at most 8 files come back from the device
    "device_check.log", "gpu_tests.txt", "bench_gpu.csv", "variance70b_summary.csv",
    "variance70b_config.json", "norms_ratio.csv", "norms.png",
}  # fmt: skip


def test_device_check_runs_every_step_small(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    script = ROOT / "benchmarks" / "device_check.sh"
    cmd = ["bash", str(script)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "every step passed" in res.stdout and "!!!" not in res.stdout
    assert "NO CUDA: tiny sizes" in res.stdout  # here it must say its figures are not GPU figures
    assert {p.name for p in tmp_path.iterdir()} == BACK and len(BACK) <= 8
    assert "FAILED" not in (tmp_path / "bench_gpu.csv").read_text()
    lines = (tmp_path / "bench_gpu.csv").read_text().splitlines()
    assert lines[0] == "case,value,peak_gib,target"
    assert len(lines) == 1 + 2 + 4 + 2 + 1  # variance x2, forward x4, two ratios, grad-norms
