"""Issue 41, Reliability IV: the checkpoint surface as hardened as the rest. Every case of
the issue, each a one-line usage error naming the option (or the file) and what is
allowed, exit 2, no traceback and no run folder; the memory pre-check from one place
(tinit.experiments.memory.check_fits) for every command that builds or reads a model;
a forked child of a user's factory never outlives the audit.

The command-line cases run in one child process under an address-space cap (RLIMIT_AS,
3 GiB), as tests/test_hostile_bombs.py's do, so that a memory bomb that comes back fails
here instead of taking the machine: each case through typer's CliRunner, its exit code,
stderr and output reported. ``RUN`` is a d32 L2 V64 ``tinit train --save-steps 0,final``
folder, ``HF`` a small saved LlamaConfig folder."""

import collections
import importlib.util
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT, figures_built_not_saved
from typer.testing import CliRunner

from tinit.cli import app
from tinit.model.config import ConfigError

HAS_HF = importlib.util.find_spec("transformers") is not None
CAP = 3 * 2**30  # bytes of address space the child may map
HERE = Path(__file__).resolve().parent
M = ["--layers", "2", "--d-model", "32", "--heads", "2", "--vocab", "64", "--seq-len", "8"]
TRAIN = [*M, "--batch", "2", "--steps", "4", "--eval-batches", "1", "--init", "naive", "--pre-norm"]
runner = CliRunner()  # (its click command built once: conftest)

CHILD = r"""
import json, sys
import typer.main, typer.testing
from tinit.cli import app

built = typer.main.get_command(app)
typer.testing._get_command = lambda _: built
runner = typer.testing.CliRunner()
out = []
for args in json.loads(sys.stdin.read()):
    try:
        res = runner.invoke(app, args)
        code, err, text = res.exit_code, res.stderr, res.output
        if res.exception is not None and not isinstance(res.exception, SystemExit):
            err += f"\nException: {type(res.exception).__name__}: {res.exception}"
    except BaseException as exc:  # a MemoryError the runner did not catch
        code, err, text = -1, f"{type(exc).__name__}: {exc}", ""
    out.append({"code": code, "stderr": err, "output": text})
print("RESULTS" + json.dumps(out))
"""


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


# --- the inputs ------------------------------------------------------------------------------


def _edit_json(path: Path, **changes) -> None:
    doc = json.loads(path.read_text())
    for key, value in changes.items():
        where, _, leaf = key.rpartition(".")
        (doc[where] if where else doc)[leaf] = value
    path.write_text(json.dumps(doc))


def _run_copy(run: Path, dest: Path) -> Path:
    """One run's checkpoint folder (step 0 and 4) copied to ``dest``."""
    (src,) = (run / "checkpoints").iterdir()
    shutil.copytree(src, dest)
    return dest


def _hf_copy(hf: Path, dest: Path, **config) -> Path:
    shutil.copytree(hf, dest)
    if config:
        _edit_json(dest / "config.json", **config)
    return dest


def _make_inputs(tmp: Path) -> dict[str, str]:
    """RUN and HF and their hostile variants; the special files (FIFO, /dev/zero link,
    symlink loop) where a folder, a config, weights or a shard belong."""
    f: dict[str, str] = {}
    run = tmp / "RUN"
    with pytest.MonkeyPatch.context() as mp:  # (the checkpoints are what is tested, not the figures)
        figures_built_not_saved(mp)
        res = runner.invoke(app, ["train", *TRAIN, "--save-steps", "0,final", "-q", "--out", str(run)])
    assert res.exit_code == 0, res.output
    f["run"] = str(run)
    one = _run_copy(run, tmp / "layers")
    _edit_json(one / "step-000000.json", **{"model.n_layers": 100000})
    f["layers"] = str(one / "step-000000.safetensors")
    for name, changes in {"unknown": {"model.foo": 1}, "user_set": {"model.user_set": "no"},
                          "step_huge": {"step": 10**30}}.items():  # fmt: skip
        d = _run_copy(run, tmp / name)
        _edit_json(d / "step-000000.json", **changes)
        f[name] = str(d)
    d = _run_copy(run, tmp / "disagree")  # step-000004.json says step 0: two rows of step 0
    _edit_json(d / "step-000004.json", step=0)
    f["disagree"] = str(d)
    d = _run_copy(run, tmp / "twice")  # step-0 beside step-000000: both step 0
    for suffix in (".safetensors", ".json"):
        shutil.copy(d / f"step-000000{suffix}", d / f"step-0{suffix}")
    f["twice"] = str(d)
    d = _run_copy(run, tmp / "json_fifo")
    (d / "step-000000.json").unlink()
    os.mkfifo(d / "step-000000.json")
    f["json_fifo"] = str(d)
    os.mkfifo(tmp / "fifo")
    (tmp / "zero").symlink_to("/dev/zero")
    (tmp / "loop").symlink_to(tmp / "loop")
    f.update(fifo=str(tmp / "fifo"), zero=str(tmp / "zero"), loop=str(tmp / "loop"))
    (tmp / "ok.toml").write_text('name = "s-ok"\n')
    (tmp / "bias_like.toml").write_text('name = "bl"\nbias = false\nbias_like = ["o"]\n')
    (tmp / "span.toml").write_text('name = "sp"\nqk_norm = false\nqk_norm_span = "full"\n')
    f.update({k: str(tmp / f"{k}.toml") for k in ("ok", "bias_like", "span")})
    if HAS_HF:
        f.update(_hf_inputs(tmp))
    return f


