"""``tinit audit --checkpoint``: the stream law and the weights of trained checkpoints.

For each checkpoint (:mod:`.sources`: every saved step of every run of a ``tinit train``
folder, or one Hugging Face model), read block by block (:mod:`.checkpoint`, one block
resident at a time):

- ``variance``: the stream variance at every one of the 2L additions against the law
  with the measured branch variances, as ``tinit variance`` writes it, plus ``run`` and
  ``step`` (a tinit checkpoint through tinit's own streamed forward and the scheme's
  theory; an HF model through the audit's hooks and the plain law);
- ``summary``: ``tinit variance``'s summary row per checkpoint, plus ``run`` and ``step``;
- ``drift``: per tensor its std, the std its scheme draws it with at step 0
  (``expected_std``), its spectral norm (largest singular value, matrices only) and,
  where the init is known (the run's step-0 checkpoint, else its seed: a tinit block
  depends only on (seed, layer, role)), ``rel_change`` = ||W - W0|| / ||W0||;
- ``checkpoints``: one row per checkpoint: v_2L / v0 now and at the run's first
  checkpoint, the addition where the stream grows fastest, the roles that moved most.

Tokens: uniform random ids from ``data_seed`` (default: the run's seed, so a step-0
checkpoint gives ``tinit variance``'s numbers exactly), or a ``TrainData``'s first
held-out batch (``tinit train``'s loader).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from ...model.config import ConfigError, ModelConfig, RunConfig
from ..device import make_tokens, stat_dtype
from ..driver import Meter, Run
from ..measure.variance import NOT_APPLICABLE as VARIANCE_NOT_APPLICABLE
from ..measure.variance import SUMMARY_COLUMNS, VARIANCE_COLUMNS, add_theory, summarize
from ..measure.variance import measure_stream as tinit_stream
from ..memory import check_fits
from ..result import ExperimentResult, Progress
from .checkpoint import (
    CheckpointTransformer,
    LazyBlocks,
    init_block_state,
    model_from_info,
    params_on_meta,
    tinit_expected,
    tinit_groups,
    weight_row,
)
from .precheck import check_checkpoints
from .sources import Checkpoint, Found
from .tensors import CheckpointError, TensorFiles, tied_groups

KEY = ["run", "step"]
DRIFT_COLUMNS = [*KEY, "layer", "role", "param", "shape", "numel", "rel_change", "std", "expected_std",
                 "spectral_norm"]  # fmt: skip
TABLE_COLUMNS = [*KEY, "init", "norm_position", "n_layers", "v_final_rel", "v_final_rel_first",
                 "first_step", "fastest_k", "fastest_growth", "moved_most", "moved_most_rel_change",
                 "init_source"]  # fmt: skip

#: A token source: (vocab of the model, seq_len, batch, seed, device) -> (batch, seq) ids.
Tokens = Callable[[int, int, int, int, torch.device], torch.Tensor]


def _no_step(df: pd.DataFrame):
    """An HF model's checkpoint has no training step."""
    return df["step"].isna()


NOT_APPLICABLE = {
    "variance": {**VARIANCE_NOT_APPLICABLE["variance"], "step": _no_step},
    "summary": {**VARIANCE_NOT_APPLICABLE["summary"], "step": _no_step},
    "drift": {
        "step": _no_step,
        # no init known (an HF model), or W0 = 0 (a zero-initialised matrix): no relative change
        "rel_change": lambda df: df["rel_change"].isna(),
        # a constant (norm gain, bias) or no scheme to expect: no expected std
        "expected_std": lambda df: df["expected_std"].isna(),
        "spectral_norm": lambda df: ~df["shape"].astype(str).str.contains("x"),
        "std": lambda df: df["numel"] <= 1,
    },
    "checkpoints": {"step": _no_step, "first_step": lambda df: df["first_step"].isna(),
                    "moved_most": lambda df: df["init_source"] == "none",
                    "moved_most_rel_change": lambda df: df["init_source"] == "none"},
}  # fmt: skip


def random_tokens(vocab: int, seq_len: int, batch: int, seed: int, device) -> torch.Tensor:
    """``tinit variance``'s tokens: uniform ids drawn from the seed alone."""
    return make_tokens(ModelConfig(vocab_size=vocab, n_layers=1, d_model=8, n_heads=1),
                       RunConfig(batch=batch, seq_len=seq_len), seed, device)  # fmt: skip


