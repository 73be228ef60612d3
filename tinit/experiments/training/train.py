"""Training tinit's model: does what holds at initialization survive training?

One run is one (model, init, peak lr, warmup, seed): AdamW (Loshchilov & Hutter
2019) with a linear warmup and cosine decay to ``min_lr_ratio`` of the peak, global
gradient-norm clipping, bf16 autocast on CUDA (float32 master weights), nothing
random but the seeded data, so a CPU run is reproducible bit for bit.

Recorded per optimizer step (``train`` frame): the lr used, the training loss of the
batch the step used, the global gradient norm before clipping, and every
``eval_every`` steps (and at the last) the held-out loss; per step and per layer the
update ratio ||W_after - W_before|| / ||W_before|| of W_O and W_down (the matrices
that write the residual stream, ``update_ratios`` frame); and at a few steps the
residual-stream variance at every addition with :class:`VarianceProbe`
(``variance_during_training`` frame), so v_2L can be followed through training.

A run is stopped and marked diverged at the first step whose training loss is not
finite or exceeds the first step's loss by more than ``diverge_margin`` nats.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import LambdaLR

from ...model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from ...model.param_rules import describe_groups, optimizer_groups
from ...model.params import count_params
from ...model.transformer import Transformer
from ..configs import check_configs
from ..device import matmul_precision, resolve_device
from ..driver import Run
from ..measure.probes import VarianceProbe
from ..memory import available_memory
from ..meta import run_meta
from ..result import ExperimentResult, Partial, Progress
from .data import TrainData

#: Configuration columns, first in every frame of a training run.
CONFIG_COLUMNS = [
    "init",
    "norm_position",
    "norm",
    "ffn",
    "tied",
    "n_layers",
    "d_model",
    "d_ff",
    "seed",
    "peak_lr",
    "warmup",
]
TRAIN_COLUMNS = [*CONFIG_COLUMNS, "step", "tokens", "lr", "train_loss", "eval_loss", "grad_norm", "status"]
RATIO_COLUMNS = [*CONFIG_COLUMNS, "step", "layer", "tensor", "update_ratio"]
PROBE_COLUMNS = [*CONFIG_COLUMNS, "step", "k", "layer", "sublayer", "stream_var", "branch_var", "cross_corr"]
RUN_COLUMNS = [
    *CONFIG_COLUMNS,
    "params",
    "initial_eval_loss",
    "final_eval_loss",
    "best_eval_loss",
    "diverged",
    "diverged_step",
    "steps_done",
    "tokens",
    "train_seconds",
    "tokens_per_s",
    "model_flops_per_s",
    "mfu",
]
GROUP_COLUMNS = [c for c in CONFIG_COLUMNS if c != "seed"]
SUMMARY_COLUMNS = [
    *GROUP_COLUMNS,
    "seeds",
    "diverged",
    "final_eval_loss_mean",
    "final_eval_loss_se",
    "initial_eval_loss_mean",
    "entropy_floor",
    "gap_to_floor",
    "tokens_per_s",
    "mfu",
]

#: Dense bf16 tensor-core peak FLOP/s by device-name fragment (vendor datasheets), for MFU.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}


def flops_per_token(params: int, cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token, 6N + 12 L d T (Kaplan et al. 2020; PaLM appendix B;
    nanoGPT's estimate_mfu): forward and backward matmuls plus attention scores."""
    return 6 * params + 12 * cfg.n_layers * cfg.d_model * seq_len


