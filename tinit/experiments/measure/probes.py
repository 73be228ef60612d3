"""Probes: objects the model calls at every residual addition (docs/design.md §11).

Statistics are computed on the device and kept there as small tensors; the host
sees them once, when the run asks for the table (no sync in the layer loop).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

#: Columns a VarianceProbe records per addition, in order.
STAT_COLUMNS = ("stream_var", "branch_var", "cross_corr", "stream_in_var", "stream_var_normed", "cos_sim",
                "res_ratio")  # fmt: skip


def token_similarity(
    x: torch.Tensor, dtype: torch.dtype, norms: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-collapse metrics of a stream x (batch, tokens, d), averaged over sequences:

    - the mean pairwise cosine similarity of a sequence's token vectors (Noci et al.
      2022), *exactly* and in O(T d) rather than over sampled pairs: with unit rows
      u_i, sum_{i != j} u_i . u_j = |sum_i u_i|^2 - T, over the T (T - 1) pairs;
    - Dong et al. (2021)'s residual ratio |X - 1 xbar^T| / |X|, xbar the token mean,
      with their composite norm |M| = sqrt(|M|_1 |M|_inf) (largest column and row
      absolute sums).
    Both are 1 (cosine) and 0 (ratio) for a collapsed sequence whose tokens are all
    the same vector. Sequences of one token give NaN.

    ``norms``: the rows' Euclidean norms, when the caller has them (:func:`row_norms`).
    Two temporaries the size of x (|x| and the centred sequence, made absolute in
    place): sum_i u_i is a matrix-vector product of x with the rows' inverse norms.
    (A 1-norm reduction would skip writing |x| out, but on the CPU it is 5-10x slower
    than the two passes.)"""
    x = x.to(dtype)
    T = x.shape[-2]
    norms = row_norms(x) if norms is None else norms
    inv = 1.0 / norms.clamp_min(torch.finfo(dtype).tiny)
    s = torch.matmul(inv.unsqueeze(-2), x).squeeze(-2)  # sum over tokens of x_i / |x_i|
    cos = ((torch.linalg.vecdot(s, s) - T) / (T * (T - 1))).mean() if T > 1 else x.new_full((), math.nan)

    def composite(a: torch.Tensor) -> torch.Tensor:  # of |m|: largest column and row sums
        return torch.sqrt(a.sum(dim=-2).amax(dim=-1) * a.sum(dim=-1).amax(dim=-1))

    res = (x - x.mean(dim=-2, keepdim=True)).abs_()
    ratio = (composite(res) / composite(x.abs()).clamp_min(torch.finfo(dtype).tiny)).mean()
    return cos, ratio


def row_norms(t: torch.Tensor) -> torch.Tensor:
    """The Euclidean norm of every row (over the last dim) of t: one pass, no temporary."""
    return torch.linalg.vector_norm(t, dim=-1)


