"""The models ``tinit audit`` can load: a Hugging Face config (offline, built with
``AutoModelForCausalLM.from_config`` so the model's own ``_init_weights`` runs, which
is what is audited), or a user's factory ``pkg.module:factory`` /
``path/to/file.py:factory``.

The user-module contract: ``factory()`` takes no arguments and returns an
``nn.Module`` whose ``forward(tokens)`` maps token ids, a LongTensor of shape
(batch, seq), to logits of shape (batch, seq, vocab) (or a tuple / an object with
``.logits`` holding them). Its blocks must be held (not built on the fly) in a
``ModuleList``. The vocabulary is taken from its largest ``nn.Embedding`` unless
``--vocab`` says otherwise.

transformers is imported only here and only when asked for, with the hub switched
off first (HF_HUB_OFFLINE=1, TRANSFORMERS_OFFLINE=1): nothing is ever downloaded.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import math
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...model.config import ConfigError
from ...userfile import MAX_DEPTH, UserFileError, depth_problem, load_json
from ..result import is_run_failure

HF_INSTALL = "pip install -e '.[hf]' (or pip install 'transformers>=5')"


#: The most layers an audited Hugging Face config may declare. Counting a model's
#: parameters on the meta device (before anything is allocated) costs ~55 KiB and ~10 ms
#: of Python objects per layer, and building it as much again: 1,000 layers is a minute
#: of the audit, and eight times the deepest published decoders (~130 layers).
MAX_HF_LAYERS = 1000
#: The most expert MLPs an audited mixture-of-experts config may declare over all its
#: layers (layers x experts per layer): each is built and counted as a layer's MLP is.
#: Kimi K2's 61 x 384 = 23,424 and DeepSeek-V3's 61 x 256 are the largest published.
MAX_HF_EXPERTS = 32_768
#: Config fields that multiply a layer's MLP into experts, in the families transformers has.
EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts",
                 "n_shared_experts", "num_shared_experts")  # fmt: skip


def parse_set(items: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; a value is JSON when it parses (numbers, true/false/null,
    lists), else a string. A number that is not finite (NaN, Infinity, 1e400) and a value
    nested deeper than :data:`tinit.userfile.MAX_DEPTH` are refused, naming ``--set``."""
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("--set", f"{item!r}: expected KEY=VALUE, e.g. num_hidden_layers=4")
        low = raw.strip()
        try:
            value = json.loads(low)
        except RecursionError:
            raise ConfigError("--set", f"{key.strip()}: nested deeper than {MAX_DEPTH} levels") from None
        except ValueError:
            value = {"none": None, "true": True, "false": False}.get(low.lower(), low)
        why = json_problem(value)
        if why:
            raise ConfigError("--set", f"{key.strip()}={low[:40]}: {why}")
        if key.strip() in out:
            raise ConfigError("--set", f"{key.strip()} is set twice ({key.strip()}={out[key.strip()]!r}, "
                              f"{item.strip()}): give it once")  # fmt: skip
        out[key.strip()] = value
    return out


def json_problem(value: Any) -> str | None:
    """What makes a parsed JSON value unusable as a config value, or None: nesting deeper
    than :data:`tinit.userfile.MAX_DEPTH`, or a number that is not finite (JSON's NaN,
    Infinity, or 1e400, which parses as inf; transformers checks few of its fields)."""
    why = depth_problem(value)
    if why:
        return why
    todo: list[tuple[str, Any]] = [("", value)]
    while todo:
        where, v = todo.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return f"{where + ': ' if where else ''}{v} is not a finite number"
        if isinstance(v, dict):
            todo += [(where or str(k), x) for k, x in v.items()]
        elif isinstance(v, list):
            todo += [(where, x) for x in v]
    return None


def _check_depth(
    model_type: str, cls, kw: dict[str, Any], sets: dict[str, Any], spec: str, default=None
) -> None:
    """The config's layer count at most :data:`MAX_HF_LAYERS`, and its layers times any
    expert count (:data:`EXPERT_FIELDS`, given or the family's default) at most
    :data:`MAX_HF_EXPERTS`, before the config is made (some make a list per layer) and
    the model counted on the meta device."""
    amap = getattr(cls, "attribute_map", {}) or {}
    real = amap.get("num_hidden_layers", "num_hidden_layers")
    layers = kw.get(real)
    if isinstance(layers, int) and not isinstance(layers, bool) and layers > MAX_HF_LAYERS:
        given = [k for k in sets if amap.get(k, k) == real]
        option = "--set" if given else "--hf"
        where = f"{given[0]}={layers}" if given else f"{spec}: {real} = {layers}"
        raise ConfigError(option, f"{where}: at most {MAX_HF_LAYERS} layers (counting a {model_type} model "
                          "costs ~10 ms and 55 KiB a layer before any weight exists)")  # fmt: skip

    def whole(v):
        return isinstance(v, int) and not isinstance(v, bool) and v > 0

    layers = layers if whole(layers) else getattr(default, real, None)
    layers = layers if whole(layers) else 1
    for key in EXPERT_FIELDS:
        n = kw.get(amap.get(key, key), getattr(default, amap.get(key, key), None))
        if whole(n) and layers * n > MAX_HF_EXPERTS:
            given = [k for k in sets if amap.get(k, k) in (amap.get(key, key), real)]
            option = "--set" if given else "--hf"
            raise ConfigError(option, f"{spec}: {layers} layers x {n} experts ({key}) is over "
                              f"{MAX_HF_EXPERTS:,} expert MLPs (each is built and counted as a layer's MLP "
                              "before any weight exists)")  # fmt: skip


