"""What a run holds in memory: the bytes an ordinary backward keeps, bounded before
anything is allocated, the process's resident memory as it goes, the memory it may
still take (free host memory under the cgroup and address-space limits, or the
device's), and the streaming decision made from them.

The streaming decision (:func:`should_stream`) compares
what a fully built pass would hold with the free memory. For a forward without
gradients that is the weights; for a backward it is far more: autograd keeps, for
every block, the tensors its backward needs (the inputs of every linear layer, the
norms' statistics, the FFN's hidden activations, the attention's softmax or its
log-sum-exp), which at the default depth-sweep shape (d 256, 8 x 128 tokens)
are eight times the block's weights. They can be counted by running one block on the
``meta`` device (shapes only, no memory, no arithmetic) under
``torch.autograd.graph.saved_tensors_hooks`` and adding up the distinct storages it
saves that are not weights. That count costs a second of a process's start (torch's
meta kernels for the norms import its compiler, 70 MB), so the decision uses a bound
from the shapes instead (:func:`backward_bound`), which the tests hold against the count
in every block variant: never below it, at most ~25% above.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable

import torch

from ..model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from ..model.layers import rope_cache
from ..model.transformer import Block


def rss_mib() -> float | None:
    """This process's resident memory now, in MiB (Linux ``/proc/self/statm``); None
    where the platform does not say."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_own_mib() -> float | None:
    """The peak resident memory of this process's own address space, in MiB (Linux
    ``VmHWM``); None where /proc does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def block_bytes(
    cfg: ModelConfig, init: InitConfig, batch: int, seq_len: int, dtype: torch.dtype
) -> tuple[int, int]:
    """(weights, saved) of one block: the bytes of its parameters, and the bytes autograd
    saves for the backward of its forward on ``batch`` x ``seq_len`` tokens (distinct
    storages, weights excluded). Measured on the meta device, where attention takes
    torch's reference (math) path and saves its softmax (batch x heads x seq^2): an
    upper bound for the fused kernels, which keep less."""
    cfg = dataclasses.replace(cfg, max_seq_len=max(cfg.max_seq_len, seq_len))
    if cfg.branch == "gaussian":  # its draw needs a real generator; the model's branch saves more
        cfg = dataclasses.replace(cfg, branch="model")
    seen: dict[int, torch.UntypedStorage] = {}  # held, so that no address is reused while counting
    with torch.device("meta"):
        block = Block(cfg, 0, seed=init.seed, dtype=dtype, init=init)
    params = list(block.parameters())
    weights = {p.untyped_storage()._cdata for p in params}
    # (tensors made on the meta device directly, not under its context: a factory such as
    # arange there takes torch's Python reference, which imports sympy, 1 s of a process)
    rope = None
    if cfg.positions == "rope":
        rope = tuple(t.to("meta") for t in rope_cache(seq_len, cfg.head_dim, cfg.rope_base, "cpu", dtype))
    x = torch.empty(batch, seq_len, cfg.d_model, dtype=dtype, device="meta", requires_grad=True)

    def pack(t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        if storage._cdata not in weights:
            seen[storage._cdata] = storage
        # pack to nothing: a saved output packed as itself would hold the node that holds
        # it, a cycle through C++ that the collector never frees (and no backward runs
        # here to unpack it); its storage alone holds no graph

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda _: None):
        block(x, rope, x0=x)
    return sum(p.numel() * p.element_size() for p in params), sum(s.nbytes() for s in seen.values())


def gradient_pass_bytes(
    cfg: ModelConfig, init: InitConfig, batch: int, seq_len: int, dtype: torch.dtype
) -> int:
    """What one ordinary backward through the fully built stack holds at its peak.

    Throughout: the weights, and the logits with their log-softmax and gradient (in
    the statistics dtype). At the start of the backward: every block's saved
    activations (:func:`block_bytes`; they include the stream tensors the gradient tap
    keeps). As it goes down the stack each block's activations are freed and its weight
    gradients arrive, with the retained stream gradients (one per addition; post-norm
    retains the sum before the norm as well): at the end, weights' gradients and those.
    The peak is the larger of the two ends. Checked against the peak resident memory
    of real backwards (tests/test_memory_flat.py)."""
    weights, saved = block_bytes(cfg, init, batch, seq_len, dtype)
    L = cfg.n_layers
    retained, head = _retained_and_head(cfg, batch * seq_len, dtype)
    return L * weights + max(L * saved, L * weights + retained) + head


def _per_token_upper(cfg: ModelConfig, init: InitConfig, seq_len: int) -> int:
    """At least as many elements per token as a block saves for its backward, and at most
    ~25% more (both checked against :func:`block_bytes` in tests/test_memory_flat.py over
    every placement, FFN, positions, norm, QK-norm, GQA, gain, x0 mix and the
    architectures schemes bring): 6 d for the attention's q, k, v, their rotations and
    output and the FFN's input; per norm 2 d for RMSNorm (input and normalised) and 1 d
    for LayerNorm (whose statistics are small), the placement's norms per block (two;
    four in sandwich; none without norms), two more for QK-norm and for torchscale's sub-LN (whose FFN norm
    is d_ff wide); 2 d for a learned gain; the FFN's hidden tensors (gated 4 d_ff,
    relu^2 3, plain 2) of the scheme's own FFN where it has one (QK-norm followed by
    nanochat's q, k gain saves nothing more); the attention's softmax
    (heads x seq, torch's reference path), twice with a soft-cap; and one d of margin."""
    from ..model.draws import ffn_of

    scheme = init.definition
    # a (1 + w) gain (Gemma) is applied outside LayerNorm's kernel, which then saves its output
    per_norm = 2 if cfg.norm == "rmsnorm" or scheme.norm_offset else 1
    norms = cfg.placement.block_norms
    # (nanochat scales q and k after its QK-norm: attention saves the scaled ones, the norms
    # nothing more)
    qk = (scheme.qk_norm if cfg.qk_norm is None else cfg.qk_norm) and scheme.qk_gain is None
    kind, d_ff = ffn_of(cfg, scheme)
    hidden = {"swiglu": 4, "geglu": 4, "relu2": 3}.get(kind, 2) * d_ff
    width = 6 + per_norm * (norms + 2 * bool(qk) + bool(scheme.subln)) + 2 * bool(scheme.branch_learned) + 1
    subln_ffn = per_norm * d_ff if scheme.subln else 0
    softmax = cfg.n_heads * seq_len * (2 if scheme.attn_softcap is not None else 1)
    return width * cfg.d_model + hidden + subln_ffn + softmax + 32


def gradient_pass_bounds(
    cfg: ModelConfig, init: InitConfig, batch: int, seq_len: int, dtype: torch.dtype
) -> tuple[int, int]:
    """Bounds on :func:`gradient_pass_bytes` from shapes alone: below, the weights, their
    gradients, the retained stream gradients and the head (no activations); above, the
    same with :func:`_per_token_upper` elements per token and block for the activations.
    (Gaussian branches are counted as the model's, as :func:`block_bytes` does: more.)"""
    if cfg.branch == "gaussian":
        cfg = dataclasses.replace(cfg, branch="model")
    with torch.device("meta"):
        block = Block(cfg, 0, seed=init.seed, dtype=dtype, init=init)
    weights = sum(p.numel() * p.element_size() for p in block.parameters())
    itemsize = torch.empty((), dtype=dtype).element_size()
    L, tokens = cfg.n_layers, batch * seq_len
    retained, head = _retained_and_head(cfg, tokens, dtype)
    low = 2 * L * weights + retained + head
    saved = tokens * _per_token_upper(cfg, init, seq_len) * max(itemsize, 4)
    high = L * weights + max(L * saved, L * weights + retained) + head
    return low, high


def _retained_and_head(cfg: ModelConfig, tokens: int, dtype: torch.dtype) -> tuple[int, int]:
    itemsize = torch.empty((), dtype=dtype).element_size()
    stats = 8 if dtype == torch.float64 else 4
    L = cfg.n_layers
    # a norm after each sum (post-norm): the tap keeps the sum and the normalised stream
    retained = (2 * L + 1) * (2 if cfg.placement.resets else 1) * tokens * cfg.d_model * itemsize
    head = 3 * tokens * cfg.vocab_size * stats + 2 * cfg.vocab_size * cfg.d_model * itemsize
    return retained, head


def backward_bound(
    configs: list[tuple[ModelConfig, InitConfig]], batch: int, seq_len: int, dtype: torch.dtype
) -> int:
    """The streaming decision's figure: the largest upper bound (:func:`gradient_pass_bounds`)
    over the configurations a run builds. Never below what a built backward holds, and at
    most a quarter above; from shapes alone, so deciding costs nothing."""
    return max(gradient_pass_bounds(c, i, batch, seq_len, dtype)[1] for c, i in configs)


# --- the memory a run may still take, and the streaming decision ---


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (no limit) and junk: None


#: Where the process's cgroups are listed and where the cgroup file systems are mounted.
PROC_CGROUP, CGROUP_MOUNT = "/proc/self/cgroup", "/sys/fs/cgroup"


def _cgroup_headroom() -> int | None:
    """Bytes this process's memory cgroup may still grow (limit - usage), or None
    when no limit applies. cgroup v2 (memory.max) and v1 (memory.limit_in_bytes); the
    process's own cgroup folder first, then the mount's root (what a container sees)."""
    try:
        with open(PROC_CGROUP) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":
            mount, limit_file, usage_file = CGROUP_MOUNT, "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            mount = f"{CGROUP_MOUNT}/memory"
            limit_file, usage_file = "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        for base in (mount + rel.rstrip("/"), mount):
            limit = _read_int(f"{base}/{limit_file}")
            if limit is not None and limit < 2**60:  # v1 says "no limit" with a huge number
                return max(limit - (_read_int(f"{base}/{usage_file}") or 0), 0)
    return None


def _address_space_headroom() -> int | None:
    """Bytes of address space left under RLIMIT_AS (``ulimit -v``), or None."""
    try:
        import resource
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    used = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    used = int(line.split()[1]) * 1024
    except OSError:
        pass
    return max(soft - used, 0)


def host_memory() -> int:
    """Available host memory (MemAvailable), at most what this process's cgroup
    memory limit and its address-space limit (RLIMIT_AS) still allow."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    if avail is None:
        avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    limits = [x for x in (_cgroup_headroom(), _address_space_headroom()) if x is not None]
    return min([avail, *limits])


def available_memory(device: torch.device) -> int:
    """Free bytes on the device (CUDA) or available host memory (CPU; see
    :func:`host_memory`)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return host_memory()


def block_param_count(cfg: ModelConfig) -> int:
    """Exact parameters in one block (built on the meta device: no memory)."""
    with torch.device("meta"):
        return sum(p.numel() for p in Block(cfg, 0).parameters())


def should_stream(
    cfg: ModelConfig, dtype: torch.dtype, device: torch.device, requested: bool | None,
    need: int | None = None,
) -> bool:  # fmt: skip
    """Stream when asked to, or when what the fully built pass holds would take more
    than half the free memory: ``need`` bytes, by default the blocks' weights (all a
    forward without gradients holds; a backward holds far more, see
    :func:`gradient_pass_bytes`).

    A forward without gradients (``need`` None) off CUDA always streams: each block is
    built once either way, so streaming costs nothing there (it was 15% faster at L = 40,
    reusing one block's memory) and the memory stays flat in depth. On CUDA the built
    model saves the side stream's synchronisation."""
    if requested is not None:
        return requested
    if need is None and device.type != "cuda":
        return True
    if need is None:
        need = cfg.n_layers * block_param_count(cfg) * torch.empty((), dtype=dtype).element_size()
    return need > 0.5 * available_memory(device)


# --- the pre-check of the forward and gradient commands ---

#: More memory than any one machine a run's point goes to has (1 PiB): what a sweep's
#: plan, made where its points may not run, refuses before a block is built on the meta
#: device (whose storage sizes overflow at d 1e9).
ANY_MACHINE = 2**50
#: The shape each size is compared with to say which option drives an excess (the
#: defaults of ModelConfig and RunConfig).
_DEFAULTS = {"n_layers": 12, "d_model": 256, "vocab_size": 1024, "batch": 8, "seq_len": 128}


def least_bytes(
    cfg: ModelConfig, init: InitConfig, batch: int, seq_len: int, dtype: torch.dtype, backward: bool,
) -> dict[tuple[str, ...], int]:  # fmt: skip
    """Bytes any run of ``cfg`` on ``batch`` x ``seq_len`` tokens holds at once, however it
    runs (streamed or built), as terms keyed by the sizes that multiply into them; from
    the closed-form parameter count (nothing is built, not even on the meta device, whose
    storage sizes overflow at d 1e9). A forward holds the embedding, positions, final
    norm and head, at least one block's weights (all ``L`` when ``cfg`` is built:
    ``stream`` False), the token ids and, per token, the larger of two stream tensors (a
    block's input and output) and the stream with two of the FFN's hidden tensors (its
    activation's input and output exist at once, in every FFN kind; 12 GB of a
    ``--batch 1000000 --seq-len 8`` forward at d 32 were those). A backward (layer-wise,
    its smallest form: tinit.experiments.measure.backward) adds the gradients of those
    weights, the stream at every layer boundary and the logits.
    A lower bound: what is refused on it cannot run."""
    from ..model.draws import ffn_of
    from ..model.params import count_params

    item = torch.empty((), dtype=dtype).element_size()
    stats = 8 if dtype == torch.float64 else 4
    n = count_params(cfg, init.definition)
    # (a Gaussian branch runs no FFN)
    hidden = 2 * ffn_of(cfg, init.definition)[1] if cfg.branch != "gaussian" else 0
    block = n.attention + n.ffn + n.norms
    outer = n.embedding + n.positions + n.final_norm + n.head
    tokens = batch * seq_len
    terms = {
        ("vocab_size", "d_model"): outer * item * (2 if backward else 1),
        ("d_model",): block * item * (2 if backward else 1),
        ("batch", "seq_len"): tokens * 8,
        ("batch", "seq_len", "d_model"): tokens * max(2 * cfg.d_model, cfg.d_model + hidden) * item,
    }
    if backward:
        terms[("n_layers", "batch", "seq_len", "d_model")] = (cfg.n_layers + 1) * tokens * cfg.d_model * item
        terms[("batch", "seq_len", "vocab_size")] = tokens * cfg.vocab_size * stats
    return terms


def check_fits(
    terms: dict[tuple[str, ...], int], sizes: dict[str, float], what: str, device: torch.device | None, *,
    here: bool = True, field: str | None = None, blame: dict[str, str] | None = None,
    scale: dict[str, float] | None = None, purpose: str = "", hint: str = "",
) -> None:  # fmt: skip
    """The one memory pre-check of every command that builds or reads a model (variance,
    grad-norms, depth-sweep, check and the sweeps' points through :func:`check_memory`;
    train, lr-sweep and claims, coord-check, attention-scale; ``audit --hf``, ``--module``
    and ``--checkpoint``): before anything is allocated, the bytes ``terms`` (keyed by
    the names of the sizes that multiply into each) must fit in the device's free memory
    (:func:`available_memory`; ``here`` False: in :data:`ANY_MACHINE`, a sweep's plan
    whose points may run elsewhere). Else a ConfigError naming ``field`` when given, else
    the size that drives the excess: of the largest term, the size furthest beyond its
    ``scale`` (default the shape of :data:`_DEFAULTS`: L 12, d 256, V 1024, 8 x 128
    tokens; 1 for a size not listed), as ``blame`` names it (default: the size's own
    name, a config field). The one line: ``{what} at least N GiB of memory{purpose}, more
    than the M GiB free{hint}`` (``what`` ends in its verb: "a run ... needs")."""
    need = sum(terms.values())
    free = (available_memory(device) if device is not None else host_memory()) if here else ANY_MACHINE
    if need <= free:
        return
    if field is None:
        ratios = {**_DEFAULTS, **(scale or {})}
        top = max(terms, key=terms.__getitem__)
        size = max(top, key=lambda k: sizes[k] / ratios.get(k, 1))
        field = (blame or {}).get(size, size)
    where = f"more than the {free / 2**30:.3g} GiB free" if here else "more than any machine holds (1 PiB)"
    raise ConfigError(field, f"{what} at least {need / 2**30:.3g} GiB of memory{purpose}, {where}{hint}")


def check_memory(
    model: ModelConfig, init: InitConfig, run: RunConfig, configs: Iterable[tuple[str, str]],
    backward: bool = False, n_layers: int | None = None, here: bool = True,
) -> None:  # fmt: skip
    """Before anything is allocated (a block built on the meta device included: its
    storage sizes overflow at d 1e9): the least any (scheme, norm position) of
    ``configs`` holds at ``n_layers`` (default the model's) on ``run``'s batch
    (:func:`least_bytes`; with ``run.stream`` False every block's weights, built) fits
    in the device's free memory (:func:`check_fits`, whose ConfigError names the size
    that drives the excess). ``here`` False (a sweep's plan, whose points may run on
    other machines): against :data:`ANY_MACHINE` instead of this machine's free memory."""
    from .configs import configure
    from .device import resolve_device, resolve_dtype

    device, dtype = resolve_device(run.device), resolve_dtype(run.dtype)
    batch, seq_len, stream = run.batch, run.seq_len, run.stream
    if n_layers is not None:
        model = dataclasses.replace(model, n_layers=n_layers)
    for scheme, position in configs:
        cfg, ini = configure(model, init, run, scheme, position)
        terms = least_bytes(cfg, ini, batch, seq_len, dtype, backward)
        if stream is False:
            terms[("n_layers", "d_model")] = terms.pop(("d_model",)) * cfg.n_layers
        sizes = {"n_layers": cfg.n_layers, "d_model": cfg.d_model, "vocab_size": cfg.vocab_size,
                 "batch": batch, "seq_len": seq_len}  # fmt: skip
        what = "weights and activations" if not backward else "weights, gradients and activations"
        check_fits(terms, sizes, f"a run at L={cfg.n_layers}, d={cfg.d_model}, V={cfg.vocab_size}, {batch} x "
                   f"{seq_len} tokens needs", device, here=here, purpose=f" for its {what}")  # fmt: skip
