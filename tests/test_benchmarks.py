"""Guards the GPU benchmark script (a session with a device has minutes, not hours):
at tiny sizes it must run end to end on the CPU and print its table."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_benchmark_runs_small(tmp_path):
    out = tmp_path / "bench.csv"
    script = ROOT / "benchmarks" / "bench_gpu.py"
    cmd = [sys.executable, str(script), "--small", "--repeats", "1", "--csv", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "FAILED" not in res.stdout
    lines = out.read_text().splitlines()
    assert lines[0] == "case,value,peak_gib,target"
    assert len(lines) == 1 + 2 + 4 + 2 + 1  # variance x2, forward x4, two ratios, grad-norms
