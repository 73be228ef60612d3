"""The upstream figures at two shapes (tests/data/upstream-shapes/) hold together.

Each file was measured from an upstream code base (its README says how). These tests check
the files themselves, independently of tinit: the columns and shapes the issue fixes, every
layer present, and every drawn tensor's measured std against the std its upstream code asks
for (``formula_std``, read from that code), within sampling error for the tensor's size.
"""

import csv
import math
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data" / "upstream-shapes"
COLUMNS = (
    "scheme,shape,n_layers,d_model,n_heads,d_ff,vocab,tied,role,layer,distribution,std,mean,absmax,"
    "formula_std,source"
).split(",")
FEATURE_COLUMNS = ["scheme", "shape", "feature", "value", "source"]
SHAPES = {"A": (4, 256, 4, 512), "B": (6, 384, 6, 1024)}
FEATURES = ("tied", "placement", "norm", "bias", "embed_mult", "embed_norm", "qk_norm", "attn_scale",
            "logit_mult", "logit_softcap", "attn_softcap", "ffn", "d_ff", "rope_base")  # fmt: skip
#: relative standard error of a sample std is sqrt((kurtosis - 1) / (4 n))
KURTOSIS_TERM = {"normal": 0.5, "uniform": 0.2}
FILES = sorted(p for p in DATA.glob("*.csv") if not p.name.endswith(".features.csv"))


def _rows(path: Path) -> tuple[list[str], list[dict]]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def _numel(row: dict) -> int | None:
    """Elements of a tinit-role tensor at the row's shape (None: not a tinit role)."""
    d, d_ff, vocab = int(row["d_model"]), int(row["d_ff"]), int(row["vocab"])
    role = row["role"]
    sizes = {"q": d * d, "k": d * d, "v": d * d, "o": d * d, "gate": d * d_ff, "up": d * d_ff,
             "down": d * d_ff, "embed": vocab * d, "head": vocab * d, "q.bias": d, "k.bias": d, "v.bias": d,
             "o.bias": d, "gate.bias": d_ff, "up.bias": d_ff, "down.bias": d}  # fmt: skip
    return sizes.get(role)


def test_files_exist():
    assert len(FILES) >= 10, f"expected the measured schemes in {DATA}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_columns_shapes_and_layers(path):
    columns, rows = _rows(path)
    assert columns == COLUMNS
    assert {r["shape"] for r in rows} == set(SHAPES)
    for r in rows:
        L, d, h, vocab = SHAPES[r["shape"]]
        assert (int(r["n_layers"]), int(r["d_model"]), int(r["n_heads"]), int(r["vocab"])) == (L, d, h, vocab)
        assert r["tied"] in ("true", "false", "refused")
        assert -1 <= int(r["layer"]) <= L
    for shape, (L, *_) in SHAPES.items():
        for role in ("q", "k", "v", "o", "up", "down"):
            layers = {int(r["layer"]) for r in rows if r["shape"] == shape and r["role"] == role}
            assert layers == set(range(L)), f"{path.name} {shape} {role}: layers {sorted(layers)}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_measured_std_is_the_code_std(path):
    """The measured std of every drawn tensor is the std its code asks for, within 6 standard
    errors; zeros are exactly 0, ones exactly 1. A padding row set to 0 (fairseq, Gemma)
    shrinks an embedding's std by sqrt(1 - 1/V), far inside the tolerance."""
    _, rows = _rows(path)
    checked = 0
    for r in rows:
        where = f"{path.name} {r['shape']} {r['role']}[{r['layer']}]"
        std, mean, absmax = float(r["std"]), float(r["mean"]), float(r["absmax"])
        if r["distribution"] == "zeros":
            assert std == 0 and absmax == 0, where
        elif r["distribution"] == "ones":
            assert std == 0 and mean == 1, where
        elif r["distribution"] in KURTOSIS_TERM and r["formula_std"] and _numel(r):
            target = float(r["formula_std"])
            tol = 6 * math.sqrt(KURTOSIS_TERM[r["distribution"]] / _numel(r))
            assert abs(std / target - 1) <= tol, f"{where}: std {std} vs code's {target} (tol {tol:.3g})"
            checked += 1
    assert checked > 0 or all(r["distribution"] not in KURTOSIS_TERM for r in rows)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_features_cover_both_shapes(path):
    feature_path = path.with_name(path.stem + ".features.csv")
    columns, rows = _rows(feature_path)
    assert columns == FEATURE_COLUMNS
    for shape in SHAPES:
        have = {r["feature"] for r in rows if r["shape"] == shape}
        missing = set(FEATURES) - have
        assert not missing, f"{feature_path.name} {shape}: missing {sorted(missing)}"
        tied = next(r["value"] for r in rows if r["shape"] == shape and r["feature"] == "tied")
        weights = {r["tied"] for r in _rows(path)[1] if r["shape"] == shape}
        assert weights == {tied}, f"{path.name} {shape}: tied {weights} vs feature {tied}"
