"""A module that calls sys.exit(0) when imported (issue 22 case 6)."""

import sys

sys.exit(0)


def build():
    raise AssertionError("never reached")
