"""Guards the numbers of every placement: ``tinit variance`` and ``tinit grad-norms``
write, byte for byte, the CSVs that the code before placements became values wrote
(redesign branch at c855d30, where ``Block._add`` branched on the placement's name).

Every placement runs with schemes that bring their own architecture: nanochat (x0 mix,
backout, RMS-normed embedding, relu^2, q/k gain, soft-cap), gemma2 ((1 + w) norms,
soft-caps, GeGLU), magneto (sub-LN), rezero (learned gain), deepnet (stream multiplier),
olmo2 and gpt2; a second shape runs LayerNorm with biases, an untied head, learned
positions, GELU, QK-norm and GQA, streamed; a third puts nanochat's backout on the last
block's own output (L = 2); a fourth replaces the branches by Gaussian noise. The CSVs
are what the CLI writes (:func:`tinit.results.rundir.write_csvs`: not-applicable cells
empty, floats in round-trip precision), so an equal file is an equal number.

The reference files were written by ``python tests/test_placement_numbers.py --write``
at c855d30 (torch 2.13.0+cpu, CPU capability AVX512, one thread). torch's vectorised
reductions sum in an order that depends on the CPU's vector width, so on other kernels
the last bits may differ: the test then skips, naming both.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import sys
from pathlib import Path

import pytest
import torch

from tinit.experiments.measure.grad_norms import run_grad_norms
from tinit.experiments.measure.variance import run_variance
from tinit.model.config import InitConfig, ModelConfig, RunConfig
from tinit.results.rundir import not_applicable_mask

DATA = Path(__file__).parent / "data" / "placements"
ALL = ("pre", "post", "sandwich", "reordered", "none")
SCHEMES = ("naive", "gpt2", "olmo2", "deepnet", "rezero", "nanochat", "gemma2", "magneto")
RUN = RunConfig(batch=2, seq_len=16, device="cpu")
TINY = {"d_model": 32, "vocab_size": 64, "max_seq_len": 16}

#: name -> (model, init, run, schemes)
CASES = {
    "schemes": (ModelConfig(n_layers=3, n_heads=2, **TINY),
                InitConfig(seed=3, sigma=0.05), RUN, SCHEMES),
    "layernorm": (ModelConfig(n_layers=3, n_heads=4, n_kv_heads=2, **TINY,
                              norm="layernorm", ffn="gelu", bias=True, tie_embeddings=False,
                              positions="learned", qk_norm=True),
                  InitConfig(seed=1, sigma="inv-sqrt-d"), dataclasses.replace(RUN, stream=True),
                  ("naive", "gpt2")),
    "backout-last": (ModelConfig(n_layers=2, n_heads=2, **TINY),
                     InitConfig(seed=2), RUN, ("nanochat",)),
    "gaussian": (ModelConfig(n_layers=3, n_heads=2, **TINY, branch="gaussian", branch_var=0.5),
                 InitConfig(seed=4), RUN, ("naive", "rezero")),
}  # fmt: skip


def platform() -> dict:
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def exact_csv(df, rules) -> str:
    """``df`` as CSV text: floats as ``repr`` (round-trip exact), a not-applicable NaN empty."""
    out, na = df.copy(), not_applicable_mask(df, rules)
    for col in df.columns:
        if df[col].dtype.kind == "f":
            out[col] = ["" if b else repr(float(v)) for v, b in zip(df[col], na[col], strict=True)]
    return out.to_csv(index=False)


def write_case(name: str, out: Path) -> list[Path]:
    """Run variance and grad-norms for case ``name`` in every placement; write their CSVs
    under ``out`` (``variance/`` and ``grad_norms/``) as the CLI does."""
    model, init, run, schemes = CASES[name]
    torch.set_num_threads(1)
    written = []
    for command, result in (
        ("variance", run_variance(model, init, run, schemes, ALL)),
        ("grad_norms", run_grad_norms(model, init, run, schemes, ALL)),
    ):
        folder = out / name / command
        folder.mkdir(parents=True, exist_ok=True)
        for stem, df in result.frames.items():
            path = folder / f"{stem}.csv"
            path.write_text(exact_csv(df, result.not_applicable.get(stem)))
            written.append(path)
    return written


@pytest.mark.parametrize("name", list(CASES))
def test_every_placement_writes_the_reference_numbers(name, tmp_path):
    recorded = json.loads((DATA / "platform.json").read_text())
    if recorded != platform():
        pytest.skip(f"reference written on {recorded}; this is {platform()} (other reduction order)")
    files = sorted(write_case(name, tmp_path))
    expected = sorted((DATA / name).rglob("*.csv"))
    assert [p.relative_to(tmp_path) for p in files] == [p.relative_to(DATA) for p in expected]
    for got, want in zip(files, expected, strict=True):
        a, b = want.read_text(), got.read_text()
        if a != b:
            diff = difflib.unified_diff(a.splitlines(), b.splitlines(), str(want), str(got), lineterm="", n=0)
            pytest.fail("\n".join(list(diff)[:12]))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_placement_numbers.py --write  (rewrites tests/data/placements)")
    for case in CASES:
        for path in write_case(case, DATA):
            print(path.relative_to(DATA.parent.parent.parent))
    (DATA / "platform.json").write_text(json.dumps(platform(), indent=1) + "\n")
