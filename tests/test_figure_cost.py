"""Guards the cheaper figure writing: with mathtext parsed once per process (not once per
renderer) the PNG is byte for byte the one matplotlib draws without it, and drawing a
figure a second time parses nothing again."""

import subprocess
import sys

SCRIPT = """
import io, sys, hashlib
import pandas as pd
from tinit.results import mathtext_cache
from tinit.results.plots import plot_variance
if sys.argv[1] == "shared":
    assert mathtext_cache.install()
frame = pd.read_csv(io.StringIO(sys.stdin.read()))
for _ in range(2 if sys.argv[1] == "shared" else 1):  # the second: the shared cache answers all
    buf = io.BytesIO()
    plot_variance(frame, "L=3 $v_k$").savefig(buf, format="png", dpi=200, bbox_inches="tight")
    print(hashlib.sha256(buf.getvalue()).hexdigest())
"""


def test_shared_mathtext_cache_draws_the_same_bytes(capsys, monkeypatch):
    """matplotlib as it is (a fresh process) against the shared cache (here), both drawing
    one measured variance frame (handed to the child as CSV: it imports no torch). The
    fresh process draws it once; here the first and the second figure must both be its
    bytes."""
    import io

    from tinit.experiments.measure.variance import run_variance
    from tinit.model.config import InitConfig, ModelConfig, RunConfig

    model = ModelConfig(n_layers=3, d_model=32, n_heads=2, vocab_size=64, max_seq_len=16)
    res = run_variance(model, InitConfig(), RunConfig(batch=2, seq_len=16, device="cpu"))
    csv = res["variance"].to_csv(index=False)
    cmd = [sys.executable, "-c", SCRIPT, "plain"]
    plain = subprocess.run(
        cmd, input=csv, capture_output=True, text=True, check=True, timeout=300
    ).stdout.split()
    monkeypatch.setattr(sys, "argv", ["-c", "shared"])
    monkeypatch.setattr(sys, "stdin", io.StringIO(csv))
    exec(compile(SCRIPT, "<figure script>", "exec"), {})
    shared = capsys.readouterr().out.split()
    assert len(plain) == 1 and shared == plain * 2


def test_a_second_figure_parses_no_mathtext_again():
    import io

    from matplotlib import mathtext
    from matplotlib.figure import Figure

    from tinit.results import mathtext_cache

    assert mathtext_cache.install()
    calls = []
    real = mathtext._mathtext.Parser.parse
    mathtext._mathtext.Parser.parse = lambda self, *a, **k: calls.append(a[0]) or real(self, *a, **k)
    try:
        sizes = []
        for _ in range(2):
            fig = Figure(figsize=(3, 2), layout="constrained")
            ax = fig.subplots()
            ax.set_yscale("log")
            ax.plot([1, 2, 3], [1e-3, 1, 1e3], label=r"$a^2 v_{k-1} + g^2 s_k^2$ once")
            ax.legend()
            before = len(calls)
            fig.savefig(io.BytesIO(), format="png", dpi=200, bbox_inches="tight")
            sizes.append(len(calls) - before)
    finally:
        mathtext._mathtext.Parser.parse = real
    assert sizes[0] > 0 and sizes[1] == 0, sizes
