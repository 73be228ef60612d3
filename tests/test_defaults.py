"""One source for every default: each command's option defaults against the defaults of
the library it calls (the run_* function's keywords and the configs it builds when
given None), so `tinit X` and `run_X()` run the same thing."""

import dataclasses
import inspect

import pytest
import typer

from tinit.cli import app
from tinit.experiments.audit import audit
from tinit.experiments.bench import norms
from tinit.experiments.measure import attention_scale, check, depth_sweep, grad_norms, variance
from tinit.experiments.training import claims, trainer
from tinit.experiments.training.data import load_data
from tinit.model.catalogue import parse_init_list
from tinit.model.config import InitConfig, ModelConfig, RunConfig

COMMANDS = typer.main.get_command(app).commands


def cli(command: str) -> dict:
    """The command's defaults by option (``--layers``; an argument by its name)."""
    params = COMMANDS[command].params
    return {next((o for o in p.opts if o.startswith("--")), p.name): p.default for p in params}


def option(name: str) -> str:
    """A parameter's name as its option: warmup -> --warmup, high_lr -> --high-lr."""
    return "--" + name.replace("_", "-")


def kw(fn) -> dict:
    return {
        k: v.default for k, v in inspect.signature(fn).parameters.items() if v.default is not inspect._empty
    }


def fields(cls) -> dict:
    return {f.name: f.default for f in dataclasses.fields(cls)}


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in str(text).split(","))


#: shared option -> (config class, field, the option's value as the field's)
SHARED = {
    "--layers": (ModelConfig, "n_layers", int), "--d-model": (ModelConfig, "d_model", int),
    "--heads": (ModelConfig, "n_heads", int), "--d-ff": (ModelConfig, "d_ff", None),
    "--vocab": (ModelConfig, "vocab_size", int),
    "--norm": (ModelConfig, "norm", None), "--ffn": (ModelConfig, "ffn", None),
    "--positions": (ModelConfig, "positions", None),
    "--attention": (ModelConfig, "attention", None),
    "--untie": (ModelConfig, "tie_embeddings", lambda v: not v),
    "--bias": (ModelConfig, "bias", None), "--no-attn-scale": (ModelConfig, "attn_scale", lambda v: not v),
    "--qk-norm": (ModelConfig, "qk_norm", None), "--kv-heads": (ModelConfig, "n_kv_heads", None),
    "--branch": (ModelConfig, "branch", None), "--branch-var": (ModelConfig, "branch_var", None),
    "--sigma": (InitConfig, "sigma", float), "--embed-std": (InitConfig, "embed_std", None),
    "--seed": (InitConfig, "seed", None), "--base-width": (InitConfig, "base_width", None),
    "--base-depth": (InitConfig, "base_depth", None), "--batch": (RunConfig, "batch", None),
    "--seq-len": (RunConfig, "seq_len", None), "--device": (RunConfig, "device", None),
    "--dtype": (RunConfig, "dtype", None), "--stream": (RunConfig, "stream", None),
    "--tf32": (RunConfig, "tf32", None),
}  # fmt: skip
#: The commands' own defaults of shared options (checked in the tests below, or there by design).
TRAINING_CPU = {"--d-model", "--heads", "--vocab", "--seq-len", "--batch"}  # sized for a 2-core CPU
OWN = {
    "depth-sweep": {"--layers"},  # a list of depths
    # run_check's (test_check_defaults)
    "check": {"--layers", "--d-model", "--heads", "--seq-len", "--batch"},
    "train": {"--layers", *TRAINING_CPU}, "lr-sweep": {"--layers", *TRAINING_CPU}, "claims": TRAINING_CPU,
    "audit": {"--sigma", "--vocab"},  # the audited model's own unless given
    "norms": {"--d-model"},  # a list of widths
    # lists of widths and depths, sized for a 2-core CPU (tests/test_coord_check.py)
    "coord-check": {"--layers", "--d-model", "--vocab", "--seq-len", "--batch"},
}  # fmt: skip


