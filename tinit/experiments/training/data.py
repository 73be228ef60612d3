"""Training data with no download: a synthetic language whose entropy rate is known
exactly, the Python standard library's sources as bytes, or a user's file.

Every source gives seeded training batches and a fixed held-out evaluation set of
``(batch, seq_len + 1)`` token windows (inputs are ``[:, :-1]``, targets ``[:, 1:]``).

The synthetic language is a first-order Markov chain over the vocabulary in which
each token has ``k`` successors with Dirichlet(alpha) probabilities. Its entropy
rate is H = sum_i pi_i H(P_i), pi the stationary distribution (Cover & Thomas,
*Elements of Information Theory*, Theorem 4.2.4). A window starts from pi, so every
next-token prediction in it has expected loss exactly H under the true chain: H is
the floor of every loss curve.
"""

from __future__ import annotations

import hashlib
import math
import sysconfig
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...model.config import ConfigError
from ...userfile import UserFileError, regular_file

#: Fraction of a token file (or corpus) held out at its end for evaluation.
EVAL_FRACTION = 0.1
#: Largest vocabulary whose stationary distribution is solved densely (32 MiB of float64).
DENSE_MAX = 2048
#: Default cap on the standard-library corpus read (bytes): enough for any CPU run.
STDLIB_CAP = 8 * 2**20


