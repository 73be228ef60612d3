"""Does the large-width prediction's error shrink as the width grows? (issue 44)

At fixed logit variance and fixed variances everywhere (sigma = 1/sqrt(d) on every
matrix, embedding std 1 so v0 = 1, heads of d_h = 32: the prediction is then the same
at every width), 12 layers, 8 x 128 tokens, d = 64, 128, 256, 512, 1024, seeds 0, 1, 2
(weights and tokens re-drawn per seed, as depth-sweep's seeds), naive and scaled, pre-
and post-norm: the measured stream variance v_k at every addition against the prediction
for the same tokens. Errors per (configuration, d):

- ``rms_seed_err``: the root mean square over seeds of the mean over k of |v_k / mf_k - 1|
  (one run's error: finite-width fluctuation and bias together);
- ``bias``: the mean over k of |mean over seeds of v_k / mean of mf_k - 1|;
- ``cos_err``: the mean over k and seeds of |cos_k - mf cos_k|;

and their log-log slopes against d (least squares over the five widths). Writes
mf_width.json beside this file and the figure docs/img/mf-width.png (a 256-colour PNG,
as the README's pictures).

    python docs/findings/mf_width.py [--cache FILE]     # ~10 min on one CPU thread
"""

from __future__ import annotations

import json
import math
import os
import pickle
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from tinit import InitConfig, ModelConfig, RunConfig
from tinit.experiments.measure.variance import run_variance

HERE = Path(__file__).resolve().parent
FIGURE = HERE.parent / "img" / "mf-width.png"
WIDTHS = (64, 128, 256, 512, 1024)
SEEDS = (0, 1, 2)
HEAD_DIM = 32
LAYERS = 12
CONFIGS = [("naive", "pre"), ("scaled", "pre"), ("naive", "post"), ("scaled", "post")]


