"""Through training: the stream law at init and after 300 Adam steps, over five seeds.

Regenerates every number of the README's "Through training" paragraph and of
docs/reference/audit.md's "Through training" section, and the figure
docs/img/checkpoints.png: naive and depth-scaled (gpt2) x pre- and post-norm, 12 layers,
d 96, 300 Adam steps on the standard library's bytes, seeds 0-4, checkpoints at steps 0,
150 and 300, each audited on the same held-out batch (`tinit audit --checkpoint --data
stdlib`: its windows drawn by --seed 0 for every run). Writes training.json beside this
file and the figure, and prints the numbers.

    python docs/findings/training.py             # ~35 min on the shared 2-core VM
    python docs/findings/training.py --reuse     # the run folders of the last full run
    python docs/findings/training.py --small     # a reduced size (the test): seconds

A run **stalled** when its held-out loss at its last step is at least 95% of the
unigram entropy of the held-out bytes (it learned no more than how often each byte
occurs): a criterion fixed before the runs, from the data alone. Medians and ranges are
over the seeds; a comparison of two configurations says "separated" only when their
ranges over the seeds do not overlap.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FULL = {
    "layers": 12,
    "d_model": 96,
    "heads": 4,
    "seq_len": 64,
    "batch": 8,
    "steps": 300,
    "warmup": 30,
    "eval_every": 50,
    "save": "0,150,final",
    "seeds": 5,
}
SMALL = {
    "layers": 2,
    "d_model": 16,
    "heads": 2,
    "seq_len": 16,
    "batch": 2,
    "steps": 6,
    "warmup": 2,
    "eval_every": 3,
    "save": "0,3,final",
    "seeds": 2,
}
CONFIGS = [("naive", "pre"), ("gpt2", "pre"), ("naive", "post"), ("gpt2", "post")]
#: A run stalled when its final held-out loss is at least this share of the unigram entropy.
STALL_SHARE = 0.95


def commands(size: dict, work: Path) -> list[list[str]]:
    """The two command lines (as the README shows them, with --seeds)."""
    tinit = [sys.executable, "-m", "tinit"]
    train = [
        *tinit,
        "train",
        "--layers",
        str(size["layers"]),
        "--d-model",
        str(size["d_model"]),
        "--heads",
        str(size["heads"]),
        "--seq-len",
        str(size["seq_len"]),
        "--batch",
        str(size["batch"]),
        "--vocab",
        "256",
        "--data",
        "stdlib",
        "--init",
        "naive,gpt2",
        "--norm-position",
        "pre,post",
        "--steps",
        str(size["steps"]),
        "--lr",
        "3e-3",
        "--warmup",
        str(size["warmup"]),
        "--eval-every",
        str(size["eval_every"]),
        "--save-steps",
        size["save"],
        "--threads",
        "1",
        "--seeds",
        str(size["seeds"]),
        "-q",
        "--out",
        str(work / "train"),
    ]
    audit = [
        *tinit,
        "audit",
        "--checkpoint",
        str(work / "train"),
        "--data",
        "stdlib",
        "--seq-len",
        str(size["seq_len"]),
        "--batch",
        str(size["batch"]),
        "--threads",
        "1",
        "-q",
        "--out",
        str(work / "audit"),
    ]
    return [train, audit]


def run(cmd: list[str]) -> dict:
    """One whole process: wall seconds, peak RSS, the load before and after."""
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err[-2000:]}")
    return {
        "seconds": round(time.perf_counter() - t0, 1),
        "peak_mib": round(usage.ru_maxrss / 1024),
        "load": [round(load, 2), round(os.getloadavg()[0], 2)],
    }


def unigram_entropy() -> float:
    """The entropy (nats) of the byte frequencies of the held-out text (the last 10% of
    the standard library's bytes that tinit train evaluates on), counted here."""
    from tinit.experiments.training.data import held_out, stdlib_corpus

    held = held_out(stdlib_corpus()[0])
    p = np.bincount(held.astype(np.int64), minlength=256) / held.size
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def spread(values) -> dict:
    """Median, min and max over the seeds (and the values)."""
    v = [float(x) for x in values]
    return {"median": float(np.median(v)), "min": min(v), "max": max(v), "values": v}


def analyse(work: Path) -> dict:
    runs = pd.read_csv(work / "train" / "runs.csv")
    summary = pd.read_csv(work / "audit" / "summary.csv")
    variance = pd.read_csv(work / "audit" / "variance.csv")
    drift = pd.read_csv(work / "audit" / "drift.csv")
    h = unigram_entropy()
    steps = sorted(summary["step"].unique().tolist())
    out: dict = {"unigram_entropy": h, "stall_share": STALL_SHARE, "steps": steps, "configs": {}}
    for init, pos in CONFIGS:
        r = runs[(runs["init"] == init) & (runs["norm_position"] == pos)].sort_values("seed")
        loss = r["final_eval_loss"].to_numpy(float)
        stalled = [int(s) for s, x in zip(r["seed"], loss, strict=True) if x >= STALL_SHARE * h]
        s = summary[(summary["init"] == init) & (summary["norm_position"] == pos)]
        v = variance[(variance["init"] == init) & (variance["norm_position"] == pos)]
        d = drift[(drift["init"] == init) & (drift["norm_position"] == pos)] if "init" in drift else None
        per_step = {}
        for step in steps:
            at = s[s["step"] == step]
            vs = v[v["step"] == step]
            # block 0's growth: v after its two additions over v0 (k = 2 against k = 0), per run
            b0 = [
                float(g.loc[g["k"] == 2, "stream_var"].iloc[0] / g.loc[g["k"] == 0, "stream_var"].iloc[0])
                for _, g in vs.groupby("run")
            ]
            corr = [float(g["cross_corr"].mean()) for _, g in vs.groupby("run")]
            per_step[str(step)] = {
                "v_final_rel": spread(at["v_final_rel"]),
                "measured_over_law": spread(at["v_final"] / at["pred_cumulative_final"]),
                "block0_growth": spread(b0),
                "mean_cross_corr": spread(corr),
            }
        moved, spectral = {}, {}
        if d is not None:
            last, first = steps[-1], steps[0]
            for role in ("embed", "q", "k", "v", "o", "gate", "up", "down"):
                dr = d[d["role"] == role]
                if len(dr):
                    moved[role] = spread(dr[dr["step"] == last].groupby("run")["rel_change"].mean())
                    spectral[role] = {
                        str(st): spread(dr[dr["step"] == st].groupby("run")["spectral_norm"].mean())
                        for st in (first, last)
                    }
        out["configs"][f"{init}/{pos}"] = {
            "seeds": [int(x) for x in r["seed"]],
            "final_eval_loss": spread(loss),
            "stalled_seeds": stalled,
            "steps": per_step,
            "moved_at_last_step": moved,
            "spectral_norm_mean_over_layers": spectral,
        }
    last = str(steps[-1])
    a = out["configs"]["gpt2/pre"]["steps"][last]["measured_over_law"]
    b = out["configs"]["naive/pre"]["steps"][last]["measured_over_law"]
    out["pre_norm_order_at_last_step"] = (
        "separated"
        if a["max"] < b["min"] or b["max"] < a["min"]
        else "overlapping: the seeds do not order them"
    )
    return out


def figure(data: dict, path: Path) -> None:
    """Two panels: measured / law at v_2L against the step, every seed a point and the
    median a line, per configuration; and each run's final held-out loss, a stalled run
    hollow, beside the unigram entropy."""
    from tinit.results.palette import config_style
    from tinit.results.style import FONT, FULL_WIDTH, NEUTRAL, new_figure, styled

    @styled
    def draw():
        fig, (a, b) = new_figure(2, 1, FULL_WIDTH, 3.2)
        steps = data["steps"]
        dx = 0.025 * (steps[-1] - steps[0] or 1)  # (the seeds of a configuration side by side)
        for i, (init, pos) in enumerate(CONFIGS):
            c = data["configs"][f"{init}/{pos}"]
            st = config_style(init, pos)
            med = [c["steps"][str(s)]["measured_over_law"]["median"] for s in steps]
            a.plot(steps, med, color=st["color"], marker=st["marker"], lw=1.6, label=f"{init} / {pos}")
            for s in steps:
                vals = c["steps"][str(s)]["measured_over_law"]["values"]
                a.scatter([s + (i - 1.5) * dx] * len(vals), vals, color=st["color"], s=9, alpha=0.6, lw=0)
            losses = c["final_eval_loss"]["values"]
            stalled = set(c["stalled_seeds"])
            for seed, x in zip(c["seeds"], losses, strict=True):
                hollow = seed in stalled
                b.scatter(
                    i + (seed - 2) * 0.06,
                    x,
                    marker=st["marker"],
                    s=28,
                    facecolors="none" if hollow else st["color"],
                    edgecolors=st["color"],
                )
        a.axhline(1.0, color=NEUTRAL, ls=(0, (4, 2)), lw=1.0)
        a.set_xlabel("training step", fontsize=FONT)
        a.set_ylabel("measured / law at v_2L (dashed: the law holds)", fontsize=FONT)
        a.set_xticks(steps)
        a.legend(fontsize=FONT - 1, loc="upper left")
        h = data["unigram_entropy"]
        b.axhline(h, color=NEUTRAL, ls=(0, (4, 2)), lw=1.0)
        b.axhline(STALL_SHARE * h, color=NEUTRAL, ls=(0, (1, 1.5)), lw=1.0)
        b.text(3.45, h, "unigram entropy", fontsize=FONT - 1, va="bottom", ha="right", color=NEUTRAL)
        b.text(
            3.45,
            STALL_SHARE * h,
            f"stalled above ({STALL_SHARE:.0%})",
            fontsize=FONT - 1,
            va="top",
            ha="right",
            color=NEUTRAL,
        )
        b.set_xticks(range(len(CONFIGS)), [f"{i} / {p}" for i, p in CONFIGS], fontsize=FONT)
        b.set_xlim(-0.5, len(CONFIGS) - 0.5)
        b.set_ylabel(f"held-out loss at step {steps[-1]} (nats; hollow: stalled)", fontsize=FONT)
        n = len(data["configs"]["naive/pre"]["seeds"])
        fig.suptitle(f"Through training, {n} seeds each: the law at v_2L, and the loss", fontsize=FONT + 1)
        return fig

    fig = draw()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def quotes(data: dict) -> dict[str, list[str]]:
    """The strings README.md and docs/reference/audit.md must hold, from ``data``
    (tests/test_findings.py checks them against the committed training.json)."""
    c, last = data["configs"], str(data["steps"][-1])

    def rng(x: dict, f: str = "{:.2f}") -> str:
        return f"{f.format(x['median'])} ({f.format(x['min'])}-{f.format(x['max'])})"

    mol = {k: rng(v["steps"][last]["measured_over_law"]) for k, v in c.items()}
    init_mol = {k: rng(v["steps"]["0"]["measured_over_law"], "{:.3f}") for k, v in c.items()}
    stalled = {k: f"{len(v['stalled_seeds'])} of {len(v['seeds'])}" for k, v in c.items()}
    readme = [
        f"gpt2 {mol['gpt2/pre']}",
        f"naive {mol['naive/pre']}",
        f"stalled in {stalled['naive/post']}",
        f"{stalled['gpt2/post']}",
    ]
    audit = [*(f"| {k} | {init_mol[k]} | {mol[k]} |" for k in c)]
    return {"README.md": readme, "docs/reference/audit.md": audit}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="a reduced size (the test's)")
    ap.add_argument("--reuse", action="store_true", help="analyse the run folders already in --work")
    ap.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "out" / "findings" / "training")
    ap.add_argument("--out", type=Path, default=HERE, help="where training.json goes (the figure: docs/img)")
    a = ap.parse_args(argv)
    size = SMALL if a.small else FULL
    timing = {}
    if not a.reuse:
        a.work.mkdir(parents=True, exist_ok=True)
        for name, cmd in zip(("train", "audit"), commands(size, a.work), strict=True):
            if (a.work / name).exists():
                raise SystemExit(f"{a.work / name} exists: give --reuse or another --work")
            timing[name] = run(cmd)
    data = {
        "size": size,
        "commands": [" ".join(c[2:]) for c in commands(size, Path("WORK"))],
        "timing": timing,
        **analyse(a.work),
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "training.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    img = (a.out if a.small else ROOT / "docs" / "img") / "checkpoints.png"
    figure(data, img)
    for k, v in data["configs"].items():
        last = str(data["steps"][-1])
        print(
            f"{k}: loss {v['final_eval_loss']['median']:.3f} stalled {v['stalled_seeds']}, measured/law at "
            f"v_2L {v['steps'][last]['measured_over_law']['median']:.2f}"
        )
    print(f"wrote {a.out / 'training.json'} and {img}")


if __name__ == "__main__":
    main()