def _seeded(seed: int, purpose: str) -> np.random.Generator:
    digest = hashlib.blake2b(f"tinit/data/{seed}/{purpose}".encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


@dataclass(frozen=True)
class MarkovChain:
    """A sparse random Markov chain: ``succ[i]`` are the k successors of token i and
    ``prob[i]`` their probabilities. Successor (i + 1) mod V is always among them, so
    the chain is irreducible (the cycle 0 -> 1 -> ... -> V-1 -> 0 visits every token)
    and its stationary distribution is unique."""

    succ: np.ndarray  # (V, k) int64, distinct per row
    prob: np.ndarray  # (V, k) float64, rows sum to 1

    @classmethod
    def random(cls, vocab: int, k: int, seed: int, alpha: float = 0.5) -> MarkovChain:
        if vocab < 2:
            raise ConfigError("vocab_size", f"the Markov language needs a vocabulary of >= 2, got {vocab}")
        if not 1 <= k <= vocab:
            raise ConfigError("markov_k", f"must be between 1 and the vocabulary size {vocab}, got {k}")
        rng = _seeded(seed, "markov")
        succ = np.empty((vocab, k), dtype=np.int64)
        for i in range(vocab):
            nxt = (i + 1) % vocab
            others = rng.choice(vocab - 1, size=k - 1, replace=False)
            others = others + (others >= nxt)  # skip nxt: successors stay distinct
            succ[i] = np.concatenate([[nxt], others])
        prob = rng.dirichlet(np.full(k, alpha), size=vocab)
        prob = np.maximum(prob, 1e-300)  # alpha < 1 can underflow a draw to 0: keep log finite
        prob /= prob.sum(axis=1, keepdims=True)
        return cls(succ, prob)

    @property
    def vocab(self) -> int:
        return self.succ.shape[0]

    def dense(self) -> np.ndarray:
        """The V x V transition matrix P (float64)."""
        P = np.zeros((self.vocab, self.vocab))
        np.put_along_axis(P, self.succ, self.prob, axis=1)
        return P

    def stationary(self) -> np.ndarray:
        """pi with pi P = pi, sum pi = 1, in float64 (read-only; solved once per chain:
        every batch starts from it). Up to ``DENSE_MAX`` tokens the linear
        system is solved exactly (one balance equation replaced by the normalisation);
        above, the dense V x V matrix would not fit, and the lazy chain (I + P) / 2 (same pi,
        aperiodic) is iterated on the sparse successor lists until pi moves less than 1e-14."""
        return self._pi

    @cached_property
    def _pi(self) -> np.ndarray:
        pi = self._solve_stationary()
        pi.flags.writeable = False
        return pi

    @cached_property
    def _cum(self) -> np.ndarray:
        """Each row's cumulative successor probabilities, the last exactly 1."""
        cum = np.cumsum(self.prob, axis=1)
        cum[:, -1] = 1.0
        cum.flags.writeable = False
        return cum

    def _solve_stationary(self) -> np.ndarray:
        V = self.vocab
        if V <= DENSE_MAX:
            A = self.dense().T - np.eye(V)
            A[-1] = 1.0
            b = np.zeros(V)
            b[-1] = 1.0
            pi = np.clip(np.linalg.solve(A, b), 0.0, None)
            return pi / pi.sum()
        pi = np.full(V, 1.0 / V)
        flat = self.succ.ravel()
        for _ in range(100_000):
            step = np.bincount(flat, weights=(pi[:, None] * self.prob).ravel(), minlength=V)
            new = 0.5 * (pi + step)
            new /= new.sum()
            done = np.abs(new - pi).sum() < 1e-14
            pi = new
            if done:
                break
        return pi

    def entropy_rate(self) -> float:
        """H = -sum_i pi_i sum_j P_ij ln P_ij, in nats per token."""
        row_entropy = -(self.prob * np.log(self.prob)).sum(axis=1)
        return float(self.stationary() @ row_entropy)

    def sample(self, n: int, length: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` independent windows of ``length`` tokens, each starting from pi."""
        cum = self._cum
        out = np.empty((n, length), dtype=np.int64)
        out[:, 0] = rng.choice(self.vocab, size=n, p=self.stationary())
        u = rng.random((n, length - 1))
        for t in range(1, length):
            prev = out[:, t - 1]
            j = (u[:, t - 1, None] > cum[prev]).sum(axis=1)
            out[:, t] = self.succ[prev, np.minimum(j, self.succ.shape[1] - 1)]
        return out


def stdlib_corpus(cap: int = STDLIB_CAP, root: Path | None = None) -> tuple[np.ndarray, dict[str, Any]]:
    """The standard library's ``.py`` files (site-packages excluded) in sorted path
    order, concatenated as bytes up to ``cap``; the array and what it is (root, files,
    bytes, sha256) for config.json."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.is_file())
    chunks, size, used = [], 0, 0
    for p in files:
        if size >= cap:
            break
        data = p.read_bytes()[: cap - size]
        chunks.append(data)
        size += len(data)
        used += 1
    blob = b"".join(chunks)
    if not blob:
        raise ConfigError("data", f"no .py files found under {root}")
    info = {
        "source": "stdlib",
        "root": str(root),
        "files": used,
        "files_available": len(files),
        "bytes": len(blob),
        "cap_bytes": cap,
        "sha256": hashlib.sha256(blob).hexdigest(),
    }
    return np.frombuffer(blob, dtype=np.uint8), info


def file_tokens(path: Path) -> tuple[np.ndarray, dict[str, Any]]:
    """A user's file, memory-mapped: ``.npy`` (integer tokens), ``.bin`` (raw uint16
    tokens, as nanoGPT's prepare.py writes them) or anything else as bytes (vocab 256)."""
    path = Path(path)
    try:  # a regular file (not a FIFO, a device, a directory or a symlink loop): tinit.userfile
        regular_file(path)
    except UserFileError as exc:
        raise ConfigError("data", f"{exc} (give markov, stdlib or a path)") from None
    if path.stat().st_size == 0:
        raise ConfigError("data", f"{path} is empty")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        try:  # never unpickles (allow_pickle is False): a file with objects is refused here
            tokens = np.load(path, mmap_mode="r")
        except (ValueError, OSError, EOFError) as exc:
            why = " ".join(str(exc).split())[:160]
            raise ConfigError("data", f"{path}: not a .npy array of integer tokens ({why})") from None
        if not isinstance(tokens, np.ndarray) or tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise ConfigError("data", f"{path}: a .npy token file must be a 1-D integer array")
        if tokens.size and int(tokens.min()) < 0:
            raise ConfigError("data", f"{path}: token ids must be >= 0, it holds {int(tokens.min())}")
        kind = "npy"
    elif suffix == ".bin":
        if path.stat().st_size % 2:
            raise ConfigError("data", f"{path}: a .bin token file holds uint16, its size must be even")
        tokens, kind = np.memmap(path, dtype=np.uint16, mode="r"), "uint16 bin"
    else:
        tokens, kind = np.memmap(path, dtype=np.uint8, mode="r"), "bytes"
    if tokens.size < 2:
        raise ConfigError("data", f"{path} holds fewer than 2 tokens")
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(2**20), b""):
            h.update(chunk)
    digest = h.hexdigest()
    info = {
        "source": "file",
        "path": str(path.resolve()),
        "format": kind,
        "tokens": int(tokens.size),
        "bytes": path.stat().st_size,
        "sha256": digest,
    }
    return tokens, info


@dataclass
class TrainData:
    """Seeded training windows and a fixed held-out evaluation set.

    ``vocab``: the vocabulary the model needs; ``floor``: the exact entropy rate
    (Markov language) or None; ``info``: what the data is, for config.json.
    """

    vocab: int
    seq_len: int
    batch: int
    seed: int
    floor: float | None
    info: dict[str, Any]
    eval_windows: torch.Tensor  # (n_eval * batch, seq_len + 1) int64
    chain: MarkovChain | None = None
    train_tokens: np.ndarray | None = None
    _rng: np.random.Generator | None = field(default=None, repr=False)

    def reset(self, stream: int = 0) -> None:
        """Restart training stream number ``stream`` from its beginning: the same
        (data seed, stream) gives the same batches. A run uses its init seed."""
        self._rng = _seeded(self.seed, f"train/{stream}")

    def next_batch(self) -> torch.Tensor:
        """The next training batch, (batch, seq_len + 1) int64 on the CPU."""
        if self._rng is None:
            self.reset()
        if self.chain is not None:
            return torch.from_numpy(self.chain.sample(self.batch, self.seq_len + 1, self._rng))
        return torch.from_numpy(_windows(self.train_tokens, self.seq_len + 1, self.batch, self._rng))

    def eval_batches(self) -> list[torch.Tensor]:
        return list(self.eval_windows.split(self.batch))


def _windows(tokens: np.ndarray, length: int, n: int, rng: np.random.Generator) -> np.ndarray:
    starts = rng.integers(0, tokens.size - length + 1, size=n)
    return np.stack([np.asarray(tokens[s : s + length], dtype=np.int64) for s in starts])


def held_out(tokens: np.ndarray) -> np.ndarray:
    """The held-out part of a token (or byte) sequence: its last ``EVAL_FRACTION``."""
    return tokens[tokens.size - int(tokens.size * EVAL_FRACTION) :]


def eval_windows(held: np.ndarray, seq_len: int, n: int, seed: int) -> np.ndarray:
    """The ``n`` held-out windows of ``seq_len + 1`` tokens that the seed draws from ``held``."""
    return _windows(held, seq_len + 1, n, _seeded(seed, "eval"))


def text_source(source: str, stdlib_cap: int = STDLIB_CAP) -> tuple[np.ndarray, dict[str, Any]] | None:
    """The bytes of a text source (``stdlib``, or a file read as bytes) and what it is;
    None for a token file (``.npy``, ``.bin``: ids already) or the Markov language."""
    if source == "markov":
        return None
    if source == "stdlib":
        return stdlib_corpus(stdlib_cap)
    tokens, info = file_tokens(Path(source))
    return (tokens, info) if info["format"] == "bytes" else None


def _check_fits(source: str, vocab: int, k: int, seq_len: int, batch: int, eval_batches: int) -> None:
    """Refuse, before any array is allocated, data that cannot fit in the host's free
    memory: the Markov chain's tables (V x k successors, probabilities and their sums)
    and the held-out windows (and, for the chain, the uniforms that draw them)."""
    from ..memory import check_fits

    if source == "markov":
        check_fits({("vocab_size",): vocab * k * 24}, {},
                   f"{vocab} tokens x {k} successors: the Markov chain's tables need", None,
                   field="vocab_size")  # fmt: skip
    windows = eval_batches * batch * (seq_len + 1) * (16 if source == "markov" else 8)
    field = "seq_len" if seq_len + 1 > eval_batches * batch else "batch"
    check_fits({("windows",): windows}, {},
               f"{eval_batches} held-out batches of {batch} x {seq_len + 1} tokens need", None, field=field,
               hint=" (--eval-batches, --batch, --seq-len)")  # fmt: skip


def load_data(
    source: str,
    *,
    vocab: int,
    seq_len: int,
    batch: int,
    seed: int,
    eval_batches: int = 4,
    markov_k: int = 4,
    markov_alpha: float = 0.5,
    stdlib_cap: int = STDLIB_CAP,
) -> TrainData:
    """``source``: ``"markov"`` (synthetic, vocabulary ``vocab``), ``"stdlib"`` (bytes,
    vocab 256) or a path. The Markov language depends on ``seed``; token files are
    split into their first 90 % (training) and last 10 % (held out). The eval set is
    ``eval_batches`` batches, fixed by the seed."""
    if eval_batches < 1:
        raise ConfigError("eval_batches", f"must be >= 1, got {eval_batches}")
    n_eval = eval_batches * batch
    _check_fits(source, vocab, markov_k, seq_len, batch, eval_batches)
    if source == "markov":
        chain = MarkovChain.random(vocab, markov_k, seed, markov_alpha)
        floor = chain.entropy_rate()
        evals = chain.sample(n_eval, seq_len + 1, _seeded(seed, "eval"))
        info = {
            "source": "markov",
            "vocab": vocab,
            "k": markov_k,
            "alpha": markov_alpha,
            "entropy_rate_nats": floor,
            "uniform_entropy_nats": math.log(vocab),
            "note": "first-order Markov chain; windows start from the stationary distribution",
        }
        return TrainData(vocab, seq_len, batch, seed, floor, info, torch.from_numpy(evals), chain=chain)
    if source == "stdlib":
        tokens, info = stdlib_corpus(stdlib_cap)
        vocab_needed = 256
    else:
        tokens, info = file_tokens(Path(source))
        vocab_needed = 256 if info["format"] == "bytes" else int(tokens.max()) + 1
    n_eval_tokens = int(tokens.size * EVAL_FRACTION)
    if n_eval_tokens < seq_len + 1 or tokens.size - n_eval_tokens < seq_len + 1:
        raise ConfigError(
            "data", f"{info.get('path', source)}: {tokens.size} tokens are too few for --seq-len {seq_len}"
        )
    train, held = tokens[: tokens.size - n_eval_tokens], held_out(tokens)
    evals = eval_windows(held, seq_len, n_eval, seed)
    info.update(
        vocab=vocab_needed,
        train_tokens=int(train.size),
        eval_tokens=int(held.size),
        split="last 10% held out for evaluation",
    )
    return TrainData(
        vocab_needed, seq_len, batch, seed, None, info, torch.from_numpy(evals), train_tokens=train
    )
