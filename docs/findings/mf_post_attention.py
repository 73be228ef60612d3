"""Is post-norm attention's excess over the prediction a finite-width effect?

At the depth-sweep defaults (d 256) the measured post-norm attention s² is 0.7-1.8% above
the large-width prediction on average over the layers (docs/findings/mf.md). Here: naive
post-norm, sigma 0.02, heads of d_h = 64, 4 layers, 8 x 128 tokens (one batch, data seed
0), 6 weight seeds, at d 256 and 1024: the mean over seeds of the layer-mean (layers 1-3,
after the first norm) of measured / predicted attention s² - 1, with its s.e. Writes
mf_post_attention.json beside this file.

    python docs/findings/mf_post_attention.py      # ~2 min on one CPU thread
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch

from tinit import InitConfig, ModelConfig, RunConfig
from tinit.experiments.measure.variance import run_variance

HERE = Path(__file__).resolve().parent


def main() -> dict:
    torch.set_num_threads(1)
    out = {"load_start": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M"), "widths": {}}
    for d in (256, 1024):
        rel = []
        for seed in range(6):
            model = ModelConfig(n_layers=4, d_model=d, n_heads=d // 64)
            v = run_variance(model, InitConfig(seed=seed), RunConfig(data_seed=0, device="cpu"), ("naive",),
                             ("post",))["variance"]  # fmt: skip
            a = v[(v["sublayer"] == "attn") & (v["layer"] >= 1)]
            rel.append(float(a["branch_var"].mean() / a["mf_branch_var"].mean() - 1))
        se = float(np.std(rel, ddof=1) / math.sqrt(len(rel)))
        out["widths"][d] = {"rel_err_mean": float(np.mean(rel)), "se": se, "per_seed": rel}
    out["load_end"] = os.getloadavg()
    return out


if __name__ == "__main__":
    result = main()
    (HERE / "mf_post_attention.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
