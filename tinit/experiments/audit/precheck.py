"""What ``tinit audit --checkpoint`` checks before any model is built for real, any tensor
is read or any run folder is claimed: that each checkpoint's config describes the
weights its files hold, and that auditing it fits in memory.

- A **tinit checkpoint**: its JSON's embedding shape and layer count against the keys
  the safetensors header holds, before a block is built even on the meta device (a JSON
  saying ``n_layers`` 100000 over two stored blocks built 100,000 meta blocks, 72 s,
  before "missing blocks.2").
- A **Hugging Face checkpoint**: its config.json parsed (one line naming the file, not
  ``--hf``, which was not given), its position count a whole number >= 1, the model
  built entirely on the meta device (no parameter nor buffer gets storage: an
  ``intermediate_size`` of 1e10 or a ``vocab_size`` of 1e12 asked the allocator for
  1.28 TB and 128 TB) and its every tensor held against the files' headers.
- **Memory**: the least the streamed audit holds (one block converted and as stored,
  with its step-0 twin for a tinit checkpoint's drift and one table's twin; the batch's
  embedding rows and the small tensors outside the blocks; the real buffers of an HF
  model; the token ids and the stream tensors of ``--batch`` x ``--seq-len`` tokens)
  through :func:`tinit.experiments.memory.check_fits`, the one pre-check every command
  makes.

Every refusal is a ConfigError (a :class:`~.tensors.CheckpointError` naming
``--checkpoint``, or ``seq_len``/``batch`` naming ``--seq-len``/``--batch``): exit 2.
"""

from __future__ import annotations

import re
import warnings

import torch

from ...model.config import ConfigError, RunConfig
from ..memory import check_fits, least_bytes
from .sources import Checkpoint, Found
from .tensors import CheckpointError, TensorFiles, tied_groups

#: A tinit block's key (at most 7 digits: MAX_LAYERS is 100,000).
BLOCK_KEY = re.compile(r"^blocks\.([0-9]{1,7})\.")
#: The keys of an HF config that count positions.
POSITION_KEYS = ("max_position_embeddings", "n_positions")


def check_checkpoints(found: Found, run: RunConfig, device: torch.device, dtype: torch.dtype) -> None:
    """Every checkpoint of ``found`` (see the module docstring), in order, before the
    first is measured."""
    hf_given = found.source == "safetensors + --hf"
    for ck in found.checkpoints:
        files = ck.tensors()
        if ck.kind == "tinit":
            _tinit(ck, files, run, device, dtype)
        else:
            _hf(ck, files, run, device, dtype, hf_given)


def fewest_positions(found: Found) -> int | None:
    """The fewest positions any checkpoint's model declares (tinit: ``max_seq_len``; HF:
    ``max_position_embeddings`` or ``n_positions``), or None."""
    from .checkpoint import model_from_info

    limits = []
    for ck in found.checkpoints:
        if ck.kind == "tinit":
            limits.append(model_from_info(ck.info, str(ck.path.with_suffix(".json")))[0].max_seq_len)
        else:
            limits.append(_positions(checkpoint_config(ck, found.source == "safetensors + --hf"), ck))
    return min((x for x in limits if x is not None), default=None)


def checkpoint_config(ck: Checkpoint, hf_given: bool):
    """The transformers config of an HF checkpoint. Its errors name ``--checkpoint`` and
    the config file, unless ``--hf`` gave the config (a single .safetensors file)."""
    from .loaders import hf_config

    try:
        return hf_config(str(ck.config), {})
    except CheckpointError:
        raise
    except ConfigError as exc:
        if hf_given:
            raise
        where = str(ck.config)
        message = exc.message if exc.message.startswith(where) else f"{where}: {exc.message}"
        raise CheckpointError(message) from None


def _positions(config, ck: Checkpoint) -> int | None:
    for key in POSITION_KEYS:
        v = getattr(config, key, None)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise CheckpointError(f"{ck.config}: {key} {v!r} is not a whole number >= 1")
        return v
    return None


def check_seq(seq_len: int, limit: int | None, model: str, key: str) -> None:
    """``--seq-len`` against the positions of ``model`` (its config's ``key``): an error
    that says which model, how many positions it has and what to give instead."""
    if limit is not None and seq_len > limit:
        raise ConfigError("seq_len", f"{seq_len} tokens do not fit the {model}: it has {limit} positions "
                          f"({key}); give --seq-len {limit} or less")  # fmt: skip


def positions_key(config) -> str:
    """The key of the config's file that holds its positions, for the error's words
    (GPT-2's max_position_embeddings is its n_positions: its attribute_map)."""
    key = next((k for k in POSITION_KEYS if getattr(config, k, None) is not None), POSITION_KEYS[0])
    return getattr(config, "attribute_map", {}).get(key, key)


