"""The plot formats a run can write (no matplotlib here: option parsing needs this)."""

FORMATS = ("png", "pdf", "svg")