def _hf_inputs(tmp: Path) -> dict[str, str]:
    import warnings

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=64, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(config)
        model.save_pretrained(tmp / "HF")
        model.save_pretrained(tmp / "sharded", max_shard_size="20KB")
    hf = tmp / "HF"
    f = {"hf": str(hf)}
    for name, changes in {"intermediate": {"intermediate_size": 10**10}, "vocab": {"vocab_size": 10**12},
                          "positions": {"max_position_embeddings": 10**9},
                          "positions_neg": {"max_position_embeddings": -1},
                          "heads": {"num_attention_heads": 3}}.items():  # fmt: skip
        f[f"hf_{name}"] = str(_hf_copy(hf, tmp / f"hf_{name}", **changes))
    d = _hf_copy(hf, tmp / "hf_config_fifo")
    (d / "config.json").unlink()
    os.mkfifo(d / "config.json")
    f["hf_config_fifo"] = str(d)
    d = _hf_copy(hf, tmp / "hf_config_zero")
    (d / "config.json").unlink()
    (d / "config.json").symlink_to("/dev/zero")
    f["hf_config_zero"] = str(d)
    d = _hf_copy(hf, tmp / "hf_config_dir")
    (d / "config.json").unlink()
    (d / "config.json").mkdir()
    f["hf_config_dir"] = str(d)
    d = _hf_copy(hf, tmp / "hf_weights_dir")
    (d / "model.safetensors").unlink()
    (d / "model.safetensors").mkdir()
    f["hf_weights_dir"] = str(d)
    shard = sorted((tmp / "sharded").glob("model-*.safetensors"))[0]
    shard.unlink()
    shard.symlink_to(shard.name)  # a loop: the link names itself
    f["hf_shard_loop"] = str(tmp / "sharded")
    return f


# --- the cases: (id, argv, the option the one line names, words it must say, words it must not)