def _tinit(ck: Checkpoint, files: TensorFiles, run: RunConfig, device, dtype: torch.dtype) -> None:
    from .checkpoint import model_from_info

    where = str(ck.path.with_suffix(".json"))
    cfg, init = model_from_info(ck.info, where)
    check_tinit_claims(files, cfg, where)
    what = f"tinit model of its JSON (L={cfg.n_layers}, d={cfg.d_model}, V={cfg.vocab_size})"
    check_seq(run.seq_len, cfg.max_seq_len, f"tinit model of {where}", "max_seq_len")
    terms = least_bytes(cfg, init, run.batch, run.seq_len, dtype, backward=False)
    # streamed (checkpoint.py): the tables outside the blocks are never held whole, but drift
    # rebuilds (or reads) one table's step-0 twin at a time (none at the step-0 checkpoint
    # itself); a block is held converted, as stored (at least 2 bytes an element) and, for
    # drift, beside its twin
    item = torch.empty((), dtype=dtype).element_size()
    twin = ck.step != 0
    terms[("vocab_size", "d_model")] = cfg.vocab_size * cfg.d_model * item if twin else 0
    terms[("d_model",)] = terms[("d_model",)] // item * ((2 if twin else 1) * item + 2)
    sizes = {"n_layers": cfg.n_layers, "d_model": cfg.d_model, "vocab_size": cfg.vocab_size,
             "batch": run.batch, "seq_len": run.seq_len}  # fmt: skip
    check_fits(terms, sizes, f"{ck.path}: its {what} on {run.batch} x {run.seq_len} tokens needs", device,
               blame=dict.fromkeys(("n_layers", "d_model", "vocab_size"), "--checkpoint"),
               purpose=" for one block as stored and converted, the step-0 twins of a block and a table, "
               "and the first activations")  # fmt: skip


def check_tinit_claims(files: TensorFiles, cfg, where: str) -> None:
    """The embedding's shape and the blocks a tinit checkpoint's header holds agree with
    its JSON's model, before any block of that model is built (even on the meta device)."""
    V, d = cfg.vocab_size, cfg.d_model
    emb = files.shapes.get("embed.weight")
    if emb is not None and emb != (V, d):
        raise CheckpointError(f"{files.where}: embed.weight has shape {list(emb)}, the model of its JSON "
                              f"({where}: V={V}, d={d}) needs [{V}, {d}]")  # fmt: skip
    held = {int(m.group(1)) for k in files.shapes if (m := BLOCK_KEY.match(k))}
    beyond = sorted(i for i in held if i >= cfg.n_layers)
    if beyond:
        raise CheckpointError(f"{files.where}: holds blocks.{beyond[0]}, beyond the n_layers {cfg.n_layers} "
                              f"of its JSON ({where})")  # fmt: skip
    if len(held) < cfg.n_layers:
        missing = next(i for i in range(cfg.n_layers) if i not in held)
        raise CheckpointError(f"{files.where}: missing blocks.{missing}: it holds {len(held)} block(s), its "
                              f"JSON ({where}) says n_layers {cfg.n_layers}")  # fmt: skip


def _hf(ck: Checkpoint, files: TensorFiles, run: RunConfig, device, dtype: torch.dtype,
        hf_given: bool) -> None:  # fmt: skip
    from .sites import SiteError, largest_block_list

    config = checkpoint_config(ck, hf_given)
    what = f"{config.model_type} model of {ck.config.name}"
    check_seq(
        run.seq_len,
        _positions(config, ck),
        f"{config.model_type} model of {ck.config}",
        positions_key(config),
    )
    model = meta_model(config, ck, dtype)
    groups = tied_groups(model)
    files.check(groups, what)
    try:
        path = largest_block_list(model)
    except SiteError as exc:
        raise CheckpointError(f"{ck.config}: {exc.message}") from None
    item = torch.empty((), dtype=dtype).element_size()
    blocks: dict[str, int] = {}
    top = 0
    top_small = 0
    vocab_rows = getattr(config, "vocab_size", None)
    for names, shape in groups:
        n = 1
        for s in shape:
            n *= s
        head, _, rest = names[0].partition(path + ".")
        if head == "" and rest:
            block = rest.split(".", 1)[0]
            blocks[block] = blocks.get(block, 0) + n
        else:
            top += n
            if not shape or shape[0] != vocab_rows:
                top_small += n
    try:
        emb = model.get_input_embeddings()
        d = int(emb.weight.shape[1])
    except (AttributeError, NotImplementedError, IndexError):  # (no embedding found: its streams unknown)
        d = 0
    tokens = run.batch * run.seq_len
    vocab = getattr(config, "vocab_size", 1) or 1
    terms = {
        # streamed (checkpoint.py): the embedding read by the batch's rows, the head and any
        # table of vocab rows in row chunks; the rest outside the blocks (norms) held
        ("vocab_size", "d_model"): (top_small + min(tokens, vocab) * d) * item,
        # one block converted, and as stored (at least 2 bytes an element)
        ("d_model",): max(blocks.values(), default=0) * (item + 2),
        # (an HF model's buffers get storage when it is built: RoPE's frequencies, masks)
        ("buffers",): sum(b.numel() * b.element_size() for b in model.buffers()),
        ("batch", "seq_len"): tokens * 8,
        ("batch", "seq_len", "d_model"): 3 * tokens * d * item,
    }
    sizes = {"vocab_size": vocab, "d_model": d, "buffers": 1,
             "batch": run.batch, "seq_len": run.seq_len}  # fmt: skip
    check_fits(terms, sizes, f"{ck.path}: its {what} on {run.batch} x {run.seq_len} tokens needs", device,
               blame=dict.fromkeys(("d_model", "vocab_size", "buffers"), "--checkpoint"),
               purpose=" for the embedding and head, one block, its buffers and the first "
               "activations")  # fmt: skip


def meta_model(config, ck: Checkpoint, dtype: torch.dtype):
    """The causal LM of ``config`` built wholly on the meta device: every parameter and
    buffer a shape without storage, whatever sizes the config says."""
    from transformers import AutoModelForCausalLM

    config.use_cache = False
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    except Exception as exc:  # the config's model cannot be built: the input's fault
        raise CheckpointError(f"{ck.config}: cannot build its causal LM: {type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:200]}") from None  # fmt: skip