def peak_flops(device: torch.device) -> float | None:
    """The device's dense bf16 peak, when tinit knows it (CUDA only)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


@dataclass(frozen=True)
class TrainConfig:
    """The optimizer, schedule and bookkeeping of a training run."""

    steps: int = 300  # optimizer steps
    lr: float = 1e-2  # peak learning rate
    warmup: int = 30  # steps of linear warmup from lr/warmup to lr; 0: none
    min_lr_ratio: float = 0.1  # cosine decay ends at this fraction of the peak
    weight_decay: float = 0.1  # decoupled, on matrices only (norm gains and biases are not decayed)
    eps: float = 1e-8  # AdamW's eps (torch's default)
    param_rules: bool = True  # apply the scheme's optimizer rules (muP's lr / m, ...); False: one lr
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global gradient norm; 0: no clipping (the norm is still recorded)
    eval_every: int = 25  # held-out loss every this many steps (and at step 0 and the last step)
    diverge_margin: float = 1.0  # nats above the first step's loss that mark a run diverged
    probe_points: int = 3  # variance profiles at this many evenly spaced steps (0 and the last included)
    autocast: bool = True  # bf16 autocast on CUDA (no effect on the CPU)
    compile: bool = False  # torch.compile the model (meant for long GPU runs)

    def __post_init__(self) -> None:
        for name in ("steps", "eval_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(name, f"must be a whole number >= 1, got {v!r}")
        for name in ("warmup", "probe_points"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(name, f"must be a whole number >= 0, got {v!r}")
        for name in ("lr", "eps"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
                raise ConfigError(name, f"must be a positive number, got {v!r}")
        if not isinstance(self.param_rules, bool):
            raise ConfigError("param_rules", f"must be true or false, got {self.param_rules!r}")
        for name in ("min_lr_ratio", "weight_decay", "grad_clip", "diverge_margin"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(name, f"must be a finite number >= 0, got {v!r}")
        if self.min_lr_ratio > 1:
            raise ConfigError("min_lr_ratio", f"must be <= 1, got {self.min_lr_ratio}")
        if self.diverge_margin <= 0:
            raise ConfigError("diverge_margin", f"must be a positive number, got {self.diverge_margin}")


def lr_factor(step: int, warmup: int, steps: int, min_ratio: float) -> float:
    """Multiplier of the peak lr at optimizer step ``step`` (0-based): (step+1)/warmup
    during the warmup, then a cosine from 1 down to ``min_ratio`` at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    span = max(steps - warmup - 1, 1)
    progress = min((step - warmup) / span, 1.0)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def probe_steps(steps: int, points: int) -> list[int]:
    """``points`` evenly spaced steps from 0 to ``steps`` (both included when >= 2)."""
    if points == 0:
        return []
    if points == 1:
        return [steps]
    return sorted({round(i * steps / (points - 1)) for i in range(points)})


def stream_writers(model: Transformer) -> list[tuple[int, str, torch.nn.Parameter]]:
    """(layer, tensor name, weight) of W_O and W_down in every block."""
    return [
        (b.layer, name, getattr(sub, name).weight)
        for b in model.blocks
        for sub, name in ((b.attn, "o"), (b.ffn, "down"))
    ]


