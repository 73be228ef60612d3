"""Independent peer of `tinit coord-check --init mup`, built on microsoft/mup's own package.

No tinit import: plain torch + ``mup`` (PyPI ``mup`` 1.0.0, the code of microsoft/mup
@1981497). The model follows mup's scheme (README "Basic Usage", examples/Transformer/model.py):
``set_base_shapes`` with a base model at d0 = 256 and a delta model at 2 d0, hidden matrices
re-initialised with ``mup.init.normal_`` (std sigma * sqrt(d0 / fan_in): sigma at d0),
``MuReadout``/``MuSharedReadout`` (logits x d0 / d), attention q.k / d_head and zero-initialised
queries, ``MuAdamW`` (lr / m on hidden matrices) at lr 1e-2 without weight decay. The measuring
is ``mup.coord_check.get_coord_data`` itself: one fixed batch, forward hooks on each step's
forward (t = 1 is the forward at init, so step = t - 1 updates taken), with the ``l2`` statistic
(sqrt(mean x^2), the RMS) in place of mup's default ``l1``.

Model: pre-norm decoder, ``nn.RMSNorm`` (eps 1e-6) before attention, FFN and the readout;
causal multi-head attention (4 heads, rotary position embedding on q and k, no biases);
SwiGLU FFN (d_ff = 3 d by default, so that every width multiplier is exactly d / d0; --d-ff 8d/3
for LLaMA's rounded-up size); the readout is tied to the embedding (``MuSharedReadout``, no bias)
for tinit's constants (sigma 0.02 everywhere) and untied zero-initialised
(``MuReadout(readout_zero_init=True)``) for mup's example constants (sigma 0.0625 = 1/sqrt(256),
embedding N(0, 1)); two mixed sets change one of them at a time. Data, drawn per seed with the
weights: one fixed batch of a random first-order Markov chain over V = 256 tokens (k = 4
successors per token, uniform over them) or uniform random tokens, sequences of 32, next-token
cross-entropy.

Fit (as tinit's coord_check_fit.csv): per seed, step and quantity, the mean over layers of
log2 RMS, a least-squares slope against log2 width; the table prints mean +- standard error
over seeds. Criterion (tinit.criteria.COORD_SLOPE_TOL, restated here, not imported): a block
quantity is within when |slope| <= 0.25, the logits when slope <= 0.25.

Run it from a venv that has ``mup`` (it is not a tinit dependency), one thread, about 10 s:

    python benchmarks/mup_coord_peer.py                # tinit's and mup's constants, batch 4, 1; L = 2
    python benchmarks/mup_coord_peer.py --layers 8 --constants tinit --seeds 12
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

try:
    import mup
    from mup.coord_check import get_coord_data
except ImportError:  # the peer needs mup's own package, never a re-implementation
    sys.exit("mup_coord_peer.py: needs the `mup` package (pip install mup) in a separate venv")

D0 = 256  # base width: muP's multipliers are 1 here
VOCAB = 256
SEQ = 32
HEADS = 4
LR = 1e-2
SLOPE_TOL = 0.25
CONSTANTS = {  # name -> (hidden sigma at d0, embedding std, tied readout)
    "tinit": (0.02, 0.02, True),
    "mup-example": (1 / math.sqrt(D0), 1.0, False),
    # one constant changed at a time: which of sigma and the readout carries the effect
    "sigma0.0625-tied": (1 / math.sqrt(D0), 0.02, True),
    "sigma0.02-untied": (0.02, 1.0, False),
}


def rope(x: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (Su et al. 2021), rotate-half form, base 10000, on (B, H, T, dh)."""
    t, dh = x.shape[-2], x.shape[-1]
    inv = 10000.0 ** (-torch.arange(0, dh, 2, dtype=x.dtype) / dh)
    ang = torch.arange(t, dtype=x.dtype)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    x1, x2 = x[..., : dh // 2], x[..., dh // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        dh = d // HEADS
        q, k, v = (m(x).view(b, t, HEADS, dh).transpose(1, 2) for m in (self.q, self.k, self.v))
        # muP's 1/d_head (Tensor Programs V, sec. 4; mup's attn_mult / d_head), not 1/sqrt(d_head)
        y = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True, scale=1.0 / dh)
        return self.o(y.transpose(1, 2).reshape(b, t, d))