def _check_seq(seq_len: int, cfg_len: int | None, where: str) -> None:
    if cfg_len is not None and seq_len > cfg_len:
        raise ConfigError("seq_len", f"{seq_len} exceeds the {cfg_len} positions of {where}")


def _fastest(df: pd.DataFrame) -> tuple[int | None, float]:
    """The addition k where the stream variance grows most, v_k / v_{k-1}."""
    v = df.sort_values("k")["stream_var"].to_numpy(dtype=float)
    if len(v) < 2:
        return None, math.nan
    with np.errstate(all="ignore"):
        g = v[1:] / v[:-1]
    if not np.isfinite(g).any():
        return None, math.nan
    i = int(np.nanargmax(np.where(np.isfinite(g), g, -np.inf)))
    return i + 1, float(g[i])


def _memory_check(files: TensorFiles, groups_top: int, block_bytes: int, where: str, device) -> None:
    """One block and the non-block tensors (and, for drift, their step-0 twins) must fit."""
    check_fits({("checkpoint",): 3 * (groups_top + block_bytes)}, {}, f"{where}: one block and the embedding "
               "and head need", device, field="--checkpoint", purpose=" with their step-0 twins")  # fmt: skip


def _sizes(files: TensorFiles, keys: list[str], blocks: list[list[str]], itemsize: int) -> tuple[int, int]:
    top = sum(math.prod(files.shapes[k]) for k in keys) * itemsize
    block = max((sum(math.prod(files.shapes[k]) for k in b) for b in blocks), default=0) * itemsize
    return top, block


def audit_tinit(ck: Checkpoint, ref: Checkpoint | None, tokens: Tokens, run: RunConfig, device,
                dtype: torch.dtype, data_seed: int | None, on_block=None):  # fmt: skip
    """One tinit checkpoint: (variance rows with theory, summary row, drift rows, meta)."""
    cfg, init = model_from_info(ck.info, str(ck.path.with_suffix(".json")))
    what = f"tinit model of its JSON (L={cfg.n_layers}, d={cfg.d_model}, V={cfg.vocab_size})"
    groups = tinit_groups(cfg, init, dtype)
    files = ck.tensors()
    keys = files.check(groups, what)
    item = torch.empty((), dtype=dtype).element_size()
    top = [keys[n[0]] for n, _ in groups if not n[0].startswith("blocks.")]
    blocks = [
        [keys[n[0]] for n, _ in groups if n[0].startswith(f"blocks.{i}.")]
        for i in range(min(cfg.n_layers, 2))
    ]
    _memory_check(files, *_sizes(files, top, blocks, item), str(ck.path), device)
    ref_files = ref_keys = None
    if ref is not None and ref.path != ck.path:
        ref_files = ref.tensors()
        ref_keys = ref_files.check(groups, what)
    source = "checkpoint" if ref is not None else "seed"
    rows: list[dict] = []

    def measure_block(layer: int, state: dict[str, torch.Tensor]) -> None:
        if ref is not None and ref.path == ck.path:
            w0 = state  # the step-0 checkpoint itself
        elif ref_files is not None:
            w0 = ref_files.read([ref_keys[n] for n in state], dtype, device)
            w0 = {n: w0[ref_keys[n]] for n in state}
        else:
            w0 = init_block_state(cfg, init, layer, device, dtype)
        for name, w in state.items():
            at = layer if layer >= 0 else (-1 if name.startswith(("embed", "pos")) else cfg.n_layers)
            role, expected = tinit_expected(cfg, init, name, at, w.shape)
            rows.append({"layer": at, "role": role, **weight_row(name, w, w0.get(name), expected)})
        if on_block is not None:
            on_block(layer)

    seq_len = run.seq_len
    _check_seq(seq_len, cfg.max_seq_len, what)
    ids = tokens(cfg.vocab_size, seq_len, run.batch, init.seed if data_seed is None else data_seed, device)
    model = CheckpointTransformer(cfg, init, files, keys, device, dtype, on_block=measure_block)
    raw = tinit_stream(model, ids, stat_dtype(dtype))
    del model
    df = add_theory(raw, cfg.norm_position, cfg, init)
    labels = {"init": init.scheme, "norm_position": cfg.norm_position, "n_layers": cfg.n_layers,
              "seed": init.seed}  # fmt: skip
    summary = {**labels, **summarize(df, init.definition.closed_form)}
    return df.assign(**labels), summary, rows, {"init_source": source}


