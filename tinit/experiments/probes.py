"""Probes: objects the model calls at every residual addition (DESIGN.md section 3).

Statistics are computed on the device and kept there as small tensors; the host
sees them once, when the run asks for the table (no sync in the layer loop).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

#: Columns a VarianceProbe records per addition, in order.
STAT_COLUMNS = ("stream_var", "branch_var", "cross_corr", "stream_in_var", "stream_var_normed")


def pooled_var_mean(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Pooled (population) variance and mean over every element of t, in ``dtype``."""
    return torch.var_mean(t.to(dtype), correction=0)


class VarianceProbe:
    """Records, at addition k, var(x_{k-1} + F_k), var(F_k), the correlation of
    stream and branch, var(x_{k-1}) and (post-norm) the variance after the norm.
    At k = 0 only the embedding's variance."""

    def __init__(self, stat_dtype: torch.dtype = torch.float32):
        self.dtype = stat_dtype
        self.keys: list[tuple[int, int, str]] = []
        self._stats: list[torch.Tensor] = []

    def __call__(self, k, layer, sublayer, stream_in, branch, stream_out, normed=None) -> None:
        dt = self.dtype
        v_out, _ = pooled_var_mean(stream_out, dt)
        nan = torch.full((), math.nan, dtype=dt, device=stream_out.device)
        if stream_in is None:
            stats = (v_out, nan, nan, nan, nan)
        else:
            x, f = stream_in.to(dt), branch.to(dt)
            v_in, m_in = torch.var_mean(x, correction=0)
            v_f, m_f = torch.var_mean(f, correction=0)
            cov = (x * f).mean() - m_in * m_f
            corr = cov / torch.sqrt(v_in * v_f)
            v_n = nan if normed is None else pooled_var_mean(normed, dt)[0]
            stats = (v_out, v_f, corr, v_in, v_n)
        self.keys.append((k, layer, sublayer))
        self._stats.append(torch.stack(stats))

    def frame(self) -> pd.DataFrame:
        """One row per recorded addition; one device-to-host transfer."""
        if not self._stats:
            return pd.DataFrame(columns=["k", "layer", "sublayer", *STAT_COLUMNS])
        values = torch.stack(self._stats).cpu().to(torch.float64).numpy()
        keys = np.array(self.keys, dtype=object)
        df = pd.DataFrame(values, columns=list(STAT_COLUMNS))
        df.insert(0, "sublayer", keys[:, 2].astype(str))
        df.insert(0, "layer", keys[:, 1].astype(int))
        df.insert(0, "k", keys[:, 0].astype(int))
        return df
