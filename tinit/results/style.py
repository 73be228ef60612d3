"""One visual grammar for every tinit figure.

Every plot module takes its line styles, sizes, layouts and axis rules from here, and
its colours, markers and labels from :mod:`tinit.results.palette`, so the same
configuration looks the same in every figure:

- a configuration (scheme x norm placement) has one colour and one marker
  everywhere (:func:`tinit.results.palette.config_style`, keyed by the scheme's name);
- measurement is a solid line (translucent where a theory line is drawn on it),
  theory a thinner dashed line on top (:data:`MEASURED`, :data:`THEORY`); a second
  prediction is dotted (:data:`THEORY_ALT`); the large-width prediction made from the
  init alone (:mod:`tinit.mf`), which takes nothing from the measurement, is
  dash-dot-dot (:data:`PREDICTION`);
- full-width figures are :data:`FULL_WIDTH` inches wide with fonts of at least 8 pt at
  that size (:data:`RC`, applied with :func:`styled`, scoped to the plot function);
- y axes are log or linear by what the measured data span (:func:`value_axis`), and
  their limits come from the measured data: predictions outside are clipped and marked
  at the edge (:func:`mark_clipped`);
- curves that coincide are named in a note (:func:`coincidences`), and their markers
  are staggered (:func:`markevery`) so each stays visible.
"""

from __future__ import annotations

import functools
import textwrap
import warnings
from collections.abc import Callable, Iterable, Sequence

import matplotlib as mpl
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .text import wrap_settings

#: Width of a full-width figure (inches): one column of a paper, or a page at 7 in.
FULL_WIDTH = 7.0
#: Fonts (pt) at FULL_WIDTH; never below 8 pt.
FONT = 8.0
RC = {
    "font.size": FONT,
    "axes.titlesize": 9.0,
    "axes.labelsize": FONT,
    "xtick.labelsize": FONT,
    "ytick.labelsize": FONT,
    "legend.fontsize": FONT,
    "figure.titlesize": 9.0,
    "legend.framealpha": 0.85,
    "legend.handlelength": 2.6,
    "lines.markersize": 4.0,
    "axes.titlelocation": "center",
}

#: Measurement: solid. Where a theory line lies on it, the measurement is translucent
#: and thick, the theory thin, dark-dashed and on top, so both stay visible.
MEASURED = {"ls": "-", "lw": 1.6, "zorder": 2}
MEASURED_UNDER = {"ls": "-", "lw": 3.2, "alpha": 0.45, "zorder": 2}
THEORY = {"ls": (0, (4, 2)), "lw": 1.1, "zorder": 3}
THEORY_ALT = {"ls": (0, (1, 1.5)), "lw": 1.1, "zorder": 3}
#: The large-width prediction (tinit.mf): dash-dot-dot, a little heavier, on top of
#: everything (it is the line a reader compares the measurement with).
PREDICTION = {"ls": (0, (7, 1.5, 1.3, 1.5, 1.3, 1.5)), "lw": 1.5, "zorder": 4}
#: Line styles of the settings a figure tells apart besides the configuration (depth,
#: lr, warmup, norm, FFN, tying), in order; the configuration is colour and marker.
LINESTYLES = ("-", (0, (5, 2)), (0, (5, 1.5, 1, 1.5)), (0, (1, 1.2)), (0, (8, 2, 1, 2, 1, 2)), (0, (3, 1)))
#: Grey of style-only legend entries ("measured", "theory").
NEUTRAL = "0.3"
#: Clipped points: a triangle at the axis edge, in the series' colour.
CLIP_MARKERS = {"low": "v", "high": "^"}