def audit_hf(ck: Checkpoint, tokens: Tokens, run: RunConfig, device, dtype: torch.dtype,
             data_seed: int | None, expect=None, on_block=None):  # fmt: skip
    """One Hugging Face checkpoint, read block by block through :class:`LazyBlocks`."""
    from .loaders import hf_config
    from .roles import classify_roles
    from .sites import find_sites, largest_block_list
    from .stream import measure_stream

    config = hf_config(str(ck.config), {})
    from transformers import AutoModelForCausalLM

    config.use_cache = False
    try:
        with params_on_meta(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    except Exception as exc:  # the config's model cannot be built: the input's fault
        raise CheckpointError(f"{ck.config}: cannot build its causal LM: {type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:200]}") from None  # fmt: skip
    files = ck.tensors()
    what = f"{config.model_type} model of {ck.config.name}"
    keys = files.check(tied_groups(model), what)
    path = largest_block_list(model)
    names = [f"{path}.{i}" for i in range(len(model.get_submodule(path)))]
    vocab = int(config.vocab_size)
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    _check_seq(run.seq_len, limit, what)
    rows: list[dict] = []
    roles: dict[str, tuple[str, int]] = {}

    def measure_block(layer: int, state: dict[str, torch.Tensor]) -> None:
        for name, w in state.items():
            role, at = roles.get(name, ("unknown", layer))
            exp = math.nan
            if expect is not None and role not in ("norm", "bias", "gain", "unknown"):
                kind, value = expect.expected(role, len(names), 0.0, at, tuple(w.shape), False)
                exp = value if kind == "std" else math.nan
            rows.append({"layer": at, "role": role, **weight_row(name, w, None, exp)})
        if on_block is not None:
            on_block(layer)

    lazy = LazyBlocks(model, names, files, keys, device, dtype, on_block=measure_block)
    groups = tied_groups(model)
    top_keys = [keys[n[0]] for n in lazy.top]
    blocks = [[keys[n[0]] for n in b] for b in lazy.per_block[:2]]
    _memory_check(files, *_sizes(files, top_keys, blocks, torch.empty((), dtype=dtype).element_size()),
                  str(ck.path), device)  # fmt: skip
    del groups
    top = lazy.load_top()
    ids = tokens(vocab, run.seq_len, run.batch, 0 if data_seed is None else data_seed, device)
    with lazy:
        sites, tr = find_sites(model, ids[:1, : min(4, ids.shape[1])])
        roles.update({r.name: (r.role, r.layer) for r in classify_roles(model, sites, tr, vocab)})
        measure_block(-1, top)
        lazy.measuring = True
        raw, rel = measure_stream(model, sites, ids)
    df = add_theory(raw, sites.norm_position)
    labels = {"init": "as-built", "norm_position": sites.norm_position, "n_layers": sites.n_layers, "seed": 0}
    summary = {**labels, **summarize(df)}
    finite = [x for x in rel if not math.isnan(x)]
    return (
        df.assign(**labels),
        summary,
        rows,
        {
            "init_source": "none",
            "sites": sites.describe(),
            "stream_check_max_rel_err": max(finite) if finite else None,
        },
    )


def _table_row(ck: Checkpoint, summary: dict, df: pd.DataFrame, drift: pd.DataFrame, first: dict | None,
               source: str) -> dict:  # fmt: skip
    k, growth = _fastest(df)
    moved = (
        drift[drift["numel"] > 1].groupby("role")["rel_change"].mean().dropna().sort_values(ascending=False)
    )
    return {
        "run": ck.run, "step": ck.step, "init": summary["init"], "norm_position": summary["norm_position"],
        "n_layers": summary["n_layers"], "v_final_rel": summary["v_final_rel"],
        "v_final_rel_first": first["v_final_rel"] if first else summary["v_final_rel"],
        "first_step": first["step"] if first else ck.step, "fastest_k": k, "fastest_growth": growth,
        # (nothing moved, at the step-0 checkpoint: no order among the roles to report)
        "moved_most": ", ".join(moved.index[:3]) if len(moved) and moved.iloc[0] > 0 else "none",
        "moved_most_rel_change": float(moved.iloc[0]) if len(moved) else math.nan, "init_source": source,
    }  # fmt: skip


def run_checkpoint_audit(found: Found, run: RunConfig, device: torch.device, dtype: torch.dtype,
                         tokens: Tokens = random_tokens, data_seed: int | None = None, expect=None,
                         progress: Progress | None = None, on_partial=None,
                         meta: dict | None = None) -> ExperimentResult:  # fmt: skip
    """Audit every checkpoint of ``found`` in order (see the module docstring). Frames:
    variance, summary, drift, checkpoints. A checkpoint found bad (keys, shapes, dtypes)
    stops the audit before anything of it is measured, with a CheckpointError."""
    meta = dict(meta or {})
    check_checkpoints(found, run, device, dtype)  # configs against files, and memory, before anything
    cks = found.checkpoints
    first_of: dict[str, Checkpoint] = {}
    for ck in cks:
        first_of.setdefault(ck.run, ck)
    refs = {run_: c if c.step == 0 else None for run_, c in first_of.items()}
    # every header (and a tinit checkpoint's keys, shapes and dtypes) checked before anything
    # is measured: a bad file stops the audit before a row exists
    for ck in cks:
        files = ck.tensors()
        if ck.kind == "tinit":
            cfg, init = model_from_info(ck.info, str(ck.path.with_suffix(".json")))
            files.check(tinit_groups(cfg, init, dtype), f"tinit model of its JSON (L={cfg.n_layers}, "
                        f"d={cfg.d_model}, V={cfg.vocab_size})")  # fmt: skip
    var, sums, drift, table = [], [], [], []
    firsts: dict[str, dict] = {}
    meta.update(source=found.source, checkpoints=[str(c.path) for c in cks], skipped=found.skipped,
                batch=run.batch, seq_len=run.seq_len, device=str(device),
                dtype=str(dtype).replace("torch.", ""), init_source={}, data_seed=data_seed)  # fmt: skip

    def frames() -> dict[str, pd.DataFrame]:
        def cat(fs, cols):
            return pd.concat(fs, ignore_index=True)[cols] if fs else pd.DataFrame(columns=cols)

        return {"variance": cat(var, [*KEY, *VARIANCE_COLUMNS]),
                "summary": pd.DataFrame(sums, columns=[*KEY, *SUMMARY_COLUMNS]),
                "drift": pd.DataFrame(drift, columns=DRIFT_COLUMNS),
                "checkpoints": pd.DataFrame(table, columns=TABLE_COLUMNS)}  # fmt: skip

    driver = Run(meta, frames, NOT_APPLICABLE, meter=Meter(device), on_partial=on_partial, progress=progress,
                 total=len(cks))  # fmt: skip

    def measure(ck: Checkpoint):
        if ck.kind == "tinit":
            return audit_tinit(ck, refs.get(ck.run), tokens, run, device, dtype, data_seed)
        return audit_hf(ck, tokens, run, device, dtype, data_seed, expect)

    def collect(ck: Checkpoint, measured) -> None:
        df, summary, rows, info = measured
        key = {"run": ck.run, "step": ck.step}
        var.append(df.assign(**key))
        sums.append({**key, **summary})
        d = pd.DataFrame([{**key, **r} for r in rows], columns=DRIFT_COLUMNS)
        drift.extend(d.to_dict("records"))
        firsts.setdefault(ck.run, {**summary, "step": ck.step})
        table.append(_table_row(ck, summary, df, d, firsts[ck.run], info["init_source"]))
        meta["init_source"][ck.run or "hf"] = info["init_source"]
        for k in ("sites", "stream_check_max_rel_err"):
            if k in info:
                meta[k] = info[k]
        driver.tick()

    driver.each(cks, measure, collect, label=lambda c: f"{c.run or 'model'} step {c.step}",
                span=lambda c: f"{c.run or 'model'}@{c.step}")  # fmt: skip
    return driver.result()
