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

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import ROOT, parser, readme_commands, replace, run_process, shrink  # noqa: E402

#: The test's tiny size, appended to the README's commands (the last value of an option wins).
SMALL = {
    "train": ("--layers 2 --d-model 16 --heads 2 --seq-len 16 --batch 2 --steps 6 --warmup 2 --eval-every 3 "
              "--save-steps 0,3,final --seeds 2").split(),
    "audit": "--seq-len 16 --batch 2".split(),
}  # fmt: skip
CONFIGS = [("naive", "pre"), ("gpt2", "pre"), ("naive", "post"), ("gpt2", "post")]
#: A run stalled when its final held-out loss is at least this share of the unigram entropy.
STALL_SHARE = 0.95


def commands(small: bool, work: Path) -> list[list[str]]:
    """The README's two command lines (read from it: the block above checkpoints.png),
    their folders in ``work``."""
    train, audit = readme_commands()["checkpoints"]
    train = replace(train + ["-q"], "--out", str(work / "train"))
    audit = replace(
        replace(audit + ["-q"], "--out", str(work / "audit")), "--checkpoint", str(work / "train")
    )
    if small:
        train, audit = shrink(train, SMALL["train"]), shrink(audit, SMALL["audit"])
    return [train, audit]


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
    # (drift.csv names each run; its scheme and placement are the summary's)
    drift = drift.merge(summary[["run", "init", "norm_position"]].drop_duplicates(), on="run")
    h = unigram_entropy()
    steps = sorted(summary["step"].unique().tolist())
    out: dict = {"unigram_entropy": h, "stall_share": STALL_SHARE, "steps": steps, "configs": {}}
    for init, pos in CONFIGS:
        r = runs[(runs["init"] == init) & (runs["norm_position"] == pos)].sort_values("seed")
        loss = r["final_eval_loss"].to_numpy(float)
        stalled = [int(s) for s, x in zip(r["seed"], loss, strict=True) if x >= STALL_SHARE * h]
        s = summary[(summary["init"] == init) & (summary["norm_position"] == pos)]
        v = variance[(variance["init"] == init) & (variance["norm_position"] == pos)]
        d = drift[(drift["init"] == init) & (drift["norm_position"] == pos)]
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
        if len(d):
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
    la, lb = out["configs"]["gpt2/pre"]["final_eval_loss"], out["configs"]["naive/pre"]["final_eval_loss"]
    out["pre_norm_loss_order"] = (
        "gpt2 lower on every seed" if la["max"] < lb["min"] else
        "naive lower on every seed" if lb["max"] < la["min"] else "overlapping: the seeds do not order them"
    )  # fmt: skip
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
            stalled = set(c["stalled_seeds"])
            for s in steps:
                vals = c["steps"][str(s)]["measured_over_law"]["values"]
                for seed, y in zip(c["seeds"], vals, strict=True):
                    hollow = seed in stalled
                    a.scatter(
                        s + (i - 1.5) * dx,
                        y,
                        s=12,
                        marker=st["marker"],
                        lw=0.8,
                        facecolors="none" if hollow else st["color"],
                        edgecolors=st["color"],
                    )
            losses = c["final_eval_loss"]["values"]
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
        a.set_title("each seed a point (hollow: stalled), the median a line", fontsize=FONT)
        a.set_xticks(steps)
        a.legend(fontsize=FONT - 1, loc="upper left")
        h = data["unigram_entropy"]
        b.axhline(h, color=NEUTRAL, ls=(0, (4, 2)), lw=1.0)
        b.axhline(STALL_SHARE * h, color=NEUTRAL, ls=(0, (1, 1.5)), lw=1.0)
        b.text(-0.45, h + 0.01, "unigram entropy of the held-out bytes", fontsize=FONT - 1, va="bottom",
               ha="left", color=NEUTRAL)  # fmt: skip
        b.text(-0.45, STALL_SHARE * h - 0.01, f"stalled above ({STALL_SHARE:.0%} of it)", fontsize=FONT - 1,
               va="top", ha="left", color=NEUTRAL)  # fmt: skip
        every = [x for c in data["configs"].values() for x in c["final_eval_loss"]["values"]]
        b.set_ylim(min(STALL_SHARE * h, *every) - 0.1, max(h, *every) + 0.15)
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
    loss = {k: rng(v["final_eval_loss"], "{:.3f}") for k, v in c.items()}
    stalled = {k: f"{len(v['stalled_seeds'])} of {len(v['seeds'])}" for k, v in c.items()}
    init = [c[k]["steps"]["0"]["measured_over_law"] for k in ("naive/pre", "gpt2/pre")]
    post0 = [c[k]["steps"]["0"]["measured_over_law"] for k in ("naive/post", "gpt2/post")]
    t = data["timing"]
    tr = t["train"]
    readme = [
        f"measured/law {min(x['min'] for x in init):.2f}–{max(x['max'] for x in init):.2f} pre-norm, "
        f"{min(x['min'] for x in post0):.3f} post-norm",
        f"is gpt2 {mol['gpt2/pre']}, naive {mol['naive/pre']} times the law's",
        *(
            ["the seeds do not order the two"]
            if data["pre_norm_order_at_last_step"].startswith("overlapping")
            else []
        ),
        *(
            ["gpt2 ends at the lower loss on every seed"]
            if data["pre_norm_loss_order"].startswith("gpt2")
            else []
        ),
        f"stalled at the unigram entropy in {stalled['gpt2/post']} seeds, naive in {stalled['naive/post']}",
        "# {:.0f} min at load {:.1f}, {} MiB".format(tr["seconds"] / 60, tr["load"][0], tr["peak_mib"]),
        f"# {t['audit']['seconds']:.0f} s",
    ]
    audit = [f"| {k} | {loss[k]} | {stalled[k]} | {mol[k]} |" for k in c]

    def big(x: dict) -> str:  # (a ratio of tens or more: whole numbers with separators)
        return rng(x, "{:,.0f}") if x["median"] >= 10 else rng(x)

    for k, v in c.items():
        for st in (str(s) for s in data["steps"]):
            x = v["steps"][st]
            if k.endswith("post") and st not in ("0", last):
                continue  # (the page's table leaves post-norm's middle step out)
            m = rng(x["measured_over_law"], "{:.3f}" if st == "0" else "{:.2f}")
            audit.append(f"| {k} | {st} | {big(x['v_final_rel'])} | {m} | {big(x['block0_growth'])} | "
                         f"{x['mean_cross_corr']['median']:.3f} |")  # fmt: skip
    return {"README.md": readme, "docs/reference/audit.md": audit}


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__, "training")
    ap.add_argument("--reuse", action="store_true", help="analyse the run folders already in --work")
    a = ap.parse_args(argv)
    timing = {}
    if a.reuse and (a.work / "timing.json").exists():  # (what the run that made the folders took)
        timing = json.loads((a.work / "timing.json").read_text())
    if not a.reuse:
        a.work.mkdir(parents=True, exist_ok=True)
        for name, cmd in zip(("train", "audit"), commands(a.small, a.work), strict=True):
            if (a.work / name).exists():
                raise SystemExit(f"{a.work / name} exists: give --reuse or another --work")
            timing[name] = run_process(cmd)
        (a.work / "timing.json").write_text(json.dumps(timing) + "\n")
    data = {
        "small": a.small,
        "commands": ["tinit " + " ".join(c) for c in commands(a.small, Path("WORK"))],
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
