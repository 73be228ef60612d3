"""Regenerate every finding: each script of docs/findings/ in turn, as a whole process,
its wall time and the load printed (docs/findings/index.md lists what each one writes).

    python docs/findings/all.py                  # every finding: ~1 h 45 min on the shared 2-core VM
    python docs/findings/all.py training readme  # some of them

The README, docs/reference/audit.md and docs/findings/mf.md quote the JSON files these
write; `pytest tests/test_findings.py` then says which quoted number no longer matches
(a regeneration changes the seconds and the loads, and whatever the code changed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: In order; each ~minutes on the shared 2-core VM, one torch thread (docs/findings/index.md).
FINDINGS = ("training", "readme", "coord_check", "mf_depth", "mf_width", "mf_post_attention")


def main() -> None:
    names = sys.argv[1:] or list(FINDINGS)
    unknown = set(names) - set(FINDINGS)
    if unknown:
        raise SystemExit(f"no finding {sorted(unknown)}: one of {', '.join(FINDINGS)}")
    total = time.perf_counter()
    for name in names:
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        subprocess.run([sys.executable, str(HERE / f"{name}.py")], check=True)
        print(
            f"== {name}: {time.perf_counter() - t0:.0f} s (load {load:.1f} -> {os.getloadavg()[0]:.1f})",
            flush=True,
        )
    print(f"== every finding: {(time.perf_counter() - total) / 60:.1f} min")


if __name__ == "__main__":
    main()