def _cases(f: dict[str, str]) -> list[tuple[str, list[str], str, tuple[str, ...], tuple[str, ...]]]:
    a, ck, small = ["audit", "--checkpoint"], "--checkpoint", ["--seq-len", "8", "--batch", "2"]
    save = ["train", *TRAIN, "--save-steps"]
    # fmt: off
    cases = [
        # 1. memory bombs: audit --checkpoint had no pre-check for --batch / --seq-len
        ("batch-1e6", [*a, f["run"], "--seq-len", "8", "--batch", "1000000"], "--batch", ("GiB", "free"), ()),
        ("batch-1e8", [*a, f["run"], "--seq-len", "8", "--batch", "100000000"], "--batch", ("GiB",), ()),
        # the same forward in variance (its FFN's hidden tensors now counted) and train
        ("variance-batch-1e6", ["variance", *M, "--batch", "1000000"], "--batch", ("GiB",), ()),
        ("train-batch-1e6", ["train", *M, "--batch", "1000000", "--steps", "2", "--eval-batches", "1"],
         "--batch", ("GiB", "activations"), ()),
        # 2. tracebacks
        ("fifo", [*a, f["fifo"]], ck, ("FIFO",), ("NotADirectoryError",)),
        ("dev-zero-link", [*a, f["zero"]], ck, ("character device",), ("NotADirectoryError",)),
        # 3. a JSON claiming 100,000 layers over a file of two: refused before any block is built
        ("json-layers", [*a, f["layers"], *small], ck, ("missing blocks.2", "n_layers 100000"), ()),
        # 5. silently accepted
        ("init-file-alone", [*a, f["run"], "--init-file", f["ok"], *small], "--init-file",
         ("--expect s-ok",), ()),
        ("toml-bias-like", ["variance", *M, "--init-file", f["bias_like"]], "--init-file",
         ("bias_like", "bias = false"), ()),
        ("toml-qk-span", ["variance", *M, "--init-file", f["span"]], "--init-file",
         ("qk_norm_span", "qk_norm = false"), ()),
        ("save-steps-empty", [*save, ""], "--save-steps", ("names no step",), ()),
        ("save-steps-last", [*save, "0,last"], "--save-steps", ("'final'",), ()),
        ("save-steps-fullwidth", [*save, "\uff11"], "--save-steps", ("'final'",), ()),
        ("save-steps-underscore", [*save, "0,1_0"], "--save-steps", ("'final'",), ()),
        ("json-step-huge", [*a, f["step_huge"], *small], ck, ("from 0 to 1,000,000,000,000",), ()),
        ("json-step-disagrees", [*a, f["disagree"], *small], ck, ("disagrees", "step-000004"), ()),
        ("json-step-twice", [*a, f["twice"], *small], ck, ("step 0 twice",), ()),
        # 6. messages that mislead
        ("loop", [*a, f["loop"]], ck, ("symlink loop",), ("no such",)),
        ("json-fifo", [*a, f["json_fifo"], *small], ck, ("FIFO", "step-000000.json"), ("no step",)),
        ("empty-path", [*a, ""], ck, ("give a path",), ("no config.json",)),
        ("json-user-set", [*a, f["user_set"], *small], ck, ("user_set 'no'", "a list of field"),
         ("('n', 'o')",)),
        ("json-unknown-field", [*a, f["unknown"], *small], ck, ("no field 'foo'",),
         ("__init__", "unexpected keyword")),
    ]
    if HAS_HF:
        cases += [
            ("hf-positions-1e9", [*a, f["hf_positions"], "--seq-len", "10000000", "--batch", "1"],
             "--seq-len", ("GiB",), ()),
            # 3. HF config sizes bounded before anything is built for real
            ("hf-intermediate-1e10", [*a, f["hf_intermediate"], *small], ck,
             ("[10000000000, 32]", "config.json"), ("allocate",)),
            ("hf-vocab-1e12", [*a, f["hf_vocab"], *small], ck, ("[1000000000000, 32]",), ("allocate",)),
            # 2. tracebacks
            ("hf-expect-unknown", [*a, f["hf"], "--expect", "nosuch", *small], "--expect",
             ("'nosuch' is not one of", "declared"), ("KeyError",)),
            ("hf-init-file-other-expect", [*a, f["hf"], "--init-file", f["ok"], "--expect", "naive", *small],
             "--init-file", ("--expect s-ok",), ()),
            # 6. messages that mislead
            ("hf-config-fifo", [*a, f["hf_config_fifo"], *small], ck, ("FIFO", "config.json"),
             ("no config.json",)),
            ("hf-config-dev-zero", [*a, f["hf_config_zero"], *small], ck, ("character device",),
             ("no config.json",)),
            ("hf-config-dir", [*a, f["hf_config_dir"], *small], ck, ("directory", "config.json"),
             ("no config.json",)),
            ("hf-weights-dir", [*a, f["hf_weights_dir"], *small], ck, ("directory",),
             ("no model.safetensors",)),
            ("hf-shard-loop", [*a, f["hf_shard_loop"], *small], ck, ("symlink loop",), ("does not exist",)),
            ("hf-config-error", [*a, f["hf_heads"], *small], ck, ("config.json", "attention heads"),
             ("'--hf'",)),
            ("hf-positions-negative", [*a, f["hf_positions_neg"], *small], ck,
             ("max_position_embeddings -1", "whole number >= 1"), ("'--seq-len'",)),
        ]
    # fmt: on
    return cases


