"""Guards what a reader sees, as rules over every command's outputs at small sizes
(docs/figures.md and docs/run-folders.md, "What a run promises"): each command runs
once here, at an 80-column terminal, and every table it prints, every figure it saves
and every CSV it writes is held to the rules.

- Tables: no cell text is cut at 80 columns (no "…", no line over 80, every word of
  every cell whole in the printed table).
- Empty cells: a healthy run writes no ``nan`` (a column declared not applicable is
  empty where it does not apply: a first non-finite addition where nothing overflowed,
  a divergence step of a run that did not diverge, a truncation bound of a normal draw).
- Figures: the four reserved colours only on their own configurations; one marker per
  configuration; every prediction outside the axis marked at the edge; text at 8 pt or
  more; titles and axis labels of different panels never overlapping.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
import pytest
from helpers import final_result_only
from matplotlib.lines import Line2D
from rich.cells import cell_len
from rich.console import Console
from rich.text import Text
from typer.testing import CliRunner

from tinit.cli import app
from tinit.results.palette import CONFIG_COLORS, CONFIG_MARKERS, config_style, scheme_name
from tinit.results.style import FONT

WIDTH = 80
S = ["--d-model", "32", "--heads", "2", "--seq-len", "16", "--batch", "2"]
#: training: one held-out batch an evaluation (no rule depends on how precise a loss is)
T = ["--steps", "4", "--eval-every", "2", "--eval-batches", "1", *S]
MODELS = str(Path(__file__).resolve().parent / "audit_models.py")

#: name -> the command line (without --out): every command, default grid and --init all
RUNS = {
    "variance": ["variance", "--layers", "3", *S],
    "variance_all": ["variance", "--init", "all", "--layers", "2", *S],
    "grad_norms": ["grad-norms", "--layers", "3", *S],
    "grad_norms_all": ["grad-norms", "--init", "all", "--layers", "2", *S],
    "depth_sweep": ["depth-sweep", "--layers", "2,4", "--seeds", "2", *S],
    "depth_sweep_all_one_depth": ["depth-sweep", "--init", "all", "--layers", "2", "--seeds", "1",
                                  "--no-grads", *S],
    "attention_scale": ["attention-scale", "--head-dims", "8,16", "--seq-len", "16", "--batch", "2"],
    "norms": ["norms", "--rows", "16", "--d-model", "32", "--repeats", "2", "--warmup", "1"],
    "params": ["params"],
    "check": ["check", "--layers", "2", "--deep-layers", "4", *S],
    "inits": ["inits"],
    "inits_one": ["inits", "depth-init", "--layers", "4"],
    "train": ["train", "--layers", "2,3", "--seeds", "2", *T],
    "train_all_diverging": ["train", "--init", "all", "--pre-norm", "--layers", "2", "--lr", "1e-3,3",
                            "--warmup", "0", "--diverge-margin", "0.5", *T],
    "lr_sweep": ["lr-sweep", "--layers", "2,3", "--lr", "1e-2,3e-2", *T],
    "claims": ["claims", "--seeds", "2", "--deep", "2", "--shallow", "1", *T],
    "coord_check": ["coord-check", "--d-model", "32,64", "--layers", "1,2", "--steps", "2", "--seeds", "2",
                    *S[2:]],
    "audit": ["audit", "--module", f"{MODELS}:tinit_model", "--init", "naive", "--seq-len", "8",
              "--batch", "2"],
}  # fmt: skip


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict:
    """Every run's printed tables, saved figures, output text and folder."""
    from tinit.cli import runner as cli_runner
    from tinit.results import mathtext_cache, plots, tables

    root = tmp_path_factory.mktemp("reader")
    out: dict[str, dict] = {}
    current: dict = {}
    real_print = tables.print_tables

    def print_tables(console, renderables):
        """The command's own printing, one renderable at a time (as print_tables prints
        them), each table's text kept as the command printed it, at 80 columns."""
        assert console.width == WIDTH
        for r in renderables:
            if isinstance(r, Text):
                real_print(console, [r])
                continue
            with console.capture() as printed:
                real_print(console, [r])
            current["tables"].append((r, printed.get()))
            console.file.write(printed.get())

    def save_figure(fig, run_dir, stem, formats):
        """Kept, not drawn: the rules read the figure's artists, and the 8-pt test draws
        each figure once itself (a 200-dpi tight PNG drew it twice more: a third of this
        fixture's time), with the parse cache that the real save_figure installs. The
        files keep the names the command chose, for the docs rule."""
        mathtext_cache.install()
        current["figures"][stem] = fig
        paths = [Path(run_dir) / f"{stem}.{fmt}" for fmt in formats]
        for path in paths:
            path.touch()
        return paths

    with pytest.MonkeyPatch.context() as mp:
        # the rules read what a finished run leaves: no result so far while it measures
        final_result_only(mp)
        mp.setattr(cli_runner, "print_tables", print_tables)
        mp.setattr(plots, "save_figure", save_figure)  # (the runner imports it when it draws)
        runner = CliRunner()
        for name, args in RUNS.items():
            current.clear()
            current.update(tables=[], figures={})
            folder = root / name
            res = runner.invoke(app, [*args, "--out", str(folder)], env={"COLUMNS": str(WIDTH)})
            assert res.exit_code in (0, 1), f"{name}: {res.output}"  # check's verdict may fail at tiny sizes
            assert "Traceback" not in res.output, res.output
            out[name] = {"tables": current["tables"], "figures": current["figures"], "output": res.output,
                         "folder": folder}  # fmt: skip
    return out


