"""``tinit audit --checkpoint PATH``: trained weights read block by block (issue 32).

Called by :func:`tinit.cli.audit.audit` when ``--checkpoint`` is given: PATH is a
``tinit train`` run folder saved with ``--save-steps`` (every checkpoint, over steps),
a Hugging Face model folder (config.json and model.safetensors or a sharded index), or a
single ``.safetensors`` file with ``--hf CONFIG``. Writes variance.csv and summary.csv
(with run and step), drift.csv, checkpoints.csv, config.json and three figures (no
drift.png where no init is known, an HF model: the terminal says so).
"""

from __future__ import annotations

import typer
from rich.text import Text

from ..model.config import ConfigError
from .clickcompat import given
from .configs import Options, configs_or_exit

#: Options of ``tinit audit`` that belong to the fresh-model audit only (parameter: flag).
FRESH_ONLY = {"set_": "--set", "module": "--module", "sites": "--sites", "reinit": "--init",
              "vocab_size": "--vocab", "grads": "--grads", "z_max": "--z-max", "rtol": "--rtol",
              "sigma": "--sigma"}  # fmt: skip


def audit_checkpoint(ctx: typer.Context, opts: Options, checkpoint: str, hf: str | None, data: str | None,
                     expect: str) -> None:  # fmt: skip
    from ..experiments.audit.sources import find_checkpoints
    from ..experiments.audit.trained import random_tokens, run_checkpoint_audit
    from ..experiments.device import resolve_device, resolve_dtype
    from ..model.config import RunConfig
    from ..results.plot_checkpoint import (
        checkpoint_table,
        drift_runs,
        no_drift_line,
        plot_drift,
        plot_spectral,
        plot_stream_over_steps,
    )
    from .runner import Outputs, execute

    def prepare():
        for name, flag in FRESH_ONLY.items():
            if name in opts.values and given(ctx, name):
                raise ConfigError(flag, "measures a freshly built model; it does not apply with --checkpoint")
        from ..experiments.audit.spectral import METHODS

        if opts.spectral not in METHODS:
            raise ConfigError("--spectral", f"{opts.spectral!r} is not one of {', '.join(METHODS)}")
        expectation = _expectation(ctx, opts, expect)
        found = find_checkpoints(checkpoint, hf)
        device, dtype = resolve_device(opts.device), resolve_dtype(opts.dtype)
        if expectation is not None and all(c.kind == "tinit" for c in found.checkpoints):
            raise ConfigError("--expect", "a tinit checkpoint is held against its own scheme (its JSON)")
        seq_len = opts.seq_len
        if not given(ctx, "seq_len"):  # the default does not fit a model of fewer positions: its own length
            from ..experiments.audit.precheck import fewest_positions

            seq_len = min(seq_len, fewest_positions(found) or seq_len)
        return found, device, dtype, expectation, _tokens(found, data, opts.seed), seq_len

    found, device, dtype, expectation, source, seq_len = configs_or_exit(prepare)
    opts = opts.replace(seq_len=seq_len)
    tokens = random_tokens if source is None else source
    run = RunConfig(batch=opts.batch, seq_len=seq_len)
    title = f"{checkpoint}: {len(found.checkpoints)} checkpoint(s), batch {opts.batch} x seq {seq_len}"
    title += f", {data} tokens" if data else ", random tokens"
    title += f" of seed {opts.seed}"
    meta = {"checkpoint": str(checkpoint), "data": data, "tokens": source.info if source else "random"}

    def experiment(progress, on_partial=None):
        # every run measured on the tokens of --seed (--data: its held-out windows drawn by it), not
        # on each run's own training seed: one batch for every checkpoint (config.json: tokens_seed)
        return run_checkpoint_audit(found, run, device, dtype, tokens, opts.seed, expectation, progress,
                                    on_partial, meta, opts.spectral)  # fmt: skip

    execute(
        "audit",
        opts,
        experiment,
        Outputs(
            figures=lambda r: {
                "stream_over_steps": plot_stream_over_steps(r["variance"], title),
                # (no init known, an HF model: no drift to draw, said on the terminal)
                **({"drift": plot_drift(r["drift"], title)} if drift_runs(r["drift"]) else {}),
                # (--spectral off: no spectral norms, no figure of them)
                **({"spectral_norm": plot_spectral(r["drift"], title)} if opts.spectral != "off" else {}),
            },
            tables=lambda r: (
                [checkpoint_table(r["checkpoints"], f"Checkpoints of {checkpoint}")]
                + [Text(f"Skipped (weights without their JSON): {s}") for s in found.skipped]
                + [Text(line) for line in [no_drift_line(r["drift"])] if line]
                + [
                    Text(f"Expected stds (drift.csv's expected_std): {e}")
                    for e in [r.meta.get("expected")]
                    if e
                ]
                + [Text(_tokens_line(source, opts.seed, found))]
                + [Text(memory_line(r.meta))]
            ),
        ),
    )