#: Cases that run (exit 0): the documented --expect of an --init-file scheme, and a
#: checkpoint of fewer positions than --seq-len's default audited at its own length.
def _runs(f: dict[str, str]) -> list[tuple[str, list[str]]]:
    runs = [("default-seq-len", ["audit", "--checkpoint", f["run"], "--batch", "2"])]
    if HAS_HF:
        expect = ["--expect", "s-ok", "--init-file", f["ok"], "--seq-len", "8", "--batch", "2"]
        runs.append(("hf-expect-init-file", ["audit", "--checkpoint", f["hf"], *expect]))
    return runs


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ck")
    f = _make_inputs(tmp)
    out = tmp / "out"
    cases = [(i, [*args, "--out", str(out / i)]) for i, args, *_ in _cases(f)]
    cases += [(i, [*args, "-q", "--out", str(out / i)]) for i, args in _runs(f)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps([c for _, c in cases]),
                          capture_output=True, text=True, cwd=ROOT, env=env, preexec_fn=_cap,
                          timeout=600)  # fmt: skip
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULTS")), None)
    assert line is not None, (proc.returncode, proc.stderr[-3000:])
    got = json.loads(line[len("RESULTS") :])
    return {i: (r, out / i) for (i, _), r in zip(cases, got, strict=True)}


NAMES = collections.defaultdict(lambda: "x")  # (the cases' ids and options, without their files)
CASES = {c[0]: c for c in _cases(NAMES)}


@pytest.mark.parametrize("case", list(CASES))
def test_each_case_is_one_line_naming_the_option_and_what_is_allowed(results, case):
    _, _, option, words, absent = CASES[case]
    res, out = results[case]
    assert res["code"] == 2, res
    lines = res["stderr"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), res["stderr"]
    assert f"'{option}'" in lines[0], lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])
    for w in absent:
        assert w not in lines[0], (w, lines[0])
    assert "Traceback" not in res["output"] + res["stderr"]
    assert not out.exists()  # refused before the run folder was claimed (or it was given back)


@pytest.mark.parametrize("case", [r[0] for r in _runs(NAMES)])
def test_the_documented_forms_run(results, case):
    res, out = results[case]
    assert res["code"] == 0, res
    config = json.loads((out / "config.json").read_text())
    assert config["complete"] is True
    if case == "default-seq-len":  # RUN was trained at --seq-len 8: its own length, not 128
        assert config["seq_len"] == 8
    else:  # the --init-file scheme gives the HF weights their expected std
        import pandas as pd

        drift = pd.read_csv(out / "drift.csv")
        assert drift.loc[drift["role"].isin(["q", "down"]), "expected_std"].notna().all()


# --- the memory pre-check, from one place ----------------------------------------------------


def test_every_command_that_builds_or_reads_a_model_refuses_through_check_fits(results, monkeypatch,
                                                                               tmp_path):  # fmt: skip
    """With 1 KiB free (memory.available_memory), every command that builds or reads a
    model is refused before it runs: one line naming an option and "GiB free", exit 2, no
    run folder; and each refusal comes from the one place, memory.check_fits (counted
    here wherever it is imported)."""
    from tinit.experiments import memory

    monkeypatch.setattr(memory, "available_memory", lambda device: 1024)
    calls = []
    real = memory.check_fits

    def counted(*a, **k):
        calls.append(a[2])
        return real(*a, **k)

    for module in [m for name, m in sys.modules.items() if name.startswith("tinit.")]:
        if getattr(module, "check_fits", None) is real:
            monkeypatch.setattr(module, "check_fits", counted)
    run = str(results["default-seq-len"][1].parent.parent / "RUN")
    small = ["--seq-len", "8", "--batch", "2"]
    commands = [
        ["variance", *M], ["grad-norms", *M], ["depth-sweep", *M, "--layers", "1,2"],
        ["check", "--d-model", "32", "--heads", "2"], ["train", *TRAIN],
        ["lr-sweep", *TRAIN, "--lr", "1e-3,1e-2"], ["coord-check", *M], ["attention-scale", "--seq-len", "8"],
        ["audit", "--module", f"{HERE}/audit_models.py:good_model", *small],
        ["audit", "--checkpoint", run, *small],
    ]  # fmt: skip
    if HAS_HF:
        hf = str(results["default-seq-len"][1].parent.parent / "HF")
        commands += [["audit", "--hf", "llama", *small], ["audit", "--checkpoint", hf, *small]]
    for args in commands:
        out = tmp_path / args[0]
        before = len(calls)
        res = runner.invoke(app, [*args, "--out", str(out)])
        assert res.exit_code == 2, (args, res.output)
        line = res.stderr.strip()
        assert line.startswith("Error: Invalid value for '--") and "GiB free" in line, (args, line)
        assert len(calls) > before, args
        assert not out.exists()


