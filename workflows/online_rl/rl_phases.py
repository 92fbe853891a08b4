"""The RL training of the online job as segments around Entropulse phases (METHOD.md §7).

    segment 0 ("rl") ──trigger──► SFT phase 1 ──► segment 1 ("rl-p01") ──trigger──► … ──► max_steps

Each segment is one Ray Train fit over a new epoch of the buffer's stream. Its ``stop_fn``
(:class:`~workflows.online_rl.entropulse.EntropulseStop`) applies the trigger rule to every step's
metrics inside the loop, so the fit checkpoints and returns at exactly the step a phase is
due, while rollouts go on; the job then ends the stream epoch (its read tasks stop taking
rows), runs the SFT phase from that checkpoint, publishing through the same publisher (the
served version keeps rising), and the next segment resumes RL from the SFT weights with the
step counter carried on (``start_step``): ``trainer.max_steps`` counts RL steps over the job.

:func:`resume_point` finds where a restarted job continues: the current segment's own latest
checkpoint, else the last phase's checkpoint, else a fresh start.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from train_loops.checkpoint import checkpoint_complete
from train_loops.jsonl import read_jsonl
from workflows.online_rl.entropulse import EVENTS_FILE, checkpoint_version


def rl_run_name(phases_done: int) -> str:
    """The Ray Train run name of the RL segment after ``phases_done`` Entropulse phases."""
    return "rl" if phases_done == 0 else f"rl-p{phases_done:02d}"


@dataclass(frozen=True)
class ResumePoint:
    """Where RL (re)starts: segment, weights, RL steps done so far, weight version."""

    phases_done: int = 0
    checkpoint: Path | None = None
    step: int = 0
    version: int = 0

    @property
    def run_name(self) -> str:
        return rl_run_name(self.phases_done)


def _rl_checkpoints(folder: Path) -> list[tuple[int, int, Path]]:
    """(step, version, folder) of the complete RL checkpoints of one Ray Train run."""
    found = []
    for state_file in folder.glob("checkpoint_*/trainer_state.json"):
        state = json.loads(state_file.read_text())
        if state.get("kind", "rl") == "rl" and checkpoint_complete(state_file.parent):
            found.append(
                (int(state.get("step", 0)), int(state.get("version", 0)), state_file.parent)
            )
    return sorted(found)


def resume_point(run_dir: Path) -> ResumePoint:
    """The newest consistent state of the job's RL training under ``run_dir``."""
    ends = [
        e for e in read_jsonl(run_dir / EVENTS_FILE) if e.get("event") == "entropulse/phase_end"
    ]
    phases = len(ends)
    steps = [c[0] for d in run_dir.glob("rl*") for c in _rl_checkpoints(d)]
    own = _rl_checkpoints(run_dir / rl_run_name(phases))
    if own:
        step, version, folder = own[-1]
        return ResumePoint(phases, folder, step, version)
    if ends:
        ckpt = Path(ends[-1]["entropulse/checkpoint"])
        return ResumePoint(phases, ckpt, max(steps, default=0), checkpoint_version(ckpt))
    return ResumePoint()


def end_reason(run_dir: Path, run_name: str) -> str | None:
    """Why the latest fit of ``run_name`` ended (``max_steps``, ``stop_requested``,
    ``data_exhausted``), from the trainer's events file."""
    ends = [
        e
        for e in read_jsonl(run_dir / "train_events.jsonl")
        if e.get("event") == "end" and e.get("run") == run_name
    ]
    return ends[-1].get("reason") if ends else None


def set_aside(run_dir: Path) -> Path | None:
    """``resume=false``: move an earlier run's non-empty folder to ``<name>.before-<time>``
    (never deleted) so nothing of it (Ray Train's run snapshot, pending groups, job state)
    leaks into the new run. Returns where it went, None when there was nothing to move."""
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = run_dir.with_name(f"{run_dir.name}.before-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = run_dir.with_name(f"{run_dir.name}.before-{stamp}-{n}")
    run_dir.rename(target)
    return target
