"""``tinit audit``: measure the init of a model tinit did not build (a Hugging Face
config, or a user's module), against a scheme; exit 3 when any weight deviates."""

import dataclasses
import math
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from ..model.catalogue import alias_note
from ..model.catalogue import names as scheme_names
from ..model.config import ConfigError
from . import options as opt
from .configs import Options, configs_or_exit
from .options import Param

if TYPE_CHECKING:
    from ..experiments.audit.audit import Expectation

AUDIT = "Audit"
#: The catalogue's schemes as --expect and --init list them (scaled is gpt2's alias).
SCHEMES_HELP = ", ".join(scheme_names(custom=False)) + f" ({alias_note()}); 'tinit inits' describes each"


def _scheme(value: str, option: str, extra: tuple[str, ...], custom: tuple = ()) -> str:
    """A scheme name --expect / --init accept: the catalogue's (aliases too), the
    --init-file scheme's, or one of ``extra``; kept as the user wrote it (``gpt2`` stays
    ``gpt2``, ``scaled`` stays ``scaled``), as every other command labels its rows."""
    from ..model.catalogue import known, names_and_aliases

    if value not in extra and not known(value, custom):
        allowed = dict.fromkeys((*extra, *names_and_aliases(custom)))
        raise ConfigError(option, f"{value!r} is not one of {', '.join(allowed)}")
    return value


def _declared(model, sites, sigma: float | None) -> "Expectation":
    """What the model says its init is: tinit's InitConfig (its scheme itself, a user's
    --init-file scheme included), an HF config's initializer_range plus the family's own
    rule, or (nothing declared) naive."""
    from ..experiments.audit.audit import Expectation, declared_expectation
    from ..model.transformer import Transformer

    if isinstance(model, Transformer):
        d, ini = model.cfg.d_model, model.init
        s = ini.resolved_sigma(d) if sigma is None else sigma
        e = ini.resolved_embed_std(d) if sigma is None else sigma
        why = f"the model's declared init (tinit {ini.scheme}, sigma {s:g})"
        return Expectation(ini.definition, s, e, why, base_width=ini.base_width, base_depth=ini.base_depth)
    return declared_expectation(getattr(model, "config", None), sites, sigma)


def _no_closed_form(summary) -> list[str]:
    """The configurations of an audit whose summary has no closed form (all of them: the
    audit sets each beside the law from its measured branch variances only)."""
    if "closed_form" not in summary:
        return list(summary["init"])
    return list(summary.loc[summary["closed_form"].isna() | (summary["closed_form"] == ""), "init"])


