"""A factory that imports a file beside it (issue 22 case 15): `--module path/file.py:build`
puts the file's folder first on sys.path, as `python path/file.py` would."""

from neighbour_for_audit import make


def build():
    return make()