# --- tables --------------------------------------------------------------------------


def _cells(table):
    from rich.text import Text

    console = Console(width=WIDTH)
    for col in table.columns:
        for cell in [col.header, *col._cells]:
            if isinstance(cell, str):
                yield console.render_str(cell).plain
            elif isinstance(cell, Text):
                yield cell.plain


@pytest.mark.parametrize("name", list(RUNS))
def test_no_table_cell_is_cut_at_80_columns(outputs, name):
    """Every word of every cell appears whole in the table as printed at 80 columns:
    numbers are never shortened to "4.0e…", verdicts to "hol…", words never broken."""
    run = outputs[name]
    assert run["tables"], f"{name} printed no table"
    assert "…" not in run["output"]
    for table, text in run["tables"]:
        assert "…" not in text
        assert max(cell_len(line) for line in text.splitlines()) <= WIDTH, text  # cells: s̄ is one
        words = set(text.split())
        for cell in _cells(table):
            for word in cell.split():
                assert word in words, f"{name}: {word!r} of {cell!r} is cut in\n{text}"


def test_fit_table_splits_a_wide_table_and_repeats_the_key_column():
    """A table wider than the terminal becomes parts, each with the first column and no
    cut number; the title breaks between settings, never inside one."""
    from tinit.results.tables import fit_table, summary_table, wrap_settings

    t = summary_table("x")
    for c in ("config", *(f"col{i}" for i in range(12))):
        t.add_column(c, no_wrap=True)
    t.add_row("full-megatron/reordered", *(f"{1.2345e-4 * i:.4e}" for i in range(12)))
    parts = fit_table(t, 80, Console(width=80))
    assert len(parts) >= 2 and all(p.columns[0].header == "config" for p in parts)
    assert sum(len(p.columns) - 1 for p in parts) == 12
    lines = wrap_settings("L=12, d=64, float32, seed 0, 3 seeds", 20)
    assert lines == ["L=12, d=64, float32,", "seed 0, 3 seeds"]


# --- empty cells ---------------------------------------------------------------------


@pytest.mark.parametrize("name", list(RUNS))
def test_a_healthy_run_writes_no_nan(outputs, name):
    """Where a column does not apply the cell is empty, so a healthy run (these are)
    flags nothing: config.json counts no non-finite value and no CSV holds one."""
    import json

    folder = outputs[name]["folder"]
    meta = json.loads((folder / "config.json").read_text())
    assert meta["non_finite_total"] == 0, meta["non_finite"]
    for csv in folder.glob("*.csv"):
        text = csv.read_text()
        assert not re.search(r"(^|,)(nan|inf|-inf)(,|$)", text, flags=re.M), f"{csv.name} holds nan/inf"


def test_empty_where_not_applicable(outputs):
    """The columns the issue names: empty, not nan, where nothing overflowed, nothing
    diverged, the draw is not truncated; one depth gives no transfer verdict."""
    f = outputs["variance"]["folder"]
    assert pd.read_csv(f / "summary.csv")["first_nonfinite_k"].isna().all()  # read back: empty
    runs = pd.read_csv(outputs["train_all_diverging"]["folder"] / "runs.csv")
    assert runs["diverged"].any() and not runs["diverged"].all()  # a mix, so the column is numeric
    assert runs.loc[~runs["diverged"], "diverged_step"].isna().all()
    assert runs.loc[runs["diverged"], "diverged_step"].notna().all()
    stds = pd.read_csv(outputs["inits_one"]["folder"] / "init_stds.csv")
    assert stds.loc[stds["distribution"] == "trunc", "bound"].notna().all()
    assert stds.loc[stds["distribution"] != "trunc", "bound"].isna().all()
    fit = pd.read_csv(outputs["depth_sweep_all_one_depth"]["folder"] / "depth_sweep_fit.csv")
    assert fit["transfers"].isna().all() and fit["transfer_ratio"].isna().all()
    assert "transfers: yes" not in outputs["depth_sweep_all_one_depth"]["output"]