OPTIONS = (
    Param(
        "hf",
        Annotated[
            str | None,
            typer.Option(
                "--hf",
                help="A transformers config.json file, or a MODEL_TYPE "
                "(llama, gpt2, ...) with --set; built offline with AutoModelForCausalLM.from_config. "
                "With --checkpoint FILE.safetensors: the config of its weights.",
                rich_help_panel=AUDIT,
                metavar="CONFIG.json|MODEL_TYPE",
            ),
        ],
        None,
    ),
    Param(
        "checkpoint",
        Annotated[
            str | None,
            typer.Option(
                "--checkpoint",
                help="Trained weights, read block by block: a `tinit train --save-steps` run folder (every "
                "checkpoint, over steps), a Hugging Face model folder (config.json + model.safetensors or a "
                "sharded index) or a .safetensors file with --hf CONFIG. Writes drift.csv and "
                "checkpoints.csv.",
                rich_help_panel=AUDIT,
                metavar="PATH",
            ),
        ],
        None,
    ),
    Param(
        "spectral",
        Annotated[
            str,
            typer.Option(
                "--spectral",
                help="With --checkpoint: how each matrix's spectral norm (largest singular value) is found: "
                "fast (Lanczos, stopped at 1% relative; an SVD for a side <= 256), exact (svdvals: minutes "
                "for an 8B model), or off (drift.csv's spectral_norm left empty).",
                rich_help_panel=AUDIT,
                metavar="fast|exact|off",
            ),
        ],
        "fast",
    ),
    Param(
        "set_",
        Annotated[
            list[str] | None,
            typer.Option(
                "--set",
                help="Override a config field, KEY=VALUE (repeatable), e.g. --set num_hidden_layers=4.",
                rich_help_panel=AUDIT,
                metavar="KEY=VALUE",
            ),
        ],
        None,
    ),
    Param(
        "module",
        Annotated[
            str | None,
            typer.Option(
                "--module",
                help="pkg.module:FACTORY or path/file.py:FACTORY, where FACTORY() returns an nn.Module "
                "mapping token ids (batch, seq) to logits (the model keeps its dtype unless --dtype is "
                "given).",
                rich_help_panel=AUDIT,
                metavar="SPEC",
            ),
        ],
        None,
    ),
    Param(
        "sites",
        Annotated[
            str | None,
            typer.Option(
                "--sites",
                help="Name the additions: BLOCKS:ATTN[>ADDED]:FFN[>ADDED], "
                "e.g. model.layers:self_attn:mlp (child names may be shell patterns).",
                rich_help_panel=AUDIT,
                metavar="SPEC",
            ),
        ],
        None,
    ),
    Param(
        "expect",
        Annotated[
            str,
            typer.Option(
                "--expect",
                help="Scheme the weights are checked against: declared (what the model says: "
                "initializer_range plus the family's rules) or a scheme of the catalogue: "
                + SCHEMES_HELP
                + "; or the scheme of --init-file.",
                rich_help_panel=AUDIT,
            ),
        ],
        "declared",
    ),
    Param(
        "reinit",
        Annotated[
            str,
            typer.Option(
                "--init",
                help="Also measure the same model re-initialised by this scheme (as --expect lists them; "
                "each role drawn from its own distribution) on the same tokens, beside 'as-built'; none: "
                "only as built.",
                rich_help_panel=AUDIT,
            ),
        ],
        "none",
    ),
    Param(
        "z_max",
        Annotated[
            float,
            typer.Option(
                "--z-max", help="A std is ok when |z| <= this (or within --rtol).", rich_help_panel=AUDIT
            ),
        ],
        5.0,
    ),
    Param(
        "rtol",
        Annotated[
            float,
            typer.Option(
                "--rtol",
                help="...or when within this relative distance of the expected std.",
                rich_help_panel=AUDIT,
            ),
        ],
        0.01,
    ),
    opt.GRADS,
)


