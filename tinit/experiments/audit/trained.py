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
  (``expected_std``: a tinit run's own scheme; an HF model's declared init, its config's
  ``initializer_range`` plus its family's rule, or ``--expect``'s scheme), its spectral
  norm (largest singular value, matrices only) and,
  where the init is known (the run's step-0 checkpoint, else its seed: a tinit block
  depends only on (seed, layer, role)), ``rel_change`` = ||W - W0|| / ||W0||;
- ``checkpoints``: one row per checkpoint: v_2L / v0 now and at the run's first
  checkpoint, the addition where the stream grows fastest, the roles that moved most.

Tokens: uniform random ids from ``data_seed`` (``tinit audit --checkpoint``: ``--seed``,
the same tokens for every run; None: each run's own seed, so a step-0 checkpoint gives
``tinit variance``'s numbers exactly), or a ``TrainData``'s first held-out batch
(``tinit train``'s loader, its windows drawn by ``--seed``); config.json's
``tokens_seed`` says which.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from ... import theory
from ...model.config import ConfigError, ModelConfig, RunConfig
from ..device import make_tokens, stat_dtype
from ..driver import Meter, Run
from ..measure.variance import NOT_APPLICABLE as VARIANCE_NOT_APPLICABLE
from ..measure.variance import SUMMARY_COLUMNS, VARIANCE_COLUMNS, add_theory, summarize
from ..measure.variance import measure_stream as tinit_stream
from ..memory import check_fits, rss_mib
from ..result import ExperimentResult, Progress
from .checkpoint import (
    CheckpointTransformer,
    LazyBlocks,
    embedding_rows,
    init_block_state,
    init_top_tensor,
    model_from_info,
    params_on_meta,
    tinit_expected,
    tinit_groups,
)
from .precheck import check_checkpoints, check_seq, positions_key
from .reader import BlockReader
from .reader import _set as _set_tensor
from .sources import Checkpoint, Found
from .spectral import FAST_RTOL, METHODS
from .tensors import CheckpointError, TensorFiles, read_json, tied_groups
from .weights import STAT_CHUNK, table_row, weight_row

KEY = ["run", "step"]
DRIFT_COLUMNS = [*KEY, "layer", "role", "param", "shape", "numel", "rel_change", "std", "expected_std",
                 "spectral_norm", "spectral_method"]  # fmt: skip
TABLE_COLUMNS = [*KEY, "init", "norm_position", "n_layers", "v_final_rel", "v_final_rel_first",
                 "first_step", "fastest_k", "fastest_growth", "moved_most", "moved_most_rel_change",
                 "init_source"]  # fmt: skip

#: A token source: (vocab of the model, seq_len, batch, seed, device) -> (batch, seq) ids.
Tokens = Callable[[int, int, int, int, torch.device], torch.Tensor]


def _no_step(df: pd.DataFrame):
    """An HF model's checkpoint has no training step."""
    return df["step"].isna()


def _matrix(df: pd.DataFrame):
    return df["shape"].astype(str).str.contains("x")


NOT_APPLICABLE = {
    "variance": {**VARIANCE_NOT_APPLICABLE["variance"], "step": _no_step},
    "summary": {**VARIANCE_NOT_APPLICABLE["summary"], "step": _no_step},
    "drift": {
        "step": _no_step,
        # no init known (an HF model), or W0 = 0 (a zero-initialised matrix): no relative change
        "rel_change": lambda df: df["rel_change"].isna(),
        # a constant (norm gain, bias) or no scheme to expect: no expected std
        "expected_std": lambda df: df["expected_std"].isna(),
        # not a matrix, or --spectral off (a matrix that is not finite has a NaN, flagged)
        "spectral_norm": lambda df: ~_matrix(df) | (df["spectral_method"] == "off"),
        "spectral_method": lambda df: ~_matrix(df),
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


class Ticker:
    """Progress in blocks over every checkpoint, with the bytes read and the block rate
    (``progress(done, total, detail)``; a caller's two-argument callback gets no detail)."""

    def __init__(self, progress: Progress | None, total_blocks: int, total_bytes: int):
        self.progress, self.total, self.total_bytes = progress, max(total_blocks, 1), total_bytes
        self.done, self.read_before, self.t0 = 0, 0, time.perf_counter()
        self.files: TensorFiles | None = None
        self.label, self.blocks = "", 0

    def checkpoint(self, label: str, files: TensorFiles, blocks: int) -> None:
        if self.files is not None:
            self.read_before += self.files.bytes_read
        self.label, self.files, self.blocks = label, files, blocks

    @property
    def bytes_read(self) -> int:
        return self.read_before + (self.files.bytes_read if self.files is not None else 0)

    def __call__(self, layer: int) -> None:
        self.done += 1
        if self.progress is None:
            return
        rate = self.done / max(time.perf_counter() - self.t0, 1e-9)
        where = "embedding, head" if layer < 0 else f"block {layer + 1}/{self.blocks}"
        gib = f"{self.bytes_read / 2**30:.2f}/{self.total_bytes / 2**30:.2f} GiB read"
        detail = f"{self.label} {where} · {gib} · {rate:.2f} blocks/s"
        try:
            self.progress(min(self.done, self.total), self.total, detail)
        except TypeError:  # a (done, total) callback
            self.progress(min(self.done, self.total), self.total)


def _activation_bytes(batch: int, seq: int, d: int, d_ff: int, heads: int, itemsize: int) -> int:
    """A bound on what one block's forward holds besides its weights: the stream, the
    branch and the probe's temporaries (8 stream-sized tensors), the FFN's three hidden
    tensors, and two attention score matrices (the eager and the math SDPA paths)."""
    tokens = batch * seq
    return itemsize * (tokens * (8 * d + 3 * d_ff) + 2 * batch * heads * seq * seq) + 8 * tokens


def _memory_plan(reader: BlockReader, top_bytes: int, rows_bytes: int, act: int,
                 twins: int, device, where: str) -> dict:  # fmt: skip
    """What streaming this checkpoint holds at its peak, checked against the free memory
    before anything is read: the reader's arena and staging, the step-0 twin of a block
    (drift) and of the largest tensor outside the blocks, the small tensors read whole,
    the embedding rows of the batch, the row chunks of a table (two buffers) and one
    block's activations. A CheckpointError naming the sizes when it does not fit."""
    from .tensors import CHUNK_BYTES

    arena = reader.arena_elements * reader.itemsize
    staging = reader.bytes_held - arena
    chunks = 3 * CHUNK_BYTES + 8 * STAT_CHUNK
    need = arena + staging + twins + top_bytes + rows_bytes + chunks + act
    now = (rss_mib() or 0.0) / 1024  # (the interpreter, torch and what the command imported)
    plan = {"arena_gib": arena / 2**30, "staging_gib": staging / 2**30, "twins_gib": twins / 2**30,
            "activations_gib": act / 2**30, "process_gib": now,
            "predicted_gib": now + need / 2**30}  # fmt: skip
    # (the pre-check, precheck.py, refused what cannot fit from the headers alone; this is
    # the same sum from the reader's own buffers, checked again where it is spent)
    check_fits({("checkpoint",): need}, {}, f"{where}: streaming it (one block converted {arena / 2**30:.3g} "
               f"GiB, the next as stored {staging / 2**30:.3g} GiB, activations {act / 2**30:.3g} GiB) needs",
               device, field="--checkpoint", hint="; lower --batch or --seq-len, or audit with --dtype "
               "bfloat16")  # fmt: skip
    return plan


def _block_keys(groups, keys: dict[str, str], L: int) -> list[list[str]]:
    return [[keys[n[0]] for n, _ in groups if n[0].startswith(f"blocks.{i}.")] for i in range(L)]


def audit_tinit(ck: Checkpoint, ref: Checkpoint | None, tokens: Tokens, run: RunConfig, device,
                dtype: torch.dtype, data_seed: int | None, spectral: str = "fast",
                ticker: Ticker | None = None, stats: dict | None = None):  # fmt: skip
    """One tinit checkpoint: (variance rows with theory, summary row, drift rows, meta)."""
    cfg, init = model_from_info(ck.info, str(ck.path.with_suffix(".json")))
    what = f"tinit model of its JSON (L={cfg.n_layers}, d={cfg.d_model}, V={cfg.vocab_size})"
    groups = tinit_groups(cfg, init, dtype)
    files = ck.tensors()
    keys = files.check(groups, what)
    if ticker is not None:
        ticker.checkpoint(f"{ck.run}@{ck.step}", files, cfg.n_layers)
    seq_len = run.seq_len
    check_seq(seq_len, cfg.max_seq_len, f"tinit model of {ck.path.with_suffix('.json')}", "max_seq_len")
    top = [n[0] for n, _ in groups if not n[0].startswith("blocks.")]
    reader = BlockReader(files, _block_keys(groups, keys, cfg.n_layers), dtype, device)
    item = reader.itemsize
    same = ref is not None and ref.path == ck.path
    largest_top = max((math.prod(files.shapes[keys[n]]) for n in top), default=0) * item
    small_top = sum(math.prod(files.shapes[keys[n]]) for n in top if n.startswith(("pos.", "final_norm.")))
    twins = 0 if same else reader.arena_elements * item + largest_top
    act = _activation_bytes(run.batch, seq_len, cfg.d_model, cfg.d_ff, cfg.n_heads, item)
    rows = min(run.batch * seq_len, cfg.vocab_size) * cfg.d_model * item
    plan = _memory_plan(reader, small_top * item, rows, act, twins, device, str(ck.path))
    ref_files = ref_keys = None
    if ref is not None and not same:
        ref_files = ref.tensors()
        ref_keys = ref_files.check(groups, what)
    source = "checkpoint" if ref is not None else "seed"
    rows_out: list[dict] = []

    def at_layer(name: str, layer: int) -> int:
        return layer if layer >= 0 else (-1 if name.startswith(("embed", "pos")) else cfg.n_layers)

    # the tensors outside the blocks, from the file in row chunks (never a table whole)
    for name in top:
        at = at_layer(name, -1)
        shape = files.shapes[keys[name]]
        role, expected = tinit_expected(cfg, init, name, at, shape)
        if same:
            w0 = None
        elif ref_files is not None:
            w0 = ref_files.read([ref_keys[name]], dtype, device)[ref_keys[name]]
        else:
            w0 = init_top_tensor(cfg, init, name, device, dtype)
        row = table_row(files, keys[name], name, expected, spectral, w0, device, stats, same=same)
        rows_out.append({"layer": at, "role": role, **row})
        del w0
    if ticker is not None:
        ticker(-1)

    def measure_block(layer: int, state: dict[str, torch.Tensor]) -> None:
        if same:
            w0 = state  # the step-0 checkpoint itself
        elif ref_files is not None:
            w0 = ref_files.read([ref_keys[n] for n in state], dtype, device)
            w0 = {n: w0[ref_keys[n]] for n in state}
        else:
            w0 = init_block_state(cfg, init, layer, device, dtype)
        for name, w in state.items():
            role, expected = tinit_expected(cfg, init, name, layer, w.shape)
            rows_out.append({"layer": layer, "role": role,
                             **weight_row(name, w, w0.get(name), expected, spectral, stats)})  # fmt: skip

    ids = tokens(cfg.vocab_size, seq_len, run.batch, init.seed if data_seed is None else data_seed, device)
    model = CheckpointTransformer(
        cfg, init, files, keys, reader, device, dtype, on_block=measure_block, on_measured=ticker
    )
    raw = tinit_stream(model, ids, stat_dtype(dtype))
    del model
    df = add_theory(raw, cfg.norm_position, cfg, init)
    labels = {"init": init.scheme, "norm_position": cfg.norm_position, "n_layers": cfg.n_layers,
              "seed": init.seed}  # fmt: skip
    summary = {**labels, **summarize(df, theory.closed_form_text(init.definition, cfg.norm_position))}
    return df.assign(**labels), summary, rows_out, {"init_source": source, "memory": plan}


def audit_hf(ck: Checkpoint, tokens: Tokens, run: RunConfig, device, dtype: torch.dtype,
             data_seed: int | None, expect=None, spectral: str = "fast", ticker: Ticker | None = None,
             stats: dict | None = None):  # fmt: skip
    """One Hugging Face checkpoint: the base model (no head) run through the audit's
    hooks, its blocks given their weights by :class:`LazyBlocks` one at a time, its
    embedding read by the batch's rows; the tensors outside the blocks measured from
    the file in row chunks."""
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
    if ticker is not None:
        ticker.checkpoint(ck.run, files, len(names))
    vocab = int(config.vocab_size)
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    check_seq(run.seq_len, limit, f"{config.model_type} model of {ck.config}", positions_key(config))
    rows: list[dict] = []
    roles: dict[str, tuple[str, int]] = {}
    held: list = []  # the expectation, once the sites (the family's rule) are known

    def expected_of(role: str, at: int, shape) -> float:
        if role in ("norm", "bias", "gain", "unknown"):
            return math.nan
        kind, value = held[0].expected(role, len(names), 0.0, at, tuple(shape), False)
        return value if kind == "std" else math.nan

    def measure_block(layer: int, state: dict[str, torch.Tensor]) -> None:
        for name, w in state.items():
            role, at = roles.get(name, ("unknown", layer))
            exp = expected_of(role, at, w.shape)
            rows.append({"layer": at, "role": role, **weight_row(name, w, None, exp, spectral, stats)})

    lazy = LazyBlocks(model, names, keys, on_block=measure_block, on_measured=ticker)
    reader = BlockReader(files, lazy.block_keys(), dtype, device)
    base = model.base_model
    emb = model.get_input_embeddings()
    emb_name = next(n[0] for n in lazy.top if model.get_parameter(n[0]) is emb.weight) if any(
        True for _ in lazy.top) else None  # fmt: skip
    base_params = {id(p) for p in base.parameters()}
    needed = [n for n in lazy.top if n[0] != emb_name and id(model.get_parameter(n[0])) in base_params]
    item = reader.itemsize
    small = sum(math.prod(files.shapes[keys[n[0]]]) for n in needed) * item
    d = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0) or emb.weight.shape[1])
    d_ff = int(getattr(config, "intermediate_size", 0) or getattr(config, "n_inner", 0) or 4 * d)
    heads = int(getattr(config, "num_attention_heads", 0) or getattr(config, "n_head", 0) or 1)
    act = _activation_bytes(run.batch, run.seq_len, d, d_ff, heads, item)
    rows_b = min(run.batch * run.seq_len, vocab) * d * item
    plan = _memory_plan(reader, small, rows_b, act, 0, device, str(ck.path))
    read = files.read([keys[n[0]] for n in needed], dtype, device)
    for names_ in needed:
        for n in names_:
            _set_tensor(model, n, read[keys[names_[0]]])
    ids = tokens(vocab, run.seq_len, run.batch, 0 if data_seed is None else data_seed, device)
    emb_key = keys[emb_name]
    with lazy.reading(reader, blank=True), embedding_rows(model, files, emb_key, dtype, device):
        # the structure from a forward of zeros: nothing of the blocks is read for it
        sites, tr = find_sites(model, ids[:1, : min(2, ids.shape[1])], forward=base)
    held.append(_hf_expectation(expect, config, sites))
    roles.update({r.name: (r.role, r.layer) for r in classify_roles(model, sites, tr, vocab)})
    del tr
    for group in lazy.top:
        name = group[0]
        role, at = roles.get(name, ("unknown", -1))
        shape = files.shapes[keys[name]]
        rows.append({"layer": at, "role": role, **table_row(files, keys[name], name,
                     expected_of(role, at, shape), spectral, None, device, stats)})  # fmt: skip
    if ticker is not None:
        ticker(-1)
    with lazy.reading(reader), embedding_rows(model, files, emb_key, dtype, device):
        raw, rel = measure_stream(model, sites, ids, forward=base, stats=stat_dtype(dtype))
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
            "expected": held[0].source,
            "sites": sites.describe(),
            "stream_check_max_rel_err": max(finite) if finite else None,
            "memory": plan,
        },
    )