def _transformers():
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    if importlib.util.find_spec("transformers") is None:
        raise ConfigError("--hf", f"needs the optional dependency transformers: {HF_INSTALL}")
    import transformers

    # tiny audit shapes trip config warnings (bos/eos ids outside a small vocabulary): errors only
    transformers.logging.set_verbosity_error()
    return transformers


def hf_config(spec: str, sets: dict[str, Any]):
    """A transformers config from a config.json file or a model type, with ``sets``
    applied at construction (so derived fields such as head_dim follow)."""
    tf = _transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    path = Path(spec)
    # (a FIFO, a device or a symlink loop is a file given: refused as such, not taken for a hub id)
    if spec.endswith(".json") or (os.path.lexists(spec) and not path.is_dir()):
        try:  # (a regular file of at most 1 MiB, nested at most 32 levels; no NaN or Infinity)
            doc = load_json(path)
            why = json_problem(doc)
        except UserFileError as exc:
            raise ConfigError("--hf", f"cannot read it as a config.json: {exc}") from None
        if why:
            raise ConfigError("--hf", f"{spec}: {why}")
        if not isinstance(doc, dict) or not isinstance(doc.get("model_type"), str):
            raise ConfigError("--hf", f"{spec} has no model_type string: not a transformers config.json")
        if doc.get("auto_map"):
            raise ConfigError(
                "--hf", f"{spec} needs custom model code from the hub (auto_map); tinit never downloads"
            )
        model_type = doc.pop("model_type")
    else:
        if "/" in spec:
            raise ConfigError(
                "--hf",
                f"{spec!r} looks like a hub id; tinit never downloads: pass a config.json file or MODEL_TYPE",
            )
        doc, model_type = {}, spec
    if model_type not in CONFIG_MAPPING:
        known = ", ".join(
            sorted(
                k
                for k in CONFIG_MAPPING
                if k in ("llama", "gpt2", "qwen2", "mistral", "olmo2", "gemma2", "gemma3_text", "gpt_neox")
            )
        )
        raise ConfigError(
            "--hf", f"unknown model type {model_type!r} for transformers {tf.__version__} (e.g. {known})"
        )
    cls = CONFIG_MAPPING[model_type]
    amap = getattr(cls, "attribute_map", {}) or {}
    default = cls()
    kw = dict(doc)
    for key, value in sets.items():
        real = amap.get(key, key)
        if not hasattr(default, real) and real not in doc and _stored_as_unknown(cls, real, value):
            raise ConfigError("--set", f"{model_type} config has no field {key!r}")
        kw[real] = value
    kw.pop("transformers_version", None)
    doc.pop("transformers_version", None)
    _check_depth(model_type, cls, kw, sets, spec, default)
    try:
        return cls(**kw)
    except Exception as exc:  # transformers' validation raises its own classes, not only ValueError
        raise blame(exc, spec, sets, f"invalid {model_type} config", lambda: cls(**doc)) from None


def blame(exc: BaseException, spec: str, sets: dict[str, Any], what: str, without_sets) -> ConfigError:
    """A transformers error as a one-line ConfigError naming the option that set the
    value it complains about: ``--set KEY`` when its message names a key given with
    --set, ``--set`` when the same build without the --set values (``without_sets()``)
    succeeds, else ``--hf`` (the config file or the model type's defaults)."""
    text = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]
    for key in sets:
        if re.search(rf"\b{re.escape(key)}\b", text):
            return ConfigError("--set", f"{key}={sets[key]!r}: {what}: {text}")
    if sets:
        try:
            without_sets()
        except Exception:
            pass
        else:
            given = " ".join(f"{k}={v!r}" for k, v in sets.items())
            return ConfigError("--set", f"{given}: {what}: {text}")
    return ConfigError("--hf", f"{spec}: {what}: {text}")


