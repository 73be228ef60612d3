"""The coordinate checks that docs/reference/coord-check.md quotes ("Measured"): each
command run as the page writes it, its fit read from coord_check_fit.csv.

    python docs/findings/coord_check.py          # ~3 min on the shared 2-core VM
    python docs/findings/coord_check.py --small  # a reduced size (the test)

Per command and scheme: the verdict along width, how many fit rows are outside the 0.25
tolerance, the worst slope (with its standard error, quantity, step and depth), and the
FFN branch's slope after the first step at each depth. The README's own coord-check
(`--init gpt2,mup-example --untie --norm layernorm`) is docs/findings/readme.py's.
Writes coord_check.json beside this file.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import parser, replace, run_in_process, run_process, shrink, width_fits  # noqa: E402

COMMANDS = {
    "defaults": "coord-check --init gpt2,mup",
    "rules_off": "coord-check --init mup --param-rules off",
    "example_constants": "coord-check --init gpt2,mup --sigma 0.0625 --embed-std 1 --untie",
}
SMALL = "--d-model 16,32 --layers 1,2 --steps 1 --seeds 2 --seq-len 16 --batch 2 --vocab 64".split()


def read(run: Path) -> dict:
    out = {}
    for init, (base, worst, g) in width_fits(run).items():
        ffn1 = g[(g["quantity"] == "ffn") & (g["step"] == 1)]
        out[init] = {
            **base,
            "worst": {
                "slope": float(worst["slope"]),
                "se": float(worst["slope_se"]),
                "quantity": str(worst["quantity"]),
                "step": int(worst["step"]),
                "layers": int(worst["n_layers"]),
            },  # fmt: skip
            "ffn_step1": {
                str(int(r["n_layers"])): {"slope": float(r["slope"]), "se": float(r["slope_se"])}
                for _, r in ffn1.iterrows()
            },  # fmt: skip
        }
    return out


def quotes(data: dict) -> dict[str, list[str]]:
    """The strings docs/reference/coord-check.md must hold, from coord_check.json."""
    d, off, ex = data["defaults"]["fit"], data["rules_off"]["fit"], data["example_constants"]["fit"]

    def outside(x: dict) -> str:
        return f"**{x['verdict']}** ({x['outside']} of {x['rows']} rows outside)"

    m1 = d["mup"]["ffn_step1"]

    def slope(x: dict) -> str:  # (the page writes a minus sign, not a hyphen)
        return f"d^{x['slope']:.2f} ± {x['se']:.2f}".replace("-", "−")

    return {"docs/reference/coord-check.md": [
        f"`gpt2` {outside(d['gpt2'])}",
        f"`mup`\n  {outside(d['mup'])}",
        f"{slope(m1['2'])} (L = 2)",
        f"{slope(m1['8'])} (L = 8)",
        f"(muP's init and multipliers, one lr for\n  every parameter): {outside(off['mup'])}",
        f"`mup`\n  **{ex['mup']['verdict']}** ({ex['mup']['outside']} of {ex['mup']['rows']} rows outside",
    ]}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__, "coord_check")
    a = ap.parse_args(argv)
    data = {}
    for key, cmd in COMMANDS.items():
        folder = a.work / key
        if folder.exists():
            raise SystemExit(f"{folder} exists: remove it (or give another --work)")
        args = replace([*shlex.split(cmd), "-q"], "--out", str(folder))
        if a.small:
            run_in_process(shrink(args, SMALL))
            timing = {}
        else:
            timing = run_process(args)
        data[key] = {"command": "tinit " + cmd, "timing": timing, "fit": read(folder)}
        print(f"{key}: {json.dumps(data[key]['fit'])[:300]}", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "coord_check.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {a.out / 'coord_check.json'}")


if __name__ == "__main__":
    main()
