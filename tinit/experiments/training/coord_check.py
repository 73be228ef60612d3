"""The coordinate check: does every layer's activation scale stay put as the model gets
wider (muP) or deeper (CompleteP, depth-muP) during the first steps of training?

After microsoft/mup@1981497 ``mup/coord_check.py`` (``_get_coord_data``): for each
width, seed and scheme, build the model, train it for a few steps of Adam on one fixed
batch (mup's ``fix_data=True``), and record a statistic of every module's output during
the forward pass of each step, i.e. after 0, 1, 2, ... updates (mup's ``t = 1, 2, ...``
is tinit's step 0, 1, ...). mup records the mean absolute coordinate, ``l1 =
mean(|x|)`` ("coord size"); tinit records the RMS, ``sqrt(mean(x^2))``, the scale whose
square is the variance every other tinit command measures. For a fixed coordinate
distribution the two differ by a constant factor (sqrt(2/pi) for a Gaussian), so their
slopes against width agree; RMS weighs the large coordinates more, and a blow-up starts
there. tinit adds the depth axis (CompleteP, Dey et al. 2025, arXiv 2505.01618) and a
fitted slope with a verdict (:mod:`.coord_fit`).

Quantities, from tinit's probe (``Transformer`` calls it at every residual addition):
``embed`` (the stream entering block 0, layer -1), ``attn`` and ``ffn`` (each block's
branch output Out(F(In(x))), before the scheme's branch multiplier g: the module's
output, what mup's forward hook on the module sees), ``stream`` (the stream leaving
each block, after post-norm's norm) and ``logits`` (after the scheme's logit multiplier,
layer L). Each over every element of the batch (tokens x features).

The optimizer: Adam(W), no weight decay, no warmup, no clipping, a constant lr (mup's
coord check: plain ``Adam(lr)`` or ``MuAdam(lr)``), with the scheme's parameter rules
(:func:`coord_optimizer`). One point is one training run: (scheme, norm position, width,
depth, seed); its numbers depend on that point alone, so a sweep gathers the same frame.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

from ...model.catalogue import placements_for
from ...model.checks import MAX_SEEDS, check_count
from ...model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from ...model.param_rules import optimizer_groups, rules_summary
from ...model.params import count_params
from ...model.structure import apply_scheme
from ...model.transformer import Transformer
from ..configs import check_configs, grid, parse_widths, position_list, scheme_list
from ..device import matmul_precision, resolve_device
from ..driver import Meter, ProgressCounter, run_plan
from ..meta import run_meta
from ..points import Frames, Plan, Point
from ..points import grid_meta as points_grid_meta
from ..result import ExperimentResult, Partial, Progress
from .configs import CoordConfig
from .coord_fit import fit_coord_check, fit_not_applicable
from .data import load_data

#: coord_check.csv's columns.
COLUMNS = ["init", "norm_position", "d_model", "n_layers", "seed", "step", "layer", "quantity", "rms"]
#: The placement of a scheme that presumes none, when the user chose none.
DEFAULT_PLACEMENT = ("pre",)


def coord_optimizer(model: Transformer, init: InitConfig, coord: CoordConfig) -> torch.optim.Optimizer:
    """AdamW with the scheme's optimizer rules (:func:`tinit.model.param_rules.optimizer_groups`:
    muP's lr / m on hidden matrices as mup's MuAdam, CompleteP's depth rules, ...), or one
    lr for every parameter when ``coord.param_rules`` is off. No weight decay (mup's
    coord check decays nothing), torch's default betas (mup's ``Adam(lr)``) and ``coord.eps``
    (torch's default unless --adam-eps), scaled per group by the scheme's rules."""
    groups = optimizer_groups(model, init, lr=coord.lr, weight_decay=0.0, eps=coord.eps,
                              rules=coord.param_rules)  # fmt: skip
    return torch.optim.AdamW(groups, lr=coord.lr, weight_decay=0.0, eps=coord.eps)


class RMSProbe:
    """Records the RMS of the embedding, each branch output, each block's output stream
    and (:meth:`logits`) the logits, on the device; one host transfer per forward."""

    def __init__(self) -> None:
        self.keys: list[tuple[int, str]] = []
        self.values: list[torch.Tensor] = []

    def add(self, layer: int, quantity: str, t: torch.Tensor) -> None:
        with torch.no_grad():
            x = t.detach().float()
            self.keys.append((layer, quantity))
            self.values.append(torch.sqrt(torch.linalg.vecdot(x, x).sum() / x.numel()))

    def __call__(self, k, layer, sublayer, stream_in, branch, stream_out, normed=None) -> None:
        if k == 0:
            self.add(-1, "embed", stream_out)
            return
        self.add(layer, sublayer, branch)
        if sublayer == "ffn":  # the block's output: after the norm that follows the sum (post)
            self.add(layer, "stream", stream_out if normed is None else normed)

    def rows(self) -> list[tuple[int, str, float]]:
        values = torch.stack(self.values).cpu().tolist() if self.values else []
        out = [(layer, q, v) for (layer, q), v in zip(self.keys, values, strict=True)]
        self.keys, self.values = [], []
        return out


def coord_point(
    model: ModelConfig, init: InitConfig, run: RunConfig, coord: CoordConfig, scheme: str,
    norm_position: str, d_model: int, n_layers: int, seed: int, d_ff: int | None = None,
    progress: Progress | None = None,
) -> ExperimentResult:  # fmt: skip
    """One training run of the check: ``coord.steps`` Adam steps of the scheme at
    (width, depth, seed) on one fixed batch of the Markov language (drawn from the
    seed), the RMS of every quantity recorded in each step's forward pass. ``d_ff``
    None: the FFN width follows d (8d/3 or 4d). Frame ``coord_check``."""
    device = resolve_device(run.device)
    cfg = dataclasses.replace(model, d_model=d_model, n_layers=n_layers, d_ff=d_ff,
                              max_seq_len=max(model.max_seq_len, run.seq_len))  # fmt: skip
    cfg = apply_scheme(cfg, scheme, init.schemes, norm_position=norm_position)  # as ModelConfig.from_scheme
    ini = dataclasses.replace(init, scheme=scheme, seed=seed)
    data = load_data("markov", vocab=cfg.vocab_size, seq_len=run.seq_len, batch=run.batch,
                     seed=init.seed, eval_batches=1, markov_k=coord.markov_k)  # fmt: skip
    data.reset(seed)  # the data language is --seed's; the batch is the run seed's
    batch = data.next_batch().to(device)
    tick = ProgressCounter(progress, coord.steps + 1)
    labels = {"init": scheme, "norm_position": norm_position, "d_model": d_model, "n_layers": n_layers,
              "seed": seed}  # fmt: skip
    rows: list[dict[str, Any]] = []
    net = Transformer(cfg, ini, device)
    opt = coord_optimizer(net, ini, coord)
    probe = RMSProbe()
    with matmul_precision(run):
        for step in range(coord.steps + 1):
            last = step == coord.steps
            with torch.set_grad_enabled(not last):  # the last record needs no update after it
                logits = net(batch[:, :-1], probe)
                probe.add(n_layers, "logits", logits)
                rows += [{**labels, "step": step, "layer": layer, "quantity": q, "rms": v}
                         for layer, q, v in probe.rows()]  # fmt: skip
                if not last:
                    loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                del logits
            tick()
    del net, opt
    return ExperimentResult({"coord_check": pd.DataFrame(rows, columns=COLUMNS)}, {})


@dataclass(frozen=True)
class CoordGrid:
    """The points of a check: (scheme, norm position) x depth x width x seed."""

    configs: tuple[tuple[str, str], ...]
    widths: tuple[int, ...]
    depths: tuple[int, ...]
    seeds: tuple[int, ...]

    def points(self) -> list[dict[str, Any]]:
        return [
            {"scheme": r, "norm_position": p, "n_layers": L, "d_model": d, "seed": s}
            for r, p in self.configs for L in self.depths for d in self.widths for s in self.seeds
        ]  # fmt: skip


def make_grid(
    model: ModelConfig, init: InitConfig, run: RunConfig, inits: Sequence[str],
    norm_positions: Sequence[str] | None, widths: Sequence[int], depths: Sequence[int], seeds: int,
    d_ff: int | None = None, coord: CoordConfig | None = None,
) -> CoordGrid:  # fmt: skip
    """The grid, checked before anything runs: every width a valid model (heads divide
    it, RoPE's head size even), every scheme defined at every depth and width (and its
    optimizer rules in range there, unless ``coord`` turns the rules off).
    ``norm_positions`` None: each scheme in its presumed placement, else pre-norm (the
    placement of mup's and CompleteP's models)."""
    inits, norm_positions = scheme_list(inits, init.schemes), position_list(norm_positions)
    from ..configs import parse_layers

    widths = parse_widths(widths)  # each a whole number >= 1, once (ConfigError otherwise)
    depths = parse_layers(depths)
    configs = (
        tuple(grid(inits, norm_positions, init.schemes))
        if norm_positions
        else tuple((r, placements_for(r, DEFAULT_PLACEMENT, init.schemes)[0]) for r in inits)
    )
    for d in widths:
        cfg = dataclasses.replace(model, d_model=d, d_ff=None)  # raises ConfigError (n_heads, d_model)
        check_configs(cfg, init, run, configs, depths, optimizer=coord is None or coord.param_rules)
    if d_ff is not None and len(widths) > 1:
        raise ConfigError("d_ff", "a list of widths takes each width's default FFN width; leave --d-ff out")
    check_count("seeds", seeds, MAX_SEEDS)
    check_fits(model, init, run, configs, max(widths), max(depths))
    return CoordGrid(configs, tuple(widths), tuple(depths), tuple(init.seed + i for i in range(seeds)))


def check_fits(model: ModelConfig, init: InitConfig, run: RunConfig, configs, width: int, depth: int) -> None:
    """Before anything is built: the grid's largest point (widest and deepest) must fit in
    the device's free memory: its built backward (weights, gradients, every block's saved
    activations and the logits: :func:`tinit.experiments.memory.gradient_pass_bounds`, an
    upper bound from the shapes) and AdamW's two moments. Else a ConfigError naming
    --layers or --d-model, whichever is further beyond the default shape (L 12, d 256;
    memory grows as L and as d^2)."""
    from ..memory import check_fits, gradient_pass_bounds

    device = resolve_device(run.device)
    seq = run.seq_len
    for scheme, placement in configs:
        cfg = dataclasses.replace(model, d_model=width, n_layers=depth, d_ff=None, norm_position=placement,
                                  max_seq_len=max(model.max_seq_len, seq))  # fmt: skip
        ini = dataclasses.replace(init, scheme=scheme)
        n = count_params(cfg, ini.definition).total
        need = gradient_pass_bounds(cfg, ini, run.batch, seq, torch.float32)[1] + 2 * 4 * n
        field = "n_layers" if depth / 12 > (width / 256) ** 2 else "d_model"
        check_fits({("n_layers", "d_model"): need}, {"n_layers": depth, "d_model": width},
                   f"the largest point ({scheme}, L={depth}, d={width}, {n:.3g} params) needs", device,
                   field=field,
                   purpose=" for its weights, gradients, activations and AdamW state")  # fmt: skip


def gather(frames: Sequence[pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The check's frames from its points' ``coord_check`` frames, in grid order."""
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    return {"coord_check": rows, "coord_check_fit": fit_coord_check(rows)}


