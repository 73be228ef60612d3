"""One training run of tinit's model (the grid of runs is :mod:`.train`).

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

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import LambdaLR

from ...criteria import TRAIN_CONFIG_COLUMNS as CONFIG_COLUMNS
from ...model.config import InitConfig, ModelConfig
from ...model.param_rules import describe_groups, optimizer_groups
from ...model.transformer import Transformer
from ..measure.probes import VarianceProbe
from .configs import TrainConfig
from .data import TrainData

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
            "init": self.init.scheme,
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

    def checkpoint_label(self) -> str:
        """The run's name in its checkpoints' folder: its configuration
        (``gpt2-pre-L12-d256-lr0.01-w30-seed0``), and a norm, FFN or head that is not the
        default (``-layernorm``, ``-gelu``, ``-untied``: claims' runs differ in them). Two
        runs of one configuration are told apart by :func:`checkpoint_labels`."""
        x = self.labels()
        extra = [str(v) for v, default in ((x["norm"], "rmsnorm"), (x["ffn"], "swiglu")) if v != default]
        extra += [] if x["tied"] else ["untied"]
        return (f"{x['init']}-{x['norm_position']}-L{x['n_layers']}-d{x['d_model']}-lr{x['peak_lr']:g}"
                f"-w{x['warmup']}-seed{x['seed']}" + "".join(f"-{e}" for e in extra))  # fmt: skip

    def checkpoint_info(self, train: TrainConfig) -> dict[str, Any]:
        """What a checkpoint's JSON says besides its step: the model config, the init
        (scheme, seed, sigma, ...), the run's labels and the training settings, enough
        to rebuild the model and, from the seed, its weights at step 0. A user's scheme
        (``--init-file``) comes with the TOML text it was read from (``init.schemes[i].toml``)."""
        init = self.init.to_dict()
        for entry, s in zip(init["schemes"], self.init.schemes, strict=True):
            entry["toml"] = s.toml
        return {"model": self.model.to_dict(), "init": init, "labels": self.labels(),
                "train": asdict(train), "format": "tinit-checkpoint-1"}  # fmt: skip


def checkpoint_labels(specs: Sequence[RunSpec]) -> list[str]:
    """Each run's checkpoint folder name (:meth:`RunSpec.checkpoint_label`), a run whose
    configuration an earlier run of the grid has already taken suffixed ``-run<i>`` (its
    place in the grid, from 1): two runs never share a folder."""
    labels = [s.checkpoint_label() for s in specs]
    seen: set[str] = set()
    out = []
    for i, label in enumerate(labels):
        out.append(label if label not in seen else f"{label}-run{i + 1}")
        seen.add(label)
    return out


#: ``on_checkpoint(step, run_label, state_dict, info) -> entry``: writes one checkpoint
#: (the CLI's :class:`tinit.results.checkpoints.CheckpointWriter`) and returns what
#: config.json lists for it.
OnCheckpoint = Callable[[int, str, dict, dict], dict]


@dataclass
class RunRecord:
    train: list[dict]
    ratios: list[dict]
    probes: list[pd.DataFrame]
    summary: dict
    groups: list[dict]  # the optimizer's parameter groups (name, lr, weight_decay, eps, ...)
    checkpoints: list[dict] = None  # what on_checkpoint returned, in step order

    def __post_init__(self) -> None:
        self.checkpoints = [] if self.checkpoints is None else self.checkpoints


def train_run(
    spec: RunSpec, train: TrainConfig, data: TrainData, device: torch.device, tick=None,
    on_checkpoint: OnCheckpoint | None = None, save_steps: Sequence[int] = (), label: str | None = None,
) -> RunRecord:  # fmt: skip
    """Train one configuration; the training batches are seeded by the init seed.
    ``on_checkpoint`` is called with the model's state dict at each of ``save_steps``
    (0: before the first step; a step after that optimizer step); a run that diverges
    saves nothing after its divergence; ``label`` names the run's checkpoints (default:
    :meth:`RunSpec.checkpoint_label`)."""
    labels = spec.labels()
    model = Transformer(spec.model, spec.init, device)
    trainer = Trainer(model, train, device, spec.lr, spec.warmup)
    data.reset(spec.init.seed)
    evals = [b.to(device) for b in data.eval_batches()]
    probe_at = set(probe_steps(train.steps, train.probe_points))
    tokens_per_step = data.batch * data.seq_len
    rows, ratios, probes = [], [], []

    saved: list[dict] = []
    save_at, label = set(save_steps), label or spec.checkpoint_label()
    info = spec.checkpoint_info(train) if on_checkpoint is not None else {}

    def probe(step: int) -> None:
        if step in probe_at:
            probes.append(trainer.variance_profile(evals[0]).assign(step=step, **labels))
        if on_checkpoint is not None and step in save_at:
            saved.append(on_checkpoint(step, label, model.state_dict(), info))

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
    return RunRecord(rows, ratios, probes, summary, trainer.groups, saved)