def memory_line(meta: dict) -> str:
    """What streaming held and read: the measured peak beside the plan's parts."""
    mem, peak = meta.get("memory") or {}, meta.get("peak_rss_mib")
    secs = sum((meta.get("seconds") or {}).values())
    read = meta.get("bytes_read", 0) / 2**30
    parts = ", ".join(f"{label} {mem[k]:.2f} GiB" for k, label in (
        ("process_gib", "the process before"), ("arena_gib", "one block converted"),
        ("staging_gib", "the next block as stored"), ("twins_gib", "step-0 twins"),
        ("activations_gib", "activations")) if mem.get(k))  # fmt: skip
    peak_s = f"peak {peak / 1024:.2f} GiB resident" if peak else "peak not known here"
    if mem.get("predicted_gib"):
        parts += f"; planned {mem['predicted_gib']:.2f} GiB"
    # (a run stopped inside its first checkpoint has no plan and no measured span yet)
    measured = f", measured in {secs:.1f} s ({read / secs:.2f} GiB/s)" if secs > 0 else ""
    return f"Memory: {peak_s}{f' ({parts})' if parts else ''}; read {read:.2f} GiB{measured}"


def _expectation(ctx, opts: Options, expect: str):
    """``--expect SCHEME`` (a catalogue scheme, or the scheme of ``--init-file``), which an
    HF checkpoint's ``expected_std`` follows (at the config's ``initializer_range``); None
    for ``declared`` (the default: the config's ``initializer_range`` plus the family's
    own rule, as ``audit --hf`` declares it, resolved once the model's sites are found). An
    ``--init-file`` serves only this: given without ``--expect`` naming its scheme, it is
    refused (never silently ignored)."""
    from ..model.catalogue import known, names_and_aliases

    custom = opts.custom_schemes if "init_file" in opts.values else ()
    if custom and (not given(ctx, "expect") or expect not in [s.name for s in custom]):
        raise ConfigError("--init-file", f"with --checkpoint it only gives --expect its scheme: add --expect "
                          f"{custom[0].name} (an HF checkpoint's weights are held against it)")  # fmt: skip
    if expect == "declared":
        return None
    if not known(expect, custom):
        allowed = dict.fromkeys(("declared", *names_and_aliases(custom)))
        raise ConfigError("--expect", f"{expect!r} is not one of {', '.join(allowed)}")
    from ..experiments.audit.audit import Expectation

    scheme = next((s for s in custom if s.name == expect), expect)
    return Expectation(scheme, 0.02, 0.02, f"--expect {expect}", label=expect)


def _tokens_line(source, seed: int, found) -> str:
    """The terminal's line on the tokens: what they are and the seed that drew them, the
    same for every run (config.json's tokens_seed)."""
    what = source.line() if source else "Tokens: uniform random ids"
    drawn = "windows drawn" if source else "drawn"
    runs = {c.run for c in found.checkpoints}
    every = ", the same for every run (not each run's own training seed)" if len(runs) > 1 else ""
    return f"{what}, {drawn} by --seed {seed}{every}"


def _tokens(found, data: str | None, seed: int):
    """``--data``: the source's first held-out batch (its bytes, or a token file's ids), or
    with a Hugging Face folder that holds a tokenizer, the text tokenized by it (offline)."""
    from ..experiments.audit.data_tokens import DataTokens, has_tokenizer, load_tokenizer

    if data is None:
        return None
    folder = found.checkpoints[0].path.parent if found.source == "hf folder" else None
    if folder is not None and data != "markov" and has_tokenizer(folder):
        return DataTokens(data, seed, load_tokenizer(folder), folder)
    return DataTokens(data, seed)
