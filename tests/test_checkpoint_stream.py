"""`tinit audit --checkpoint` at scale (issue 45): what is read and how.

- the reads (whole tensors into a reused buffer, a batch's embedding rows, row chunks of
  a table) give the values safetensors' own ``load_file`` gives, for every float dtype;
- a shard shorter than its header says (a partial download) is refused before anything
  is measured, one line naming the file and the bytes missing; a folder holding a file
  still being written says so;
- a file that changes while the audit reads it stops the run there: the checkpoints
  measured before it are kept, config.json says incomplete and names the file, exit 1;
- the embedding read by rows: a Gemma 3 model (its embedding scales its rows by sqrt(d)
  and has a padding row) streamed block by block gives the stream of the model's own
  forward with ``output_hidden_states`` (Llama and GPT-2: tests/test_checkpoint_hf.py);
- ``--spectral off`` leaves the spectral norms empty (not applicable, not NaN), a bad
  value is one line, and config.json records the method, the memory plan and the bytes
  read; the progress callback gets the blocks, the bytes and the rate.
"""

import json
import os
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import assert_one_line_error, skip_module_without, tiny
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from tinit.cli import app
from tinit.experiments.audit.sources import find_checkpoints
from tinit.experiments.audit.tensors import CheckpointError, TensorFiles, _pread
from tinit.experiments.audit.trained import run_checkpoint_audit
from tinit.experiments.result import InputChanged
from tinit.model.config import RunConfig

runner = CliRunner()
CPU = torch.device("cpu")


def _file(tmp_path):
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "a": torch.randn(37, 11, generator=gen).to(torch.bfloat16),
        "b": torch.randn(5, 3, generator=gen).to(torch.float16),
        "c": torch.randn(7, generator=gen, dtype=torch.float64),
        "d": torch.randn(300, 64, generator=gen),
        "e": torch.tensor(2.5),
    }
    f = tmp_path / "t.safetensors"
    save_file(tensors, str(f))
    return f, load_file(str(f))


def test_reads_equal_safetensors_own(tmp_path):
    f, ref = _file(tmp_path)
    files = TensorFiles.single(f)
    raw = torch.empty(files.staged_bytes(ref), dtype=torch.uint8)
    got = files.read_into(list(ref), raw)
    for k, t in ref.items():
        assert got[k].dtype == t.dtype and torch.equal(got[k], t), k
        assert torch.equal(files.read([k], torch.float64, CPU)[k], t.double())
    rows = torch.tensor([0, 3, 36])
    assert torch.equal(files.read_rows("a", rows), ref["a"][rows])
    for key in ("a", "d", "c"):
        parts = [c.clone() for c in files.row_chunks(key, torch.float32, CPU, chunk_bytes=100)]
        assert (len(parts) > 1) == (key != "c") and torch.equal(torch.cat(parts), ref[key].float())
    assert files.bytes_read > 0


def test_a_changed_or_truncated_file_is_never_mixed(tmp_path):
    f, ref = _file(tmp_path)
    files = TensorFiles.single(f)
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # rewritten since its header was read
    with pytest.raises(InputChanged, match="changed while the audit read it"):
        files.read(["a"], torch.float32, CPU)
    short = tmp_path / "short"
    short.write_bytes(b"x" * 10)
    fd = os.open(short, os.O_RDONLY)
    try:
        with pytest.raises(InputChanged, match="ended 6 bytes early"):
            _pread(fd, torch.empty(16, dtype=torch.uint8), 0, short)
    finally:
        os.close(fd)


# --- Hugging Face folders --------------------------------------------------------------------