def test_check_fits_names_the_size_furthest_beyond_its_default():
    import torch

    from tinit.experiments.memory import check_fits

    terms = {("batch", "seq_len", "d_model"): 2**70, ("d_model",): 1}
    sizes = {"batch": 8, "seq_len": 128 * 1000, "d_model": 256 * 10}
    with pytest.raises(
        ConfigError, match=r"needs at least .* GiB of memory for x, more than the .* GiB free"
    ) as exc:
        check_fits(terms, sizes, "it needs", torch.device("cpu"), purpose=" for x")
    assert exc.value.field == "seq_len"
    with pytest.raises(ConfigError) as exc:
        check_fits(terms, sizes, "it needs", torch.device("cpu"), blame={"seq_len": "--checkpoint"})
    assert exc.value.field == "--checkpoint"
    with pytest.raises(ConfigError, match="1 PiB"):
        check_fits(terms, sizes, "it needs", torch.device("cpu"), here=False)
    check_fits({("d_model",): 1}, sizes, "it needs", torch.device("cpu"))  # fits: nothing raised


# --- 4. a user's factory that forks ----------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _audit_module(factory: str, tmp_path: Path, **popen):
    pids = tmp_path / "pids"
    pids.write_text("")
    cmd = [sys.executable, "-m", "tinit", "audit", "--module", f"{HERE}/hostile/forks.py:{factory}",
           "--seq-len", "8", "--batch", "2", "--no-grads", "-q", "--out", str(tmp_path / "out")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TINIT_TEST_PIDS": str(pids)}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **popen), pids  # fmt: skip


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
@pytest.mark.parametrize("factory", ["forks", "forks_and_returns_twice", "daemonizes"])
def test_a_factory_that_leaves_a_process_is_refused_and_the_process_ends(tmp_path, factory):
    """mod_fork.py:build forked a child that outlived the audit (rc 3, reparented to init).
    Now: one line naming --module and the process, exit 2, no run folder, and every
    process the factory started (a double fork's grandchild included) has ended."""
    proc, pids = _audit_module(factory, tmp_path)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    started = [int(x) for x in pids.read_text().split()]
    assert started
    assert proc.returncode == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "'--module'" in lines[0] and "left process(es) behind" in lines[0], stderr
    assert "no fork" in lines[0] and str(started[0]) in lines[0]
    assert not (tmp_path / "out").exists()
    assert not [p for p in started if _alive(p)]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_a_stop_while_the_factory_runs_ends_its_child_too(tmp_path):
    """SIGTERM while the factory still runs (its child started): the audit ends as an
    interrupted command does (Interrupted., 130), and the child with it."""
    proc, pids = _audit_module("forks_then_sleeps", tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not pids.read_text().strip():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    (child,) = [int(x) for x in pids.read_text().split()]
    assert proc.returncode == 130 and stderr.strip() == "Interrupted.", stderr
    assert "Traceback" not in stderr and not _alive(child)


def test_a_child_waited_for_is_no_objection(tmp_path):
    from tinit.experiments.audit.loaders import load_module

    model = load_module(f"{HERE}/hostile/forks.py:forks_and_waits")
    assert sum(p.numel() for p in model.parameters()) > 0


# --- 5, 6, 7: the library's side of the same ---------------------------------------------------


@pytest.mark.parametrize(("text", "key"), [
    ('name = "a"\nbias = false\nbias_like = ["o", "down"]\n', "bias_like"),
    ('name = "a"\nqk_norm = false\nqk_norm_span = "head"\n', "qk_norm_span"),
])  # fmt: skip
def test_a_toml_key_the_other_voids_is_refused(text, key):
    import tomllib

    from tinit.model.formula import FormulaError
    from tinit.model.scheme_file import parse_scheme

    with pytest.raises(FormulaError, match=f"{key}: .*drop one of the two"):
        parse_scheme(tomllib.loads(text), "s.toml")
    # either key alone (or the other with true) is a scheme
    for ok in ('name = "a"\nbias = true\nbias_like = ["o"]\n', 'name = "a"\nbias_like = ["o"]\n',
               'name = "a"\nqk_norm = true\nqk_norm_span = "full"\n',
               'name = "a"\nqk_norm = false\n'):  # fmt: skip
        assert parse_scheme(tomllib.loads(ok), "s.toml").name == "a"


@pytest.mark.parametrize("schemes", [5, "gpt2", ("str",), None, b"x"])
def test_from_scheme_refuses_schemes_that_are_not_schemes(schemes):
    from tinit.model.config import ModelConfig

    with pytest.raises(ConfigError) as exc:
        ModelConfig.from_scheme("gpt2", schemes=schemes)
    assert exc.value.field == "schemes" and "tuple of Scheme" in exc.value.message


def test_from_scheme_refuses_one_scheme_and_a_name_that_is_no_string():
    from tinit.model.catalogue import get_scheme
    from tinit.model.config import ModelConfig

    with pytest.raises(ConfigError, match=r"schemes=\(scheme,\)") as exc:
        ModelConfig.from_scheme("gpt2", schemes=get_scheme("gpt2"))
    assert exc.value.field == "schemes"
    with pytest.raises(ConfigError) as exc:
        ModelConfig.from_scheme(5)
    assert exc.value.field == "scheme"
    assert ModelConfig.from_scheme("gpt2", schemes=[]) == ModelConfig.from_scheme("gpt2")


def test_a_stop_inside_a_run_is_said_once(tmp_path):
    """config.json said "run 1/2: stopped by SIGTERM; stopped by SIGTERM": the run's
    IncompleteRun names the unit, its result the reason alone; the reason once."""
    from tinit.experiments.result import ExperimentResult
    from tinit.results.writer import write_result

    result = ExperimentResult({}, {}, False, "stopped by SIGTERM")
    done = write_result(tmp_path, "train", result, lambda r: {}, lambda r, d: [], ("png",), [],
                        "run 1/2: stopped by SIGTERM")  # fmt: skip
    assert done.error == "run 1/2: stopped by SIGTERM"
    assert json.loads((tmp_path / "config.json").read_text())["error"] == "run 1/2: stopped by SIGTERM"
    # a sweep's failed points, beside a stop: both said
    result = ExperimentResult({}, {}, False, "2 points failed")
    assert write_result(tmp_path, "x", result, lambda r: {}, lambda r, d: [], ("png",), [],
                        "stopped by SIGHUP").error == "stopped by SIGHUP; 2 points failed"  # fmt: skip


def test_library_find_checkpoints_says_what_a_path_is(tmp_path):
    from tinit.experiments.audit.sources import find_checkpoints
    from tinit.experiments.audit.tensors import CheckpointError

    os.mkfifo(tmp_path / "p.safetensors")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    cases = [(tmp_path / "p.safetensors", "FIFO"), (tmp_path / "loop", "symlink loop"), ("", "give a path"),
             (" ", "give a path"), (tmp_path / "none", "no such")]  # fmt: skip
    for path, words in cases:
        with pytest.raises(CheckpointError, match=words):
            find_checkpoints(path if isinstance(path, str) else str(path))


def test_the_cases_name_the_issue_items():
    """Every item of the issue with a command-line case is here (a guard against a case
    list that shrinks)."""
    ids = set(CASES)
    assert {"batch-1e6", "batch-1e8", "fifo", "dev-zero-link", "json-layers", "init-file-alone",
            "toml-bias-like", "toml-qk-span", "save-steps-empty", "save-steps-last", "save-steps-fullwidth",
            "json-step-huge", "json-step-disagrees", "json-step-twice", "loop", "json-fifo", "empty-path",
            "json-user-set", "json-unknown-field"} <= ids  # fmt: skip
    if HAS_HF:
        assert {"hf-positions-1e9", "hf-intermediate-1e10", "hf-vocab-1e12", "hf-expect-unknown",
                "hf-config-fifo", "hf-config-dev-zero", "hf-config-dir", "hf-weights-dir", "hf-shard-loop",
                "hf-config-error", "hf-positions-negative"} <= ids  # fmt: skip
