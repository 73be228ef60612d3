"""The device check's one table: the figures every step of benchmarks/device_check.sh
left in its work folder, with the target each is held to, printed as markdown and
written as CSV (step, figure, value, unit, target, verdict).

    python benchmarks/device_table.py WORK_DIR --bench bench_gpu.csv --csv device_table.csv

A figure a step did not leave (it failed, timed out or was skipped) is a row with an
empty value and the step's exit status, so the table always says what is missing.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
from pathlib import Path


def _read_csv(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _float(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _peak_gib(meta: dict) -> float:
    """The largest peak-memory figure a run recorded (GPU when there is one), in GiB."""
    values = [_float(v) / 1024 for k, v in meta.items() if k.startswith("peak") and k.endswith("_mib")]
    return max(values) if values else math.nan


def _verdict(value: float, target: str) -> str:
    """``meets`` / ``misses`` against a target's first bound (``<= 0.6 s, <= 6 GiB``)."""
    m = re.match(r"\s*<=\s*([0-9.]+)", target or "")
    if not m or not math.isfinite(value):
        return ""
    return "meets" if value <= float(m.group(1)) else "misses"


def rows(work: Path, bench_csv: Path) -> list[dict]:
    out: list[dict] = []

    def add(step: str, figure: str, value: float, unit: str, target: str = "") -> None:
        out.append({"step": step, "figure": figure, "value": value, "unit": unit, "target": target,
                    "verdict": _verdict(value, target)})  # fmt: skip

    for r in _read_csv(bench_csv):  # bench_gpu.py's own rows and targets
        case, target = r["case"], r.get("target", "")
        unit = "%" if "overhead" in case else ("x" if "off/on" in case else "s")
        add("bench-gpu", case, _float(r["value"]), unit, target.split(",")[0])
        if math.isfinite(_float(r.get("peak_gib"))):
            peak_target = next((t.strip() for t in target.split(",") if "GiB" in t), "")
            add("bench-gpu", f"{case}: peak memory", _float(r["peak_gib"]), "GiB", peak_target)
    for stem, step in (("variance", "variance-70b"), ("audit", "audit-7b"), ("train", "train")):
        peak = _peak_gib(_read_json(work / stem / "config.json"))
        if math.isfinite(peak):
            add(step, f"{step}: peak memory", peak, "GiB")
    ckpt = _read_json(work / "ckpt-audit" / "config.json")
    if ckpt:
        add("ckpt-audit", "8B checkpoint audit: measured (read, blocks, figures excluded)",
            sum(_float(v) for v in (ckpt.get("seconds") or {}).values()), "s")  # fmt: skip
        rss = _float(ckpt.get("peak_rss_mib")) / 1024
        add("ckpt-audit", "8B checkpoint audit: host peak RSS", rss, "GiB", "<= 2.5 GiB")
        gpu = [_float(v) for v in (ckpt.get("peak_gpu_memory_gib") or {}).values()]
        if gpu:
            add("ckpt-audit", "8B checkpoint audit: GPU peak memory", max(gpu), "GiB")
        add("ckpt-audit", "8B checkpoint audit: GiB read", _float(ckpt.get("bytes_read")) / 2**30, "GiB")
    for r in _read_csv(work / "norms" / "norms_ratio.csv"):
        add("norms", f"LayerNorm / RMSNorm time, {r['impl']} {r['pass']} ({r['rows']} x {r['d_model']})",
            _float(r.get("time_ratio")), "x")  # fmt: skip
    for r in _read_csv(work / "train" / "runs.csv"):
        add("train", "train tokens/s (drawing the data included)", _float(r.get("tokens_per_s")), "tokens/s")
        add("train", "train MFU (empty off a GPU tinit knows)", _float(r.get("mfu")), "fraction")
    for r in _read_csv(work / "coord" / "coord_check_fit.csv"):
        if r.get("verdict"):
            add("coord-check", f"coord-check {r.get('init')}: {r.get('verdict')}", _float(r.get("slope")),
                "slope")  # fmt: skip
    for r in _read_csv(work / "steps.csv"):  # every step's whole wall time, and how it ended
        ended = {"0": "meets", "skipped": "skipped"}.get(r["exit"], f"exit {r['exit']}")
        out.append({"step": r["step"], "figure": f"{r['step']}: whole step", "value": _float(r["seconds"]),
                    "unit": "s", "target": "exit 0", "verdict": ended})  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("work", type=Path, help="device_check.sh's work folder")
    ap.add_argument("--bench", type=Path, required=True, help="bench_gpu.py's CSV")
    ap.add_argument("--csv", type=Path, required=True)
    args = ap.parse_args()
    table = rows(args.work, args.bench)
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["step", "figure", "value", "unit", "target", "verdict"])
        w.writeheader()
        for r in table:
            w.writerow({**r, "value": "" if not math.isfinite(r["value"]) else f"{r['value']:.4g}"})
    print("| step | figure | value | unit | target | verdict |\n|---|---|---|---|---|---|")
    for r in table:
        value = f"{r['value']:.4g}" if math.isfinite(r["value"]) else ""
        print(f"| {r['step']} | {r['figure']} | {value} | {r['unit']} | {r['target']} | {r['verdict']} |")
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