def _sums(
    t: torch.Tensor, dtype: torch.dtype, norms: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The two reductions of a pooled (population) variance and mean, E[t^2] - E[t]^2:
    sum(t), sum(t^2) and the count (accurate to ~1e-7 relative in float32 at 16M elements,
    and on the CPU about 10x faster than ``torch.var_mean``'s single-pass Welford).
    sum(t^2) is the sum of the rows' squared norms (``norms``, when the caller has
    them): a norm squares inside its reduction, where a dot product of t with itself
    (``linalg.vecdot``, on the CPU) writes the elementwise product out first."""
    t = t.to(dtype)
    norms = row_norms(t) if norms is None else norms
    return t.sum(), norms.square().sum(), t.numel()


def _var_mean(total: torch.Tensor, squares: torch.Tensor, n) -> tuple[torch.Tensor, torch.Tensor]:
    """Variance and mean from :func:`_sums` (elementwise: on one value or on a column of them)."""
    mean = total / n
    return squares / n - mean * mean, mean


#: What a VarianceProbe keeps per addition until :meth:`VarianceProbe.frame`: the raw
#: reductions (sums, sums of squares, the sum of products of stream and branch), from
#: which the statistics are derived once, over every addition at the same time.
_RAW = ("out_sum", "out_sq", "in_sum", "in_sq", "f_sum", "f_sq", "prod", "normed_sum", "normed_sq", "cos_sim",
        "res_ratio")  # fmt: skip
_COL = {name: i for i, name in enumerate(_RAW)}


class VarianceProbe:
    """Records, at addition k, var(x_{k-1} + F_k), var(F_k), the correlation of
    stream and branch, var(x_{k-1}) and (post-norm) the variance after the norm.
    At k = 0 only the embedding's variance.

    Three variance reductions per addition: the stream entering addition k is the
    tensor that left addition k-1, so its sums are reused rather than recomputed; the
    sums of squares are squared row norms, whose reduction squares as it goes (on the
    CPU ``linalg.vecdot`` writes the elementwise product out first, so only the
    covariance, which needs the product, pays that pass). The rank-collapse pair
    (:func:`token_similarity`) reuses the row norms of the stream that leaves the
    addition. Everything stays on the device until :meth:`frame`, and only the
    reductions happen per addition: the variances, the correlation and its checks are
    derived there, once, over every addition (the same elementwise arithmetic on a
    column instead of one value at a time, so the same numbers, without ~25 scalar
    operations, each a dispatch, per addition).

    Each addition's reductions are written into one table that grows by doubling,
    not kept as a small tensor of their own: ~640 small blocks alive among the
    forward's megabyte temporaries split the heap's free space, so that the forward
    kept taking fresh pages from the system (~56,000 page faults over a default
    `tinit variance`, and its matmuls ~15% slower, against ~8,000 this way).
    """

    def __init__(self, stat_dtype: torch.dtype = torch.float32):
        self.dtype = stat_dtype
        self.keys: list[tuple[int, int, str]] = []
        self._table: torch.Tensor | None = None  # row i: addition i's reductions (_RAW)
        self._counts: list[int] = []  # elements of each addition's tensors (the divisor of the means)
        # (tensor, its sum, its sum of squares): the stream the next addition takes in
        self._last: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._nan: torch.Tensor | None = None

    def _sums(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._last is not None and self._last[0] is t:
            return self._last[1], self._last[2]
        return _sums(t, self.dtype)[:2]

    def __call__(self, k, layer, sublayer, stream_in, branch, stream_out, normed=None) -> None:
        dt = self.dtype
        nan = self._nan
        if nan is None or nan.device != stream_out.device:
            nan = self._nan = torch.full((), math.nan, dtype=dt, device=stream_out.device)
        # the stream that continues along the path (post-norm's normed output): its row
        # norms serve both its sum of squares and its tokens' cosine similarity
        # (converted to the statistics' dtype once: a bfloat16 stream is copied once, not thrice)
        ahead = (stream_out if normed is None else normed).to(dt)
        ahead_norms = row_norms(ahead)
        out_sum, out_sq, n = _sums(ahead, dt, ahead_norms) if normed is None else _sums(stream_out, dt)
        cos, ratio = token_similarity(ahead, dt, ahead_norms) if stream_out.dim() == 3 else (nan, nan)
        if stream_in is None:
            row = (out_sum, out_sq, nan, nan, nan, nan, nan, nan, nan, cos, ratio)
        else:
            in_sum, in_sq = self._sums(stream_in)
            f_sum, f_sq, _ = _sums(branch, dt)
            prod = torch.linalg.vecdot(stream_in.to(dt), branch.to(dt)).sum()
            n_sum = n_sq = nan
            if normed is not None:
                n_sum, n_sq, _ = _sums(ahead, dt, ahead_norms)
            row = (out_sum, out_sq, in_sum, in_sq, f_sum, f_sq, prod, n_sum, n_sq, cos, ratio)
        self._last = (stream_out, out_sum, out_sq) if normed is None else (normed, n_sum, n_sq)
        self._record(row)
        self.keys.append((k, layer, sublayer))
        self._counts.append(n)

    def _record(self, row: tuple[torch.Tensor, ...]) -> None:
        i, table = len(self.keys), self._table
        if table is None or i == len(table):
            grown = row[0].new_empty((max(64, 2 * i), len(_RAW)))
            if table is not None:
                grown[:i] = table
            table = self._table = grown
        with torch.no_grad():  # (measurements: no graph, and out= takes none)
            torch.stack(row, out=table[i])

    @staticmethod
    def _derive(raw: torch.Tensor, n: int) -> torch.Tensor:
        """The STAT_COLUMNS from the raw reductions of additions whose tensors have ``n``
        elements each, one row per addition."""
        c = {name: raw[:, i] for name, i in _COL.items()}
        v_out, _ = _var_mean(c["out_sum"], c["out_sq"], n)
        v_in, m_in = _var_mean(c["in_sum"], c["in_sq"], n)
        v_f, m_f = _var_mean(c["f_sum"], c["f_sq"], n)
        v_n, _ = _var_mean(c["normed_sum"], c["normed_sq"], n)
        cov = c["prod"] / n - m_in * m_f
        corr = cov / torch.sqrt(v_in * v_f)
        # a branch too small for its variance to be a number of this dtype (a trunc
        # bound of 1e-30): not a zero branch (its covariance is not 0) and no
        # correlation: both NaN, flagged as measured values that are not finite
        lost = (v_f == 0) & (cov != 0) | ~torch.isfinite(corr) & (cov != 0) & torch.isfinite(cov)
        nan = torch.full((), math.nan, dtype=raw.dtype, device=raw.device)
        v_f = torch.where(lost, nan, v_f)
        corr = torch.where(lost, nan, corr)
        return torch.stack((v_out, v_f, corr, v_in, v_n, c["cos_sim"], c["res_ratio"]), dim=1)

    def release(self) -> None:
        """Let go of the last stream seen (kept to reuse its statistics at the next
        addition): under autograd it holds the graph that made it."""
        self._last = None

    def frame(self) -> pd.DataFrame:
        """One row per recorded addition; one device-to-host transfer."""
        if not self.keys:
            return pd.DataFrame(columns=["k", "layer", "sublayer", *STAT_COLUMNS])
        raw = self._table[: len(self.keys)]
        counts = sorted(set(self._counts))
        if len(counts) == 1:  # (always, in a model whose additions keep the stream's shape)
            stats = self._derive(raw, counts[0])
        else:
            stats = torch.cat([self._derive(raw[i : i + 1], n) for i, n in enumerate(self._counts)])
        values = stats.cpu().to(torch.float64).numpy()
        keys = np.array(self.keys, dtype=object)
        df = pd.DataFrame(values, columns=list(STAT_COLUMNS))
        df.insert(0, "sublayer", keys[:, 2].astype(str))
        df.insert(0, "layer", keys[:, 1].astype(int))
        df.insert(0, "k", keys[:, 0].astype(int))
        return df
