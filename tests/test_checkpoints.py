"""Checkpoints of `tinit train` and their audit (issue 32): the files written (atomic,
a JSON beside each, no pickle), the step-0 checkpoint audited giving `tinit variance`'s
numbers for the same model and tokens, drift and spectral norms against an independent
computation from the files, and every bad checkpoint refused in one line."""

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tinit.experiments.audit.sources import find_checkpoints
from tinit.experiments.audit.tensors import CheckpointError
from tinit.experiments.audit.trained import run_checkpoint_audit
from tinit.experiments.measure.variance import run_variance
from tinit.experiments.training.data import load_data
from tinit.experiments.training.grid import TrainGrid
from tinit.experiments.training.saving import parse_save_steps
from tinit.experiments.training.train import run_train
from tinit.experiments.training.trainer import TrainConfig
from tinit.model.config import ConfigError, InitConfig, ModelConfig, RunConfig
from tinit.model.transformer import Transformer
from tinit.results.checkpoints import CheckpointWriter

CPU = torch.device("cpu")
MODEL = ModelConfig(n_layers=3, d_model=32, n_heads=2, vocab_size=64)
AUDIT_RUN = RunConfig(batch=2, seq_len=16)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two runs (gpt2 pre, naive post) of 12 steps, saved at 0, 6 and the last step."""
    d = tmp_path_factory.mktemp("run")
    writer = CheckpointWriter(d)
    data = load_data("markov", vocab=64, seq_len=16, batch=8, seed=0)
    listed = []
    for scheme, position in (("gpt2", "pre"), ("naive", "post")):
        grid = TrainGrid(MODEL, InitConfig(seed=3), RunConfig(device="cpu"), TrainConfig(steps=12, warmup=2),
                         data, [scheme], [position], [3], [3])  # fmt: skip
        res = run_train(grid, on_checkpoint=writer, save_steps="0,6,final")
        listed += res.meta["checkpoints"]
    return d, listed, writer


def _info(path):
    return json.loads(path.with_suffix(".json").read_text())


def test_save_steps_parsed_and_bounded():
    assert parse_save_steps("0,100,final", 300) == [0, 100, 300]
    assert parse_save_steps("final,5", 10) == [5, 10]
    assert parse_save_steps(None, 10) == parse_save_steps([], 10) == []
    assert parse_save_steps([0, "final"], 10) == [0, 10]
    # (issue 41: "" saved nothing without a word; "last", a fullwidth digit, "1_0" and "+5" were read)
    for bad, word in (("0,11", "outside 0..10"), ("1,1", "twice"), ("x", "not a step"), ("-1", "not a step"),
                      ("2.5", "not a step"), ("", "names no step"), (" ", "names no step"),
                      ("last", "not a step"), ("\uff11", "not a step"), ("1_0", "not a step"),
                      ("+5", "not a step"), ("0,", "not a step"), ([True], "not a step")):  # fmt: skip
        with pytest.raises(ConfigError, match=word) as exc:
            parse_save_steps(bad, 10)
        assert exc.value.field == "save_steps"


def test_checkpoint_files_listed_and_complete(trained):
    d, listed, writer = trained
    assert len(listed) == 2 * 3 and [e["step"] for e in listed[:3]] == [0, 6, 12]
    for e in listed:
        f = d / e["file"]
        assert f.stat().st_size == e["bytes"] and (d / e["json"]).is_file()
        info = _info(f)
        assert info["step"] == e["step"] and info["init"]["seed"] == 3 and info["model"]["n_layers"] == 3
    # no temporary file left behind, and nothing but safetensors and JSON
    names = {p.name for p in (d / "checkpoints").rglob("*") if p.is_file()}
    assert all(n.endswith((".safetensors", ".json")) and not n.startswith(".") for n in names)
    # the step-0 file holds the weights a fresh model of the same config and seed draws
    first = d / listed[0]["file"]
    info = _info(first)
    cfg = ModelConfig(**{**info["model"], "user_set": tuple(info["model"]["user_set"])})
    fresh = Transformer(cfg, InitConfig(scheme=info["init"]["scheme"], seed=3)).state_dict()
    stored = load_file(first)
    assert set(stored) == set(fresh)
    assert all(torch.equal(stored[k], fresh[k]) for k in fresh)
    with pytest.raises(OSError, match="never overwritten"):
        writer(0, listed[0]["run"], fresh, {})


def assert_step0_is_variance(found, ck, run=AUDIT_RUN, schemes=()):
    """The audit of ``found`` gives, for its step-0 checkpoint ``ck``, the stream variances
    `tinit variance` gives for the model and scheme of ``ck``'s JSON on the same tokens
    (the run's seed): to float precision, at every one of the 2L + 1 points (``schemes``:
    the user's, for an --init-file run). Returns the audit's variance frame and the reference's."""
    res = run_checkpoint_audit(found, run, CPU, torch.float32)
    cfg = ModelConfig(**{**ck.info["model"], "user_set": tuple(ck.info["model"]["user_set"])})
    scheme, seed = ck.info["init"]["scheme"], ck.info["init"]["seed"]
    ref = run_variance(cfg, InitConfig(scheme=scheme, seed=seed, schemes=schemes), run, inits=[scheme],
                       norm_positions=[cfg.norm_position])  # fmt: skip
    got = res["variance"]
    got = got[(got["run"] == ck.run) & (got["step"] == 0)].sort_values("k")
    want = ref["variance"].sort_values("k")
    assert len(got) == 2 * cfg.n_layers + 1
    for col in ("stream_var", "branch_var", "pred_cumulative", "pred_closed"):
        np.testing.assert_allclose(
            got[col].to_numpy(float), want[col].to_numpy(float), rtol=1e-6, equal_nan=True
        )
    return res["variance"], want


@pytest.mark.parametrize("scheme,position", [("gpt2", "pre"), ("naive", "post")])
def test_step0_audit_gives_variance_numbers(trained, scheme, position):
    """Done-when: the step-0 checkpoint, audited, gives `tinit variance`'s stream variances
    for the same model and tokens."""
    found = find_checkpoints(trained[0])
    ck = next(c for c in found.checkpoints if c.step == 0 and c.run.startswith(f"{scheme}-{position}-"))
    variance, want = assert_step0_is_variance(found, ck)
    # the later steps moved: their stream is not the init's
    later = variance[(variance["run"] == ck.run) & (variance["step"] == 12)]
    assert not np.allclose(
        later.sort_values("k")["stream_var"].to_numpy(float), want["stream_var"].to_numpy(float)
    )


#: A user's scheme whose branch multiplier acts in the forward: an audit that rebuilt any
#: other scheme would measure another stream.
HALFWAY = (
    'name = "halfway"\ndescription = "o by layer, down truncated"\nbranch_mult = "0.5"\n[roles]\n'
    'o = "sigma / sqrt(2 * (l + 1))"\ndown = { std = "sigma / (2 * L)", dist = "trunc", bound = "2 * std" }\n'
)


def test_init_file_scheme_travels_with_its_checkpoints(tmp_path):
    """An --init-file run's checkpoints carry the scheme's TOML text: with the file gone,
    the step-0 audit gives `tinit variance --init-file` of that file (the scheme read from
    it independently of the checkpoint), and drift's expected_std is the file's formula.
    A checkpoint whose text is missing or does not parse is refused in one line."""
    from tinit.model.scheme_file import load_scheme

    toml = tmp_path / "halfway.toml"
    toml.write_text(HALFWAY)
    scheme = load_scheme(toml)
    data = load_data("markov", vocab=64, seq_len=16, batch=8, seed=0)
    init, tcfg = InitConfig(seed=3, schemes=(scheme,)), TrainConfig(steps=2, warmup=1)
    grid = TrainGrid(MODEL, init, RunConfig(device="cpu"), tcfg, data, ["halfway"], ["pre"], [3], [3])
    run_train(grid, on_checkpoint=CheckpointWriter(tmp_path / "run"), save_steps="0,final")
    toml.unlink()
    found = find_checkpoints(tmp_path / "run")
    ck = found.checkpoints[0]
    assert ck.step == 0 and ck.info["init"]["schemes"][0]["toml"] == HALFWAY
    assert_step0_is_variance(found, ck, schemes=(scheme,))
    drift = run_checkpoint_audit(found, AUDIT_RUN, CPU, torch.float32)["drift"]
    o = drift[(drift["role"] == "o") & (drift["step"] == 2)].set_index("layer")["expected_std"]
    assert [o[i] for i in range(3)] == pytest.approx([0.02 / np.sqrt(2 * (i + 1)) for i in range(3)])
    sidecar = ck.path.with_suffix(".json")
    bad = 'name = "halfway"\n[roles]\no = "sigma +"\n'
    for text, word in (("", "does not carry"), (bad, "does not parse"),
                       (HALFWAY.replace("halfway", "other"), "declares 'other'")):  # fmt: skip
        info = json.loads(sidecar.read_text())
        info["init"]["schemes"][0]["toml"] = text
        sidecar.write_text(json.dumps(info))
        with pytest.raises(CheckpointError, match=word) as exc:
            run_checkpoint_audit(find_checkpoints(ck.path), AUDIT_RUN, CPU, torch.float32)
        assert "\n" not in exc.value.message


def test_drift_and_spectral_norm_from_the_files(trained, tmp_path):
    """rel_change and spectral norm against numpy on the stored tensors; the seed's rebuilt
    init (no step-0 checkpoint) gives the same drift as the step-0 checkpoint."""
    d = trained[0]
    run = next(p for p in (d / "checkpoints").iterdir() if p.name.startswith("gpt2-pre-"))
    res = run_checkpoint_audit(find_checkpoints(run), AUDIT_RUN, CPU, torch.float32)
    drift = res["drift"].set_index(["step", "param"])
    w0 = load_file(run / "step-000000.safetensors")
    w = load_file(run / "step-000012.safetensors")
    for name in ("blocks.1.attn.o.weight", "blocks.2.ffn.down.weight", "embed.weight"):
        a, b = w[name].double().numpy(), w0[name].double().numpy()
        row = drift.loc[(12, name)]
        assert row["rel_change"] == pytest.approx(np.linalg.norm(a - b) / np.linalg.norm(b), rel=1e-9)
        assert row["spectral_norm"] == pytest.approx(np.linalg.norm(a, 2), rel=1e-9)
        assert row["std"] == pytest.approx(a.std(), rel=1e-9)
        assert drift.loc[(0, name)]["rel_change"] == 0.0
    assert res.meta["init_source"][run.name] == "checkpoint"
    # without the step-0 checkpoint: the init rebuilt from the run's seed
    alone = tmp_path / run.name
    alone.mkdir()
    for n in ("step-000012.safetensors", "step-000012.json"):
        shutil.copy(run / n, alone / n)
    seed_res = run_checkpoint_audit(find_checkpoints(alone), AUDIT_RUN, CPU, torch.float32)
    assert seed_res.meta["init_source"][run.name] == "seed"
    a = seed_res["drift"].set_index("param")["rel_change"]
    b = res["drift"][res["drift"]["step"] == 12].set_index("param")["rel_change"]
    np.testing.assert_allclose(a.loc[b.index].to_numpy(float), b.to_numpy(float), rtol=1e-12, equal_nan=True)
    # the per-checkpoint table: v_2L/v0 now against the run's first checkpoint
    table = res["checkpoints"].set_index("step")
    v = res["summary"].set_index("step")["v_final_rel"]
    assert table.loc[12, "v_final_rel"] == v.loc[12] and table.loc[12, "v_final_rel_first"] == v.loc[0]
    assert 1 <= table.loc[12, "fastest_k"] <= 6


# --- bad input: one line naming the file and what is wrong -----------------------------------


def _one_ckpt(trained, tmp_path):
    """A copy of one step-6 checkpoint (weights + JSON) to damage."""
    d = trained[0]
    run = next(p for p in (d / "checkpoints").iterdir() if p.name.startswith("gpt2-pre-"))
    for n in ("step-000006.safetensors", "step-000006.json"):
        shutil.copy(run / n, tmp_path / n)
    return tmp_path / "step-000006.safetensors"


def _refused(path, match, hf=None):
    with pytest.raises(CheckpointError, match=match) as exc:
        found = find_checkpoints(path, hf)
        run_checkpoint_audit(found, AUDIT_RUN, CPU, torch.float32)
    msg = exc.value.message
    assert "\n" not in msg and exc.value.field in ("--checkpoint", "--hf")
    return msg


def test_truncated_and_corrupt_files(trained, tmp_path):
    f = _one_ckpt(trained, tmp_path)
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    assert str(f) in _refused(f, "truncated or corrupt")
    f.write_bytes(b"\x00" * 64)
    _refused(f, "truncated or corrupt")
    f.write_bytes(b"")
    _refused(f, "truncated or corrupt")


def _rewrite(f, change):
    tensors = load_file(f)
    change(tensors)
    save_file(tensors, str(f))


def test_missing_extra_shape_dtype(trained, tmp_path):
    f = _one_ckpt(trained, tmp_path)
    _rewrite(f, lambda t: t.pop("blocks.2.ffn.up.weight"))
    assert "missing blocks.2.ffn.up.weight" in _refused(f, "missing")
    f = _one_ckpt(trained, tmp_path)
    _rewrite(f, lambda t: t.update(extra=torch.zeros(3)))
    _refused(f, "has extra, which the tinit model")
    f = _one_ckpt(trained, tmp_path)
    _rewrite(f, lambda t: t.update({"blocks.0.attn.q.weight": torch.zeros(32, 16)}))
    _refused(f, r"blocks.0.attn.q.weight has shape \[32, 16\], the tinit model .* needs \[32, 32\]")
    f = _one_ckpt(trained, tmp_path)
    _rewrite(f, lambda t: t.update({"embed.weight": torch.zeros(64, 32, dtype=torch.int32)}))
    _refused(f, "embed.weight is I32; the model takes floating point")
    # no JSON beside a lone file, and no --hf
    f = _one_ckpt(trained, tmp_path)
    f.with_suffix(".json").unlink()
    _refused(f, "no step-000006.json beside it")


def test_folder_without_config_and_missing_shard(tmp_path):
    (tmp_path / "empty").mkdir()
    _refused(tmp_path / "empty", "no config.json")
    (tmp_path / "pickled").mkdir()
    (tmp_path / "pickled" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"x")
    _refused(tmp_path / "pickled", "is a pickle, which tinit never loads")
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"a": torch.zeros(2)}, str(sharded / "model-00001-of-00002.safetensors"))
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    msg = _refused(sharded, "names shard model-00002-of-00002.safetensors, which does not exist")
    assert "model.safetensors.index.json" in msg


def test_a_failed_write_leaves_no_partial_checkpoint(tmp_path, monkeypatch):
    """A write that fails half-way (a full disk, a signal turned into an exception) leaves
    neither a file under its final name nor its temporary file; earlier checkpoints stay."""
    import safetensors.torch as st

    writer = CheckpointWriter(tmp_path)
    state = {"w": torch.ones(4, 4)}
    first = writer(0, "run", state, {"model": {}, "init": {}})
    real = st.save_file

    def half(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:
            f.truncate(10)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(st, "save_file", half)
    with pytest.raises(OSError, match="No space left"):
        writer(5, "run", state, {"model": {}, "init": {}})
    folder = tmp_path / "checkpoints" / "run"
    assert sorted(p.name for p in folder.iterdir()) == ["step-000000.json", "step-000000.safetensors"]
    assert torch.equal(load_file(tmp_path / first["file"])["w"], state["w"])
    assert len(writer.written) == 1
