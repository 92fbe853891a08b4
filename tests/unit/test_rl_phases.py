"""Where the online RL job resumes around Entropulse phases (files only, no Ray)."""

from __future__ import annotations

import json
from pathlib import Path

from train_loops.checkpoint import TrainerState, write_manifest
from workflows.online_rl.entropulse import EVENTS_FILE
from workflows.online_rl.rl_phases import ResumePoint, resume_point, rl_run_name, set_aside


def _checkpoint(run_dir: Path, run: str, kind: str, step: int, version: int) -> Path:
    """A complete two-rank checkpoint: state, weights, each rank's optimizer shard + manifest."""
    folder = run_dir / run / f"checkpoint_{kind}_{step:06d}"
    (folder / "deepspeed").mkdir(parents=True)
    TrainerState(kind=kind, step=step, version=version, world_size=2).write(folder)
    (folder / "model.safetensors").write_bytes(b"w" * 64)
    for rank in (0, 1):
        (folder / "deepspeed" / f"optim_{rank}.pt").write_bytes(b"o" * 32)
    for rank in (0, 1):
        write_manifest(folder, rank)
    return folder


def _phase_end(run_dir: Path, checkpoint: Path) -> None:
    event = {"event": "entropulse/phase_end", "entropulse/checkpoint": str(checkpoint)}
    with (run_dir / EVENTS_FILE).open("a") as f:
        f.write(json.dumps({"event": "entropulse/phase_start"}) + "\n")
        f.write(json.dumps(event) + "\n")


def test_run_names() -> None:
    assert [rl_run_name(p) for p in (0, 1, 12)] == ["rl", "rl-p01", "rl-p12"]


def test_fresh_run_starts_at_zero(tmp_path: Path) -> None:
    assert resume_point(tmp_path) == ResumePoint()


def test_newest_rl_checkpoint_before_any_phase(tmp_path: Path) -> None:
    _checkpoint(tmp_path, "rl", "rl", 3, 3)
    newest = _checkpoint(tmp_path, "rl", "rl", 6, 6)
    (tmp_path / "rl" / "checkpoint_rl_000009").mkdir()  # being written: no state file yet
    assert resume_point(tmp_path) == ResumePoint(0, newest, 6, 6)


def test_a_checkpoint_cut_short_by_a_kill_is_skipped(tmp_path: Path) -> None:
    whole = _checkpoint(tmp_path, "rl", "rl", 2, 2)
    truncated = _checkpoint(tmp_path, "rl", "rl", 4, 4)
    (truncated / "model.safetensors").write_bytes(b"w" * 10)
    unshared = _checkpoint(tmp_path, "rl", "rl", 6, 6)
    (unshared / "manifest_rank1.json").unlink()  # rank 1's share never arrived
    assert resume_point(tmp_path) == ResumePoint(0, whole, 2, 2)


def test_after_a_phase_rl_continues_from_the_sft_weights(tmp_path: Path) -> None:
    _checkpoint(tmp_path, "rl", "rl", 4, 4)
    sft = _checkpoint(tmp_path, "entropulse-p01", "sft", 2, 6)
    _phase_end(tmp_path, sft)
    point = resume_point(tmp_path)
    # weights and version of the SFT phase, the RL step count carried on
    assert point == ResumePoint(1, sft, 4, 6) and point.run_name == "rl-p01"


def test_a_segment_with_own_checkpoints_resumes_from_them(tmp_path: Path) -> None:
    _checkpoint(tmp_path, "rl", "rl", 4, 4)
    _phase_end(tmp_path, _checkpoint(tmp_path, "entropulse-p01", "sft", 2, 6))
    own = _checkpoint(tmp_path, "rl-p01", "rl", 7, 9)
    assert resume_point(tmp_path) == ResumePoint(1, own, 7, 9)


def test_an_interrupted_phase_resumes_rl_before_it(tmp_path: Path) -> None:
    rl = _checkpoint(tmp_path, "rl", "rl", 4, 4)
    _checkpoint(tmp_path, "entropulse-p01", "sft", 1, 5)  # killed mid-phase: no phase_end
    with (tmp_path / EVENTS_FILE).open("a") as f:
        f.write(json.dumps({"event": "entropulse/phase_start"}) + "\n")
    assert resume_point(tmp_path) == ResumePoint(0, rl, 4, 4)


def test_set_aside_keeps_the_earlier_run_and_leaves_a_fresh_folder(tmp_path: Path) -> None:
    run_dir = tmp_path / "embedded"
    assert set_aside(run_dir) is None  # nothing there yet
    run_dir.mkdir()
    assert set_aside(run_dir) is None and run_dir.is_dir()  # empty: nothing to keep
    first = _checkpoint(run_dir, "rl", "rl", 6, 6)
    kept = set_aside(run_dir)
    assert kept is not None and not run_dir.exists()
    assert (kept / first.relative_to(run_dir) / "trainer_state.json").is_file()
    assert resume_point(run_dir) == ResumePoint()  # the new run starts from scratch
    _checkpoint(run_dir, "rl", "rl", 2, 2)
    again = set_aside(run_dir)  # a second set-aside in the same second gets its own name
    assert again is not None and again != kept and kept.is_dir()