def _saved(config, path, seed: int, shard: str, perturb: float = 0.0):
    """The causal LM of ``config`` drawn at ``seed`` (its weights moved by ``perturb``
    times N(0, 1) noise: norms off 1, biases off 0), saved to ``path`` in shards."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(config).eval()
        if perturb:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(perturb * torch.randn_like(p))
        model.save_pretrained(path, max_shard_size=shard)
    return model


def _llama_folder(path, layers=3, shard="30KB"):
    skip_module_without("transformers")
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=50,
        max_position_embeddings=32,
    )
    return _saved(config, path, 0, shard)


def test_partial_download_refused_in_one_line(tmp_path):
    folder = tmp_path / "m"
    _llama_folder(folder)
    shard = sorted(folder.glob("model-*.safetensors"))[-1]
    data = shard.read_bytes()
    shard.write_bytes(data[:-1000])
    out = tmp_path / "out"
    res = runner.invoke(app, ["audit", "--checkpoint", str(folder), "--seq-len", "8", "--out", str(out)])
    assert_one_line_error(res, "--checkpoint", out)
    assert shard.name in res.stderr and "1,000 missing (a partial download" in res.stderr


def test_folder_still_being_written(tmp_path):
    folder = tmp_path / "m"
    _llama_folder(folder, shard="10GB")
    (folder / "model.safetensors").rename(folder / ".tmpA1b2C3")  # safetensors' save before its rename
    with pytest.raises(CheckpointError, match=r"\.tmpA1b2C3 looks like a file still being written"):
        find_checkpoints(folder)


def test_a_file_changed_mid_audit_keeps_what_was_measured(tmp_path, monkeypatch):
    """Two runs' folders in one tinit train folder: the second's checkpoint is rewritten
    after its header was read; the first run's rows are kept, the run says why, exit 1."""
    train = tmp_path / "train"
    res = runner.invoke(
        app,
        ["train", *tiny(2, vocab="16"), "--eval-batches", "1", "--init", "naive,gpt2", "--pre-norm",
         "--steps", "2", "--save-steps", "final", "--out", str(train)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    found = find_checkpoints(train)
    assert len(found.checkpoints) == 2
    second = found.checkpoints[1].path
    import tinit.experiments.audit.trained as trained

    calls = []
    real = trained.random_tokens

    def tokens(*args):
        calls.append(1)
        if len(calls) == 2:  # the second checkpoint's headers are read: now its weights change
            st = second.stat()
            os.utime(second, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        return real(*args)

    monkeypatch.setattr(trained, "random_tokens", tokens)
    out = tmp_path / "audit"
    res = runner.invoke(app, ["audit", "--checkpoint", str(train), "--seq-len", "8", "--batch", "2", "--out",
                              str(out)])  # fmt: skip
    assert res.exit_code == 1, res.output
    config = json.loads((out / "config.json").read_text())
    assert config["complete"] is False and str(second) in config["error"] and "changed" in config["error"]
    variance = pd.read_csv(out / "variance.csv")
    assert list(variance["run"].unique()) == [found.checkpoints[0].run] and len(variance) == 5
    assert "Traceback" not in res.output


def _hidden_state_vars(model, ids):
    with torch.no_grad():
        hs = model(ids, output_hidden_states=True).hidden_states
    return [float(h.double().var(unbiased=False)) for h in hs]


def test_gemma_scaled_embedding_read_by_rows(tmp_path):
    """Gemma 3: the embedding module multiplies its rows by sqrt(d) and has padding_idx 0;
    read by rows (a 5-row table for these ids), its output is the full table's."""
    skip_module_without("transformers")
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        vocab_size=64,
        max_position_embeddings=32,
        sliding_window=4,
        pad_token_id=0,
    )
    model = _saved(config, tmp_path, 1, "20KB", perturb=0.05)
    from tinit.experiments.audit.trained import random_tokens

    res = run_checkpoint_audit(find_checkpoints(tmp_path), RunConfig(batch=2, seq_len=12), CPU, torch.float32)
    got = res["variance"].sort_values("k")["stream_var"].to_numpy(float)
    ids = random_tokens(64, 12, 2, 0, "cpu")
    ref = _hidden_state_vars(model, ids)[:3]  # the inputs of blocks 0..2
    np.testing.assert_allclose(got[0:6:2], ref, rtol=1e-5)
    assert res.meta["stream_check_max_rel_err"] < 1e-4


def test_spectral_off_exact_and_what_config_json_records(tmp_path):
    folder = tmp_path / "m"
    _llama_folder(folder)
    outs = {}
    for method in ("off", "exact"):
        outs[method] = tmp_path / method
        res = runner.invoke(app, ["audit", "--checkpoint", str(folder), "--seq-len", "8", "--batch", "2",
                                  "--spectral", method, "--out", str(outs[method])])  # fmt: skip
        assert res.exit_code == 0, res.output
        assert "Memory: peak" in res.output and "one block converted" in res.output
    drift = pd.read_csv(outs["off"] / "drift.csv", keep_default_na=False)
    matrices = drift["shape"].str.contains("x")
    assert (drift.loc[matrices, "spectral_method"] == "off").all() and (drift["spectral_norm"] == "").all()
    # a vector has no spectral norm, off or not: empty ("not applicable") in the blocks
    # as outside them (the blocks' norm gains said "off", the final norm's nothing)
    assert (drift.loc[~matrices, "spectral_method"] == "").all() and (~matrices).sum() >= 7
    exact = pd.read_csv(outs["exact"] / "drift.csv")
    assert (exact.loc[exact["shape"].str.contains("x"), "spectral_method"] == "exact").all()
    config = json.loads((outs["exact"] / "config.json").read_text())
    assert config["spectral"]["method"] == "exact" and config["spectral"]["counts"]["exact"] == matrices.sum()
    assert config["bytes_read"] >= config["bytes_total"] > 0
    mem = config["memory"]
    assert mem["predicted_gib"] >= mem["arena_gib"] + mem["staging_gib"] > 0
    res = runner.invoke(app, ["audit", "--checkpoint", str(folder), "--spectral", "svd"])
    assert_one_line_error(res, "--spectral")
    res = runner.invoke(app, ["audit", "--hf", "llama", "--spectral", "off"])
    assert_one_line_error(res, "--spectral")


def test_progress_counts_blocks_bytes_and_rate(tmp_path):
    folder = tmp_path / "m"
    _llama_folder(folder, layers=4)
    seen = []
    run_checkpoint_audit(
        find_checkpoints(folder),
        RunConfig(batch=1, seq_len=8),
        CPU,
        torch.float32,
        progress=lambda done, total, detail=None: seen.append((done, total, detail)),
    )
    assert [d for d, _, _ in seen] == list(range(1, 6)) and {t for _, t, _ in seen} == {5}
    assert "embedding, head" in seen[0][2] and "block 4/4" in seen[-1][2]
    assert "GiB read" in seen[-1][2] and "blocks/s" in seen[-1][2]
    two = []  # a (done, total) callback still works
    run_checkpoint_audit(find_checkpoints(folder), RunConfig(batch=1, seq_len=8), CPU, torch.float32,
                         progress=lambda done, total: two.append(done))  # fmt: skip
    assert two == list(range(1, 6))


@pytest.mark.parametrize(
    ("w", "want"),
    [(torch.randn(64, 32), 0.0), (torch.zeros(5), float("nan")), (torch.full((7,), 1.0), 0.0),
     (torch.tensor([1.0, float("nan")]), float("nan")), (torch.tensor([1.0, float("inf")]), float("nan"))],
    ids=["matrix", "zeros", "ones", "nan", "inf"],
)  # fmt: skip
def test_a_step_0_checkpoint_against_itself_needs_no_pass(w, want):
    """The change of a tensor from itself, from its moments alone: what ||W - W||/||W||
    gives where it is a number (0; NaN for a zero tensor), and NaN (flagged) where W is
    not finite (the pass over W - W gave 0 for an infinity, NaN for a NaN)."""
    from tinit.experiments.audit.weights import Moments, weight_row

    m = Moments()
    m.add(w)
    np.testing.assert_equal(m.change_from_itself, want)
    np.testing.assert_equal(weight_row("w", w, None, float("nan"), "off", same=True)["rel_change"], want)
    if want == 0.0:  # the pass it saves says the same
        np.testing.assert_equal(weight_row("w", w, w.clone(), float("nan"), "off")["rel_change"], 0.0)