@pytest.mark.parametrize("command", list(COMMANDS))
def test_shared_options_default_to_the_configs(command):
    """Each shared option's default is the config's (ModelConfig, InitConfig, RunConfig),
    which run_X builds when given None, unless the command has its own (OWN)."""
    got = cli(command)
    for option, (cls, field, conv) in SHARED.items():
        if option in got and option not in OWN.get(command, ()):
            value = got[option] if conv is None or got[option] is None else conv(got[option])
            assert value == fields(cls)[field], (command, option)
    if "--seq-len" in got and "--seq-len" not in OWN.get(command, ()):
        # the sequence cache fits a run of the default length
        assert ModelConfig().max_seq_len == int(got["--seq-len"])


def test_grid_defaults():
    """--init both = naive, scaled; no placement given = each scheme's presumed one (None)."""
    for command, fn in (("variance", variance.run_variance), ("grad-norms", grad_norms.run_grad_norms),
                        ("depth-sweep", depth_sweep.run_depth_sweep)):  # fmt: skip
        got, lib = cli(command), kw(fn)
        assert parse_init_list(got["--init"]) == tuple(lib["inits"]), command
        assert got["--norm-position"] is None and not got["--pre-norm"] and not got["--post-norm"]
        assert lib["norm_positions"] is None, command
    assert cli("grad-norms")["--batches"] == kw(grad_norms.run_grad_norms)["batches"]
    ds, lib = cli("depth-sweep"), kw(depth_sweep.run_depth_sweep)
    assert ints(ds["--layers"]) == tuple(lib["layers"]) and ds["--seeds"] == lib["seeds"]
    assert ds["--transfer-from"] == lib["transfer_from"] and ds["--grads"] == lib["grads"]


def test_attention_scale_norms_and_audit_defaults():
    assert ints(cli("attention-scale")["--head-dims"]) == tuple(
        kw(attention_scale.run_attention_scale)["head_dims"]
    )
    got, lib = cli("norms"), kw(norms.run_norms)
    assert ints(got["--rows"]) == tuple(lib["rows"]) and ints(got["--d-model"]) == tuple(lib["d_models"])
    for name in ("repeats", "warmup", "compile", "threads", "seed"):
        assert got[option(name)] == lib[name], name
    got, lib, exp = cli("audit"), kw(audit.run_audit), fields(audit.Expectation)
    assert got["--seed"] == lib["seed"] and got["--grads"] == lib["grads"]
    assert got["--z-max"] == exp["z_max"] and got["--rtol"] == exp["rtol"]


def test_check_defaults():
    got, lib = cli("check"), kw(check.run_check)
    assert got["--deep-layers"] == lib["deep_layers"] and got["--alpha"] == lib["alpha"]
    assert ints(got["--head-dims"]) == tuple(lib["head_dims"])
    model = ModelConfig(**check.CHECK_MODEL)  # what run_check builds when given no model
    run = RunConfig(**check.CHECK_RUN)
    shape = (got["--layers"], got["--d-model"], got["--heads"])
    assert shape == (model.n_layers, model.d_model, model.n_heads)
    assert (got["--seq-len"], got["--batch"]) == (run.seq_len, run.batch)


def test_training_defaults():
    """`tinit train`'s optimizer options are TrainConfig's; the data options load_data's;
    `tinit claims`'s own options ClaimsConfig's (high_lr was 3e-2 there, 1.5e-2 here)."""
    got, cfg = cli("train"), fields(trainer.TrainConfig)
    for name in ("steps", "warmup", "min_lr_ratio", "weight_decay", "grad_clip", "eval_every",
                 "diverge_margin",
                 "probe_points", "compile"):  # fmt: skip
        assert float(got[option(name)]) == float(cfg[name]), name
    assert float(got["--lr"]) == cfg["lr"] and (not got["--no-autocast"]) == cfg["autocast"]
    data = kw(load_data)
    for command in ("train", "lr-sweep", "claims"):
        got = cli(command)
        assert got["--markov-k"] == data["markov_k"], command
        assert got["--eval-batches"] == data["eval_batches"], command
    got, cfg = cli("claims"), fields(claims.ClaimsConfig)
    for name in ("shallow", "deep", "seeds", "high_lr", "warmup", "tol"):
        assert got[option(name)] == cfg[name], name
