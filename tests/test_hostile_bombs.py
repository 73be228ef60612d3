"""Issue 30, memory bombs and tracebacks from a few characters of input. Each case ate
most of a 24 GB machine, hung, crashed or printed a traceback; now each is a one-line
usage error naming the option (exit 2), refused before memory is spent.

The cases run in one child process under an address-space cap (RLIMIT_AS, 3 GiB), so
that a regression fails these tests instead of taking the machine down (a time limit
guards against a hang): the child runs every case through typer's CliRunner and reports
exit code, stderr and output for each; a case refused as it should be claims no run
folder. SIGHUP to a local sweep's process group (what closing a terminal sends) runs as
a real process group, signalled at an event of the sweep."""

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT, signalled_run

from tinit.experiments.audit.loaders import MAX_HF_EXPERTS
from tinit.model.checks import MAX_LAYERS, MAX_LR, MAX_SEEDS
from tinit.model.config import ConfigError
from tinit.userfile import MAX_DEPTH, MAX_TEXT_BYTES, UserFileError, load_json, load_toml, read_text

HAS_HF = __import__("importlib").util.find_spec("transformers") is not None
M = ["--d-model", "32", "--heads", "2", "--seq-len", "16", "--batch", "2", "--vocab", "64"]
CAP = 3 * 2**30  # bytes of address space the child may map
HUGE = "1000000000"
AUDIT_MODELS = Path(__file__).resolve().parent / "audit_models.py"
W = ["--d-model", HUGE, "--heads", "2"]  # d 1e9: a block's storage size overflowed even on the meta device