def d_ff(d: int, rule: str) -> int:
    """'3d' keeps every width multiplier exactly d / d0; '8d/3' is LLaMA's, rounded up to 64."""
    return 3 * d if rule == "3d" else 64 * math.ceil(8 * d / 3 / 64)


class SwiGLU(nn.Module):
    def __init__(self, d: int, ff: int):
        super().__init__()
        self.gate, self.up = nn.Linear(d, ff, bias=False), nn.Linear(d, ff, bias=False)
        self.down = nn.Linear(ff, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, d: int, ff: int):
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
        self.attn, self.ffn = Attention(d), SwiGLU(d, ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class Decoder(nn.Module):
    def __init__(self, d: int, layers: int, tied: bool, ff_rule: str):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList(Block(d, d_ff(d, ff_rule)) for _ in range(layers))
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.readout = (
            mup.MuSharedReadout(self.embed.weight, bias=False)
            if tied
            else mup.MuReadout(d, VOCAB, bias=False, readout_zero_init=True)
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.readout(self.norm(x))


def build(d: int, a: argparse.Namespace, shapes: dict, seed: int) -> Decoder:
    """mup's scheme: shapes first, then re-initialise with mup.init so the std follows width."""
    sigma, embed_std, tied = CONSTANTS[a.const]
    torch.manual_seed(seed)  # overrides get_coord_data's manual_seed(0): init varies by seed
    model = Decoder(d, a.layers, tied, a.d_ff)
    mup.set_base_shapes(model, shapes[D0], delta=shapes[2 * D0])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.infshape.ninf() == 2:  # hidden matrix: N(0, sigma^2 d0 / fan_in)
                mup.init.normal_(p, std=sigma)
            if name.endswith(".q.weight"):
                p.zero_()  # mup's query_zero_init
        nn.init.normal_(model.embed.weight, std=embed_std)  # (V, d): one inf dim, constant std
        if not tied:
            model.readout.weight.zero_()
    return model


def fixed_batch(batch: int, data: str, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One fixed batch: uniform random tokens, or a random first-order Markov chain in which
    each token has k successors drawn uniformly (each picked with probability 1/k)."""
    g = torch.Generator().manual_seed(10_000 + seed)
    if data == "uniform":
        seqs = torch.randint(0, VOCAB, (batch, SEQ + 1), generator=g)
    else:
        succ = torch.randint(0, VOCAB, (VOCAB, k), generator=g)
        seqs = torch.empty(batch, SEQ + 1, dtype=torch.long)
        seqs[:, 0] = torch.randint(0, VOCAB, (batch,), generator=g)
        for t in range(SEQ):
            seqs[:, t + 1] = succ[seqs[:, t], torch.randint(0, k, (batch,), generator=g)]
    return seqs[:, :-1], seqs[:, 1:].reshape(-1)


def quantity(module: str) -> str | None:
    if module.endswith(".ffn"):
        return "ffn"
    if module.endswith(".attn"):
        return "attn"
    return "logits" if module == "readout" else None


def measure(widths: list[int], a: argparse.Namespace, batch: int) -> pd.DataFrame:
    """mup's get_coord_data per seed (its own seed loop fixes one batch for every seed; here
    the batch is drawn per seed, as tinit draws its Markov batch from the seed)."""
    tied = CONSTANTS[a.const][2]
    shapes = {k: mup.get_shapes(Decoder(k, a.layers, tied, a.d_ff)) for k in (D0, 2 * D0)}
    frames = []
    for seed in range(a.seeds):
        models = {d: (lambda d=d, s=seed: build(d, a, shapes, s)) for d in widths}
        df = get_coord_data(
            models,
            [fixed_batch(batch, a.data, a.successors, seed)],
            optimizer="adamw",
            lr=LR,
            mup=True,
            nsteps=a.steps + 1,
            nseeds=1,
            cuda=False,
            flatten_output=True,
            lossfn="xent",
            show_progress=False,
            output_fdict={"rms": "l2"},
            filter_module_by_name=lambda n: quantity(n) is not None,
        )
        frames.append(df.assign(seed=seed))
    data = pd.concat(frames, ignore_index=True)
    data["quantity"] = data["module"].map(quantity)
    data["step"] = data["t"] - 1  # mup's t = 1 is the forward at init
    return data


def fit(data: pd.DataFrame) -> pd.DataFrame:
    with np.errstate(divide="ignore"):
        data = data.assign(log2rms=np.log2(data["rms"]))
    per = data.groupby(["quantity", "step", "seed", "width"])["log2rms"].mean().reset_index()
    rows = []
    for (q, step), g in per.groupby(["quantity", "step"]):
        slopes = []
        for _, s in g.groupby("seed"):
            y = s["log2rms"].to_numpy()
            ok = np.isfinite(y).all()  # exactly-zero logits (zero readout at step 0): no slope
            slopes.append(np.polyfit(np.log2(s["width"]), y, 1)[0] if ok else math.nan)
        sl = np.array(slopes)
        se = sl.std(ddof=1) / math.sqrt(len(sl)) if len(sl) > 1 else math.nan
        rms = 2.0 ** g.groupby("width")["log2rms"].mean()
        rows.append(
            {
                "quantity": q,
                "step": step,
                "slope": sl.mean(),
                "se": se,
                "rms_min_w": rms.iloc[0],
                "rms_max_w": rms.iloc[-1],
            }
        )
    return pd.DataFrame(rows)


def within(q: str, slope: float) -> bool:
    """Tensor Programs V: every activation Theta(1) (|slope| <= tol), the output O(1) (slope <= tol:
    muP's readout starts near zero, so falling logits are allowed)."""
    return slope <= SLOPE_TOL if q == "logits" else abs(slope) <= SLOPE_TOL


def report(table: pd.DataFrame, a: argparse.Namespace, batch: int, seconds: float) -> None:
    sigma, estd, tied = CONSTANTS[a.const]
    print(
        f"\n== {a.const}: sigma {sigma:.4g}, embedding std {estd:g}, "
        f"{'tied' if tied else 'untied zero'} readout, batch {batch} x {SEQ}, L = {a.layers} "
        f"({seconds:.1f} s) =="
    )
    print("quantity step  slope +- se     RMS@min-w  RMS@max-w  within 0.25")
    for r in table.sort_values(["quantity", "step"]).itertuples():
        flat = "" if math.isnan(r.slope) else ("yes" if within(r.quantity, r.slope) else "NO")
        print(
            f"{r.quantity:8s} {r.step:4d} {r.slope:+6.2f} +- {r.se:4.2f}  "
            f"{r.rms_min_w:9.3g}  {r.rms_max_w:9.3g}  {flat}"
        )
    block = table[table["quantity"] != "logits"]
    worst = block.loc[block["slope"].abs().idxmax()]
    out = sum(not within(r.quantity, r.slope) for r in table.itertuples() if not math.isnan(r.slope))
    print(
        f"rows outside: {out} of {table['slope'].notna().sum()}; worst block quantity: "
        f"{worst['quantity']} step {worst['step']} slope {worst['slope']:+.2f} +- {worst['se']:.2f}"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--widths", default="64,128,256,512")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batches", default="4,1", help="sequences per fixed batch (of 32 tokens)")
    ap.add_argument("--constants", default="tinit,mup-example", help=",".join(CONSTANTS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--data", choices=["markov", "uniform"], default="markov")
    ap.add_argument("--successors", type=int, default=4, help="Markov successors per token")
    ap.add_argument("--d-ff", choices=["3d", "8d/3"], default="3d")
    a = ap.parse_args(argv)
    widths = [int(w) for w in a.widths.split(",")]
    consts = a.constants.split(",")
    if bad := [c for c in consts if c not in CONSTANTS]:
        ap.exit(2, f"--constants: {bad[0]!r} is not one of {', '.join(CONSTANTS)}\n")
    torch.set_num_threads(1)
    from importlib.metadata import version

    print(
        f"mup {version('mup')}, torch {torch.__version__}, widths {widths}, L = {a.layers}, "
        f"{a.seeds} seeds, steps 0..{a.steps}, MuAdamW lr {LR}, d0 = {D0}, d_ff {a.d_ff}, "
        f"data {a.data}" + (f" (k = {a.successors})" if a.data == "markov" else "")
    )
    for a.const in consts:
        for batch in (int(b) for b in a.batches.split(",")):
            t0 = time.perf_counter()
            table = fit(measure(widths, a, batch))
            report(table, a, batch, time.perf_counter() - t0)


if __name__ == "__main__":
    main()
