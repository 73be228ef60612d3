"""The large-width prediction against the measurement at the depth-sweep defaults.

Regenerates every number docs/findings/mf.md quotes about depth (issue 44's first
"done when"): d 256, 4 heads, 8 x 128 tokens, sigma 0.02, seeds 0, 1, 2 (as
`tinit depth-sweep`'s points at L = 12 and 80: the same run_variance calls, so the same
numbers), naive and scaled (gpt2), pre- and post-norm, the prediction with the default
4 heads drawn per sequence. Writes mf_depth.json beside this file and prints it.

    python docs/findings/mf_depth.py            # ~5 min on one CPU thread
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from tinit import InitConfig, ModelConfig, RunConfig
from tinit.experiments.measure.variance import run_variance

HERE = Path(__file__).resolve().parent
SEEDS = (0, 1, 2)
DEPTHS = (12, 80)
CONFIGS = [("naive", "pre"), ("scaled", "pre"), ("naive", "post"), ("scaled", "post")]


def mean_se(x) -> tuple[float, float]:
    x = np.asarray(x, dtype=np.float64)
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x)))


def ratio_se(a, b) -> tuple[float, float]:
    """mean(b) / mean(a) and its standard error, as depth-sweep computes its transfer ratio."""
    (ma, sa), (mb, sb) = mean_se(a), mean_se(b)
    r = mb / ma
    return r, abs(r) * math.sqrt((sa / ma) ** 2 + (sb / mb) ** 2)


def branch(rows, sub: str, col: str) -> np.ndarray:
    return rows[rows["sublayer"] == sub][col].to_numpy()


def quarters(m: np.ndarray, p: np.ndarray) -> list[float]:
    """measured / predicted - 1 of the layer means over the first and the last quarter of the layers."""
    q = max(len(m) // 4, 1)
    return [float(m[:q].mean() / p[:q].mean() - 1), float(m[-q:].mean() / p[-q:].mean() - 1)]


def measure(cache: Path | None) -> tuple[dict, dict]:
    """Every (L, seed)'s variance frame (from ``cache`` when it holds them) and the seconds each took."""
    import pickle

    if cache is not None and cache.exists():
        return pickle.loads(cache.read_bytes())
    frames, seconds = {}, {"load_start": os.getloadavg(), "date_start": time.strftime("%Y-%m-%d %H:%M")}
    for L in DEPTHS:
        for seed in SEEDS:
            t = time.perf_counter()
            res = run_variance(ModelConfig(n_layers=L), InitConfig(seed=seed), RunConfig(device="cpu"))
            seconds[f"L{L}-seed{seed}"] = round(time.perf_counter() - t, 1)
            frames[(L, seed)] = res["variance"]
            print(f"L={L} seed={seed}: {seconds[f'L{L}-seed{seed}']} s", file=sys.stderr)
    seconds.update(load_end=os.getloadavg(), date_end=time.strftime("%Y-%m-%d %H:%M"))
    if cache is not None:
        cache.write_bytes(pickle.dumps((frames, seconds)))
    return frames, seconds