CHILD = r"""
import json, sys
import typer.main, typer.testing
from tinit.cli import app

built = typer.main.get_command(app)  # once (typer builds it anew at every invoke: 0.08 s)
typer.testing._get_command = lambda _: built
runner = typer.testing.CliRunner()
out = []
for case in json.loads(sys.stdin.read()):
    try:
        res = runner.invoke(app, case["args"], env=case.get("env"))
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


def _files(tmp: Path) -> dict[str, str]:
    """The hostile files: a FIFO, a symlink loop, a directory, a file over 1 MiB, TOML and
    JSON nested 5000 deep, a scheme whose optimizer multiplier is 1e300."""
    fifo = tmp / "fifo.toml"
    os.mkfifo(fifo)
    (tmp / "loop-a").symlink_to(tmp / "loop-b")
    (tmp / "loop-b").symlink_to(tmp / "loop-a")
    big = tmp / "big.toml"
    big.write_text('name = "big"\n' + "# padding\n" * (MAX_TEXT_BYTES // 10 + 10))
    deep = tmp / "deep.toml"
    deep.write_text('name = "deep"\nx = ' + "[" * 5000 + "]" * 5000 + "\n")
    deep_json = tmp / "deep.json"
    deep_json.write_text('{"model_type": "llama", "x": ' + "[" * 5000 + "]" * 5000 + "}")
    lr = tmp / "lr1e300.toml"
    lr.write_text('name = "lr1e300"\n[optimizer.hidden_matrix]\nlr = "1e300"\n')
    return {"fifo": str(fifo), "loop": str(tmp / "loop-a"), "dir": str(tmp), "big": str(big),
            "deep": str(deep), "deep_json": str(deep_json), "lr": str(lr)}  # fmt: skip


def _cases(f: dict[str, str], out: Path) -> list[tuple[str, list[str], str, dict | None]]:
    """(id, argv, the option the one line must name, environment)."""
    quick = ["--steps", "2", "--eval-batches", "1", "--probe-points", "0"]
    cases = [
        # case 6: --seeds 1e9 built the seed list up front (22.5 GB)
        ("seeds-depth-sweep", ["depth-sweep", *M, "--seeds", HUGE], "--seeds", None),
        ("seeds-train", ["train", *M, "--seeds", HUGE], "--seeds", None),
        ("seeds-lr-sweep", ["lr-sweep", *M, "--seeds", HUGE], "--seeds", None),
        ("seeds-coord-check", ["coord-check", *M, "--seeds", HUGE], "--seeds", None),
        ("seeds-claims", ["claims", *M, "--seeds", HUGE], "--seeds", None),
        ("seeds-sweep", ["sweep", "depth-sweep", *M, "--seeds", HUGE], "--seeds", None),
        # case 7: coord-check had no memory pre-check (7.4 GB in 120 s)
        ("coord-deep", ["coord-check", *M, "--layers", "100000"], "--layers", None),
        ("coord-wide", ["coord-check", *M[2:], "--d-model", "200000", "--layers", "2"], "--d-model", None),
        ("batches", ["grad-norms", *M, "--batches", "100000000"], "--batches", None),
        # --init-file read without bound (/dev/zero), hung (FIFO), traced back (loop, depth)
        ("init-dev-zero", ["variance", *M, "--init-file", "/dev/zero"], "--init-file", None),
        ("init-fifo", ["variance", *M, "--init-file", f["fifo"]], "--init-file", None),
        ("init-loop", ["variance", *M, "--init-file", f["loop"]], "--init-file", None),
        ("init-dir", ["variance", *M, "--init-file", f["dir"]], "--init-file", None),
        ("init-big", ["variance", *M, "--init-file", f["big"]], "--init-file", None),
        ("init-deep", ["variance", *M, "--init-file", f["deep"]], "--init-file", None),
        ("data-fifo", ["train", *M, "--data", f["fifo"], *quick], "--data", None),
        ("data-loop", ["train", *M, "--data", f["loop"], *quick], "--data", None),
        # --threads 100000 segfaulted
        ("threads", ["variance", *M, "--threads", "100000"], "--threads", None),
        ("threads-env", ["variance", *M], "--threads", {"OMP_NUM_THREADS": "100000"}),
        # --lr 1e300 overflowed inside Adam (an internal error)
        ("lr-train", ["train", *M, "--lr", "1e300", *quick], "--lr", None),
        ("lr-lr-sweep", ["lr-sweep", *M, "--lr", "1e-3,1e300", *quick], "--lr", None),
        ("lr-coord-check", ["coord-check", *M, "--lr", "1e300"], "--lr", None),
        ("lr-claims", ["claims", *M, "--lr", "1e300"], "--lr", None),
        ("high-lr-claims", ["claims", *M, "--high-lr", "1e300"], "--high-lr", None),
        ("lr-inf", ["train", *M, "--lr", "inf", *quick], "--lr", None),
        # an optimizer multiplier of 1e300 from a TOML scheme, checked at the run's shape
        ("mult-train", ["train", *M, "--layers", "1", "--init-file", f["lr"], *quick], "--init-file", None),
        # issue 30, second pass: the forward commands had no memory pre-check ("Storage size
        # calculation overflowed" at d 1e9; out of memory, exit 1, at seq-len, batch, vocab)
        ("d-model-variance", ["variance", *W, "--layers", "1"], "--d-model", None),
        ("seq-len-variance", ["variance", *M, "--seq-len", HUGE], "--seq-len", None),
        ("batch-variance", ["variance", *M, "--batch", HUGE], "--batch", None),
        ("vocab-variance", ["variance", *M, "--vocab", "1000000000000"], "--vocab", None),
        ("batch-grad-norms", ["grad-norms", *M, "--batch", HUGE], "--batch", None),
        ("batch-depth-sweep", ["depth-sweep", *M, "--layers", "1,2", "--batch", HUGE], "--batch", None),
        ("d-model-sweep", ["sweep", "variance", *W, "--layers", "1"], "--d-model", None),
        ("batch-check", ["check", "--batch", HUGE], "--batch", None),
        ("deep-check", ["check", "--deep-layers", HUGE], "--deep-layers", None),
        ("seq-len-attention", ["attention-scale", "--seq-len", HUGE], "--seq-len", None),
        ("head-dims-attention", ["attention-scale", "--head-dims", f"16,{HUGE}"], "--head-dims", None),
        # --layers 1e8: the per-layer rule checks filled 3 GiB in 22 s (grad-norms) or ran for hours
        ("layers-grad-norms", ["grad-norms", *M, "--layers", "100000000"], "--layers", None),
        ("layers-variance", ["variance", *M, "--layers", "100000000"], "--layers", None),
        ("layers-depth-sweep", ["depth-sweep", *M, "--layers", "1,100000000"], "--layers", None),
        # --steps 1e12: a row per step (and two per layer) kept in memory for the whole run
        (
            "steps-train",
            ["train", *M, "--layers", "1", "--steps", "1000000000000", "--eval-batches", "1"],
            "--steps",
            None,
        ),  # fmt: skip
        ("steps-lr-sweep", ["lr-sweep", *M, "--steps", "1000000000000"], "--steps", None),
        # a user's module declares no positions: --seq-len 1e9 reached make_tokens (a traceback)
        (
            "seq-len-audit-module",
            ["audit", "--module", f"{AUDIT_MODELS}:good_model", "--seq-len", HUGE],
            "--seq-len",
            None,
        ),
        (
            "batch-audit-module",
            ["audit", "--module", f"{AUDIT_MODELS}:good_model", "--batch", HUGE],
            "--batch",
            None,
        ),
    ]
    if HAS_HF:
        sets = ("n_embd=32", "n_head=2", "vocab_size=64", "n_positions=32")
        tiny = [x for kv in sets for x in ("--set", kv)]
        cases += [
            # audit --hf with n_layer 1e7 counted on the meta device (3.4 GB and growing)
            ("hf-layers-gpt2", ["audit", "--hf", "gpt2", *tiny, "--set", "n_layer=10000000"], "--set", None),
            (
                "hf-layers-llama",
                ["audit", "--hf", "llama", "--set", "num_hidden_layers=10000000"],
                "--set",
                None,
            ),  # fmt: skip
            # expert counts multiply the MLPs the meta-device count builds
            (
                "hf-experts-mixtral",
                ["audit", "--hf", "mixtral", "--set", "num_local_experts=100000000"],
                "--set",
                None,
            ),  # fmt: skip
            (
                "hf-experts-qwen3",
                [
                    "audit",
                    "--hf",
                    "qwen3_moe",
                    "--set",
                    "num_hidden_layers=1",
                    "--set",
                    "num_experts=100000000",
                ],
                "--set",
                None,
            ),  # fmt: skip
            (
                "hf-experts-default",
                ["audit", "--hf", "deepseek_v3", "--set", "num_hidden_layers=1000"],
                "--set",
                None,
            ),  # fmt: skip
            ("hf-file-zero", ["audit", "--hf", "/dev/zero"], "--hf", None),
            ("hf-file-fifo", ["audit", "--hf", f["fifo"]], "--hf", None),
            ("hf-file-loop", ["audit", "--hf", f["loop"]], "--hf", None),
            ("hf-file-deep", ["audit", "--hf", f["deep_json"]], "--hf", None),
            (
                "hf-set-deep",
                ["audit", "--hf", "gpt2", *tiny, "--set", "n_layer=" + "[" * 5000 + "]" * 5000],
                "--set",
                None,
            ),  # fmt: skip
        ]
        for value in ("Infinity", "inf", "-Infinity", "-inf", "1e400", "NaN"):
            cases.append((f"hf-range-{value}", ["audit", "--hf", "gpt2", *tiny, "--set", "n_layer=1", "--set",
                                                f"initializer_range={value}"], "--set", None))  # fmt: skip
    return [(i, [*args, "--out", str(out / i)], option, env) for i, args, option, env in cases]


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bombs")
    cases = _cases(_files(tmp), tmp / "runs")
    payload = json.dumps([{"args": args, "env": env} for _, args, _, env in cases])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.run([sys.executable, "-c", CHILD], input=payload, capture_output=True, text=True,
                          cwd=ROOT, env=env, preexec_fn=_cap, timeout=600)  # fmt: skip
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULTS")), None)
    assert line is not None, (proc.returncode, proc.stderr[-3000:])
    results = json.loads(line[len("RESULTS") :])
    return {i: (r, option, tmp / "runs" / i) for (i, _, option, _), r in zip(cases, results, strict=True)}


FILES = ("fifo", "loop", "dir", "big", "deep", "deep_json", "lr")
CASE_IDS = [c[0] for c in _cases(dict.fromkeys(FILES, "x"), Path("out"))]


@pytest.mark.parametrize("case", CASE_IDS)
def test_a_hostile_size_or_file_is_one_line_before_memory_is_spent(bombs, case):
    res, option, out = bombs[case]
    assert res["code"] == 2, res
    lines = res["stderr"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), res["stderr"]
    assert option in lines[0], lines[0]
    assert "Traceback" not in res["output"] + res["stderr"]
    assert not out.exists()  # refused before the run folder was claimed (or it was given back)


def test_the_bounds_say_the_allowed_range(bombs):
    """The one line says what is allowed, not only that the value is wrong."""
    assert f"{MAX_SEEDS}" in bombs["seeds-train"][0]["stderr"]
    assert f"{MAX_LR:g}" in bombs["lr-train"][0]["stderr"]
    assert "GiB" in bombs["coord-deep"][0]["stderr"]
    for case in ("d-model-variance", "seq-len-variance", "batch-variance", "vocab-variance", "steps-train"):
        assert "GiB" in bombs[case][0]["stderr"], case
    assert "1 PiB" in bombs["d-model-sweep"][0]["stderr"]  # a sweep's points may run elsewhere
    assert f"{MAX_LAYERS:,}" in bombs["layers-variance"][0]["stderr"]
    if HAS_HF:
        assert f"{MAX_HF_EXPERTS:,}" in bombs["hf-experts-default"][0]["stderr"]
    threads = bombs["threads-env"][0]["stderr"]
    assert "from 1 to" in threads and "OMP_NUM_THREADS" in threads


# --- the library refuses the same, before building anything ------------------------------


def test_library_seed_and_batch_counts_are_bounded_before_any_list_exists():
    """10**12 seeds or batches are refused before a list of them is made: the calls
    allocate next to nothing (a list of 10**12 seeds would be 8 TB; before the bound,
    it filled memory)."""
    import tracemalloc

    from tinit.experiments.measure.depth_sweep import run_depth_sweep
    from tinit.experiments.measure.grad_norms import run_grad_norms
    from tinit.experiments.training.claims import ClaimsConfig
    from tinit.model.config import ModelConfig, RunConfig

    tiny = ModelConfig(n_layers=1, d_model=16, n_heads=2, vocab_size=32)
    run = RunConfig(batch=1, seq_len=4, device="cpu")
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="10,000") as exc:
            run_depth_sweep(tiny, run=run, layers="1", seeds=10**12)
        assert exc.value.field == "seeds"
        with pytest.raises(ConfigError) as exc:
            run_grad_norms(tiny, run=run, batches=10**12)
        assert exc.value.field == "batches"
        with pytest.raises(ConfigError) as exc:
            ClaimsConfig(seeds=10**12)
        assert exc.value.field == "seeds"
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, peak  # (the imports of a first call included)


@pytest.mark.parametrize("shape", [
    {"n_layers": 2, "d_model": 64, "n_heads": 4, "vocab_size": 512},
    {"n_layers": 6, "d_model": 32, "n_heads": 2, "vocab_size": 64, "norm_position": "post"},
    {"n_layers": 3, "d_model": 48, "n_heads": 3, "vocab_size": 8000, "ffn": "gelu"},
])  # fmt: skip
def test_the_memory_pre_check_is_a_lower_bound(shape):
    """What the pre-check refuses on never exceeds what a built backward holds, counted
    independently on the meta device (memory.gradient_pass_bytes: autograd's saved
    storages): the layer-wise backward's least, and the forward's, are at most that."""
    import torch

    from tinit.experiments.memory import gradient_pass_bytes, least_bytes
    from tinit.model.config import InitConfig, ModelConfig

    cfg, init = ModelConfig(max_seq_len=32, **shape), InitConfig()
    counted = gradient_pass_bytes(cfg, init, 4, 32, torch.float32)
    for backward in (False, True):
        least = sum(least_bytes(cfg, init, 4, 32, torch.float32, backward).values())
        assert 0 < least <= counted, (backward, least, counted)


def test_library_layers_are_bounded():
    from tinit.model.config import ModelConfig

    with pytest.raises(ConfigError) as exc:
        ModelConfig(n_layers=MAX_LAYERS + 1)
    assert exc.value.field == "n_layers"
    assert ModelConfig(n_layers=MAX_LAYERS).n_layers == MAX_LAYERS


@pytest.mark.parametrize("lr", [1e300, float("inf"), float("nan"), 0.0, -1.0, MAX_LR * 1.01])
def test_library_learning_rates_are_bounded(lr):
    from tinit.experiments.training.coord_check import CoordConfig
    from tinit.experiments.training.trainer import TrainConfig

    for make in (lambda: TrainConfig(lr=lr), lambda: CoordConfig(lr=lr)):
        with pytest.raises(ConfigError) as exc:
            make()
        assert exc.value.field == "lr"


def test_an_optimizer_group_lr_that_overflows_is_refused_naming_the_scheme(tmp_path):
    """A user's [optimizer] multiplier of 1e300: the group's lr overflowed float32 inside
    Adam's first step (an internal error); now optimizer_groups refuses it."""
    from tinit.model.config import InitConfig, ModelConfig
    from tinit.model.param_rules import optimizer_groups
    from tinit.model.scheme_file import load_scheme
    from tinit.model.transformer import Transformer

    path = tmp_path / "s.toml"
    path.write_text('name = "huge-lr"\n[optimizer.hidden_matrix]\nlr = "1e300"\n')
    scheme = load_scheme(path)
    init = InitConfig("huge-lr", schemes=(scheme,))
    net = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, vocab_size=32), init)
    with pytest.raises(ConfigError, match="hidden_matrix") as exc:
        optimizer_groups(net, init, lr=1e-2)
    assert exc.value.field == "init_file"
    assert optimizer_groups(net, init, lr=1e-2, rules=False)  # without the rules: one ordinary lr