class Trainer:
    """The optimizer, schedule and step of one run; :meth:`step` is what the CPU
    benchmark times against a bare PyTorch loop."""

    def __init__(
        self, model: Transformer, train: TrainConfig, device: torch.device, peak_lr: float, warmup: int
    ):
        self.model, self.train, self.device = model, train, device
        self.forward = torch.compile(model) if train.compile else model
        self.params = [p for p in model.parameters() if p.requires_grad]
        # per-group lr, decay and eps: the scheme's optimizer rules (tinit.model.param_rules)
        groups = optimizer_groups(
            model, lr=peak_lr, weight_decay=train.weight_decay, eps=train.eps, rules=train.param_rules
        )
        self.groups = describe_groups(groups)
        self.peak_lr = peak_lr
        self.optimizer = torch.optim.AdamW(
            groups, lr=peak_lr, betas=(train.beta1, train.beta2), fused=device.type == "cuda"
        )
        self.schedule = LambdaLR(
            self.optimizer, lambda s: lr_factor(s, warmup, train.steps, train.min_lr_ratio)
        )
        self.tracked = stream_writers(model)
        self.autocast = train.autocast and device.type == "cuda"
        self.max_norm = train.grad_clip if train.grad_clip > 0 else math.inf

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy (nats) of a (batch, seq + 1) window."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            logits = self.forward(batch[:, :-1])
        return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())

    def step(self, batch: torch.Tensor) -> tuple[float, float, float, list[float]]:
        """One optimizer step on ``batch``: (lr used, loss, grad norm before clipping,
        update ratios of the tracked matrices). A non-finite loss takes no step."""
        # the base lr of this step (each group's is its multiple of it)
        lr = self.peak_lr * self.schedule.lr_lambdas[0](self.schedule.last_epoch)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(batch)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        loss_value = float(loss.detach())
        if not math.isfinite(loss_value):
            return lr, loss_value, float(grad_norm), [math.nan] * len(self.tracked)
        weights = [w for _, _, w in self.tracked]
        before = [w.detach().clone() for w in weights]
        self.optimizer.step()
        self.schedule.step()
        with torch.no_grad():
            delta = torch._foreach_norm(torch._foreach_sub(weights, before))
            base = torch._foreach_norm(before)
            ratios = (torch.stack(delta) / torch.stack(base)).tolist() if weights else []
        # a matrix that was zero (zero-out's, nanochat's W_O, W_down at step 1) has no
        # relative update: NaN, written empty (not the inf of a division by zero)
        ratios = [math.nan if float(b) == 0 else x for x, b in zip(ratios, base, strict=True)]
        return lr, loss_value, float(grad_norm), ratios

    @torch.no_grad()
    def eval_loss(self, batches: Sequence[torch.Tensor]) -> float:
        return float(torch.stack([self.loss(b) for b in batches]).mean())

    @torch.no_grad()
    def variance_profile(self, batch: torch.Tensor) -> pd.DataFrame:
        probe = VarianceProbe(torch.float32)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            self.model.forward_stream(batch[:, :-1], probe)
        return probe.frame()


@dataclass
class RunSpec:
    """One training run of a grid."""

    model: ModelConfig
    init: InitConfig
    lr: float
    warmup: int

    def labels(self) -> dict[str, Any]:
        m = self.model
        return {
            "init": self.init.recipe,
            "norm_position": m.norm_position,
            "norm": m.norm,
            "ffn": m.ffn,
            "tied": m.tie_embeddings,
            "n_layers": m.n_layers,
            "d_model": m.d_model,
            "d_ff": m.d_ff,
            "seed": self.init.seed,
            "peak_lr": self.lr,
            "warmup": self.warmup,
        }


@dataclass
class RunRecord:
    train: list[dict]
    ratios: list[dict]
    probes: list[pd.DataFrame]
    summary: dict
    groups: list[dict]  # the optimizer's parameter groups (name, lr, weight_decay, eps, ...)