def key_rows_height(n: int, ncol: int, row: float = 0.17, pad: float = 0.15) -> float:
    """Height (inches) of a legend row of ``n`` entries in ``ncol`` columns."""
    return pad + row * -(-n // max(ncol, 1))


def styled(fn: Callable[..., Figure]) -> Callable[..., Figure]:
    """Run a plot function under :data:`RC` (scoped: no global style change)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs) -> Figure:
        # a measured NaN or inf is flagged in the CSVs and on the terminal; in a plot it
        # is simply not drawn, so numpy's warnings about it are noise here
        with mpl.rc_context(RC), np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return fn(*args, **kwargs)

    return wrapper


def new_figure(
    ncols: int = 1, nrows: int = 1, width: float = FULL_WIDTH, row_height: float = 2.9, **kw
) -> tuple[Figure, np.ndarray]:
    """A figure ``width`` inches wide in total (not per panel), Agg canvas, no pyplot
    state; its axes as a flat array, tick labels at :data:`FONT`."""
    fig = Figure(figsize=(width, row_height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw).ravel()
    for ax in axes:
        ax.tick_params(labelsize=FONT)
        ax.grid(True, which="major", alpha=0.3)
    return fig, axes


def new_figure_with_key(
    ncols: int = 1,
    row_height: float = 2.9,
    key_height: float = 0.35,
    width: float = FULL_WIDTH,
    nrows: int = 1,
) -> tuple[Figure, np.ndarray, object]:
    """``nrows`` rows of ``ncols`` panels and, under them, a row of its own for the legend
    (a legend inside a panel covers data somewhere; one under the figure collides with
    the notes): returns (fig, flat axes, key axes). ``key_height``: see
    :func:`key_rows_height`."""
    fig = Figure(figsize=(width, row_height * nrows + key_height), layout="constrained")
    gs = fig.add_gridspec(nrows + 1, ncols, height_ratios=[row_height] * nrows + [key_height])
    axes = np.array([fig.add_subplot(gs[r, c]) for r in range(nrows) for c in range(ncols)])
    for ax in axes:
        ax.tick_params(labelsize=FONT)
        ax.grid(True, which="major", alpha=0.3)
    key = fig.add_subplot(gs[nrows, :])
    key.axis("off")
    return fig, axes, key


def key_legend(key, handles: list, ncol: int = 4, handlelength: float = 2.2) -> None:
    """The legend in the key row made by :func:`new_figure_with_key` (``handlelength``:
    longer where line styles tell settings apart)."""
    key.legend(handles=handles, loc="center", ncol=min(ncol, max(len(handles), 1)), handlelength=handlelength,
               columnspacing=1.2, frameon=False)  # fmt: skip


def markevery(n: int, i: int, n_series: int, marks: int = 10) -> tuple[int, int]:
    """About ``marks`` markers on an ``n``-point line, staggered by series ``i`` of
    ``n_series`` so that markers of coinciding lines do not sit on each other."""
    step = max(1, n // marks)
    # spread evenly when there is room; else alternate, so neighbours (i, i+1) never share
    offset = (i * step) // max(n_series, 1) if step >= n_series else i % step
    return (offset % step, step)


def finite(values: Iterable[float]) -> np.ndarray:
    v = np.asarray(list(values), dtype=np.float64).ravel()
    return v[np.isfinite(v)]


def wants_log(values: Iterable[float], ratio: float = 30.0) -> bool:
    """Log scale when the positive values span more than ``ratio`` (and none is <= 0)."""
    v = finite(values)
    return v.size > 0 and bool((v > 0).all()) and v.max() / v.min() > ratio


def value_axis(
    ax, values: Iterable[float], axis: str = "y", log_ratio: float = 30.0, min_rel_span: float = 0.02,
    pad: float = 0.06, include: Sequence[float] = (),
) -> tuple[float, float]:  # fmt: skip
    """Scale and limits of ``axis`` from the measured ``values`` only: log when they
    span more than ``log_ratio``, else linear. A linear axis spans at least
    ``min_rel_span`` of the values' magnitude, so that noise of 0.5% around a constant
    is drawn as the near-constant it is. ``include``: values that must be inside too
    (e.g. a reference line). Returns the limits."""
    v = np.concatenate([finite(values), finite(include)])
    if v.size == 0:
        return (0.0, 1.0)
    lo, hi = float(v.min()), float(v.max())
    set_scale, set_lim = (ax.set_yscale, ax.set_ylim) if axis == "y" else (ax.set_xscale, ax.set_xlim)
    if wants_log(v, log_ratio):
        set_scale("log")
        f = (hi / lo) ** pad
        lim = (lo / f, hi * f)
        if hi / lo > 10:  # matplotlib labels no minor tick past a decade: skip their empty labels
            (ax.yaxis if axis == "y" else ax.xaxis).set_tick_params(which="minor", label1On=False)
    else:
        mid, half = (lo + hi) / 2, (hi - lo) / 2
        half = max(half, min_rel_span * max(abs(lo), abs(hi)) / 2, 1e-30)
        half *= 1 + 2 * pad
        lim = (mid - half, mid + half)
        get_axis = ax.yaxis if axis == "y" else ax.xaxis
        fmt = mpl.ticker.ScalarFormatter(useMathText=True)  # a scale as x10^-6, never an offset
        fmt.set_useOffset(False)
        get_axis.set_major_formatter(fmt)
    set_lim(*lim)
    return lim


def near(measured: Iterable[float], predicted: Iterable[float], frac: float = 0.3) -> np.ndarray:
    """The predictions within ``frac`` of the measured span beyond the measured range
    (log-aware): these widen the axis a little rather than being clipped; the rest is
    clipped and marked (:func:`mark_clipped`)."""
    m, p = finite(measured), finite(predicted)
    if m.size == 0 or p.size == 0:
        return np.array([])
    lo, hi = m.min(), m.max()
    if wants_log(m) and (p > 0).all():
        f = (hi / lo) ** frac
        return p[(p >= lo / f) & (p <= hi * f)]
    span = max(hi - lo, 1e-12 * max(abs(lo), abs(hi), 1e-300))
    return p[(p >= lo - frac * span) & (p <= hi + frac * span)]


def mark_clipped(ax, x, y, lim: tuple[float, float], color: str, zorder: float = 5) -> int:
    """Points of (x, y) outside the y limits ``lim``: a triangle at the edge they
    leave by (pointing the way they leave). Returns how many were clipped."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    lo, hi = lim
    n = 0
    for where, mask, edge in (("low", y < lo, lo), ("high", y > hi, hi)):
        mask = mask & np.isfinite(y)
        if mask.any():
            idx = np.flatnonzero(mask)
            idx = idx[:: max(1, len(idx) // 12)]  # a dozen triangles say it; a hundred clutter
            ax.plot(x[idx], np.full(len(idx), edge), ls="none", marker=CLIP_MARKERS[where], ms=6,
                    color=color, mec="k", mew=0.5, clip_on=False, zorder=zorder, gid="clipped")  # fmt: skip
            n += int(mask.sum())
    return n


def _axis_fraction(ax, v: np.ndarray, axis: str = "y") -> np.ndarray:
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    log = (ax.get_yscale() if axis == "y" else ax.get_xscale()) == "log"
    with np.errstate(divide="ignore", invalid="ignore"):
        if log:
            return (np.log(v) - np.log(lo)) / (np.log(hi) - np.log(lo))
        return (v - lo) / (hi - lo)


def _finite_quantile_rows(d: np.ndarray, q: float) -> np.ndarray:
    """Each row's ``q`` quantile over its non-NaN entries (NaN where it has none), by
    numpy's default ("linear") method and its arithmetic: ``np.nanquantile(d, q, axis=-1)``
    without its per-row Python loop (a figure of --init all compares ~1,400 pairs)."""
    s = np.sort(d, axis=-1)  # (NaN last)
    n = np.count_nonzero(~np.isnan(d), axis=-1)
    virtual = (n - 1) * q  # numpy's virtual index for the linear method
    lo = np.clip(np.floor(virtual), 0, None).astype(np.intp)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    t = virtual - np.floor(virtual)
    a = np.take_along_axis(s, lo[:, None], axis=-1)[:, 0]
    b = np.take_along_axis(s, hi[:, None], axis=-1)[:, 0]
    diff = b - a
    out = np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)
    out[n == 0] = np.nan
    return out


def coincidences(series: dict[str, Sequence[float]], ax=None, gap: float = 0.02) -> list[list[str]]:
    """Groups of equally long series drawn on top of each other: at 80% of their points
    the distance is below ``gap`` of the axis height (``ax`` given, its limits set), or below ``gap``
    relative (no ``ax``). These need a note and distinct styles."""
    names = list(series)
    parent = {n: n for n in names}

    def root(n: str) -> str:
        while parent[n] != n:
            n = parent[n]
        return n

    values = [np.asarray(series[n], dtype=np.float64) for n in names]
    if ax is not None:
        values = [_axis_fraction(ax, v) for v in values]
    for a_i, a in enumerate(names):
        x = values[a_i]
        later = [b_i for b_i in range(a_i + 1, len(names)) if values[b_i].shape == x.shape]
        if x.size == 0 or not later:
            continue
        ys = np.stack([values[b_i] for b_i in later])  # every later series of this length at once
        with np.errstate(all="ignore"), warnings.catch_warnings():  # inf - inf is no distance
            warnings.simplefilter("ignore", RuntimeWarning)  # (a row with no finite distance: NaN)
            d = np.abs(x - ys)
            if ax is None:
                d = d / np.maximum(np.maximum(np.abs(x), np.abs(ys)), 1e-300)
            d[~np.isfinite(d)] = np.nan
            # on top of each other along (nearly) their whole length, not just where they cross
            q = _finite_quantile_rows(d, 0.8)
        for b_i, qb in zip(later, q, strict=True):
            if qb < gap:
                parent[root(names[b_i])] = root(a)
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(root(n), []).append(n)
    return [g for g in groups.values() if len(g) > 1]


def coincidence_note(groups: list[list[str]], what: str = "") -> str:
    """ "naive/pre and scaled/pre lie on top of each other (told apart by marker)"."""
    if not groups:
        return ""
    parts = [(", ".join(g[:-1]) + " and " + g[-1]) for g in groups]
    return (f"{what}: " if what else "") + "; ".join(parts) + " lie on top of each other (see the markers)"


def nested_marker_size(i: int, base: float = 7.0) -> float:
    """Open markers of decreasing size, so markers of coinciding series nest, not hide."""
    return max(base - 1.3 * i, 2.5)


def integer_axis(ax, values: Sequence[float], axis: str = "x", log: bool = False, nbins: int | str = "auto",
                 ) -> None:  # fmt: skip
    """An axis of whole numbers (depths, layers): ticks at the values when few, else
    integer ticks (at most ``nbins`` intervals: a narrow panel wants few); plain labels
    ("12", never "1.0e1" or "10.0")."""
    from matplotlib.ticker import FixedLocator, NullLocator

    a = ax.xaxis if axis == "x" else ax.yaxis
    vals = sorted({int(v) for v in values})
    if log:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
        a.set_minor_locator(NullLocator())
    if len(vals) <= (12 if nbins == "auto" else nbins + 1):
        a.set_major_locator(FixedLocator(vals))
        a.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _: f"{int(round(v))}"))
    else:
        if not log:
            a.set_major_locator(MaxNLocator(nbins=nbins, integer=True))
        a.set_major_formatter(
            mpl.ticker.FuncFormatter(lambda v, _: f"{int(round(v))}" if v >= 1 else f"{v:g}")
        )


def footnote(fig: Figure, lines: Sequence[str]) -> None:
    """Notes under the figure (coincidences, clipped predictions), wrapped to its width."""
    text = "\n".join(textwrap.fill(s, int(fig.get_figwidth() * 15)) for s in lines if s)
    if text:
        fig.text(0.01, 0.0, text, ha="left", va="top", fontsize=FONT, transform=fig.transFigure,
                 gid="footnote")  # fmt: skip


def suptitle(fig: Figure, title: str) -> None:
    """The run's description over the figure, wrapped to its width at ", " (a setting
    is never split over two lines)."""
    if not title:
        return
    fig.suptitle("\n".join(wrap_settings(title, int(fig.get_figwidth() * 14))))
