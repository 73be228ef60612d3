"""``tinit audit --checkpoint PATH``: trained weights read block by block (issue 32).

Called by :func:`tinit.cli.audit.audit` when ``--checkpoint`` is given: PATH is a
``tinit train`` run folder saved with ``--save-steps`` (every checkpoint, over steps),
a Hugging Face model folder (config.json and model.safetensors or a sharded index), or a
single ``.safetensors`` file with ``--hf CONFIG``. Writes variance.csv and summary.csv
(with run and step), drift.csv, checkpoints.csv, three figures and config.json.
"""

from __future__ import annotations

import typer
from rich.text import Text

from ..model.config import ConfigError
from .clickcompat import given
from .configs import Options, configs_or_exit

#: Options of ``tinit audit`` that belong to the fresh-model audit only.
FRESH_ONLY = ("set_", "module", "sites", "reinit", "vocab", "grads", "z_max", "rtol", "sigma")


def audit_checkpoint(ctx: typer.Context, opts: Options, checkpoint: str, hf: str | None, data: str | None,
                     expect: str) -> None:  # fmt: skip
    from ..experiments.audit.sources import find_checkpoints
    from ..experiments.audit.trained import random_tokens, run_checkpoint_audit
    from ..experiments.device import resolve_device, resolve_dtype
    from ..model.config import RunConfig
    from ..results.plot_checkpoint import checkpoint_table, plot_drift, plot_spectral, plot_stream_over_steps
    from .runner import Outputs, execute

    def prepare():
        for name in FRESH_ONLY:
            if name in opts.values and given(ctx, name):
                flag = "--" + name.rstrip("_").replace("_", "-").replace("reinit", "init")
                raise ConfigError(flag, "measures a freshly built model; it does not apply with --checkpoint")
        found = find_checkpoints(checkpoint, hf)
        device, dtype = resolve_device(opts.device), resolve_dtype(opts.dtype)
        expectation = None
        if given(ctx, "expect") and expect != "declared":
            if all(c.kind == "tinit" for c in found.checkpoints):
                raise ConfigError("--expect", "a tinit checkpoint is held against its own scheme (its JSON)")
            from ..experiments.audit.audit import Expectation

            expectation = Expectation(expect, 0.02, 0.02, f"--expect {expect}")
        return found, device, dtype, expectation

    found, device, dtype, expectation = configs_or_exit(prepare)
    tokens = random_tokens if data is None else _data_tokens(data, opts.seed)
    run = RunConfig(batch=opts.batch, seq_len=opts.seq_len)
    title = f"{checkpoint}: {len(found.checkpoints)} checkpoint(s), batch {opts.batch} x seq {opts.seq_len}"
    title += f", {data} tokens" if data else ", random tokens"

    def experiment(progress, on_partial=None):
        return run_checkpoint_audit(found, run, device, dtype, tokens, None if data else opts.seed,
                                    expectation, progress, on_partial,
                                    {"checkpoint": str(checkpoint), "data": data})  # fmt: skip

    execute(
        "audit",
        opts,
        experiment,
        Outputs(
            figures=lambda r: {
                "stream_over_steps": plot_stream_over_steps(r["variance"], title),
                "drift": plot_drift(r["drift"], title),
                "spectral_norm": plot_spectral(r["drift"], title),
            },
            tables=lambda r: (
                [checkpoint_table(r["checkpoints"], f"Checkpoints of {checkpoint}")]
                + [Text(f"Skipped (weights without their JSON): {s}") for s in found.skipped]
            ),
        ),
    )


def _data_tokens(source: str, seed: int):
    """``--data``: the first held-out batch of ``tinit train``'s loader (stdlib bytes, a
    text file, a nanoGPT .bin), its vocabulary within the model's."""
    from ..experiments.training.data import load_data

    cache: dict = {}

    def tokens(vocab: int, seq_len: int, batch: int, _seed: int, device):
        key = (vocab, seq_len, batch)
        if key not in cache:
            data = load_data(source, vocab=vocab, seq_len=seq_len, batch=batch, seed=seed, eval_batches=1)
            if data.vocab > vocab:
                raise ConfigError(
                    "--data", f"{source} needs a vocabulary of {data.vocab}, the model has {vocab}"
                )
            cache[key] = data.eval_batches()[0][:, :seq_len]
        return cache[key].to(device)

    return tokens