# --- the user-file guard -------------------------------------------------------------------


def test_user_file_guard(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    loop = tmp_path / "a"
    loop.symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(loop)
    cases = [(fifo, "FIFO"), (loop, "symlink loop"), (tmp_path, "directory"),
             (Path("/dev/zero"), "character device"), (tmp_path / "none", "no such file")]  # fmt: skip
    for path, words in cases:
        with pytest.raises(UserFileError, match=words):
            read_text(path)
    ok = tmp_path / "ok.toml"
    ok.write_text("a = " + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "\n")
    with pytest.raises(UserFileError, match="nested deeper"):
        load_toml(ok)  # the document's table is a level too
    ok.write_text("a = " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n")
    assert load_toml(ok)["a"]
    (tmp_path / "x.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(UserFileError, match="nested deeper"):
        load_json(tmp_path / "x.json")
    (tmp_path / "y.json").write_bytes(b"\xff\xfe")
    with pytest.raises(UserFileError, match="not UTF-8"):
        load_json(tmp_path / "y.json")
    exact = tmp_path / "exact.toml"
    exact.write_text("#" * (MAX_TEXT_BYTES - 1) + "\n")
    assert read_text(exact).endswith("\n")
    exact.write_text("#" * MAX_TEXT_BYTES + "\n")
    with pytest.raises(UserFileError, match="larger than"):
        read_text(exact)


def test_a_proc_file_that_says_size_0_is_read_only_up_to_the_bound():
    """/proc files report st_size 0: the read itself is bounded (here a small one reads)."""
    assert "Name:" in read_text("/proc/self/status")


# --- SIGHUP to a local sweep's process group ----------------------------------------------


def _group(pgid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(d.name))
    return out


def test_sighup_to_a_sweeps_process_group_prints_no_traceback(tmp_path):
    """Closing the terminal sends SIGHUP to the whole group: multiprocessing's resource
    tracker died of it, and the one relaunched printed five KeyError tracebacks. Now the
    sweep ends as a signal does elsewhere: one message, exit 1, the finished points kept,
    marked incomplete, and no process of the group left."""
    out = tmp_path / "run"
    args = ["sweep", "depth-sweep", *M, "--layers", "1,2,3,4", "--seeds", "3", "--no-grads", "--workers", "2",
            "-q", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    # the group's SIGHUP as the second point is done (10 still to run): sent by the sweep's
    # own process to its group, as the terminal would send it
    proc, stdout, stderr = signalled_run(args, env, "SIGHUP", "sweep", 2, group=True, cwd=ROOT,
                                         start_new_session=True, preexec_fn=_cap)  # fmt: skip
    try:
        _check_sighup(proc, stdout, stderr, out)
    finally:
        for pid in _group(proc.pid):  # (a failed check leaves none behind either)
            os.kill(pid, signal.SIGKILL)


def _check_sighup(proc, stdout: str, stderr: str, out: Path) -> None:
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr and "resource_tracker" not in stderr, stderr
    assert "stopped by SIGHUP" in stderr and stdout.strip() == str(out)
    assert f"tinit sweep --resume {out}" in stderr
    doc = json.loads((out / "config.json").read_text())
    assert doc["complete"] is False and doc["error"].startswith("stopped by SIGHUP")
    counts = doc["sweep"]["counts"]
    assert counts["queued"] == counts["running"] == 0 and counts["done"] >= 2 and counts["failed"] > 0
    # the finished points merged: a row each, and the figure
    assert (out / "depth_sweep.csv").read_text().count("\n") - 1 == counts["done"]
    assert (out / "depth_sweep.png").is_file()
    # the group's last processes (the resource tracker) end once the sweep's pipes close;
    # the wait is only a guard against a hang
    deadline = time.monotonic() + 120
    while _group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _group(proc.pid), "processes of the sweep's group outlived it"