def main(cache: Path | None = None) -> dict:
    torch.set_num_threads(1)
    frames, seconds = measure(cache)
    out = {"configs": {}}
    for scheme, pos in CONFIGS:
        key = f"{scheme}/{pos}"

        def rows(L, seed, scheme=scheme, pos=pos):
            v = frames[(L, seed)]
            return v[(v["init"] == scheme) & (v["norm_position"] == pos)].sort_values("k")

        c: dict = {}
        vf = {L: [rows(L, s)["stream_var"].iloc[-1] for s in SEEDS] for L in DEPTHS}
        mf = {L: [rows(L, s)["mf_stream_var"].iloc[-1] for s in SEEDS] for L in DEPTHS}
        r, r_se = ratio_se(vf[12], vf[80])
        mf_r = float(np.mean(mf[80]) / np.mean(mf[12]))
        inside = bool(abs(mf_r - r) <= 2 * r_se)
        c["ratio_80_12"] = {"measured": r, "se": r_se, "predicted": mf_r, "inside_2se": inside,
                            "z": (r - mf_r) / r_se}  # fmt: skip
        for L in DEPTHS:
            d: dict = {"v_final": dict(zip(("measured", "se"), mean_se(vf[L]), strict=True)),
                       "v_final_predicted": float(np.mean(mf[L]))}  # fmt: skip
            d["v_final_rel_err"] = d["v_final"]["measured"] / d["v_final_predicted"] - 1
            for sub in ("attn", "ffn"):
                meas = np.array([branch(rows(L, s), sub, "branch_var") for s in SEEDS])
                pred = np.array([branch(rows(L, s), sub, "mf_branch_var") for s in SEEDS])
                m, p = meas.mean(0), pred.mean(0)
                se = meas.std(0, ddof=1) / math.sqrt(len(SEEDS))
                z = (m - p) / np.where(se > 0, se, np.nan)
                # the seeds' relative spread pooled over the layers (an s.e. from 3 values is itself
                # uncertain: an unbiased prediction passes 2 s.e. at only 82% of the layers, t with 2
                # degrees of freedom; pooled over the layers, at 95%)
                rel_sd = float(np.sqrt(np.mean(meas.var(0, ddof=1) / m**2)))
                z_pooled = (m - p) / (rel_sd * np.abs(m) / math.sqrt(len(SEEDS)))
                layers = range(1, L) if pos == "post" else range(L)  # post: layer 0 reads the raw embedding
                sel = np.array(list(layers))
                d[f"s2_{sub}"] = {
                    "layer_mean_measured": float(m[sel].mean()),
                    "layer_mean_predicted": float(p[sel].mean()),
                    "layer_mean_rel_err": float(m[sel].mean() / p[sel].mean() - 1),
                    "layers_within_2se": int(np.sum(np.abs(z[sel]) <= 2)),
                    "layers": len(sel),
                    "worst_layer_z": float(np.nanmax(np.abs(z[sel]))),
                    "seed_rel_sd_pooled": rel_sd,
                    "layers_within_2se_pooled": int(np.sum(np.abs(z_pooled[sel]) <= 2)),
                    "worst_layer_z_pooled": float(np.nanmax(np.abs(z_pooled[sel]))),
                    "worst_layer_rel_err": float(np.max(np.abs(m[sel] / p[sel] - 1))),
                    "rel_err_first_last_quarter": quarters(m[sel], p[sel]),
                }  # fmt: skip
            cos = [rows(L, s)["cos_sim"].iloc[-1] for s in SEEDS]
            mcos = [rows(L, s)["mf_cos_sim"].iloc[-1] for s in SEEDS]
            (cm, cse), cp = mean_se(cos), float(np.mean(mcos))
            d["cos_last"] = {"measured": cm, "se": cse, "predicted": cp, "diff": cm - cp}
            c[f"L{L}"] = d
        out["configs"][key] = c
    out["settings"] = {"d_model": 256, "heads": 4, "batch": 8, "seq_len": 128, "sigma": 0.02, "seeds": SEEDS,
                       "depths": DEPTHS, "mf_draws": RunConfig().mf_draws, "torch_threads": 1}  # fmt: skip
    out["seconds"] = seconds
    out["machine"] = {
        # the load average (1, 5, 15 min) when the measurement began and ended, and when
        **{k: seconds.pop(k) for k in ("load_start", "load_end", "date_start", "date_end")},
        "host": platform.node(), "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }  # fmt: skip
    return out


def quotes(data: dict) -> dict[str, list[str]]:
    """The strings README.md must hold, from mf_depth.json's ``data``
    (tests/test_findings.py holds the README to them)."""
    sp, nv = data["configs"]["scaled/pre"], data["configs"]["naive/pre"]
    a, b = sp["ratio_80_12"], nv["ratio_80_12"]
    cos = sp["L80"]["cos_last"]
    return {"README.md": [
        f"×{a['predicted']:.3f} scaled/pre and ×{b['predicted']:.2f} naive/pre ({abs(a['z']):.2f} and "
        f"{abs(b['z']):.2f} s.e. from the measured)",
        f"the last cosine {cos['predicted']:.3f} for {cos['measured']:.3f}",
    ]}  # fmt: skip


if __name__ == "__main__":
    # --cache FILE: keep (or reuse) the measured frames there, to redo the analysis alone
    result = main(Path(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[1] == "--cache" else None)
    (HERE / "mf_depth.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
