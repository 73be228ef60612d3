"""The tokens ``tinit audit --checkpoint ... --data SOURCE`` measures a checkpoint on.

``--data`` names a source as ``tinit train`` reads it (``stdlib``, a text file, a
nanoGPT ``.bin`` or a ``.npy`` of token ids), and the audit takes its first held-out
batch: ``batch`` windows of ``seq_len`` tokens drawn by the seed from the source's last
10 % (:func:`tinit.experiments.training.data.eval_windows`).

- By default the text is its bytes (ids 0..255), as ``tinit train`` trains on it.
- With a Hugging Face folder that holds a tokenizer (:data:`TOKENIZER_FILES`), a text
  source is tokenized with it instead: the held-out text (the source's last 10 % of
  bytes), decoded as UTF-8 (an undecodable byte becomes U+FFFD), tokenized without
  special tokens (``AutoTokenizer.from_pretrained(folder, local_files_only=True)``:
  nothing is downloaded), and the windows drawn from its ids as above.
- A token file (``.bin``, ``.npy``) holds ids already: no tokenizer applies.

Every id must be below the model's vocabulary, else a ConfigError naming ``--data``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from ...model.config import ConfigError

#: A folder holding any of these has a tokenizer (vocab.json with merges.txt: a GPT-2 BPE).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def has_tokenizer(folder: Path | str) -> bool:
    """Whether ``folder`` holds a tokenizer's files."""
    folder = Path(folder)
    named = any((folder / n).is_file() for n in TOKENIZER_FILES)
    return named or ((folder / "vocab.json").is_file() and (folder / "merges.txt").is_file())


def load_tokenizer(folder: Path | str):
    """The folder's own tokenizer, read offline (``local_files_only``; no remote code);
    a ConfigError naming ``--data`` when transformers cannot read it."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ConfigError("--data", "tokenizing with the folder's tokenizer needs transformers "
                          "(pip install 'tinit[hf]')") from None  # fmt: skip
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # (transformers raises many kinds: the folder's files are the input)
        why = " ".join(str(exc).split())[:200]
        raise ConfigError("--data", f"{folder}: its tokenizer cannot be read offline: "
                          f"{type(exc).__name__}: {why}") from None  # fmt: skip


def describe_tokenizer(tokenizer, folder: Path | str) -> dict:
    """What config.json records of the tokenizer used."""
    return {"kind": "hf", "folder": str(folder), "class": type(tokenizer).__name__, "size": len(tokenizer)}


class DataTokens:
    """A token source for :func:`tinit.experiments.audit.trained.run_checkpoint_audit`:
    ``(vocab, seq_len, batch, seed, device) -> (batch, seq_len)`` ids of ``source``'s first
    held-out batch, drawn from ``seed`` (the audit's ``--seed``, fixed here). ``tokenizer``:
    an HF tokenizer for a text source (None: bytes). :attr:`info` says what was used."""

    def __init__(self, source: str, seed: int, tokenizer=None, folder: Path | str | None = None):
        from ..training.data import text_source

        self.source, self.seed = source, seed
        self.tokenizer = None
        self._cache: dict = {}
        self._text = None
        if tokenizer is not None:
            self._text = text_source(source)  # None for a token file: no tokenizer applies
            if self._text is not None:
                self.tokenizer = tokenizer
        if self.tokenizer is not None:
            self.info = {
                "source": source,
                "tokens": "tokenizer",
                "tokenizer": describe_tokenizer(tokenizer, folder),
            }
        else:
            kind = "bytes" if source == "stdlib" or self._is_bytes() else "token ids"
            self.info = {"source": source, "tokens": kind, "tokenizer": None}
            if tokenizer is not None:
                self.info["note"] = "a token file holds ids already: the folder's tokenizer does not apply"

    def _is_bytes(self) -> bool:
        suffix = Path(self.source).suffix.lower()
        return self.source != "markov" and suffix not in (".bin", ".npy")

    def line(self) -> str:
        """The terminal's line on the tokens."""
        tok = self.info.get("tokenizer")
        if tok:
            name = f"{tok['class']}, {tok['size']:,} ids"
            return f"Tokens: --data {self.source} tokenized by {tok['folder']}'s tokenizer ({name})"
        return f"Tokens: --data {self.source} as {self.info['tokens']}" + (
            f" ({self.info['note']})" if "note" in self.info else ""
        )

    def held_ids(self) -> np.ndarray:
        """The tokenizer's ids of the held-out text (int64)."""
        from ..training.data import held_out

        if "held" not in self._cache:
            data, _ = self._text
            text = np.asarray(held_out(data), dtype=np.uint8).tobytes().decode("utf-8", errors="replace")
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            self._cache["held"] = np.asarray(ids, dtype=np.int64)
        return self._cache["held"]

    def __call__(self, vocab: int, seq_len: int, batch: int, _seed: int, device) -> torch.Tensor:
        key = (vocab, seq_len, batch)
        if key not in self._cache:
            self._cache[key] = (
                self._tokenized(vocab, seq_len, batch)
                if self.tokenizer
                else self._loaded(vocab, seq_len, batch)
            )
        return self._cache[key].to(device)

    def _loaded(self, vocab: int, seq_len: int, batch: int) -> torch.Tensor:
        from ..training.data import load_data

        data = load_data(
            self.source, vocab=vocab, seq_len=seq_len, batch=batch, seed=self.seed, eval_batches=1
        )
        if data.vocab > vocab:
            raise ConfigError(
                "--data", f"{self.source} needs a vocabulary of {data.vocab}, the model has {vocab}"
            )
        return data.eval_batches()[0][:, :seq_len]

    def _tokenized(self, vocab: int, seq_len: int, batch: int) -> torch.Tensor:
        from ..training.data import eval_windows

        ids = self.held_ids()
        if ids.size < seq_len + 1:
            raise ConfigError("--data", f"{self.source}: its held-out text is {ids.size} tokens, too few for "
                              f"--seq-len {seq_len}")  # fmt: skip
        top = int(ids.max())
        if top >= vocab:
            raise ConfigError("--data", f"{self.source} tokenized by the folder's tokenizer has id {top}, "
                              f"not below the model's vocabulary of {vocab}")  # fmt: skip
        return torch.from_numpy(eval_windows(ids, seq_len, batch, self.seed))[:, :seq_len]
