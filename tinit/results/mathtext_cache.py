"""One cache of parsed mathtext for the whole process, instead of one per renderer.

matplotlib (3.11) caches ``MathTextParser._parse_cached`` with ``functools.lru_cache``
on the method, so the parser instance is part of the key, and every renderer makes its
own parser: ``savefig(bbox_inches="tight")`` draws with two renderers (the layout pass,
then the cropped one), and each figure with new ones. Every log-axis tick label
(``$\\mathdefault{10^{2}}$``) and every math label is parsed again each time: 30% of
drawing the depth-sweep figure, 15% of the variance figure (pyparsing). The parse
depends on the instance only through its output type (raster or vector), so keying on
that instead gives byte-identical images (tests/test_figure_cost.py) at a fraction of
the cost. Installed once by :func:`tinit.results.plots.save_figure`; left alone when
matplotlib's internals are not the ones described here.
"""

from __future__ import annotations

import functools

_INSTALLED = False


def install() -> bool:
    """Share the mathtext parse cache across parsers; returns whether it is shared."""
    global _INSTALLED
    if _INSTALLED:
        return True
    from matplotlib import mathtext

    cls = mathtext.MathTextParser
    parse = getattr(cls._parse_cached, "__wrapped__", None)
    if parse is None or not callable(getattr(cls._parse_cached, "cache_info", None)):
        return False  # not the lru_cache on the method this module works around
    representative: dict[str, object] = {}

    @functools.lru_cache(maxsize=1024)
    def shared(output_type, s, dpi, prop, antialiased, load_glyph_flags):
        return parse(representative[output_type], s, dpi, prop, antialiased, load_glyph_flags)

    def _parse_cached(self, s, dpi, prop, antialiased, load_glyph_flags):
        kind = getattr(self, "_output_type", None)
        if kind is None:
            return parse(self, s, dpi, prop, antialiased, load_glyph_flags)
        representative.setdefault(kind, self)
        return shared(kind, s, dpi, prop, antialiased, load_glyph_flags)

    cls._parse_cached = _parse_cached
    _INSTALLED = True
    return True