# --- figures -------------------------------------------------------------------------


@functools.cache
def _configs(folder: Path) -> frozenset[tuple[str, str]]:
    """The (scheme, placement) pairs a run measured, from its CSVs (read once a run: the
    run folders are the module fixture's, never written after it)."""
    out = set()
    for csv in folder.glob("*.csv"):
        df = pd.read_csv(csv)
        if {"init", "norm_position"} <= set(df.columns):
            out |= set(zip(df["init"].astype(str), df["norm_position"].astype(str), strict=True))
    return frozenset(out)


def _hex(c) -> str | None:
    try:
        rgba = mpl.colors.to_rgba(c)
    except (ValueError, TypeError):
        return None
    return None if rgba[3] == 0 else mpl.colors.to_hex(rgba[:3])


def _artist_colors(fig) -> set[str]:
    colors = set()
    for ax in fig.findobj(mpl.axes.Axes):
        for line in ax.lines:
            drawn = (line.get_color(), line.get_markerfacecolor(), line.get_markeredgecolor())
            colors |= {_hex(c) for c in drawn}
        for patch in ax.patches:
            colors |= {_hex(patch.get_facecolor())}
        for coll in ax.collections:
            colors |= {_hex(c) for c in coll.get_facecolors()} | {_hex(c) for c in coll.get_edgecolors()}
    for leg in fig.findobj(mpl.legend.Legend):
        for h in leg.legend_handles:
            if isinstance(h, Line2D):
                colors |= {_hex(h.get_color()), _hex(h.get_markerfacecolor())}
            elif hasattr(h, "get_facecolor"):
                colors |= {_hex(h.get_facecolor())}
    return colors - {None}


RESERVED = {mpl.colors.to_hex(c): key for key, c in CONFIG_COLORS.items()}


def _figures():
    return [(name, stem) for name in RUNS for stem in _STEMS.get(name, ())]


#: The figures each run saves (checked against what it saved, below).
_STEMS = {
    "variance": ("variance",), "variance_all": ("variance",), "grad_norms": ("grad_norms", "stream_grads"),
    "grad_norms_all": ("grad_norms", "stream_grads"), "depth_sweep": ("depth_sweep",),
    "depth_sweep_all_one_depth": ("depth_sweep",), "attention_scale": ("attention_scale",),
    "norms": ("norms",),
    "params": ("params",), "check": ("check_variance", "stream_grads", "params", "attention_scale"),
    "train": ("loss_curves", "final_vs_depth", "variance_during_training"),
    "train_all_diverging": ("loss_curves", "variance_during_training"),  # one depth: no final_vs_depth
    "lr_sweep": ("lr_sweep", "lr_transfer", "loss_curves", "variance_during_training"),
    "claims": ("claims", "claims_deep_curves", "claims_shallow_curves", "variance_during_training"),
    "audit": ("weights", "variance", "grad_norms", "stream_grads"),
    "coord_check": ("coord_check", "coord_check_depth", "coord_check_layers_gpt2-pre-L2",
                    "coord_check_layers_mup-pre-L2"),
}  # fmt: skip


def test_every_figure_listed(outputs):
    for name in RUNS:
        assert set(outputs[name]["figures"]) == set(_STEMS.get(name, ())), name
    assert set(RENDERED_HERE) <= set(_figures())


DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize("name", list(RUNS))
def test_every_file_a_run_writes_is_documented(outputs, name):
    """Each file in the run folder (but config.json, every run's) is named in the
    command's row of docs/run-folders.md and on its reference page (the training
    commands' shared files on train's)."""
    command = RUNS[name][0]
    row = next(line for line in (DOCS / "run-folders.md").read_text().splitlines()
               if line.startswith(f"| [`{command}`]"))  # fmt: skip
    pages = [(DOCS / "reference" / f"{command}.md").read_text()]
    if command in ("lr-sweep", "claims"):
        pages.append((DOCS / "reference" / "train.md").read_text())
        row += (DOCS / "run-folders.md").read_text().split("| [`train`]", 1)[1].split("\n", 1)[0]
    for path in outputs[name]["folder"].iterdir():
        if path.name == "config.json":  # every run's, documented once on that page
            continue
        # coord-check's per-scheme figures are documented by their pattern
        pattern = "coord_check_layers_<init>-<placement>-L<L>.png"
        file = re.sub(r"^coord_check_layers_.+-L\d+\.png$", pattern, path.name)
        assert f"`{file}`" in row, f"{command}: {path.name} not in docs/run-folders.md"
        assert any(f"`{file}`" in page for page in pages), f"{command}: {path.name} not on its page"