NOT_APPLICABLE = {"coord_check_fit": fit_not_applicable()}


def grid_meta(g: CoordGrid, coord: CoordConfig, d_ff: int | None, init: InitConfig) -> dict[str, Any]:
    rules = {r: rules_summary(dataclasses.replace(init, scheme=r), coord.param_rules) for r, _ in g.configs}
    return {
        "param_rules": rules,
        "coord": dataclasses.asdict(coord),
        "grid": {"configurations": [list(c) for c in g.configs], "widths": list(g.widths),
                 "depths": list(g.depths), "seeds": list(g.seeds)},
        "d_ff": d_ff if d_ff is not None else "per width (8d/3 rounded up to 64, or 4d)",
        "statistic": "rms = sqrt(mean(x^2)) over batch, tokens and features",
        "optimizer": "AdamW, weight decay 0, constant lr, no clipping, one fixed batch per seed",
    }  # fmt: skip


def run_coord_check(
    model: ModelConfig, init: InitConfig, run: RunConfig, coord: CoordConfig, inits: Sequence[str],
    norm_positions: Sequence[str] | None, widths: Sequence[int], depths: Sequence[int], seeds: int = 3,
    d_ff: int | None = None, progress: Progress | None = None, on_partial: Partial | None = None,
) -> ExperimentResult:  # fmt: skip
    """Every point of the grid in order (:func:`coord_point`) under the run driver
    (time and resident memory per point, rows on disk after each), then the fit."""
    g = make_grid(model, init, run, inits, norm_positions, widths, depths, seeds, d_ff, coord)
    plan = coord_check_plan(model, init, run, coord, inits, norm_positions, widths, depths, seeds, d_ff, g)
    device = resolve_device(run.device)
    big = dataclasses.replace(model, d_model=max(g.widths), n_layers=max(g.depths))
    meta = run_meta(big, init, run, device, configurations=list(g.configs), **grid_meta(g, coord, d_ff, init))
    return run_plan(plan, meta, meter=Meter(device), progress=progress, on_partial=on_partial,
                    weight=lambda p: coord.steps + 1, label=lambda p: point_name(p.kwargs),
                    last_partial=False)  # fmt: skip


