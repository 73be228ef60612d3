"""Text shaping that figures and terminal tables share (no matplotlib, no rich here)."""

from __future__ import annotations

import textwrap


def wrap_settings(text: str, width: int) -> list[str]:
    """``text`` (settings joined by ", ") in lines of at most ``width``, broken only
    between settings ("seed 0" never becomes "seed" / "0,"); a setting longer than a
    line breaks at its spaces."""
    lines, line = [], ""
    for part in text.split(", "):
        cand = f"{line}, {part}" if line else part
        if len(cand) + 1 > width and line:  # + 1: a line that goes on ends in ","
            lines.append(line + ",")
            line = part
        else:
            line = cand
    lines.append(line)
    return [w for ln in lines for w in (textwrap.wrap(ln, width) if len(ln) > width else [ln])]
