"""What the findings share: the README's commands (each finding runs the command the
README shows, read from it, so the two cannot drift apart), a tiny size for the test,
and a command run as a whole process, timed with the load."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FINDINGS = Path(__file__).resolve().parent
README = ROOT / "README.md"


def readme_commands() -> dict[str, list[list[str]]]:
    """Each README picture's commands (``docs/img/<name>.png`` -> the ``tinit`` lines of
    the bash block just above it, without ``tinit``; a trailing comment dropped,
    continuation lines joined)."""
    text = README.read_text()
    out = {}
    block = r"```bash\n((?:(?!```).)*?)```\s*\n!\[[^\]]*\]\(docs/img/([\w-]+)\.png\)"
    for code, path in re.findall(block, text, re.S):
        lines = code.replace("\\\n", " ").splitlines()
        cmds = [shlex.split(line.split("#")[0]) for line in lines if line.strip().startswith("tinit ")]
        out[path] = [c[1:] for c in cmds]
    return out


def replace(args: list[str], option: str, value: str) -> list[str]:
    """``args`` with ``option``'s value replaced (appended when it has none)."""
    out = list(args)
    if option in out:
        out[out.index(option) + 1] = value
        return out
    return [*out, option, value]


def shrink(args: list[str], small: list[str]) -> list[str]:
    """``args`` at the tiny size ``small``: appended (the last value of an option wins),
    except a ``--set KEY=`` of ``small``, which replaces the command's own (a key given
    twice is refused)."""
    keys = {small[i + 1].split("=")[0] for i in range(len(small) - 1) if small[i] == "--set"}
    out, i = [], 0
    while i < len(args):
        if args[i] == "--set" and i + 1 < len(args) and args[i + 1].split("=")[0] in keys:
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out + small


def run_process(args: list[str]) -> dict:
    """``tinit ARGS`` as a whole process: wall seconds, peak RSS (MiB) and the 1-minute
    load before and after; its exit 0 or 1 (check's failed claim) accepted, else the
    end of its stderr raised."""
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "tinit", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read()
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise SystemExit(f"tinit {shlex.join(args)}: exit {code}\n{err[-2000:]}")
    return {"seconds": round(time.perf_counter() - t0, 1), "peak_mib": round(usage.ru_maxrss / 1024),
            "load": [round(load, 2), round(os.getloadavg()[0], 2)]}  # fmt: skip


def run_in_process(args: list[str]) -> None:
    """``tinit ARGS`` in this process (the tiny sizes of the test: torch imported once)."""
    from typer.testing import CliRunner

    from tinit.cli import app

    res = CliRunner().invoke(app, args)
    if res.exit_code not in (0, 1):  # (check exits 1 when a claim fails: its files are written)
        raise SystemExit(f"tinit {shlex.join(args)}: exit {res.exit_code}\n{res.output[-2000:]}")


def width_fits(run: Path) -> dict:
    """coord-check's fits along width in ``run`` (its coord_check_fit.csv), per scheme:
    ({"verdict", "outside", "rows"}, the row of largest |slope|, the rows with a slope)."""
    import pandas as pd

    fit = pd.read_csv(run / "coord_check_fit.csv")
    width = fit[(fit["axis"] == "width") & fit["slope"].notna()]
    out = {}
    for init, g in width.groupby("init"):
        verdicts = fit.loc[(fit["init"] == init) & (fit["axis"] == "width"), "verdict"].dropna()
        base = {"verdict": str(verdicts.iloc[0]) if len(verdicts) else "",
                "outside": int((~g["within"].astype(bool)).sum()), "rows": len(g)}  # fmt: skip
        out[init] = (base, g.loc[g["slope"].abs().idxmax()], g)
    return out


def parser(doc: str, name: str, small: str = "a reduced size (the test)") -> argparse.ArgumentParser:
    """A finding's command line: ``--small`` (the test's size), ``--work`` (where its
    runs go: benchmarks/out/findings/<name>) and ``--out`` (where <name>.json goes)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help=small)
    ap.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "out" / "findings" / name)
    ap.add_argument("--out", type=Path, default=FINDINGS, help=f"where {name}.json goes")
    return ap