def audit(opts: Options) -> None:
    """Audit the init of a model tinit did not build: every weight's std against a
    scheme (weights.csv), the residual-stream variance at each of the 2L additions
    (variance.csv, summary.csv, as `tinit variance`) and gradient norms (grad_norms.csv,
    as `tinit grad-norms`), with audit.md and plots.

    Exit codes: 0 every weight ok; 3 some weight deviates (off-scheme, pytorch-default,
    zero, constant, non-finite); 2 bad input; 1 the run failed part-way.
    """
    if opts.checkpoint is not None:
        from .audit_checkpoint import audit_checkpoint

        return audit_checkpoint(opts.ctx, opts, opts.checkpoint, opts.hf, opts.data, opts.expect)
    if opts.data is not None:
        raise typer.BadParameter("only applies with --checkpoint", param_hint="'--data'")
    if opts.given("spectral"):
        raise typer.BadParameter("only applies with --checkpoint", param_hint="'--spectral'")
    hf, set_, module, sites = opts.hf, opts.set_, opts.module, opts.sites
    expect, reinit, sigma, vocab, z_max = opts.expect, opts.reinit, opts.sigma, opts.vocab_size, opts.z_max
    rtol, grads, seq_len = opts.rtol, opts.grads, opts.seq_len
    from ..experiments.audit.audit import Expectation, ModelError, run_audit
    from ..experiments.audit.loaders import (
        check_parameters,
        check_token_memory,
        infer_vocab,
        load_hf,
        load_module,
        max_positions,
        parse_set,
    )
    from ..experiments.audit.loaders import one_line as _one_line
    from ..experiments.audit.roles import classify_roles
    from ..experiments.audit.sites import find_sites
    from ..experiments.device import make_tokens, resolve_device, resolve_dtype
    from ..experiments.result import is_run_failure
    from ..model.config import ModelConfig, RunConfig
    from ..results.plot_grad_norms import plot_grad_norms, plot_stream_grads
    from ..results.plots import plot_variance
    from ..results.report_audit import (
        EXIT_DEVIATING,
        plot_weight_stds,
        stream_lines,
        verdict,
        weights_table,
        write_audit_md,
    )
    from ..results.tables import output_console
    from .runner import Outputs, execute

    sets = set_ or []

    def prepare():
        if (hf is None) == (module is None):
            raise ConfigError("--hf", "give exactly one of --hf CONFIG.json|MODEL_TYPE or --module SPEC")
        if sets and hf is None:
            raise ConfigError("--set", "only applies to --hf")
        for name, value in (("--z-max", z_max), ("--rtol", rtol)):
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(name, f"must be a finite number >= 0, got {value}")
        if sigma is not None and not (isinstance(sigma, float) and math.isfinite(sigma) and sigma > 0):
            raise ConfigError("--sigma", f"give a positive number (the audited model's std), got {sigma!r}")
        if vocab is not None and vocab < 2:
            raise ConfigError("--vocab", f"the random tokens need a vocabulary of >= 2, got {vocab}")
        custom = opts.custom_schemes
        exp_scheme = _scheme(expect, "--expect", ("declared",), custom)
        rec_scheme = _scheme(reinit, "--init", ("none",), custom)
        lookup = {s.name: s for s in custom}
        device, dtype = resolve_device(opts.device), resolve_dtype(opts.dtype)
        if hf is not None:
            model = load_hf(hf, parse_set(sets), device, dtype, opts.seed)
        else:
            model = load_module(module, opts.seed)
            model = model.to(device=device, dtype=dtype if opts.given("dtype") else None)
        option = "--hf" if hf else "--module"
        check_parameters(model, option)
        inferred = infer_vocab(model)
        if inferred is not None and inferred < 2 and vocab is None:
            raise ConfigError(option, f"the model's vocabulary is {inferred} token(s): it needs >= 2")
        if vocab is not None and inferred is not None and vocab > inferred:
            raise ConfigError("--vocab", f"{vocab} exceeds the model's {inferred} token ids")
        v = vocab or inferred
        if v is None:
            raise ConfigError(
                "--vocab", "cannot infer the vocabulary (the model has no nn.Embedding); give --vocab"
            )
        seq_len, limit = opts.seq_len, max_positions(model)
        if limit is not None and seq_len > limit:
            if opts.given("seq_len"):
                raise ConfigError("--seq-len", f"{seq_len} exceeds the model's {limit} positions")
            seq_len = limit  # the default does not fit this model: its own length does
        if seq_len < 2 and grads:
            raise ConfigError("--seq-len", "must be >= 2 to measure gradients (or give --no-grads)")
        check_token_memory(model, opts.batch, seq_len, device)
        tokens = make_tokens(ModelConfig(vocab_size=v), RunConfig(batch=opts.batch, seq_len=seq_len),
                             opts.seed, device)  # fmt: skip
        try:
            found, tr = find_sites(model, tokens[:1, : min(4, seq_len)], sites)
        except ConfigError as exc:
            if exc.field == "--sites" and sites is None:  # no --sites was given: the model is at fault
                raise ConfigError(option, f"cannot find the model's additions: {exc.message}") from None
            raise
        except (Exception, SystemExit) as exc:  # the user's (or transformers') forward, in any way
            if is_run_failure(exc):
                raise
            raise ConfigError(option, f"the model's forward failed: {_one_line(exc)}") from None
        roles = classify_roles(model, found, tr, v)
        if exp_scheme == "declared":
            expectation = _declared(model, found, sigma)
        else:
            s = 0.02 if sigma is None else sigma
            rng = getattr(getattr(model, "config", None), "initializer_range", None)
            if sigma is None and isinstance(rng, int | float):
                s = float(rng)
            chosen = lookup.get(exp_scheme, exp_scheme)
            expectation = Expectation(chosen, s, s, f"--expect {expect} (sigma {s:g})")
        expectation = dataclasses.replace(expectation, z_max=z_max, rtol=rtol)
        scheme = None
        if rec_scheme != "none":
            scheme = Expectation(lookup.get(rec_scheme, rec_scheme), expectation.sigma, expectation.embed_std,
                                 f"tinit {reinit}")  # fmt: skip
        return model, found, roles, tokens, expectation, scheme, v, seq_len

    model, found, roles, tokens, expectation, scheme, v, seq_len = configs_or_exit(prepare)
    opts = opts.replace(seq_len=seq_len)
    option = "--hf" if hf else "--module"
    source = f"--hf {hf}" + "".join(f" --set {s}" for s in sets) if hf else f"--module {module}"
    meta = {"source": source, "ln_vocab": math.log(v), "vocab": v}
    if hf is not None:
        import transformers

        meta["transformers_version"] = transformers.__version__
    console = output_console()
    if not opts.quiet:
        for line in found.describe():
            console.print(line, highlight=False)
    title = f"{source}: L={found.n_layers}, batch {opts.batch} x seq {opts.seq_len}"
    figs = ["weights", "variance"] + (["grad_norms", "stream_grads"] if grads else [])

    def figures(r):
        out = {
            "weights": plot_weight_stds(r["weights"], title),
            # the audit computes no scheme's closed form (as built, the model follows none)
            "variance": plot_variance(r["variance"], title, no_closed_form=_no_closed_form(r["summary"])),
        }
        if grads:
            out["grad_norms"] = plot_grad_norms(r["grad_norms"], "both", title)
            out["stream_grads"] = plot_stream_grads(r["stream_grads"], title)
        return out

    def experiment(progress, on_partial=None):  # (one unit: nothing partial to hand over)
        try:
            result = run_audit(model, found, roles, tokens, expectation, scheme, opts.seed, grads, progress,
                               meta)  # fmt: skip
        except ModelError as exc:  # the model's forward or backward, or its output: the input's fault
            raise ConfigError(option, exc.message) from None
        check = result.meta["stream_check"].get("as-built", {})
        if sites is not None and not check.get("agrees"):
            # the additions named do not add up to the blocks' outputs: every stream number would be
            # of some other sum (and the roles found from them may be wrong): nothing is written
            err = check.get("max_rel_err")
            why = "no block output to compare with" if err is None else (
                f"stream_in + branch differs from block {check['worst_layer']}'s output by {err:.3g} "
                f"(relative; tolerance {check['tolerance']:g})")  # fmt: skip
            raise ConfigError("--sites", f"{sites!r} does not describe the residual stream: {why}")
        return result

    result = execute(
        "audit",
        opts,
        experiment,
        Outputs(
            figures=figures,
            tables=lambda r: [
                weights_table(r["weight_groups"], f"Weights against {expectation.source}"),
                Text(verdict(r.meta)[1], style="green" if verdict(r.meta)[0] else "bold red"),
                *(Text(line) for line in stream_lines(r.frames.get("summary"))),
            ],
            files=lambda r, d: [write_audit_md(r.frames, r.meta, d, figs)],
        ),
    )
    if result.meta.get("n_deviating", 0) > 0:
        raise typer.Exit(EXIT_DEVIATING)
