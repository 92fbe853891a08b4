"""Trainer checkpoints: a Hugging Face folder plus DeepSpeed optimizer state and trainer state.

Layout of one checkpoint (all ranks' files merged by ``ray.train.report``)::

    config.json, generation_config.json, model.safetensors   save_pretrained (rank 0)
    tokenizer*, processor_config.json, chat_template.jinja   copied from the base model folder
    trainer_state.json                                       TrainerState (rank 0)
    deepspeed/                                               engine.save_checkpoint (every rank)
    manifest_rank<r>.json                                    files and sizes of rank r's share

so ``AutoModelForImageTextToText.from_pretrained(ckpt)`` and ``AutoProcessor.from_pretrained
(ckpt)`` load it directly. Resuming (:func:`resolve_start`) restores weights, step, version and
optimizer state when the checkpoint is of the same kind (rl/sft) and layout (world size, ZeRO
stage); otherwise weights and version only. A plain Hugging Face folder gives weights only.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
DEEPSPEED_DIR = "deepspeed"
DEEPSPEED_TAG = "state"
MANIFEST_PREFIX = "manifest_rank"
# Files ``save_pretrained`` writes itself, or that belong to one checkpoint only: not copied
# from the base folder.
_NOT_COPIED_NAMES = {"config.json", "generation_config.json", STATE_FILE}
_NOT_COPIED_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")


@dataclass
class TrainerState:
    """Counters that travel with a checkpoint."""

    kind: str
    step: int = 0
    version: int = 0
    samples_seen: int = 0
    world_size: int = 1
    zero_stage: int = 0
    base_model: str = ""  # the run's original model: the KL reference, kept across resumes
    saved_at: float = field(default_factory=time.time)

    def write(self, folder: Path) -> None:
        (folder / STATE_FILE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def read(cls, folder: Path) -> TrainerState | None:
        path = folder / STATE_FILE
        if not path.exists():
            return None
        saved = json.loads(path.read_text())
        return cls(**{f.name: saved[f.name] for f in fields(cls) if f.name in saved})


@dataclass
class Start:
    """Where a run starts: which weights, which counters, whether optimizer state is restored."""

    weights: str
    state: TrainerState
    optimizer_dir: Path | None = None
    source: str | None = None


def newest_of(own: Path | None, given: Path | None, kind: str) -> Path | None:
    """The checkpoint a run starts from: its own latest (Ray Train's run snapshot), unless the
    caller's ``given`` one is of the same kind and further on.

    A job killed while Ray Train was registering a checkpoint leaves the folder complete on disk
    but the snapshot one checkpoint behind; the job finds the newer folder and passes it, and
    resuming from the stale snapshot would redo steps it has already counted.
    """
    if own is None or given is None:
        return own or given
    own_state, given_state = TrainerState.read(own), TrainerState.read(given)
    if own_state is None or given_state is None or given_state.kind != kind:
        return own
    return given if given_state.step > own_state.step else own


def resolve_start(checkpoint_dir: Path | None, base: TrainerState, model_path: str) -> Start:
    """Decide what to restore from ``checkpoint_dir`` (None: a fresh run from ``model_path``).

    ``base`` carries this run's kind, world size and ZeRO stage (step and version 0).
    """
    if checkpoint_dir is None:
        return Start(model_path, base)
    saved = TrainerState.read(checkpoint_dir)
    state = TrainerState(**{**asdict(base), "saved_at": time.time()})
    if saved is None:
        log.info("resuming weights only from plain Hugging Face folder %s", checkpoint_dir)
        return Start(str(checkpoint_dir), state, None, str(checkpoint_dir))
    state.version = saved.version
    state.base_model = saved.base_model or base.base_model
    if saved.kind != base.kind:
        log.info("weights and version from a %s checkpoint: new %s phase", saved.kind, base.kind)
        return Start(str(checkpoint_dir), state, None, str(checkpoint_dir))
    state.step, state.samples_seen = saved.step, saved.samples_seen
    ds_dir: Path | None = checkpoint_dir / DEEPSPEED_DIR
    same_layout = (saved.world_size, saved.zero_stage) == (base.world_size, base.zero_stage)
    if not (same_layout and ds_dir is not None and ds_dir.is_dir()):
        log.warning(
            "checkpoint layout (world %d, ZeRO %d) differs from this run's (world %d, ZeRO %d): "
            "optimizer state not restored",
            saved.world_size,
            saved.zero_stage,
            base.world_size,
            base.zero_stage,
        )
        ds_dir = None
    return Start(str(checkpoint_dir), state, ds_dir, str(checkpoint_dir))


def copy_processor_files(model_path: str | Path, out: Path) -> list[str]:
    """Copy tokenizer/processor/template files of the base model folder into ``out``."""
    copied = []
    for src in sorted(Path(model_path).iterdir()):
        if not src.is_file() or src.name in _NOT_COPIED_NAMES:
            continue
        if src.name.endswith(_NOT_COPIED_SUFFIXES):
            continue
        shutil.copy2(src, out / src.name)
        copied.append(src.name)
    return copied


def write_checkpoint(
    folder: Path,
    engine: Any,
    weights: dict[str, torch.Tensor] | None,
    state: TrainerState,
    model_path: str,
    rank: int,
) -> None:
    """Fill ``folder`` with this rank's share of a checkpoint; every rank must call it.

    ``weights`` is the full state dict on rank 0 (None elsewhere). Each rank ends with a
    manifest of its files, from which :func:`checkpoint_complete` tells a whole checkpoint from
    one whose copy into storage a crash cut short.
    """
    if weights is not None:
        engine.module.save_pretrained(folder, state_dict=weights, safe_serialization=True)
        copy_processor_files(model_path, folder)
        state.saved_at = time.time()
        state.write(folder)
    engine.save_checkpoint(str(folder / DEEPSPEED_DIR), tag=DEEPSPEED_TAG)
    write_manifest(folder, rank)


def write_manifest(folder: Path, rank: int) -> None:
    """Record the relative path and size of every file in ``folder`` as ``rank``'s share."""
    files = {
        str(f.relative_to(folder)): f.stat().st_size
        for f in sorted(folder.rglob("*"))
        if f.is_file() and not f.name.startswith(MANIFEST_PREFIX)
    }
    (folder / f"{MANIFEST_PREFIX}{rank}.json").write_text(json.dumps(files, indent=1))


def checkpoint_complete(folder: Path) -> bool:
    """Whether every rank's share of the checkpoint in ``folder`` is there in full.

    Ray Train copies each rank's files into the run folder without an atomic rename, so a job
    killed mid-copy leaves a folder that looks like a checkpoint (it may even hold
    ``trainer_state.json``) but misses files or holds truncated ones.
    """
    state = TrainerState.read(folder)
    if state is None:
        return False
    for rank in range(state.world_size):
        manifest = folder / f"{MANIFEST_PREFIX}{rank}.json"
        try:
            files = json.loads(manifest.read_text())
        except (OSError, ValueError):
            return False
        for name, size in files.items():
            path = folder / name
            if not path.is_file() or path.stat().st_size != size:
                return False
    return True


def restore_optimizer(engine: Any, ds_dir: Path) -> None:
    """Load DeepSpeed's optimizer (and module) state written by :func:`write_checkpoint`."""
    path, _ = engine.load_checkpoint(
        str(ds_dir),
        tag=DEEPSPEED_TAG,
        load_optimizer_states=True,
        load_lr_scheduler_states=False,
    )
    if path is None:
        raise RuntimeError(f"DeepSpeed found no checkpoint under {ds_dir}")
