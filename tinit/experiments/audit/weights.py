"""A stored tensor's statistics for ``drift.csv``: its std, its spectral norm
(:mod:`.spectral`) and its change from the init, in float64 chunk by chunk, from a
resident tensor (:func:`weight_row`, a block's in the reader's arena) or from the file
in row chunks (:func:`table_row`, an embedding or a head never held whole)."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator

import torch

from .spectral import (
    FAST_RTOL,
    NONE,
    Estimate,
    largest_singular_value,
    largest_singular_value_chunked,
)
from .tensors import TensorFiles

#: Elements per chunk of the float64 statistics of a resident tensor (8 MiB).
STAT_CHUNK = 1 << 20
#: The float64 buffer of each device, one per thread (:meth:`Moments._f64`; a block's
#: statistics run on the reader's measuring thread while the main thread runs a forward).
_LOCAL = threading.local()


def _chunks(t: torch.Tensor, n: int = STAT_CHUNK) -> Iterator[torch.Tensor]:
    flat = t.detach().reshape(-1)
    for i in range(0, flat.numel(), n):
        yield flat[i : i + n]


class Moments:
    """Count, mean and sum of squared deviations of a tensor given in chunks, and whether
    every element was finite. Each chunk is copied into one reused float64 buffer
    (shifted by the first chunk's mean where that mean is not small beside the spread, so
    a tensor far from zero loses nothing to cancellation) and reduced there: a float64 sum
    and dot product, ~1 ns an element on a CPU core (``torch.var_mean`` of float32, which
    also accumulates in float64, takes 8). A non-finite element makes the sums non-finite:
    that is the finiteness check."""

    def __init__(self) -> None:
        self.n, self.s1, self.s2, self.shift, self.finite = 0, 0.0, 0.0, None, True

    @staticmethod
    def _f64(chunk: torch.Tensor) -> torch.Tensor:
        """``chunk`` (at most STAT_CHUNK elements) copied into the float64 buffer of its
        device, one for the whole thread: allocated once, not per tensor (an 8 MiB block
        taken and given back per tensor fragmented the heap: ~5 MiB more resident per
        block of a 1B model)."""
        x = chunk.detach().reshape(-1)
        buffers = _LOCAL.__dict__.setdefault("buffers", {})
        buf = buffers.get(x.device)
        if buf is None or buf.numel() < x.numel():
            buf = buffers[x.device] = torch.empty(max(x.numel(), STAT_CHUNK), dtype=torch.float64,
                                                   device=x.device)  # fmt: skip
        b = buf[: x.numel()]
        b.copy_(x)
        return b

    def add(self, chunk: torch.Tensor) -> None:
        for part in _chunks(chunk):  # (the float64 buffer is one STAT_CHUNK, whatever the chunk)
            self._add(part)

    def _add(self, chunk: torch.Tensor) -> None:
        if chunk.numel() == 0:
            return
        b = self._f64(chunk)
        if self.shift is None:
            # shifted by the first chunk's mean only where the mean is not small beside the
            # spread (a norm's gains near 1): elsewhere (a weight matrix, mean ~0) the sums
            # lose nothing to cancellation and the pass is saved
            mean, ms = float(b.mean()), float(torch.dot(b, b)) / b.numel()
            self.shift = mean if mean * mean > 1e-4 * ms else 0.0
            if not (math.isfinite(mean) and math.isfinite(ms)):
                self.finite, self.shift = False, 0.0
        if self.shift:
            b.sub_(self.shift)
        s1, s2 = float(b.sum()), float(torch.dot(b, b))
        if not (math.isfinite(s1) and math.isfinite(s2)):
            self.finite = False
        self.n += b.numel()
        self.s1 += s1
        self.s2 += s2

    @property
    def change_from_itself(self) -> float:
        """||W - W0|| / ||W0|| where W0 is W (a step-0 checkpoint is its own init), from
        these moments, no pass over W: 0 where W is finite and not all zero, NaN where it
        is all zero (no relative change) or not finite (flagged, as every change is)."""
        if not self.finite or self.n == 0:
            return math.nan
        return 0.0 if self.s2 > 0 or self.shift else math.nan

    @property
    def std(self) -> float:
        if self.n <= 1 or not self.finite:
            return math.nan
        mean = self.s1 / self.n
        return math.sqrt(max(self.s2 / self.n - mean * mean, 0.0))


def rel_change(w: torch.Tensor, w0: torch.Tensor | None) -> float:
    """||W - W0|| / ||W0|| in float64, chunk by chunk in one reused buffer (NaN: W0
    unknown or zero)."""
    if w0 is None:
        return math.nan
    num = den = 0.0
    buf = Moments()
    for a, b in zip(_chunks(w), _chunks(w0), strict=True):
        x = buf._f64(b)
        den += float(torch.dot(x, x))
        x.sub_(a.to(x.device)).neg_()  # (float32 - float64: promoted per element, no copy of a)
        num += float(torch.dot(x, x))
    return math.sqrt(num) / math.sqrt(den) if den > 0 else math.nan


def _row(name: str, shape, numel: int, std: float, expected: float, spectral: Estimate, rel: float) -> dict:
    return {
        "param": name, "shape": "x".join(map(str, shape)) or "scalar", "numel": numel, "std": std,
        "expected_std": expected, "spectral_norm": spectral.value, "spectral_method": spectral.method,
        "rel_change": rel,
    }  # fmt: skip


def weight_row(name: str, w: torch.Tensor, w0: torch.Tensor | None, expected: float,
               spectral: str = "fast", stats: dict | None = None, same: bool = False) -> dict:  # fmt: skip
    """std, spectral norm (by ``spectral``, :mod:`.spectral`) and ||W - W0|| / ||W0|| of
    one resident tensor (NaN where W0 is unknown or zero: a zero-initialised matrix has
    no relative change; ``same``: W is its own W0). ``stats``: counts of the spectral
    methods used, updated."""
    m = Moments()
    m.add(w)
    est = largest_singular_value(w, spectral, finite=m.finite)
    _count(stats, est)
    rel = m.change_from_itself if same else rel_change(w, w0)
    return _row(name, w.shape, w.numel(), m.std if w.numel() > 1 else math.nan, expected, est, rel)


def table_row(files: TensorFiles, key: str, name: str, expected: float, spectral: str = "fast",
              w0: torch.Tensor | None = None, device="cpu", stats: dict | None = None,
              same: bool = False) -> dict:  # fmt: skip
    """:func:`weight_row` of a stored tensor read in row chunks, never whole: the
    moments and the change from ``w0`` in one pass, the spectral norm in one pass per
    Lanczos step (``exact``: one pass forming the Gram matrix). ``same``: the tensor is
    its own step 0 (its change is 0, or none when it is zero)."""
    shape = files.shapes[key]
    m, diff = Moments(), Moments()  # (diff: only its reused float64 buffer)
    num = den = 0.0
    r0 = 0
    keep: dict = {}  # (the chunk buffers, reused by every pass over this table)
    for c in files.row_chunks(key, None, device, keep=keep):  # (as stored: converted where used)
        m.add(c)
        if w0 is not None and not same:
            b = w0.reshape(shape)[r0 : r0 + c.shape[0]] if shape else w0
            for pa, pb in zip(_chunks(c), _chunks(b), strict=True):
                x = diff._f64(pb)
                den += float(torch.dot(x, x))
                x.sub_(pa.to(x.device)).neg_()
                num += float(torch.dot(x, x))
        r0 += c.shape[0] if shape else 1
    if same:
        rel = m.change_from_itself
    else:
        rel = math.sqrt(num) / math.sqrt(den) if w0 is not None and den > 0 else math.nan
    est = NONE
    if len(shape) == 2:
        est = largest_singular_value_chunked(
            lambda: files.row_chunks(key, None, device, count=False, keep=keep),
            shape,
            spectral,
            FAST_RTOL,
            finite=m.finite,
            device=device,
        )
    _count(stats, est)
    numel = math.prod(shape)
    return _row(name, shape, numel, m.std if numel > 1 else math.nan, expected, est, rel)


def _count(stats: dict | None, est: Estimate) -> None:
    """Tally how the spectral norms were found (config.json's ``spectral``)."""
    if stats is None or not est.method:
        return
    stats[est.method] = stats.get(est.method, 0) + 1
    if est.method == "lanczos":
        stats["lanczos_steps_max"] = max(stats.get("lanczos_steps_max", 0), est.steps)
        if not est.converged:
            stats["not_converged"] = stats.get("not_converged", 0) + 1
