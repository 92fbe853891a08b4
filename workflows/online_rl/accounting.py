"""The audit of a run folder: where every group that was ever started went.

Reads only what the job wrote (so it works on any run, finished, killed or resumed):
``trajectories/ledger.jsonl`` (the buffer's record of each group), the group shards under
``trajectories/<pending|trained|zero_grad|purged>/``, and the lineage of the newest RL
checkpoint (:mod:`train_loops.lineage`: the samples its weights were trained on). Every started
group must end in exactly one of:

- ``trained``: its rows are trained (in the lineage), or set aside with a recorded reason
  (too stale, no gradient), at least one trained;
- ``pending``: completed, some rows not trained yet, its shard in ``pending/`` (a resume
  reloads them);
- ``zero_grad`` / ``purged``: completed, no row trained, for that recorded reason;
- ``dropped:<reason>``: ended without rows, the reason in the ledger (failed, cancelled, stale,
  worker_died, abandoned).

Anything else is ``lost``. ``duplicate`` groups: started twice, a shard in two folders, or a
sample in the lineage twice. The lineage must also hold one line per optimizer step, each with
exactly ``samples_per_step`` samples (None: rollout batches, any number but none). Standard library + pyarrow.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from train_loops.jsonl import read_jsonl
from train_loops.lineage import read_lineage
from train_loops.schema import read_parquet

SHARD_FOLDERS = ("pending", "trained", "zero_grad", "purged")


@dataclass
class Accounting:
    groups_started: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)  # outcome → groups
    lost_groups: list[str] = field(default_factory=list)
    duplicate_groups: list[str] = field(default_factory=list)
    trained_samples: int = 0
    optimizer_steps: int = 0
    problems: list[str] = field(default_factory=list)  # each a sentence naming what is wrong

    @property
    def ok(self) -> bool:
        return not (self.lost_groups or self.duplicate_groups or self.problems)

    def summary(self) -> str:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))
        return (
            f"{self.groups_started} groups started: {outcomes}; {self.trained_samples} samples "
            f"trained in {self.optimizer_steps} optimizer steps; lost {len(self.lost_groups)}, "
            f"duplicate {len(self.duplicate_groups)}"
        )


def audit_run(
    run_dir: str | Path, checkpoint: str | Path | None, samples_per_step: int | None
) -> Accounting:
    """Account for every group of the run in ``run_dir``; ``checkpoint``: the newest RL
    checkpoint (its lineage says what was trained; None: nothing was)."""
    traj = Path(run_dir) / "trajectories"
    ledger = read_jsonl(traj / "ledger.jsonl")
    acc = Accounting()
    started = [e["group"] for e in ledger if e.get("ev") == "start"]
    acc.groups_started = len(set(started))
    acc.duplicate_groups = sorted(g for g, n in Counter(started).items() if n > 1)
    shards = _shards(traj, acc)
    lineage = read_lineage(checkpoint)
    trained = _check_lineage(lineage, samples_per_step, acc)
    set_aside = _set_aside(ledger)
    drops = {e["group"]: e["reason"] for e in ledger if e.get("ev") == "drop"}
    zero_grad = {e["group"] for e in ledger if e.get("ev") == "zero_grad"}
    for group in dict.fromkeys(started):
        outcome = _outcome(group, shards, drops, zero_grad, trained, set_aside)
        acc.outcomes[outcome] += 1
        if outcome == "lost":
            acc.lost_groups.append(group)
    group_of = {r["sample_id"]: g for g, (_, rows) in shards.items() for r in rows}
    twice = Counter(i for line in lineage for i in line["ids"])
    dup_samples = {group_of.get(s, s) for s, n in twice.items() if n > 1}
    acc.duplicate_groups = sorted(set(acc.duplicate_groups) | dup_samples)
    return acc


def _shards(traj: Path, acc: Accounting) -> dict[str, tuple[str, list[dict[str, Any]]]]:
    found: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    for folder in SHARD_FOLDERS:
        for shard in sorted((traj / folder).glob("*.parquet")):
            if shard.stem in found:
                acc.duplicate_groups.append(shard.stem)
                acc.problems.append(
                    f"group {shard.stem} has shards in {found[shard.stem][0]}/ and {folder}/"
                )
                continue
            found[shard.stem] = (folder, read_parquet(shard))
    return found


def _check_lineage(lineage: list[dict], samples_per_step: int | None, acc: Accounting) -> set[str]:
    steps = [line["step"] for line in lineage]
    acc.optimizer_steps = len(steps)
    acc.trained_samples = sum(len(line["ids"]) for line in lineage)
    if steps != list(range(1, len(steps) + 1)):
        acc.problems.append(f"lineage steps are not 1..{len(steps)} once each: {steps[:20]}")
    if samples_per_step is None:  # one rollout batch per step: any size, never empty
        wrong = [line["step"] for line in lineage if not line["ids"]]
        what = "at least one sample"
    else:
        wrong = [line["step"] for line in lineage if len(line["ids"]) != samples_per_step]
        what = f"exactly {samples_per_step} samples"
    if wrong:
        acc.problems.append(f"steps {wrong[:10]} did not train {what}")
    return {i for line in lineage for i in line["ids"]}


def _set_aside(ledger: list[dict[str, Any]]) -> set[str]:
    """Samples that need no training, with a recorded reason (too stale, no gradient)."""
    out: set[str] = set()
    for e in ledger:
        if e.get("ev") in ("purge", "zero_grad_samples"):
            out.update(e["ids"])
    return out


def _outcome(
    group: str,
    shards: dict[str, tuple[str, list[dict[str, Any]]]],
    drops: dict[str, str],
    zero_grad: set[str],
    trained: set[str],
    set_aside: set[str],
) -> str:
    if group not in shards:
        return f"dropped:{drops[group]}" if group in drops else "lost"
    folder, rows = shards[group]
    if group in zero_grad or folder == "zero_grad":
        return "zero_grad"
    ids = {r["sample_id"] for r in rows}
    untrained = ids - trained - set_aside
    if not untrained:
        return "trained" if ids & trained else "purged"
    # Not all trained: fine only while its shard waits in pending/ for a resume to reload it.
    return "pending" if folder == "pending" else "lost"