def train_run(
    spec: RunSpec, train: TrainConfig, data: TrainData, device: torch.device, tick=None
) -> RunRecord:
    """Train one configuration; the training batches are seeded by the init seed."""
    labels = spec.labels()
    model = Transformer(spec.model, spec.init, device)
    trainer = Trainer(model, train, device, spec.lr, spec.warmup)
    data.reset(spec.init.seed)
    evals = [b.to(device) for b in data.eval_batches()]
    probe_at = set(probe_steps(train.steps, train.probe_points))
    tokens_per_step = data.batch * data.seq_len
    rows, ratios, probes = [], [], []

    def probe(step: int) -> None:
        if step in probe_at:
            probes.append(trainer.variance_profile(evals[0]).assign(step=step, **labels))

    initial_eval = trainer.eval_loss(evals)
    rows.append(
        {
            **labels,
            "step": 0,
            "tokens": 0,
            "lr": math.nan,
            "train_loss": math.nan,
            "eval_loss": initial_eval,
            "grad_norm": math.nan,
            "status": "init",
        }
    )
    probe(0)
    first_loss, diverged_step, seconds, eval_loss = None, None, 0.0, initial_eval
    step = 0
    for step in range(1, train.steps + 1):
        t0 = time.perf_counter()  # drawing the batch is part of a step's cost (tokens/s, MFU)
        batch = data.next_batch().to(device, non_blocking=True)
        lr, loss, grad_norm, r = trainer.step(batch)
        seconds += time.perf_counter() - t0  # step() read the loss: the device is synchronised
        first_loss = loss if first_loss is None else first_loss
        bad = not math.isfinite(loss) or loss > first_loss + train.diverge_margin
        eval_loss = math.nan
        if not bad and (step % train.eval_every == 0 or step == train.steps):
            eval_loss = trainer.eval_loss(evals)
        rows.append(
            {
                **labels,
                "step": step,
                "tokens": step * tokens_per_step,
                "lr": lr,
                "train_loss": loss,
                "eval_loss": eval_loss,
                "grad_norm": grad_norm,
                "status": "diverged" if bad else "ok",
            }
        )
        ratios.extend(
            {**labels, "step": step, "layer": layer, "tensor": name, "update_ratio": v}
            for (layer, name, _), v in zip(trainer.tracked, r, strict=True)
        )
        if tick is not None:
            tick()
        if bad:
            diverged_step = step
            break
        probe(step)
    if tick is not None and step < train.steps:
        tick(train.steps - step)  # the steps a diverged run skips
    evals_done = [x["eval_loss"] for x in rows if math.isfinite(x["eval_loss"])]
    final = math.nan if diverged_step is not None else eval_loss
    summary = {
        **labels,
        "params": sum(p.numel() for p in model.parameters()),
        "initial_eval_loss": initial_eval,
        "final_eval_loss": final,
        "best_eval_loss": min(evals_done) if evals_done else math.nan,
        "diverged": diverged_step is not None,
        "diverged_step": diverged_step,
        "steps_done": step,
        "tokens": step * tokens_per_step,
        "train_seconds": seconds,
        "tokens_per_s": step * tokens_per_step / seconds if seconds > 0 else math.nan,
    }
    per_token = flops_per_token(summary["params"], spec.model, data.seq_len)
    summary["model_flops_per_s"] = summary["tokens_per_s"] * per_token
    peak = peak_flops(device)
    summary["mfu"] = summary["model_flops_per_s"] / peak if peak else math.nan
    return RunRecord(rows, ratios, probes, summary, trainer.groups)


def standard_error(values: Sequence[float]) -> float:
    """Sample std / sqrt(n) (ddof 1); NaN with fewer than two values."""
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=float)
    return float(v.std(ddof=1) / math.sqrt(v.size)) if v.size >= 2 else math.nan


def summarize_runs(runs: pd.DataFrame, floor: float | None) -> pd.DataFrame:
    """One row per configuration: final eval loss mean and standard error over the
    seeds that did not diverge, how many diverged, mean tokens per second."""
    out = []
    for key, g in runs.groupby(GROUP_COLUMNS, sort=False, dropna=False):
        finals = g.loc[~g["diverged"].astype(bool), "final_eval_loss"].to_numpy(dtype=float)
        mean = float(np.mean(finals)) if finals.size else math.nan
        out.append(
            {
                **dict(zip(GROUP_COLUMNS, key, strict=True)),
                "seeds": len(g),
                "diverged": int(g["diverged"].sum()),
                "final_eval_loss_mean": mean,
                "final_eval_loss_se": standard_error(finals),
                "initial_eval_loss_mean": float(g["initial_eval_loss"].mean()),
                "entropy_floor": math.nan if floor is None else floor,
                "gap_to_floor": math.nan if floor is None else mean - floor,
                "tokens_per_s": float(g["tokens_per_s"].mean()),
                "mfu": float(g["mfu"].mean()),
            }
        )
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)


