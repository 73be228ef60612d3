"""`tinit audit --checkpoint` on Hugging Face folders (issue 32, done-when): tiny Llama
and GPT-2 models built from configs (no download), saved by ``save_pretrained`` in many
shards, audited block by block; the stream variance at every block boundary
(k = 0, 2, ..., 2L - 2) and after the last addition (k = 2L) reproduced by an
independent forward of the model itself with ``output_hidden_states=True`` (for k = 2L:
the same model with its final norm replaced by the identity, so its last hidden state is
the stream before the norm)."""

import copy
import json
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import skip_module_without

skip_module_without("transformers")

from tinit.experiments.audit.sources import find_checkpoints  # noqa: E402
from tinit.experiments.audit.tensors import CheckpointError  # noqa: E402
from tinit.experiments.audit.trained import random_tokens, run_checkpoint_audit  # noqa: E402
from tinit.model.config import RunConfig  # noqa: E402

V, L = 100, 4
FAMILIES = ("gpt2", "llama")


def configs() -> dict:
    """family -> (config, its final norm's name); transformers is imported when a test
    runs, not when the module is collected."""
    from transformers import GPT2Config, LlamaConfig

    return {
        "llama": (LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=L,
                              num_attention_heads=4, num_key_value_heads=2, vocab_size=V,
                              max_position_embeddings=64), "model.norm"),
        "gpt2": (GPT2Config(n_embd=64, n_layer=L, n_head=4, vocab_size=V, n_positions=64, bos_token_id=0,
                            eos_token_id=0), "transformer.ln_f"),
    }  # fmt: skip


def from_config(config):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(config)


def _variances(model, ids) -> list[float]:
    with torch.no_grad():
        hs = model(ids, output_hidden_states=True).hidden_states
    return [float(h.double().var(unbiased=False)) for h in hs]