@pytest.mark.parametrize(("name", "stem"), _figures())
def test_reserved_colours_only_for_their_configurations(outputs, name, stem):
    """Red, blue, orange and green mean naive/pre, scaled/pre, naive/post, scaled/post:
    a figure uses one only when its run measured that configuration (no warmup
    category, weight role, implementation or lr in them)."""
    run = outputs[name]
    present = {(scheme_name(i), p) for i, p in _configs(run["folder"])}
    used = {RESERVED[c] for c in _artist_colors(run["figures"][stem]) if c in RESERVED}
    assert used <= present, f"{name}/{stem}: {used - present} drawn without that configuration"


#: markers that are not a configuration's: error-bar caps, law points, divergence, optima
SPECIAL_MARKERS = {"None", "none", "", " ", "_", "|", "x", "*"}


@pytest.mark.parametrize(("name", "stem"), _figures())
def test_one_marker_per_configuration(outputs, name, stem):
    """A line in a configuration's colour carries that configuration's marker (or a
    marker with a fixed meaning: a clipped point's triangle, a law point's x, an optimum's
    star), so colour and marker tell the same configuration."""
    run = outputs[name]
    configs = sorted(_configs(run["folder"]))
    marker_of = {}
    for init, pos in configs:
        st = config_style(init, pos)
        marker_of.setdefault(st["color"], set()).add(st["marker"])
    fig = run["figures"][stem]
    for ax in fig.findobj(mpl.axes.Axes):
        for line in ax.lines:
            color, marker = _hex(line.get_color()), str(line.get_marker())
            if color in marker_of and marker not in SPECIAL_MARKERS and line.get_gid() != "clipped":
                assert marker in marker_of[color], f"{name}/{stem}: {color} drawn with {marker}"
    for key, hexc in CONFIG_COLORS.items():  # the classic four keep their own markers
        assert CONFIG_MARKERS[key] in marker_of.get(mpl.colors.to_hex(hexc), {CONFIG_MARKERS[key]})


PREDICTION = ("theory:", "full:", "closed:")


@pytest.mark.parametrize(("name", "stem"), _figures())
def test_every_clipped_prediction_is_marked(outputs, name, stem):
    """A prediction with a point outside its panel's y range has triangles at the edge
    (gid "clipped") in that panel."""
    fig = outputs[name]["figures"][stem]
    for ax in fig.findobj(mpl.axes.Axes):
        lo, hi = sorted(ax.get_ylim())
        for line in ax.lines:
            if not str(line.get_gid() or "").startswith(PREDICTION):
                continue
            y = np.asarray(line.get_ydata(), dtype=float)
            y = y[np.isfinite(y)]
            if ((y < lo) | (y > hi)).any():
                assert any(x.get_gid() == "clipped" for x in ax.lines), f"{name}/{stem}: {line.get_gid()}"


#: The figures no other test renders (the plot tests build them, the commands' tests
#: skip the PNG): drawn in full here, so that every figure is rendered somewhere in the
#: suite; the others' drawn boxes come from the layout alone.
RENDERED_HERE = {("lr_sweep", "lr_sweep"), ("lr_sweep", "lr_transfer"), ("claims", "claims_shallow_curves"),
                 ("coord_check", "coord_check_depth")}  # fmt: skip


@pytest.mark.parametrize(("name", "stem"), _figures())
def test_text_at_8pt_and_labels_apart(outputs, name, stem):
    """Every text (legends included) is 8 pt or more, and no panel's title or axis label
    overlaps another panel's."""
    fig = outputs[name]["figures"][stem]
    for text in fig.findobj(mpl.text.Text):
        if text.get_text().strip() and text.get_visible():
            size = text.get_fontsize()
            assert size >= FONT - 1e-9, f"{name}/{stem}: {text.get_text()!r} at {size} pt"
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    renderer = canvas.get_renderer()
    if (name, stem) in RENDERED_HERE:
        canvas.draw()
    else:
        # the boxes a draw gives, without rasterizing: the layout engine places the
        # panels, then each panel places its title and axis labels (as its draw would);
        # equal to the drawn boxes in every figure here (checked once, to 1e-11 px)
        fig.get_layout_engine().execute(fig)
        for ax in fig.findobj(mpl.axes.Axes):
            if ax.get_visible() and ax.axison:
                ax.get_tightbbox(renderer)
    boxes = []
    for i, ax in enumerate(fig.findobj(mpl.axes.Axes)):
        if not ax.get_visible() or not ax.axison:
            continue
        for t in (ax.title, ax.xaxis.label, ax.yaxis.label):
            if t.get_text().strip():
                boxes.append((i, t.get_text(), t.get_window_extent(renderer)))
    for a in range(len(boxes)):
        for b in range(a + 1, len(boxes)):
            (i, ta, ba), (j, tb, bb) = boxes[a], boxes[b]
            if i != j:
                assert not ba.overlaps(bb), f"{name}/{stem}: {ta!r} overlaps {tb!r}"
