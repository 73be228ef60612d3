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

import re
from dataclasses import dataclass, field
from pathlib import Path

from .tensors import CheckpointError, TensorFiles, read_json

STEP_FILE = re.compile(r"^step-(\d+)\.safetensors$")
#: Suffixes of files still being written (huggingface_hub's downloads, browsers, rsync
#: leaves ``.name.XXXXXX``; safetensors' own save writes ``.tmpXXXXXX`` first).
IN_PROGRESS = (".incomplete", ".part", ".partial", ".crdownload", ".download")
#: The most checkpoints one audit measures (runs x steps).
MAX_CHECKPOINTS = 10_000


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
    if not sidecar.is_file():
        raise CheckpointError(f"{path}: no {sidecar.name} beside it (the checkpoint's model config); "
                              "give --hf CONFIG for a transformers checkpoint")  # fmt: skip
    info = read_json(sidecar, "a tinit checkpoint's JSON")
    for key in ("model", "init"):
        if not isinstance(info.get(key), dict):
            raise CheckpointError(f"{sidecar}: no {key!r} object: not a tinit checkpoint's JSON")
    step = info.get("step", int(m.group(1)) if m else None)
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{sidecar}: step {step!r} is not a whole number >= 0")
    return Checkpoint("tinit", str(info.get("run", path.parent.name)), step, path, info)


def _run_folder(folder: Path, skipped: list[str]) -> list[Checkpoint]:
    out = []
    for p in sorted(folder.iterdir()):
        if STEP_FILE.match(p.name):
            if p.with_suffix(".json").is_file():
                out.append(_tinit_file(p))
            else:
                skipped.append(str(p))
    return out


def find_checkpoints(path: Path | str, hf: str | None = None) -> Found:
    """The checkpoints under ``path`` (see the module docstring), ordered by run and
    step, or a CheckpointError naming the path and what is missing."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or folder")
    if path.is_file():
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
        runs = [d for d in sorted((path / "checkpoints").iterdir()) if d.is_dir()]
        found = [c for d in runs for c in _run_folder(d, skipped)]
        source = "tinit run folder"
    elif any(STEP_FILE.match(p.name) for p in path.iterdir()):
        found, source = _run_folder(path, skipped), "tinit run"
    else:
        return Found([_hf_folder(path)], [], "hf folder")
    if not found:
        why = f" ({len(skipped)} without their JSON: a run stopped while saving)" if skipped else ""
        raise CheckpointError(f"{path}: no complete checkpoint{why}; train with --save-steps")
    if len(found) > MAX_CHECKPOINTS:
        raise CheckpointError(f"{path}: {len(found):,} checkpoints, more than {MAX_CHECKPOINTS:,}")
    found.sort(key=lambda c: (c.run, c.step))
    return Found(found, skipped, source)


def _hf_folder(path: Path) -> Checkpoint:
    config = path / "config.json"
    if not config.is_file():
        raise CheckpointError(f"{path}: no config.json (an HF model folder has one) and no checkpoints/ "
                              "(a tinit run folder saved with --save-steps)")  # fmt: skip
    doc = read_json(config, "a transformers config")
    if not isinstance(doc.get("model_type"), str):
        raise CheckpointError(f"{config}: no model_type: not a transformers config.json (and {path} has no "
                              "checkpoints/ folder)")  # fmt: skip
    index, single = path / "model.safetensors.index.json", path / "model.safetensors"
    if index.is_file():
        return Checkpoint("hf", path.resolve().name, None, index, config=config)
    if single.is_file():
        return Checkpoint("hf", path.resolve().name, None, single, config=config)
    pickled = [n for n in ("pytorch_model.bin", "pytorch_model.bin.index.json") if (path / n).exists()]
    why = f" ({pickled[0]} is a pickle, which tinit never loads)" if pickled else ""
    writing = sorted(p.name for p in path.iterdir() if p.name.startswith(".tmp") or p.suffix in IN_PROGRESS)
    if writing and not why:
        why = f" ({writing[0]} looks like a file still being written: audit the folder once it is complete)"
    raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json{why}")