def coord_check_plan(
    model: ModelConfig, init: InitConfig, run: RunConfig, coord: CoordConfig,
    inits: Sequence[str], norm_positions: Sequence[str] | None, widths: Sequence[int],
    depths: Sequence[int], seeds: int, d_ff: int | None = None, checked: CoordGrid | None = None,
) -> Plan:  # fmt: skip
    """``coord-check`` as one point per training run (scheme, norm position, depth,
    width, seed: :func:`coord_point`), in grid order; gathering concatenates them, then
    fits (:func:`gather`). ``checked``: the grid :func:`make_grid` gave already."""
    g = checked or make_grid(model, init, run, inits, norm_positions, widths, depths, seeds, d_ff, coord)
    points = [
        Point(
            coord_point,
            {
                "d": p["d_model"],
                "n_layers": p["n_layers"],
                "seed": p["seed"],
                "init": p["scheme"],
                "norm_position": p["norm_position"],
            },
            {"model": model, "init": init, "run": run, "coord": coord, "d_ff": d_ff, **p},
        )  # fmt: skip
        for p in g.points()
    ]

    def gather_points(frames: dict[str, Frames]) -> Frames:
        return gather([frames[p.name]["coord_check"] for p in points if p.name in frames])

    big = dataclasses.replace(model, d_model=max(widths), n_layers=max(depths))
    meta = points_grid_meta(big, init, run, configurations=list(g.configs), **grid_meta(g, coord, d_ff, init))
    return Plan("coord-check", points, gather_points, meta, NOT_APPLICABLE)


def point_name(p: dict[str, Any]) -> str:
    return f"{p['scheme']}/{p['norm_position']}, d={p['d_model']}, L={p['n_layers']}, seed {p['seed']}"