def measure(cache: Path | None) -> tuple[dict, dict]:
    if cache is not None and cache.exists():
        return pickle.loads(cache.read_bytes())
    frames, seconds = {}, {"load_start": os.getloadavg(), "date_start": time.strftime("%Y-%m-%d %H:%M")}
    for d in WIDTHS:
        for seed in SEEDS:
            t = time.perf_counter()
            model = ModelConfig(n_layers=LAYERS, d_model=d, n_heads=d // HEAD_DIM)
            init = InitConfig(sigma="inv-sqrt-d", embed_std=1.0, seed=seed)
            frames[(d, seed)] = run_variance(model, init, RunConfig(device="cpu"))["variance"]
            seconds[f"d{d}-seed{seed}"] = round(time.perf_counter() - t, 1)
            print(f"d={d} seed={seed}: {seconds[f'd{d}-seed{seed}']} s", file=sys.stderr)
    seconds.update(load_end=os.getloadavg(), date_end=time.strftime("%Y-%m-%d %H:%M"))
    if cache is not None:
        cache.write_bytes(pickle.dumps((frames, seconds)))
    return frames, seconds


def slope(x, y) -> tuple[float, float]:
    """Least-squares slope of log y on log x and its standard error."""
    lx, ly = np.log(np.asarray(x, dtype=float)), np.log(np.asarray(y, dtype=float))
    A = np.vstack([lx, np.ones_like(lx)]).T
    coef, res, *_ = np.linalg.lstsq(A, ly, rcond=None)
    resid = ly - A @ coef
    se = math.sqrt(float(resid @ resid) / (len(lx) - 2) / float(((lx - lx.mean()) ** 2).sum()))
    return float(coef[0]), se


def analyse(frames: dict) -> dict:
    out: dict = {}
    for scheme, pos in CONFIGS:
        rows = {"d": list(WIDTHS), "rms_seed_err": [], "bias": [], "cos_err": [], "final_seed_err": []}
        for d in WIDTHS:
            per = []
            for seed in SEEDS:
                v = frames[(d, seed)]
                per.append(v[(v["init"] == scheme) & (v["norm_position"] == pos)].sort_values("k"))
            # post-norm: k = 0, 1 precede the first norm (the raw embedding), as the figures
            k0 = 2 if pos == "post" else 1
            errs = [np.abs(p["stream_var"] / p["mf_stream_var"] - 1)[p["k"] >= k0].mean() for p in per]
            rows["rms_seed_err"].append(float(np.sqrt(np.mean(np.square(errs)))))
            final = [abs(p["stream_var"].iloc[-1] / p["mf_stream_var"].iloc[-1] - 1) for p in per]
            rows["final_seed_err"].append(float(np.sqrt(np.mean(np.square(final)))))
            mv = np.mean([p["stream_var"].to_numpy() for p in per], axis=0)
            mm = np.mean([p["mf_stream_var"].to_numpy() for p in per], axis=0)
            k = per[0]["k"].to_numpy()
            rows["bias"].append(float(np.abs(mv / mm - 1)[k >= k0].mean()))
            rows["cos_err"].append(
                float(np.mean([np.abs(p["cos_sim"] - p["mf_cos_sim"]).mean() for p in per]))
            )
        fits = {q: dict(zip(("slope", "se"), slope(WIDTHS, rows[q]), strict=True))
                for q in ("rms_seed_err", "bias", "cos_err", "final_seed_err")}  # fmt: skip
        out[f"{scheme}/{pos}"] = {**rows, "fits": fits}
    return out


def column(frame, scheme: str, pos: str, col: str) -> np.ndarray:
    """One configuration's ``col`` along k."""
    return frame[(frame["init"] == scheme) & (frame["norm_position"] == pos)].sort_values("k")[col].to_numpy()


def figure(frames: dict, result: dict) -> None:
    import matplotlib as mpl
    from matplotlib.figure import Figure
    from PIL import Image

    from tinit.results.palette import config_label, config_style
    from tinit.results.style import FULL_WIDTH, MEASURED_UNDER, NEUTRAL, PREDICTION, RC

    with mpl.rc_context(RC):
        fig = Figure(figsize=(FULL_WIDTH, 3.6), layout="constrained")
        ax, bx = fig.subplots(1, 2, width_ratios=[1.1, 1])
        for scheme, pos in CONFIGS:
            r, st = result[f"{scheme}/{pos}"], config_style(scheme, pos)
            f = r["fits"]["rms_seed_err"]
            ax.plot(r["d"], r["rms_seed_err"], color=st["color"], marker=st["marker"], mfc="none", lw=1.6,
                    label=f"{config_label(scheme, pos)}: slope {f['slope']:.2f} ± {f['se']:.2f}")  # fmt: skip
        d = np.array(WIDTHS, dtype=float)
        top = max(result[f"{s}/{p}"]["rms_seed_err"][0] for s, p in CONFIGS)
        ax.plot(
            d,
            top * (d / d[0]) ** -0.5,
            color=NEUTRAL,
            ls=":",
            lw=1.2,
            label="$d^{-1/2}$, $d^{-1}$ (for reference)",
        )
        ax.plot(d, top * (d / d[0]) ** -1.0, color=NEUTRAL, ls=":", lw=1.2)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(d, [str(int(x)) for x in d])
        ax.set_xlabel("width d (heads of $d_h$ = 32; $\\sigma = 1/\\sqrt{d}$)")
        ax.set_ylabel("|measured / predicted $v_k$ − 1|\n(mean over k, rms over 3 seeds)")
        ax.set_title("Error of the prediction against width")
        ax.legend(fontsize=7.5, frameon=False, loc="lower left")
        ax.grid(True, which="major", alpha=0.3)
        # one configuration along k: the measurement at the narrowest and widest width, the prediction
        scheme, pos = "scaled", "pre"
        st = config_style(scheme, pos)

        def seed_mean(width: int, col: str) -> np.ndarray:
            return np.mean(
                [column(f_, scheme, pos, col) for (w, _s), f_ in frames.items() if w == width], axis=0
            )

        for d_, shade in ((WIDTHS[0], 0.45), (WIDTHS[-1], 1.0)):
            v = seed_mean(d_, "stream_var")
            bx.plot(range(len(v)), v, color=st["color"], alpha=shade * MEASURED_UNDER["alpha"] / 0.45,
                    lw=MEASURED_UNDER["lw"] * (0.6 if d_ == WIDTHS[0] else 1.0),
                    label=f"measured, d = {d_}")  # fmt: skip
        mf = seed_mean(WIDTHS[-1], "mf_stream_var")
        bx.plot(range(len(mf)), mf, color="black", label="large-width prediction", **PREDICTION)
        bx.set_xlabel("residual addition k (0 = embedding)")
        bx.set_ylabel("stream variance $v_k$ (mean of 3 seeds)")
        bx.set_title(f"{config_label(scheme, pos)}, L = {LAYERS}")
        bx.legend(fontsize=7.5, frameon=False, loc="upper left",
                  handles=[*bx.get_legend_handles_labels()[0]])  # fmt: skip
        bx.grid(True, which="major", alpha=0.3)
        fig.suptitle("Large-width prediction against measurement at fixed logit variance (12 layers, 8 x 128 "
                     "tokens)", fontsize=9)  # fmt: skip
        tmp = FIGURE.with_suffix(".tmp.png")
        fig.savefig(tmp, dpi=200, bbox_inches="tight")
    Image.open(tmp).convert("RGB").quantize(
        256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE
    ).save(FIGURE, optimize=True)
    tmp.unlink()


def main(cache: Path | None = None) -> dict:
    torch.set_num_threads(1)
    frames, seconds = measure(cache)
    result = {"configs": analyse(frames)}
    figure(frames, result["configs"])
    result["settings"] = {"widths": WIDTHS, "head_dim": HEAD_DIM, "layers": LAYERS, "seeds": SEEDS,
                          "sigma": "1/sqrt(d)", "embed_std": 1.0, "batch": 8, "seq_len": 128,
                          "mf_draws": RunConfig().mf_draws, "torch_threads": 1}  # fmt: skip
    result["seconds"] = seconds
    result["machine"] = {
        # the load average (1, 5, 15 min) when the measurement began and ended, and when
        **{k: seconds.pop(k) for k in ("load_start", "load_end", "date_start", "date_end")},
        "host": platform.node(), "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }  # fmt: skip
    return result


if __name__ == "__main__":
    result = main(Path(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[1] == "--cache" else None)
    (HERE / "mf_width.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v["fits"] for k, v in result["configs"].items()}, indent=1))
