"""What ``tinit audit --checkpoint PATH`` reads: the checkpoints a path holds.

PATH is one of:

- a ``tinit train`` run folder (its ``checkpoints/<run>/step-NNNNNN.safetensors``, each
  with the JSON beside it: every run, every saved step), or one run's folder inside it,
  or one ``step-NNNNNN.safetensors`` with its JSON;
- a Hugging Face model folder: ``config.json`` (with ``model_type``) and
  ``model.safetensors`` or a sharded ``model.safetensors.index.json``;
- a single ``.safetensors`` file with ``--hf CONFIG`` (a transformers config.json).

A tinit checkpoint is complete when its JSON exists (it is written after the weights:
:mod:`tinit.results.checkpoints`); weights without it are listed as skipped, never
measured. Nothing here reads a tensor: :class:`~.tensors.TensorFiles` reads headers.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ...userfile import UserFileError, file_or_folder
from .tensors import CheckpointError, TensorFiles, read_json, regular

#: A checkpoint's file name (ASCII digits only: ``\d`` takes a fullwidth digit too).
STEP_FILE = re.compile(r"^step-([0-9]+)\.safetensors$")
#: Suffixes of files still being written (huggingface_hub's downloads, browsers, rsync
#: leaves ``.name.XXXXXX``; safetensors' own save writes ``.tmpXXXXXX`` first).
IN_PROGRESS = (".incomplete", ".part", ".partial", ".crdownload", ".download")
#: The most checkpoints one audit measures (runs x steps).
MAX_CHECKPOINTS = 10_000
#: The largest training step a checkpoint may say it is (a million times the longest
#: published pretraining runs' steps; a step stays an exact integer in every CSV).
MAX_STEP = 10**12


@dataclass
class Checkpoint:
    """One checkpoint to measure."""

    kind: str  # "tinit" (a train run's, with its JSON) or "hf" (a transformers config)
    run: str  # the run's label (an HF model: its folder's or file's name)
    step: int | None  # the training step (None: unknown, an HF model)
    path: Path  # the .safetensors file or the index
    info: dict = field(default_factory=dict)  # tinit: the JSON beside it
    config: Path | None = None  # hf: the config.json

    def tensors(self) -> TensorFiles:
        if self.path.name.endswith(".index.json"):
            return TensorFiles.sharded(self.path)
        return TensorFiles.single(self.path)


@dataclass
class Found:
    checkpoints: list[Checkpoint]
    skipped: list[str]  # weights without their JSON (a run stopped while saving)
    source: str  # "tinit run folder", "tinit run", "tinit checkpoint", "hf folder", "safetensors + --hf"


def _tinit_file(path: Path) -> Checkpoint:
    m = STEP_FILE.match(path.name)
    sidecar = path.with_suffix(".json")
    if not os.path.lexists(sidecar):
        raise CheckpointError(f"{path}: no {sidecar.name} beside it (the checkpoint's model config); "
                              "give --hf CONFIG for a transformers checkpoint")  # fmt: skip
    info = read_json(sidecar, "a tinit checkpoint's JSON")
    check_info(info, sidecar)
    named = m.group(1) if m else None
    if named is not None and (len(named) > len(str(MAX_STEP)) or int(named) > MAX_STEP):
        raise CheckpointError(f"{path}: its name's step is over {MAX_STEP:,}, the most a checkpoint may say")
    step = info.get("step", int(named) if named is not None else None)
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
        raise CheckpointError(f"{sidecar}: step {step!r} is not a whole number from 0 to {MAX_STEP:,}")
    if named is not None and step != int(named):
        raise CheckpointError(f"{sidecar}: step {step} disagrees with its file's name ({path.name}: step "
                              f"{int(named)})")  # fmt: skip
    return Checkpoint("tinit", str(info.get("run", path.parent.name)), step, path, info)


def check_info(info: dict, sidecar: Path | str) -> None:
    """A tinit checkpoint's JSON holds a ``model`` and an ``init`` object whose keys are
    ModelConfig's and InitConfig's fields, a ``user_set`` that is a list of structure
    field names and a ``run`` label that is a string; else a CheckpointError naming the
    JSON (never a TypeError from the config's constructor, nor a string's letters read
    as field names)."""
    from ...model.config import STRUCTURE_FIELDS, InitConfig, ModelConfig

    for key, cls in (("model", ModelConfig), ("init", InitConfig)):
        if not isinstance(info.get(key), dict):
            raise CheckpointError(f"{sidecar}: no {key!r} object: not a tinit checkpoint's JSON")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(info[key]) - set(names))
        if unknown:
            raise CheckpointError(f"{sidecar}: its {key} config has no field {unknown[0]!r} (its fields: "
                                  f"{', '.join(names)})")  # fmt: skip
    user_set = info["model"].get("user_set")
    listed = isinstance(user_set, list) and all(isinstance(f, str) for f in user_set)
    if user_set is not None and not listed:
        raise CheckpointError(f"{sidecar}: user_set {user_set!r} is not a list of field names (of "
                              f"{', '.join(STRUCTURE_FIELDS)})")  # fmt: skip
    run = info.get("run")
    if run is not None and (not isinstance(run, str) or not run.strip()):
        raise CheckpointError(f"{sidecar}: run {run!r} is not a run's label (a non-empty string)")


def _listing(folder: Path) -> list[Path]:
    """The entries of ``folder``, sorted; one that cannot be listed a CheckpointError."""
    try:
        return sorted(folder.iterdir())
    except OSError as exc:
        raise CheckpointError(f"{folder}: cannot list it ({exc.strerror or exc})") from None


def _run_folder(folder: Path, skipped: list[str]) -> list[Checkpoint]:
    out = []
    for p in _listing(folder):
        if STEP_FILE.match(p.name):
            if os.path.lexists(p.with_suffix(".json")):  # (a JSON that is no file: said as such)
                out.append(_tinit_file(p))
            else:
                skipped.append(str(p))
    return out


def find_checkpoints(path: Path | str, hf: str | None = None) -> Found:
    """The checkpoints under ``path`` (see the module docstring), ordered by run and
    step, or a CheckpointError naming the path and what is missing. A FIFO, a device or
    a symlink loop where a file or a folder belongs is said as such."""
    if isinstance(path, str) and not path.strip():
        raise CheckpointError(f"{path!r}: give a path (a tinit run folder, an HF model folder or a "
                              ".safetensors file)")  # fmt: skip
    path = Path(path)
    try:
        kind = file_or_folder(path)
    except UserFileError as exc:
        raise CheckpointError(f"{exc} (give a tinit run folder, an HF model folder or a .safetensors "
                              "file)") from None  # fmt: skip
    if kind == "file":
        if not path.name.endswith(".safetensors"):
            raise CheckpointError(f"{path}: not a .safetensors file (give a run folder, an HF model folder "
                                  "or a .safetensors file)")  # fmt: skip
        if hf is not None:
            return Found([Checkpoint("hf", path.stem, None, path, config=Path(hf))], [], "safetensors + --hf")
        return Found([_tinit_file(path)], [], "tinit checkpoint")
    if hf is not None:
        raise CheckpointError(f"{path}: --hf goes with a single .safetensors file; a folder brings its "
                              "own config.json", option="--hf")  # fmt: skip
    skipped: list[str] = []
    if (path / "checkpoints").is_dir():
        runs = [d for d in _listing(path / "checkpoints") if d.is_dir()]
        found = [c for d in runs for c in _run_folder(d, skipped)]
        source = "tinit run folder"
    elif any(STEP_FILE.match(p.name) for p in _listing(path)):
        found, source = _run_folder(path, skipped), "tinit run"
    else:
        return Found([_hf_folder(path)], [], "hf folder")
    if not found:
        why = f" ({len(skipped)} without their JSON: a run stopped while saving)" if skipped else ""
        raise CheckpointError(f"{path}: no complete checkpoint{why}; train with --save-steps")
    if len(found) > MAX_CHECKPOINTS:
        raise CheckpointError(f"{path}: {len(found):,} checkpoints, more than {MAX_CHECKPOINTS:,}")
    found.sort(key=lambda c: (c.run, c.step))
    for a, b in zip(found, found[1:], strict=False):
        if (a.run, a.step) == (b.run, b.step):  # (two rows of one key in every CSV)
            raise CheckpointError(f"{b.path}: run {b.run!r} has step {b.step} twice (also {a.path}): each "
                                  "checkpoint of a run at its own step")  # fmt: skip
    return Found(found, skipped, source)


def _hf_folder(path: Path) -> Checkpoint:
    config = path / "config.json"
    if not os.path.lexists(config):
        raise CheckpointError(f"{path}: no config.json (an HF model folder has one) and no checkpoints/ "
                              "(a tinit run folder saved with --save-steps)")  # fmt: skip
    doc = read_json(config, "a transformers config")
    if not isinstance(doc.get("model_type"), str):
        raise CheckpointError(f"{config}: no model_type: not a transformers config.json (and {path} has no "
                              "checkpoints/ folder)")  # fmt: skip
    index, single = path / "model.safetensors.index.json", path / "model.safetensors"
    for weights in (index, single):
        if os.path.lexists(weights):  # (a FIFO, a device, a folder or a loop there: said as such)
            regular(weights)
            return Checkpoint("hf", path.resolve().name, None, weights, config=config)
    pickled = [n for n in ("pytorch_model.bin", "pytorch_model.bin.index.json") if (path / n).exists()]
    why = f" ({pickled[0]} is a pickle, which tinit never loads)" if pickled else ""
    writing = sorted(p.name for p in path.iterdir() if p.name.startswith(".tmp") or p.suffix in IN_PROGRESS)
    if writing and not why:
        why = f" ({writing[0]} looks like a file still being written: audit the folder once it is complete)"
    raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json{why}")