def _hf_expectation(expect, config, sites):
    """What an HF checkpoint's ``expected_std`` follows: ``expect`` (``--expect SCHEME``)
    at the config's ``initializer_range`` (0.02 where it has none), as ``audit --hf``
    takes it; None (``--expect declared``): the config's ``initializer_range`` plus the
    family's own rule (GPT-2's c_proj / sqrt(2 n_layer)), as ``audit --hf`` declares it."""
    import dataclasses

    from .audit import declared_expectation

    if expect is None:
        return declared_expectation(config, sites)
    rng = getattr(config, "initializer_range", None)
    if isinstance(rng, int | float) and not isinstance(rng, bool):
        what = f"{expect.source} (sigma {float(rng):g}, the config's initializer_range)"
        return dataclasses.replace(expect, sigma=float(rng), embed_std=float(rng), source=what)
    return dataclasses.replace(expect, source=f"{expect.source} (sigma {expect.sigma:g})")


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


def _blocks_of(ck: Checkpoint, info_cfg) -> int:
    """How many blocks a checkpoint has, for the progress bar's total (an HF config that
    does not say counts one)."""
    if info_cfg is not None:
        return info_cfg.n_layers
    try:
        doc = read_json(ck.config, "a transformers config")
    except CheckpointError:
        return 1
    n = next(
        (doc[k] for k in ("num_hidden_layers", "n_layer", "num_layers") if isinstance(doc.get(k), int)), 1
    )
    return max(int(n), 1)


