"""TrajectoryBuffer semantics (plain asyncio; the same class runs as a Ray actor)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.unit.test_schema import make_row
from train_loops.jsonl import read_jsonl
from workflows.online_rl.buffer import LEDGER_FILE, TrajectoryBuffer, group_id_of, has_gradient
from workflows.online_rl.config import BufferConfig


def _group(gid: str, n: int, version: int = 0) -> list[dict]:
    rows = []
    for i in range(n):
        r = make_row(i)
        r.update(
            sample_id=f"{gid}-{i}",
            group_id=gid,
            episode_id=f"{gid}-e{i % 2}",
            behavior_version=version,
        )
        rows.append(r)
    return rows


def run(coro):
    return asyncio.run(coro)


def test_put_take_is_atomic_and_counts() -> None:
    async def go():
        buf = TrajectoryBuffer(
            BufferConfig(capacity_samples=100, max_staleness=1), samples_per_step=4
        )
        assert await buf.acquire(0) is not None
        assert await buf.put_group("g1", _group("g1", 5), successes=1)
        first = await buf.take(3)
        second = await buf.take(3)
        empty = await buf.take(3, timeout_s=0.05)
        return buf, first, second, empty

    buf, first, second, empty = run(go())
    assert [r["sample_id"] for r in first + second] == [f"g1-{i}" for i in range(5)]
    assert empty == []
    s = buf.stats()
    assert (s["groups_completed"], s["samples_in"], s["samples_out"], s["episodes"]) == (1, 5, 5, 2)
    assert s["success_rate"] == 0.5


def test_staleness_gates_new_groups_and_drops_old_ones() -> None:
    async def go():
        buf = TrajectoryBuffer(
            BufferConfig(capacity_samples=100, max_staleness=1), samples_per_step=4
        )
        await buf.set_version(3)
        blocked = asyncio.create_task(buf.acquire(1))  # 3 - 1 > 1: must wait
        await asyncio.sleep(0.05)
        was_blocked = not blocked.done()
        blocked.cancel()
        ok = await buf.acquire(2) is not None
        dropped = not await buf.put_group("old", _group("old", 2, version=0), successes=0)
        return buf, was_blocked, ok, dropped

    buf, was_blocked, ok, dropped = run(go())
    assert was_blocked and ok and dropped
    assert buf.stats()["groups_dropped_stale"] == 1


def test_sync_mode_stops_after_a_steps_worth_until_next_version() -> None:
    async def go():
        buf = TrajectoryBuffer(BufferConfig(), samples_per_step=4, mode="sync")
        assert await buf.acquire(0) is not None
        await buf.put_group("a", _group("a", 4), successes=0)
        waiting = asyncio.create_task(buf.acquire(0))
        await asyncio.sleep(0.05)
        blocked = not waiting.done()
        await buf.set_version(1)
        resumed = await asyncio.wait_for(waiting, 1.0) is not None
        return blocked, resumed

    blocked, resumed = run(go())
    assert blocked and resumed


def test_close_wakes_everyone() -> None:
    async def go():
        buf = TrajectoryBuffer(BufferConfig(capacity_samples=1), samples_per_step=4)
        assert await buf.acquire(0) is not None
        await buf.put_group("a", _group("a", 1), successes=0)
        producer = asyncio.create_task(buf.acquire(0))  # full: waits
        await asyncio.sleep(0.05)
        await buf.close()
        rows = await buf.take(5)
        return await producer, rows, await buf.take(5)

    started, rows, after = run(go())
    assert started is None and len(rows) == 1 and after is None


def test_completed_groups_survive_a_restart(tmp_path: Path) -> None:
    """Handing rows out is not training: a restart reloads every row that the checkpoint it
    resumes from (its lineage, ``trained_ids``) lacks, and nothing it has."""

    async def first_life():
        buf = TrajectoryBuffer(BufferConfig(), samples_per_step=4, shard_dir=str(tmp_path))
        for gid in ("a", "b"):
            await buf.acquire(0)
            await buf.put_group(gid, _group(gid, 2), successes=0)
        return await buf.take(3)  # a's two rows and b-0 handed out; b-1 still queued

    taken = run(first_life())
    assert [r["sample_id"] for r in taken] == ["a-0", "a-1", "b-0"]
    trained = ["a-0", "a-1"]  # the checkpoint holds a; b-0 was lost with the trainer
    buf = TrajectoryBuffer(
        BufferConfig(), samples_per_step=4, shard_dir=str(tmp_path), trained_ids=trained
    )
    rows = run(buf.take(10))
    assert [r["sample_id"] for r in rows] == ["b-0", "b-1"]
    assert buf.stats()["groups_restored"] == 1
    assert (tmp_path / "trained" / "a.parquet").exists()
    assert (tmp_path / "pending" / "b.parquet").exists()  # until its rows are committed


def test_a_dead_trainer_attempts_rows_come_back_once(tmp_path: Path) -> None:
    """The job's answer to a trainer crash: end the stream epoch, requeue what the dead
    attempt held but its newest checkpoint does not, open the next epoch."""

    async def go():
        buf = TrajectoryBuffer(BufferConfig(), samples_per_step=2, shard_dir=str(tmp_path))
        for gid in ("a", "b"):
            await buf.acquire(0)
            await buf.put_group(gid, _group(gid, 3), successes=0)
        epoch = await buf.open_stream()
        first = await buf.take(2, epoch=epoch)  # a-0 a-1: trained and checkpointed
        assert await buf.commit(2, [r["sample_id"] for r in first]) == 2
        await buf.take(2, epoch=epoch)  # a-2 b-0: trained after the checkpoint, then lost
        await buf.take(1, epoch=epoch)  # b-1: in the dead attempt's pipeline
        await buf.end_stream()
        back = await buf.requeue(["a-0", "a-1", "a-2"])  # a-2 made a later checkpoint
        second = await buf.take(10, epoch=await buf.open_stream())
        await buf.commit(4, [r["sample_id"] for r in second])
        return buf, back, second

    buf, back, second = run(go())
    assert back == 2
    assert [r["sample_id"] for r in second] == ["b-0", "b-1", "b-2"]  # order kept
    s = buf.stats()
    assert (s["samples_trained"], s["samples_requeued"], s["groups_trained"]) == (6, 2, 2)
    assert sorted(p.name for p in (tmp_path / "trained").iterdir()) == ["a.parquet", "b.parquet"]
    assert not list((tmp_path / "pending").iterdir())


def test_a_commit_removes_a_requeued_copy_still_queued(tmp_path: Path) -> None:
    """A commit that arrives after its rows were requeued (a checkpoint the requeue did not
    know of) takes the queued copies out: they are never handed out twice."""

    async def go():
        buf = TrajectoryBuffer(BufferConfig(), samples_per_step=2, shard_dir=str(tmp_path))
        await buf.acquire(0)
        await buf.put_group("a", _group("a", 2), successes=0)
        await buf.take(2, epoch=await buf.open_stream())
        await buf.end_stream()
        assert await buf.requeue([]) == 2
        await buf.commit(1, ["a-0"])
        return buf, await buf.take(5, timeout_s=0.05)

    buf, rest = run(go())
    assert [r["sample_id"] for r in rest] == ["a-1"]
    assert buf.stats()["handed_samples"] == 1


def test_a_dead_workers_groups_are_dropped_and_its_late_answers_ignored(tmp_path: Path) -> None:
    async def go():
        buf = TrajectoryBuffer(BufferConfig(), samples_per_step=2, shard_dir=str(tmp_path))
        seqs = [await buf.acquire(0, worker=w) for w in (0, 1, 1)]
        lost = await buf.worker_lost(1)
        late = await buf.put_group(group_id_of(seqs[1]), _group(group_id_of(seqs[1]), 2), 0)
        return buf, seqs, lost, late

    buf, seqs, lost, late = run(go())
    assert lost == [group_id_of(seqs[1]), group_id_of(seqs[2])] and not late
    s = buf.stats()
    assert (s["groups_worker_died"], s["groups_in_flight"], s["groups_late"]) == (2, 1, 1)
    drops = [e for e in read_jsonl(tmp_path / LEDGER_FILE) if e["ev"] == "drop"]
    assert [(e["group"], e["reason"]) for e in drops] == [(g, "worker_died") for g in lost]


def test_a_restart_numbers_groups_after_every_earlier_one_and_records_abandoned(
    tmp_path: Path,
) -> None:
    async def first_life():
        buf = TrajectoryBuffer(BufferConfig(), samples_per_step=2, shard_dir=str(tmp_path))
        done, cut = await buf.acquire(0), await buf.acquire(0)
        await buf.put_group(group_id_of(done), _group(group_id_of(done), 2), 0)
        return cut  # the job dies while this group plays

    cut = run(first_life())
    buf = TrajectoryBuffer(
        BufferConfig(), samples_per_step=2, shard_dir=str(tmp_path), start_cursor=0
    )
    assert run(buf.acquire(0)) == 2  # not 0: ids stay unique across lives
    drops = [e for e in read_jsonl(tmp_path / LEDGER_FILE) if e["ev"] == "drop"]
    assert [(e["group"], e["reason"]) for e in drops] == [(group_id_of(cut), "abandoned")]
    assert buf.stats()["groups_abandoned"] == 1


@pytest.mark.parametrize("reason", ["failed", "cancelled"])
def test_dropped_groups_release_their_slot(reason: str) -> None:
    async def go():
        buf = TrajectoryBuffer(BufferConfig(), samples_per_step=1, mode="sync")
        assert await buf.acquire(0) is not None
        await buf.drop_group(reason)
        return buf, await asyncio.wait_for(buf.acquire(0), 1.0) is not None

    buf, ok = run(go())
    assert ok
    s = buf.stats()
    assert (s["groups_dropped_failed"], s["groups_cancelled"]) == (
        (1, 0) if reason == "failed" else (0, 1)
    )


def test_ending_a_stream_epoch_stops_its_readers_only(tmp_path: Path) -> None:
    """An Entropulse switch: the RL fit's readers end, groups keep coming in, and the next
    stream starts without the groups that became too stale meanwhile."""

    async def go():
        buf = TrajectoryBuffer(
            BufferConfig(capacity_samples=100, max_staleness=1),
            samples_per_step=4,
            shard_dir=str(tmp_path),
        )
        epoch = await buf.open_stream()
        waiting = asyncio.create_task(buf.take(2, timeout_s=5.0, epoch=epoch))
        await asyncio.sleep(0.05)
        await buf.end_stream()
        ended = await waiting  # woken at once, not after the timeout
        for gid, version in (("old", 0), ("new", 3)):
            assert await buf.acquire(version) is not None
            assert await buf.put_group(gid, _group(gid, 2, version), successes=0)
        stale_read = await buf.take(2, timeout_s=0.05, epoch=epoch)
        await buf.set_version(4)  # e.g. the SFT phase published versions 1..4
        next_epoch = await buf.open_stream()
        rows = await buf.take(10, timeout_s=0.05, epoch=next_epoch)
        await buf.commit(1, [r["sample_id"] for r in rows])
        return buf, epoch, ended, stale_read, next_epoch, rows

    buf, epoch, ended, stale_read, next_epoch, rows = run(go())
    assert ended is None and stale_read is None and next_epoch == epoch + 1
    assert [r["group_id"] for r in rows] == ["new", "new"]  # 4 - 0 > 1 + 1: purged
    s = buf.stats()
    assert (s["groups_completed"], s["groups_purged_stale"], s["samples_out"]) == (2, 1, 2)
    assert [p.name for p in (tmp_path / "purged").iterdir()] == ["old.parquet"]
    assert not list((tmp_path / "pending").iterdir())  # a restart restores neither
    assert [p.name for p in (tmp_path / "trained").iterdir()] == ["new.parquet"]


def test_has_gradient_follows_advantage_and_active_distillation() -> None:
    base = {"advantage": 0.0, "d": 1, "guide": "click OK", "avoid": ""}
    assert has_gradient({**base, "advantage": -0.5}, "off")
    assert has_gradient(base, "gated")
    assert not has_gradient(base, "off")
    assert not has_gradient({**base, "d": 0}, "gated")
    assert has_gradient({**base, "d": 0}, "ungated")
    assert not has_gradient({**base, "guide": ""}, "gated")  # no guidance: no target
    assert not has_gradient({**base, "guide": "", "d": 0}, "ungated")


def test_zero_gradient_samples_are_dropped_and_counted(tmp_path: Path) -> None:
    async def go():
        buf = TrajectoryBuffer(
            BufferConfig(drop_zero_gradient=True), samples_per_step=2,
            shard_dir=str(tmp_path), sd_type="gated",
        )  # fmt: skip
        mixed = _group("g1", 4)
        for i, r in enumerate(mixed):  # one sample with a gradient (an SD target) of four
            r.update(advantage=0.0, d=1 if i == 2 else 0, guide="g", avoid="")
        flat = _group("g2", 3)
        for r in flat:
            r.update(advantage=0.0, d=0)
        for gid, rows in (("g1", mixed), ("g2", flat)):
            await buf.acquire(0)
            await buf.put_group(gid, rows, successes=0)
        taken = await buf.take(10)
        await buf.commit(1, [r["sample_id"] for r in taken])
        return buf, taken

    buf, taken = run(go())
    assert [r["sample_id"] for r in taken] == ["g1-2"]
    s = buf.stats()
    assert (s["samples_dropped_zero_grad"], s["groups_zero_grad"], s["samples_in"]) == (6, 1, 1)
    assert s["groups_completed"] == 2  # both groups finished; neither lost
    assert (tmp_path / "zero_grad" / "g2.parquet").exists()
    assert (tmp_path / "trained" / "g1.parquet").exists()


def test_success_rate_per_task_family() -> None:
    async def go():
        buf = TrajectoryBuffer(
            BufferConfig(), samples_per_step=2, kinds={"t-a": "calc", "t-b": "os"}
        )
        for gid, task, rewards in (("g1", "t-a", (1.0, -1.0)), ("g2", "t-b", (-1.0, -1.0))):
            rows = _group(gid, 4)  # episodes e0, e1 (two steps each)
            for r in rows:
                r.update(task_id=task, reward=rewards[int(r["episode_id"][-1])])
            await buf.acquire(0)
            await buf.put_group(gid, rows, successes=sum(x > 0 for x in rewards))
        return buf.stats()

    s = run(go())
    assert (s["success_rate/calc"], s["success_rate/os"], s["success_rate"]) == (0.5, 0.0, 0.25)


def test_rollout_budget_closes_the_stream_after_the_last_group() -> None:
    async def go():
        buf = TrajectoryBuffer(BufferConfig(), samples_per_step=2, max_groups=2)
        seqs = [await buf.acquire(0), await buf.acquire(0), await buf.acquire(0)]
        await buf.put_group("g0", _group("g0", 2), successes=0)
        still_open = await buf.take(10)  # one group in flight: more rows may come
        await buf.drop_group("failed")  # the budget's last group ends without rows
        return seqs, still_open, await buf.take(10)

    seqs, still_open, after = run(go())
    assert seqs == [0, 1, None]  # no group starts past the budget
    assert len(still_open) == 2
    assert after is None  # closed and drained: the trainer's stream ends


def test_informative_task_order_learns_from_every_finished_group() -> None:
    from workflows.online_rl.curriculum import TaskPicker

    async def go():
        names = ["a", "b"] * 3
        buf = TrajectoryBuffer(
            BufferConfig(), samples_per_step=2,
            picker=TaskPicker(names, order="informative", window=1, explore=0.0),
        )  # fmt: skip
        first = buf.task_for(0)
        rows = _group("g0", 4)
        for r in rows:
            r.update(task_id="a")
        await buf.acquire(0)
        await buf.put_group("g0", rows, successes=2)  # both episodes won: "a" saturated
        return first, buf.task_for(2), buf.stats()

    first, after, stats = run(go())
    assert first == 0 and after == 3  # entry 2 is an "a": the next "b" instead
    assert (stats["tasks_saturated"], stats["tasks_skipped"]) == (1, 1)