def _stored_as_unknown(cls, key: str, value: Any) -> bool:
    """A config keeps a kwarg it does not know as a plain attribute (a typo would pass
    silently); one it consumes (a legacy name such as ``rope_theta``) disappears."""
    try:
        return hasattr(cls(**{key: value}), key)
    except (ValueError, TypeError):
        return False


#: Families whose config names its width, depth, heads, MLP and vocabulary as
#: :func:`param_bound` reads them (checked against the built models in tests/test_audit_hf.py).
BOUNDED_FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "phi3", "granite", "gemma", "gemma2", "gemma3_text",
                    "olmo2", "gpt2", "gpt_neox")  # fmt: skip


def param_bound(config) -> int | None:
    """An upper bound on a decoder's parameters from its config alone (None for a
    family not in :data:`BOUNDED_FAMILIES` or a config that does not say): per layer
    four attention matrices d x max(d, heads x head_dim) (the larger of the query and
    key-value heads), three d x d_ff MLP matrices
    (gated; two for the others) and norms and biases, untied input and output
    embeddings, learned positions."""
    if getattr(config, "model_type", None) not in BOUNDED_FAMILIES:
        return None

    def get(*names):
        return next((v for n in names if isinstance(v := getattr(config, n, None), int)), None)

    d, L, V = get("hidden_size", "n_embd"), get("num_hidden_layers", "n_layer"), get("vocab_size")
    if d is None or L is None or V is None:
        return None
    heads = max(get("num_attention_heads", "n_head") or 1, get("num_key_value_heads") or 1)
    width = max(d, heads * (get("head_dim") or 0))
    ff = max(get("intermediate_size", "n_inner") or 0, 4 * d)
    positions = get("max_position_embeddings", "n_positions") or 0
    return L * (4 * d * width + 3 * d * ff + 16 * (d + width) + 2 * ff) + 2 * V * d + positions * d + 4 * d


def _check_fits(auto, config, spec: str, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse, before allocating, a model whose weights and gradients would take more
    than the free memory (transformers' default configs are full-size: llama is 7B;
    :func:`tinit.experiments.memory.check_fits`, the one pre-check). When twice the
    config's :func:`param_bound` fits, the model is not built on the meta device first to
    count (half a second of a small audit)."""
    from ..memory import available_memory, check_fits

    itemsize = torch.empty((), dtype=dtype).element_size()
    bound = param_bound(config)
    if bound is not None and 2 * 2 * bound * itemsize <= available_memory(device):
        return
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        n = sum(p.numel() for p in auto.from_config(config, dtype=dtype).parameters())
    if n == 0:
        raise ConfigError("--hf", f"{spec}: the model has no parameters")
    check_fits({("parameters",): 2 * n * itemsize}, {"parameters": n},
               f"{spec}: {n / 1e9:.2f}B parameters need", device, field="--hf", purpose=" with gradients",
               hint="; audit a smaller copy with --set num_hidden_layers=N")  # fmt: skip


@contextlib.contextmanager
def seeded(seed: int, device: torch.device):
    """Torch's global generators seeded with ``seed`` inside, restored after: a model's
    own init (transformers' ``_init_weights``, a user's factory) draws from them, so the
    same --seed builds the same weights, and the caller's random state is left as it was."""
    device = torch.device(device)
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []  # fmt: skip
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        yield


def load_hf(spec: str, sets: dict[str, Any], device: torch.device, dtype: torch.dtype,
            seed: int = 0) -> nn.Module:  # fmt: skip
    """Build the causal LM of ``spec`` with its own init, on ``device`` in ``dtype``, its
    weights drawn from torch's generators seeded with ``seed`` (:func:`seeded`)."""
    config = hf_config(spec, sets)
    from transformers import AutoModelForCausalLM

    config.use_cache = False
    try:
        _check_fits(AutoModelForCausalLM, config, spec, device, dtype)
        # building tiny shapes makes torch and transformers warn (zero-element tensors,
        # ids outside a small vocabulary): what matters is checked below, in one line
        with torch.device(device), warnings.catch_warnings(), seeded(seed, device):
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    except ConfigError:
        raise
    except OSError as exc:  # a config that would need a file from the hub
        raise ConfigError(
            "--hf", f"{spec} needs a download, which tinit never does: {str(exc).splitlines()[0]}"
        ) from None
    except Exception as exc:  # a config value the model's code cannot build (negative sizes, ...)
        if is_run_failure(exc):
            raise
        if type(config) not in AutoModelForCausalLM._model_mapping:
            raise ConfigError("--hf", f"{spec}: {config.model_type} is not a causal language model "
                              "(AutoModelForCausalLM cannot build it)") from None  # fmt: skip

        def without_sets():
            with torch.device("meta"):
                AutoModelForCausalLM.from_config(hf_config(spec, {}), dtype=dtype)

        raise blame(exc, spec, sets, "cannot build a causal LM", without_sets) from None
    return model.eval()


def one_line(exc: BaseException) -> str:
    """What a user's code raised, in one line (``sys.exit(N)`` said as such)."""
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def load_module(spec: str, seed: int = 0) -> nn.Module:
    """Call the factory named by ``pkg.module:factory`` or ``path/to/file.py:factory``,
    with torch's generators seeded with ``seed`` during the import and the call
    (:func:`seeded`: a factory that draws its weights from them gives the same model).

    The file (or package) is *executed*, as ``python file.py`` would run it; a file's
    own folder is put first on ``sys.path`` before, so that it imports the files beside
    it. Whatever the user's code raises, including ``sys.exit(...)``, is a one-line
    error naming --module (an exit at import must not end the audit with its code). A
    process the code starts and leaves behind is stopped, and the audit refused
    (:mod:`.children`): a factory must not fork. (Every process that appears below this
    one while the code runs counts as the code's: a library caller whose other threads
    start processes meanwhile should not load a module then.)"""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ConfigError("--module", f"{spec!r}: expected pkg.module:factory or path/to/file.py:factory")
    from .children import children_stopped

    with seeded(seed, torch.device("cpu")), children_stopped(spec):
        return _load_module(spec, target, attr)


def _load_module(spec: str, target: str, attr: str) -> nn.Module:
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise ConfigError("--module", f"no such file {target!r}")
            folder = str(path.resolve().parent)
            if folder not in sys.path:
                sys.path.insert(0, folder)
            name = f"tinit_user_{path.stem}"
            mod_spec = importlib.util.spec_from_file_location(name, path)
            mod = importlib.util.module_from_spec(mod_spec)
            sys.modules[name] = mod
            mod_spec.loader.exec_module(mod)
        else:
            mod = importlib.import_module(target)
    except ConfigError:
        raise
    except (Exception, SystemExit) as exc:  # a user's module may fail in any way: one line
        raise ConfigError("--module", f"cannot import {target}: {one_line(exc)}") from None
    factory = getattr(mod, attr, None)
    if not callable(factory):
        raise ConfigError("--module", f"{target} has no callable {attr!r}")
    try:
        model = factory()
    except (Exception, SystemExit) as exc:
        raise ConfigError("--module", f"{spec}() failed: {one_line(exc)}") from None
    if not isinstance(model, nn.Module):
        raise ConfigError("--module", f"{spec}() returned {type(model).__name__}, not a torch.nn.Module")
    meta = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.device.type == "meta"]
    if meta:
        raise ConfigError("--module", f"{spec}() returned a model on the meta device ({meta[0]} and "
                          f"{len(meta) - 1} more have no values): its init never ran")  # fmt: skip
    return model.eval()