@pytest.mark.parametrize("family", FAMILIES)
def test_sharded_hf_folder_matches_hidden_states(family, tmp_path):
    config, final_norm = configs()[family]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = from_config(config).eval()
        with torch.no_grad():  # a "trained" model: weights away from the init, norm gains not 1
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        model.save_pretrained(tmp_path, max_shard_size="40KB")
    shards = list(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > L and (tmp_path / "model.safetensors.index.json").is_file()
    cpu = torch.device("cpu")
    res = run_checkpoint_audit(find_checkpoints(tmp_path), RunConfig(batch=2, seq_len=16), cpu, torch.float32)
    got = res["variance"].sort_values("k")["stream_var"].to_numpy(float)
    assert len(got) == 2 * L + 1
    ids = random_tokens(V, 16, 2, 0, "cpu")
    boundaries = _variances(model, ids)[:L]  # the inputs of blocks 0..L-1: k = 0, 2, ..., 2L - 2
    np.testing.assert_allclose(got[0 : 2 * L : 2], boundaries, rtol=1e-5)
    bare = copy.deepcopy(model)
    parent, _, leaf = final_norm.rpartition(".")
    setattr(bare.get_submodule(parent), leaf, torch.nn.Identity())
    np.testing.assert_allclose(got[2 * L], _variances(bare, ids)[L], rtol=1e-5)
    # spectral norms of the stored matrices, and no init known (rel_change empty)
    drift = res["drift"].set_index("param")
    name = next(n for n in drift.index if ".0." in n and drift.loc[n, "role"] in ("o", "down"))
    w = dict(model.named_parameters())[name].detach().double().numpy()
    assert drift.loc[name, "spectral_norm"] == pytest.approx(np.linalg.norm(w, 2), rel=1e-6)
    assert drift["rel_change"].isna().all() and res.meta["init_source"][tmp_path.name] == "none"


def test_single_file_with_hf_config_and_wrong_config(tmp_path):
    config, _ = configs()["llama"]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = from_config(config).eval()
        model.save_pretrained(tmp_path / "m")
        config.to_json_file(tmp_path / "config.json")
        wide = copy.deepcopy(config)
        wide.intermediate_size = 256
        wide.to_json_file(tmp_path / "wide.json")
    f = tmp_path / "m" / "model.safetensors"
    small, cpu = RunConfig(batch=1, seq_len=8), torch.device("cpu")
    res = run_checkpoint_audit(find_checkpoints(f, str(tmp_path / "config.json")), small, cpu, torch.float32)
    assert len(res["variance"]) == 2 * L + 1
    with pytest.raises(CheckpointError, match=r"has shape \[128, 64\], the llama model of wide.json needs"):
        run_checkpoint_audit(find_checkpoints(f, str(tmp_path / "wide.json")), small, cpu, torch.float32)


# --- --data with the folder's own tokenizer (offline) -----------------------------------------

WORDS = ("the stream law holds at init and training moves every weight away from its scheme; "
         "depth scaled inits keep the variance flat while naive ones let it grow with depth. ")  # fmt: skip


def _tokenizer_folder(folder, vocab: int):
    """A tiny Llama saved with a BPE tokenizer trained here on WORDS (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    bpe.train_from_iterator([WORDS] * 4, trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]"]))
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         vocab_size=vocab, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = from_config(config).eval()
        model.save_pretrained(folder)
        PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="[UNK]").save_pretrained(folder)
    return model


def test_data_tokenized_by_the_folders_tokenizer(tmp_path):
    """With --data, an HF folder's own tokenizer tokenizes the text: every window the audit
    measured is a run of consecutive ids of the held-out text (its last 10 % of bytes)
    tokenized by the tokenizers library itself, and v_0 is the variance of their embedding."""
    from tokenizers import Tokenizer

    from tinit.experiments.audit.data_tokens import DataTokens, has_tokenizer, load_tokenizer

    folder = tmp_path / "m"
    model = _tokenizer_folder(folder, V)
    text = tmp_path / "text.txt"
    text.write_text(WORDS * 30)
    raw = text.read_bytes()
    held = raw[len(raw) - len(raw) // 10 :].decode()
    want = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(held, add_special_tokens=False).ids
    assert has_tokenizer(folder) and max(want) < 60
    source = DataTokens(str(text), 5, load_tokenizer(folder), folder)
    seen = []

    def tokens(*args):
        seen.append(source(*args))
        return seen[-1]

    res = run_checkpoint_audit(find_checkpoints(folder), RunConfig(batch=3, seq_len=8), torch.device("cpu"),
                               torch.float32, tokens)  # fmt: skip
    ids = seen[-1]
    assert ids.shape == (3, 8)
    runs = {tuple(want[i : i + 8]) for i in range(len(want) - 7)}
    assert all(tuple(row) in runs for row in ids.tolist())
    with torch.no_grad():
        v0 = float(model.get_input_embeddings()(ids).double().var(unbiased=False))
    assert res["variance"].sort_values("k")["stream_var"].iloc[0] == pytest.approx(v0, rel=1e-5)
    assert source.info["tokenizer"]["size"] == 60
    # a nanoGPT .bin holds ids already: no tokenizer applies
    ids_file = tmp_path / "ids.bin"
    np.arange(200, dtype=np.uint16).__mod__(V).astype(np.uint16).tofile(ids_file)
    as_ids = DataTokens(str(ids_file), 5, load_tokenizer(folder), folder)
    assert as_ids.tokenizer is None and as_ids.info["tokens"] == "token ids"


def test_data_tokenizer_on_the_command_line(tmp_path, monkeypatch):
    from helpers import assert_one_line_error
    from typer.testing import CliRunner

    import tinit.cli.runner
    from tinit.cli import app

    real = tinit.cli.runner.write_result  # (the figures are not what is tested here)
    monkeypatch.setattr(
        tinit.cli.runner, "write_result", lambda d, c, r, f, *a, **k: real(d, c, r, lambda _: {}, *a, **k)
    )
    runner = CliRunner()
    text = tmp_path / "text.txt"
    text.write_text(WORDS * 30)
    _tokenizer_folder(tmp_path / "m", V)
    out = tmp_path / "audit"
    res = runner.invoke(app, ["audit", "--checkpoint", str(tmp_path / "m"), "--data", str(text), "--seq-len",
                              "8", "--batch", "2", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    tokens = json.loads((out / "config.json").read_text())["tokens"]
    assert tokens["tokens"] == "tokenizer" and tokens["tokenizer"]["size"] == 60
    assert "tokenized by" in res.output
    # ids at or above the model's vocabulary: one line naming --data, exit 2, no run folder
    _tokenizer_folder(tmp_path / "small", 20)
    res = runner.invoke(app, ["audit", "--checkpoint", str(tmp_path / "small"), "--data", str(text),
                              "--seq-len", "8", "--batch", "2", "--out", str(tmp_path / "x")])  # fmt: skip
    assert_one_line_error(res, "--data", tmp_path / "x")
    assert "vocabulary of 20" in res.stderr


# --- one HF checkpoint on the command line: what its figures and expected_std say ------------

#: initializer_range of the folders below: not tinit's 0.02, so a fallback to 0.02 shows
RANGE = 0.03


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory) -> dict:
    """family -> a folder of that family's model as its own _init_weights draws it at
    initializer_range RANGE (one checkpoint, no step, no init saved)."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for family in FAMILIES:
        config, _ = configs()[family]
        config.initializer_range = RANGE
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from_config(config).save_pretrained(root / family)
        out[family] = root / family
    return out


def _audit(folder, out, *args):
    from helpers import figures_built_not_saved
    from typer.testing import CliRunner

    from tinit.cli import app

    with pytest.MonkeyPatch.context() as mp:
        figures_built_not_saved(mp)
        small = ["--seq-len", "8", "--batch", "2", "--spectral", "off", "--out", str(out)]
        res = CliRunner().invoke(app, ["audit", "--checkpoint", str(folder), *args, *small])
    assert res.exit_code == 0, res.output
    return res


def test_one_hf_checkpoint_draws_no_drift_figure_and_says_so(hf_folders, tmp_path):
    """Its init is not known: no drift.png (it was empty axes titled "steps None"), a line
    on the terminal saying why; the stream's figure is drawn."""
    out = tmp_path / "a"
    res = _audit(hf_folders["gpt2"], out)
    assert not (out / "drift.png").exists() and (out / "stream_over_steps.png").is_file()
    assert "Drift: no drift.png for gpt2: its init is not known" in " ".join(res.output.split())
    assert pd.read_csv(out / "drift.csv")["rel_change"].isna().all()


#: (family, --expect) -> the std each matrix role's draws have, from the family's own
#: _init_weights at initializer_range RANGE (GPT-2 scales both c_proj by 1/sqrt(2 n_layer);
#: Llama draws every matrix at RANGE), and --expect gpt2 at the config's RANGE
SCALED = RANGE / np.sqrt(2 * L)
EXPECTED = {
    ("gpt2", "declared"): {
        **dict.fromkeys(("qkv", "up", "embed", "pos"), RANGE),
        "o": SCALED,
        "down": SCALED,
    },
    ("llama", "declared"): dict.fromkeys(("q", "k", "v", "o", "gate", "up", "down", "embed", "head"), RANGE),
    ("llama", "gpt2"): {"q": RANGE, "up": RANGE, "o": SCALED, "down": SCALED},
}


@pytest.mark.parametrize(("family", "expect"), list(EXPECTED))
def test_expect_declared_is_the_config_and_the_familys_rule(hf_folders, tmp_path, family, expect):
    """`--expect declared` (the default) fills an HF checkpoint's expected_std as `audit
    --hf` declares it: the config's initializer_range plus the family's own rule; it was
    empty. The weights as the model drew them measure it (4096 elements: 1.1% SE)."""
    out = tmp_path / "a"
    res = _audit(hf_folders[family], out, "--expect", expect)
    drift = pd.read_csv(out / "drift.csv")
    matrices = drift[drift["shape"].str.contains("x")]
    assert matrices["expected_std"].notna().all()
    for role, want in EXPECTED[(family, expect)].items():
        rows = matrices[matrices["role"] == role]
        assert len(rows), role
        np.testing.assert_allclose(rows["expected_std"], want, rtol=1e-6, err_msg=role)
        if expect == "declared":  # the model drew them so
            np.testing.assert_allclose(rows["std"], want, rtol=0.06, err_msg=role)
    said = json.loads((out / "config.json").read_text())["expected"]
    assert f"initializer_range {RANGE:g}" in said or f"sigma {RANGE:g}" in said
    assert "Expected stds" in res.output


@pytest.mark.parametrize(("family", "key"), [("gpt2", "n_positions"), ("llama", "max_position_embeddings")])
def test_a_sequence_too_long_is_said_as_a_person_would(hf_folders, tmp_path, family, key):
    """It read "1000 exceeds the 256 positions of llama model of config.json": now which
    model, how many positions it has (the config file's own key) and what to give."""
    from helpers import assert_one_line_error
    from typer.testing import CliRunner

    from tinit.cli import app

    out = tmp_path / "x"
    res = CliRunner().invoke(app, ["audit", "--checkpoint", str(hf_folders[family]), "--seq-len", "1000",
                                   "--out", str(out)])  # fmt: skip
    assert_one_line_error(res, "--seq-len", out)
    config = hf_folders[family] / "config.json"
    assert json.loads(config.read_text())[key] == 64
    want = (f"1000 tokens do not fit the {family} model of {config}: it has 64 positions ({key}); "
            "give --seq-len 64 or less")  # fmt: skip
    assert res.stderr.strip().endswith(want), res.stderr