def run_specs(
    specs: Sequence[RunSpec],
    train: TrainConfig,
    data: TrainData,
    run: RunConfig,
    progress: Progress | None = None,
    meta_extra: dict | None = None,
    on_partial: Partial | None = None,
) -> ExperimentResult:
    """Train every spec in order (``on_partial`` gets the result so far after each run,
    so a finished run is on disk before the next starts). Frames: ``train``, ``update_ratios``,
    ``variance_during_training``, ``runs`` (one row per run) and ``summary`` (over seeds).
    A run that fails part-way (out of memory, interrupted) raises :class:`IncompleteRun`
    holding the finished runs."""
    device = resolve_device(run.device)
    if run.dtype != "float32":
        raise ConfigError(
            "dtype", "training keeps float32 master weights (bf16 autocast on CUDA); use float32"
        )
    check_specs(specs, data, device)
    torch.manual_seed(0)  # nothing draws from the global generator; fixed in case a kernel does
    records: list[RunRecord] = []
    base = specs[0] if specs else RunSpec(ModelConfig(), InitConfig(), train.lr, train.warmup)
    meta = run_meta(
        base.model,
        base.init,
        run,
        device,
        train=dataclasses.asdict(train),
        data=data.info,
        entropy_floor=data.floor,
        runs=len(specs),
        **(meta_extra or {}),
    )
    meta["seconds"] = {}
    meta["param_groups"] = {}  # per run: every optimizer group's lr, weight decay and eps

    def frames() -> dict[str, pd.DataFrame]:
        def frame(rows, cols):
            return pd.DataFrame(rows, columns=cols) if rows else pd.DataFrame(columns=cols)

        runs = frame([r.summary for r in records], RUN_COLUMNS)
        probes = [p for r in records for p in r.probes]
        variance = pd.concat(probes, ignore_index=True)[PROBE_COLUMNS] if probes else frame([], PROBE_COLUMNS)
        out = {
            "train": frame([x for r in records for x in r.train], TRAIN_COLUMNS),
            "update_ratios": frame([x for r in records for x in r.ratios], RATIO_COLUMNS),
            "variance_during_training": variance,
            "runs": runs,
            "summary": summarize_runs(runs, data.floor) if len(runs) else frame([], SUMMARY_COLUMNS),
        }
        if train.probe_points == 0:  # none asked for: no empty CSV (and the plots still get written)
            del out["variance_during_training"]
        meta["complete_runs"] = len(records)
        return out

    # (a progress step is an optimizer step; each run's time is recorded without a Meter's
    # memory figures, which training's config.json does not carry)
    driver = Run(meta, frames, lambda _frames: not_applicable(train, device, data.floor),
                 on_partial=on_partial, progress=progress, total=len(specs) * train.steps)  # fmt: skip

    def measure(unit: tuple[int, RunSpec]) -> tuple[RunRecord, float]:
        spec = unit[1]
        if spec.model.vocab_size < data.vocab:
            raise ConfigError(
                "vocab_size", f"the data needs a vocabulary of {data.vocab}, got {spec.model.vocab_size}"
            )
        if spec.model.max_seq_len < data.seq_len:
            spec = dataclasses.replace(spec, model=dataclasses.replace(spec.model, max_seq_len=data.seq_len))
        t0 = time.perf_counter()
        with matmul_precision(run):
            record = train_run(spec, train, data, device, driver.tick)
        return record, time.perf_counter() - t0

    names = run_names(specs)

    def collect(unit: tuple[int, RunSpec], measured: tuple[RunRecord, float]) -> None:
        i, (record, seconds) = unit[0], measured
        records.append(record)
        key = names[i] if names[i] not in meta["seconds"] else f"{names[i]} (run {i + 1})"
        meta["seconds"][key] = seconds
        meta["param_groups"][key] = record.groups

    # no partial after the last run: the caller's result follows at once
    driver.each(enumerate(specs), measure, collect, label=lambda u: f"run {u[0] + 1}/{len(specs)}",
                last_partial=False)  # fmt: skip
    return driver.result()


def run_names(specs: Sequence[RunSpec]) -> list[str]:
    """Each run named by its configuration (what the timing line and config.json's
    ``seconds`` show): init/placement, then the settings that vary in the grid."""
    labels = [s.labels() for s in specs]
    short = {"n_layers": "L", "peak_lr": "lr", "d_model": "d", "d_ff": "d_ff"}
    varying = [k for k in labels[0] if k not in ("init", "norm_position")
               and len({str(x[k]) for x in labels}) > 1] if labels else []  # fmt: skip

    def part(k: str, v) -> str:
        if k == "tied":
            return "tied" if v else "untied"
        if k in ("norm", "ffn"):
            return str(v)
        return f"{short.get(k, k)}={v:g}" if isinstance(v, float) else f"{short.get(k, k)}={v}"

    return [", ".join([f"{x['init']}/{x['norm_position']}", *(part(k, x[k]) for k in varying)])
            for x in labels]  # fmt: skip