def check_parameters(model: nn.Module, option: str) -> None:
    """Every parameter must hold numbers: an empty one (a size set to 0) has no std to
    audit, and one on the meta device was never initialised."""
    for name, p in model.named_parameters():
        if p.numel() == 0:
            shape = "x".join(map(str, p.shape))
            raise ConfigError(option, f"the model's parameter {name} is empty (shape {shape}): a size is 0")


def infer_vocab(model: nn.Module) -> int | None:
    """The rows of the largest embedding table (the token table), or the HF config's."""
    v = getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(v, int):
        return v
    tables = [m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)]
    return max(tables) if tables else None


def check_token_memory(model: nn.Module, batch: int, seq_len: int, device) -> None:
    """Before the tokens are made: the least an audited forward holds, the token ids and
    three stream-sized tensors (the embedding's output, a branch, their sum) at the
    widest embedding's width (ids only when the model has no nn.Embedding), fits in the
    device's free memory (:func:`tinit.experiments.memory.check_fits`); else a
    ConfigError naming --seq-len or --batch (whichever is further beyond its default,
    128 and 8). A user's module may declare no positions, so nothing else bounds them."""
    from ..memory import check_fits

    widths = [m.embedding_dim for m in model.modules() if isinstance(m, nn.Embedding)]
    item = max((p.element_size() for p in model.parameters()), default=4)
    need = batch * seq_len * (8 + 3 * max(widths, default=0) * item)
    check_fits({("seq_len", "batch"): need}, {"batch": batch, "seq_len": seq_len},
               f"{batch} x {seq_len} tokens need", torch.device(device),
               blame={"batch": "--batch", "seq_len": "--seq-len"},
               purpose=" for the ids and the first activations")  # fmt: skip


def max_positions(model: nn.Module) -> int | None:
    """The longest sequence the model declares (HF max_position_embeddings, tinit max_seq_len)."""
    cfg = getattr(model, "config", None) or getattr(model, "cfg", None)
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        v = getattr(cfg, key, None)
        if isinstance(v, int):
            return v
    return None