def _tokens_seed(data_seed: int | None) -> dict:
    """config.json's ``tokens_seed``: which seed drew the tokens every checkpoint is
    measured on, and whether every run shares them (``tinit audit --checkpoint``: --seed,
    the same batch for every run, not each run's own training seed)."""
    if data_seed is not None:
        return {"seed": data_seed, "option": "--seed", "same_for_every_run": True}
    return {"seed": None, "option": None, "same_for_every_run": False,
            "note": "each run's own (training) seed; a Hugging Face model: 0"}  # fmt: skip


def run_checkpoint_audit(found: Found, run: RunConfig, device: torch.device, dtype: torch.dtype,
                         tokens: Tokens = random_tokens, data_seed: int | None = None, expect=None,
                         progress: Progress | None = None, on_partial=None,
                         meta: dict | None = None, spectral: str = "fast") -> ExperimentResult:  # fmt: skip
    """Audit every checkpoint of ``found`` in order (see the module docstring). Frames:
    variance, summary, drift, checkpoints. A checkpoint found bad (keys, shapes, dtypes)
    stops the audit before anything of it is measured, with a CheckpointError.
    ``spectral``: how each matrix's spectral norm is found (:data:`.spectral.METHODS`)."""
    if spectral not in METHODS:
        raise ConfigError("--spectral", f"{spectral!r} is not one of {', '.join(METHODS)}")
    meta = dict(meta or {})
    check_checkpoints(found, run, device, dtype)  # configs against files, and memory, before anything
    cks = found.checkpoints
    first_of: dict[str, Checkpoint] = {}
    for ck in cks:
        first_of.setdefault(ck.run, ck)
    refs = {run_: c if c.step == 0 else None for run_, c in first_of.items()}
    # every header (and a tinit checkpoint's keys, shapes and dtypes) checked before anything
    # is measured: a bad file stops the audit before a row exists
    blocks = total_bytes = 0
    for ck in cks:
        files = ck.tensors()
        total_bytes += files.n_bytes
        cfg = None
        if ck.kind == "tinit":
            cfg, init = model_from_info(ck.info, str(ck.path.with_suffix(".json")))
            files.check(tinit_groups(cfg, init, dtype), f"tinit model of its JSON (L={cfg.n_layers}, "
                        f"d={cfg.d_model}, V={cfg.vocab_size})")  # fmt: skip
        blocks += _blocks_of(ck, cfg) + 1
    var, sums, drift, table = [], [], [], []
    firsts: dict[str, dict] = {}
    stats: dict = {}
    meta.update(source=found.source, checkpoints=[str(c.path) for c in cks], skipped=found.skipped,
                batch=run.batch, seq_len=run.seq_len, device=str(device),
                dtype=str(dtype).replace("torch.", ""), init_source={}, data_seed=data_seed,
                tokens_seed=_tokens_seed(data_seed),
                spectral={"method": spectral, "rtol": FAST_RTOL if spectral == "fast" else None,
                          "counts": stats}, memory={}, bytes_total=total_bytes)  # fmt: skip
    ticker = Ticker(progress, blocks, total_bytes)

    def frames() -> dict[str, pd.DataFrame]:
        def cat(fs, cols):
            return pd.concat(fs, ignore_index=True)[cols] if fs else pd.DataFrame(columns=cols)

        meta["bytes_read"] = ticker.bytes_read
        return {"variance": cat(var, [*KEY, *VARIANCE_COLUMNS]),
                "summary": pd.DataFrame(sums, columns=[*KEY, *SUMMARY_COLUMNS]),
                "drift": pd.DataFrame(drift, columns=DRIFT_COLUMNS),
                "checkpoints": pd.DataFrame(table, columns=TABLE_COLUMNS)}  # fmt: skip

    driver = Run(meta, frames, NOT_APPLICABLE, meter=Meter(device), on_partial=on_partial, progress=None,
                 total=len(cks))  # fmt: skip

    def measure(ck: Checkpoint):
        if ck.kind == "tinit":
            return audit_tinit(ck, refs.get(ck.run), tokens, run, device, dtype, data_seed, spectral, ticker,
                               stats)  # fmt: skip
        return audit_hf(ck, tokens, run, device, dtype, data_seed, expect, spectral, ticker, stats)

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
        for k in ("sites", "stream_check_max_rel_err", "expected"):
            if k in info:
                meta[k] = info[k]
        plan = info.get("memory", {})
        for k, v in plan.items():  # the largest checkpoint's plan
            meta["memory"][k] = max(meta["memory"].get(k, 0.0), v)
        driver.tick()

    driver.each(cks, measure, collect, label=lambda c: f"{c.run or 'model'} step {c.step}",
                span=lambda c: f"{c.run or 'model'}@{c.step}")  # fmt: skip
    return driver.result()