def grid_specs(
    model: ModelConfig,
    init: InitConfig,
    schemes: Sequence[str],
    norm_positions: Sequence[str],
    depths: Sequence[int],
    seeds: Sequence[int],
    lrs: Sequence[float],
    warmups: Sequence[int],
    widths: Sequence[int] | None = None,
) -> list[RunSpec]:
    """schemes x norm positions x depths x widths x lrs x warmups x seeds, seeds
    innermost. A scheme is whatever ``InitConfig.recipe`` accepts: the run only passes it
    on. ``widths`` (d_model values; None: the model's) each take their default FFN width
    (d_ff grows with d, as a width-transfer study needs)."""
    return [
        RunSpec(
            dataclasses.replace(model, norm_position=pos, n_layers=L)
            if widths is None
            else dataclasses.replace(model, norm_position=pos, n_layers=L, d_model=d, d_ff=None),
            dataclasses.replace(init, recipe=scheme, seed=seed),
            lr,
            warmup,
        )
        for scheme in schemes
        for pos in norm_positions
        for L in depths
        for d in (widths or [model.d_model])
        for lr in lrs
        for warmup in warmups
        for seed in seeds
    ]


#: Bytes per parameter a training run holds at least: float32 weights, gradients and
#: AdamW's two moments.
TRAIN_BYTES_PER_PARAM = 16


def check_specs(specs: Sequence[RunSpec], data: TrainData, device: torch.device) -> None:
    """Before anything trains: no run repeats another (a repeat would be counted as a
    seed), every vocabulary covers the data, every scheme is defined at every layer, and
    the largest model's weights, gradients and AdamW state fit in the device's free
    memory (else a ConfigError naming what makes it large, not an out-of-memory stop)."""
    seen: set = set()
    for spec in specs:
        key = (tuple(sorted(spec.labels().items())), spec.init.seed)
        if key in seen:
            raise ConfigError("lr", f"the run {spec.labels()} (seed {spec.init.seed}) is in the grid twice: "
                              "give each lr, warmup, depth and seed once")  # fmt: skip
        seen.add(key)
        if spec.model.vocab_size < data.vocab:
            raise ConfigError(
                "vocab_size", f"the data needs a vocabulary of {data.vocab}, got {spec.model.vocab_size}"
            )
    checked = set()
    for spec in specs:
        key = (spec.model, spec.init.recipe)
        if key not in checked:
            checked.add(key)
            check_configs(spec.model, spec.init, RunConfig(seq_len=data.seq_len),
                          [(spec.init.recipe, spec.model.norm_position)])  # fmt: skip
    if not specs:
        return
    big = max(specs, key=lambda s: count_params(s.model, s.init.recipe).total).model
    n = count_params(big).total
    free = available_memory(device)
    if n * TRAIN_BYTES_PER_PARAM > free:
        embedding = big.vocab_size * big.d_model
        field = ("data" if data.chain is None else "vocab_size") if 2 * embedding > n else "d_model"
        need, gib = n * TRAIN_BYTES_PER_PARAM / 2**30, free / 2**30
        raise ConfigError(field, f"a model of {n:.3g} parameters (L={big.n_layers}, d={big.d_model}, "
                          f"V={big.vocab_size}) needs {need:.3g} GiB for its weights, gradients and AdamW "
                          f"state, more than the {gib:.3g} GiB free")  # fmt: skip


