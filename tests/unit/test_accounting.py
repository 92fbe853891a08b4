"""The run-folder audit, on folders written by the real buffer (plain asyncio)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.unit.test_buffer import _group
from train_loops.lineage import write_lineages
from workflows.online_rl.accounting import audit_run
from workflows.online_rl.buffer import TrajectoryBuffer, group_id_of
from workflows.online_rl.config import BufferConfig


def _life(traj: Path) -> list[dict]:
    """A life with every fate: 3 groups completed and trained in 2 steps of 2 samples (one
    row still pending), one failed, one still in flight when the 'job dies'."""

    async def go() -> list[dict]:
        buf = TrajectoryBuffer(BufferConfig(), samples_per_step=2, shard_dir=str(traj))
        seqs = [await buf.acquire(0, worker=0) for _ in range(5)]
        for seq in seqs[:3]:
            gid = group_id_of(seq)
            rows = _group(gid, 2) if seq < 2 else _group(gid, 1)
            await buf.put_group(gid, rows, successes=0)
        await buf.drop_group("failed", group_id_of(seqs[3]))
        epoch = await buf.open_stream()
        steps = []
        for step in (1, 2):
            rows = await buf.take(2, epoch=epoch)
            steps.append({"step": step, "ids": [r["sample_id"] for r in rows]})
        await buf.commit(2, [i for s in steps for i in s["ids"]])
        return steps

    return asyncio.run(go())


def test_every_group_of_a_killed_and_resumed_run_is_accounted_for(tmp_path: Path) -> None:
    lineage = _life(tmp_path / "trajectories")
    ckpt = tmp_path / "rl" / "checkpoint_rl_000002"
    ckpt.mkdir(parents=True)
    write_lineages(ckpt, {"rl": lineage})
    acc = audit_run(tmp_path, ckpt, samples_per_step=2)
    assert not acc.problems and not acc.duplicate_groups
    assert acc.groups_started == 5
    # g2's single row waits in pending/; g4 was in flight: neither trained nor recorded yet.
    assert dict(acc.outcomes) == {"trained": 2, "pending": 1, "dropped:failed": 1, "lost": 1}
    assert acc.lost_groups == ["g000004"]
    # The next life records the group the dead one left in flight, and reloads g2's row.
    TrajectoryBuffer(
        BufferConfig(), samples_per_step=2, shard_dir=str(tmp_path / "trajectories"),
        trained_ids=[i for s in lineage for i in s["ids"]],
    )  # fmt: skip
    acc = audit_run(tmp_path, ckpt, samples_per_step=2)
    assert acc.ok and acc.outcomes["dropped:abandoned"] == 1
    assert (acc.trained_samples, acc.optimizer_steps) == (4, 2)


def test_the_audit_finds_lost_rows_duplicates_and_short_steps(tmp_path: Path) -> None:
    lineage = _life(tmp_path / "trajectories")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    # A sample trained twice, a step with one sample: both are reported.
    broken = [lineage[0], {"step": 2, "ids": [lineage[0]["ids"][0]]}]
    write_lineages(ckpt, {"rl": broken})
    acc = audit_run(tmp_path, ckpt, samples_per_step=2)
    assert acc.duplicate_groups == ["g000000"]
    assert any("exactly 2 samples" in p for p in acc.problems)
    # A trained/ shard whose rows the lineage lacks is lost, not trained.
    assert "g000001" in acc.lost_groups
    assert not acc.ok