def not_applicable(train: TrainConfig, device: torch.device, floor: float | None = 0.0) -> dict:
    """The cells the training frames leave empty by design (see
    :attr:`ExperimentResult.not_applicable`): the step-0 row has no lr, train loss or
    gradient yet; the held-out loss exists only every ``eval_every`` steps and at the
    last (not after a divergence, whose row says so); the embedding (k = 0) has no
    branch, and a zero branch no correlation; a zero-initialised matrix has no relative
    update at step 1; a run that did not diverge has no divergence step, one that did no
    final loss; MFU is known only on a GPU whose peak tinit knows; a standard error needs
    two seeds that did not diverge; data with no known entropy rate (``floor`` None) has
    no floor. Any other NaN (a loss that became NaN) is written ``nan`` and flagged."""

    def init_row(df):
        return df["status"] == "init"

    def no_eval(df):
        evaluated = (df["step"] % train.eval_every == 0) | (df["step"] == train.steps)
        return ~evaluated | (df["status"] == "diverged")

    def diverged(df):
        return df["diverged"].astype(bool)

    def all_diverged(df):
        return df["diverged"] >= df["seeds"]

    no_mfu = device.type != "cuda"
    return {
        "train": {"lr": init_row, "train_loss": init_row, "grad_norm": init_row, "eval_loss": no_eval},
        "update_ratios": {"update_ratio": zero_before},
        "variance_during_training": {"branch_var": lambda df: df["k"] == 0,
                                     "cross_corr": lambda df: (df["k"] == 0) | (df["branch_var"] == 0)},
        "runs": {"mfu": no_mfu, "diverged_step": lambda df: ~diverged(df), "final_eval_loss": diverged},
        "summary": {"mfu": no_mfu, "final_eval_loss_se": lambda df: df["seeds"] - df["diverged"] < 2,
                    "final_eval_loss_mean": all_diverged,
                    # a file or stdlib has no known entropy rate: no floor, no gap to it
                    "entropy_floor": floor is None,
                    "gap_to_floor": lambda df: all_diverged(df) | (floor is None)},
    }  # fmt: skip


def zero_before(df: pd.DataFrame):
    """Update ratios with no meaning: step 1 of a matrix the scheme initialises to zero
    (its ||W_before|| is 0; any other NaN is a measurement, written nan)."""
    from ...model.catalogue import get_scheme, known

    def zero_role(name: str, tensor: str) -> bool:
        return known(name) and get_scheme(name).rule(tensor).dist == "zero"

    zero = [zero_role(str(i), str(t)) for i, t in zip(df["init"], df["tensor"], strict=True)]
    return (df["step"] == 1).to_numpy() & np.asarray(zero, dtype=bool)


def run_train(
    model: ModelConfig,
    init: InitConfig,
    run: RunConfig,
    train: TrainConfig,
    data: TrainData,
    schemes: Sequence[str],
    norm_positions: Sequence[str],
    depths: Sequence[int],
    seeds: Sequence[int],
    lrs: Sequence[float] | None = None,
    warmups: Sequence[int] | None = None,
    progress: Progress | None = None,
    on_partial: Partial | None = None,
    widths: Sequence[int] | None = None,
) -> ExperimentResult:
    """Train the grid schemes x norm positions x depths x widths x lrs x warmups x seeds
    on ``data`` (``widths``: d_model values, each with its default d_ff; None: the model's).

    >>> from tinit.experiments.training.data import load_data
    >>> data = load_data("markov", vocab=64, seq_len=16, batch=8, seed=0)
    >>> res = run_train(ModelConfig(n_layers=2, d_model=32, n_heads=2, vocab_size=64), InitConfig(),
    ...                 RunConfig(device="cpu"), TrainConfig(steps=20), data, ["scaled"], ["pre"], [2], [0])
    >>> res["summary"]["final_eval_loss_mean"]  # doctest: +SKIP
    """
    specs = grid_specs(
        model,
        init,
        schemes,
        norm_positions,
        depths,
        seeds,
        lrs or [train.lr],
        warmups if warmups is not None else [train.warmup],
        widths,
    )
    return run_specs(
        specs,
        train,
        data,
        run,
        progress,
        {
            "grid": {
                "schemes": list(schemes),
                "norm_positions": list(norm_positions),
                "depths": list(depths),
                "widths": list(widths or [model.d_model]),
                "seeds": list(seeds),
                "lrs": list(lrs or [train.lr]),
                "warmups": list(warmups if warmups is not None else [train.warmup]),
            }
        },
        on_partial,
    )
