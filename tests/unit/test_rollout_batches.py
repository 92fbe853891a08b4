"""The authors' update schedule (``trainer.schedule: rollout_batch``): the buffer deals every
``groups_per_batch`` completed groups as one rollout batch, one equal part per trainer rank;
zero-gradient samples are dropped; a batch left empty is not dealt (no update)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pytest

from tests.unit.test_buffer import _group
from train_loops.jsonl import read_jsonl
from train_loops.schema import STREAM_PART_SCHEMA
from train_loops.stream import PartStream
from workflows.online_rl.accounting import audit_run
from workflows.online_rl.batches import RolloutBatcher, deal, strip
from workflows.online_rl.buffer import LEDGER_FILE, TrajectoryBuffer
from workflows.online_rl.config import BufferConfig


def _ids(rows: list[dict]) -> list[str]:
    return [r["sample_id"] for r in rows]


def test_deal_pads_to_whole_micro_batches_on_every_rank() -> None:
    rows = _group("g", 5)
    parts = deal(rows, seq=7, world=2, micro=2)
    assert [len(p) for p in parts] == [4, 4]  # 5 real → 8 = 2 ranks × 2 micro-batches of 2
    flat = [r for p in parts for r in p]
    assert sorted(_ids([r for r in flat if r["weight"] == 1.0])) == sorted(_ids(rows))
    assert sum(r["weight"] == 0.0 for r in flat) == 3
    assert {(r["batch_seq"], r["batch_real"], r["part_rows"]) for r in flat} == {(7, 5, 4)}
    # Padding comes last on each rank: the real rows fill the first micro-batches.
    for part in parts:
        weights = [r["weight"] for r in part]
        assert weights == sorted(weights, reverse=True)
    with pytest.raises(ValueError, match="no rows"):
        deal([], seq=8, world=2, micro=2)


def test_batcher_makes_one_batch_per_groups_and_keeps_ranks_aligned() -> None:
    batcher = RolloutBatcher(groups=2, world=2, micro=1)
    done = [batcher.add_group(_group(gid, n)) for gid, n in (("a", 3), ("b", 2), ("c", 1))]
    assert done == [False, True, False] and batcher.queued_count() == 6  # c waits for a 2nd group
    rank0, rank1 = batcher.take(0, 10), batcher.take(1, 10)
    assert len(rank0) == len(rank1) == 3 and rank0[0]["batch_seq"] == rank1[0]["batch_seq"] == 0
    assert sorted(_ids(rank0 + rank1)) == ["a-0", "a-0", "a-1", "a-2", "b-0", "b-1"]  # a-0: pad
    batcher.flush()  # no more groups: c goes out alone
    assert [r["batch_real"] for r in batcher.take(0, 10) + batcher.take(1, 10)] == [1, 1]


def test_a_batch_without_rows_is_counted_and_never_dealt() -> None:
    batcher = RolloutBatcher(groups=2, world=2, micro=1)
    for rows in ([], [], _group("c", 1), []):
        batcher.add_group(rows)
    assert (batcher.batches, batcher.empty_batches) == (2, 1)
    assert [r["batch_seq"] for r in batcher.take(0, 10)] == [1]  # batch 0 had nothing


def test_rebuild_deals_each_batch_again_with_its_members_and_aligns_the_ranks() -> None:
    batcher = RolloutBatcher(groups=1, world=2, micro=1)
    for gid in ("a", "b"):
        batcher.add_group(_group(gid, 2))
    batcher.add_group([])  # an empty batch in between
    batcher.add_group(_group("c", 2))
    handed = batcher.take(0, 2)  # rank 0 read batch 0 and half of batch 1; rank 1 nothing
    batcher.rebuild(front=handed, drop={"b-1"})
    rank0, rank1 = batcher.take(0, 10), batcher.take(1, 10)
    assert [r["batch_seq"] for r in rank0] == [r["batch_seq"] for r in rank1] == [0, 1, 3]
    by_seq: dict[int, list[str]] = {}
    for r in rank0 + rank1:
        if r["weight"] > 0:
            by_seq.setdefault(r["batch_seq"], []).append(r["sample_id"])
    assert {k: sorted(v) for k, v in by_seq.items()} == {
        0: ["a-0", "a-1"],
        1: ["b-0"],
        3: ["c-0", "c-1"],
    }
    assert "weight" not in strip(rank0[0])


def _buffer(tmp_path: Path, **cfg) -> TrajectoryBuffer:
    return TrajectoryBuffer(
        BufferConfig(drop_zero_gradient=True, groups_per_batch=2, **cfg),
        samples_per_step=4, shard_dir=str(tmp_path), sd_type="gated",
        batcher=RolloutBatcher(groups=2, world=2, micro=2),
    )  # fmt: skip


def _flat(gid: str, n: int) -> list[dict]:
    rows = _group(gid, n)
    for r in rows:  # all-equal rewards and no distillation target: no gradient
        r.update(advantage=0.0, d=0)
    return rows


def test_buffer_deals_one_part_per_rank_per_rollout_batch(tmp_path: Path) -> None:
    async def go():
        buf = _buffer(tmp_path)
        for gid, rows in (("g1", _group("g1", 3)), ("g2", _flat("g2", 4))):
            await buf.acquire(0)
            await buf.put_group(gid, rows, successes=1)
        epoch = await buf.open_stream()
        parts = [await buf.take(10, epoch=epoch, rank=r) for r in (0, 1)]
        with pytest.raises(ValueError, match="rank"):
            await buf.take(1)  # a rollout-batch buffer needs the reader's rank
        return buf, parts

    buf, parts = run(go())
    # g2's samples carry no gradient (dropped), but g2 still counts as one of the 2 groups.
    assert [len(p) for p in parts] == [2, 2]
    assert sorted(_ids([r for p in parts for r in p if r["weight"] > 0])) == [
        "g1-0",
        "g1-1",
        "g1-2",
    ]
    s = buf.stats()
    assert (s["rollout_batches"], s["rollout_batches_empty"], s["samples_out"]) == (1, 0, 3)
    assert (s["samples_dropped_zero_grad"], s["groups_zero_grad"]) == (4, 1)


def test_a_batch_left_empty_is_not_dealt_and_the_next_one_is(tmp_path: Path) -> None:
    async def go():
        buf = _buffer(tmp_path)
        for gid, rows in (("g1", _flat("g1", 2)), ("g2", _flat("g2", 2)),
                          ("g3", _group("g3", 1)), ("g4", _flat("g4", 1))):  # fmt: skip
            await buf.acquire(0)
            await buf.put_group(gid, rows, successes=0)
        epoch = await buf.open_stream()
        return buf, [await buf.take(10, epoch=epoch, rank=r) for r in (0, 1)]

    buf, parts = run(go())
    assert [[(r["batch_seq"], r["batch_real"]) for r in p] for p in parts] == [[(1, 1)] * 2] * 2
    s = buf.stats()
    assert (s["rollout_batches"], s["rollout_batches_empty"]) == (2, 1)
    ledger = read_jsonl(tmp_path / LEDGER_FILE)
    assert [e["batch"] for e in ledger if e["ev"] == "empty_batch"] == [0]


def test_parts_a_dead_trainer_held_are_dealt_again_aligned(tmp_path: Path) -> None:
    async def go():
        buf = _buffer(tmp_path, capacity_samples=100)
        for gid in ("a", "b", "c", "d"):
            await buf.acquire(0)
            await buf.put_group(gid, _group(gid, 2), successes=1)
        epoch = await buf.open_stream()
        first = await buf.take(2, epoch=epoch, rank=0)  # batch 0: 4 rows, 2 per rank
        await buf.take(2, epoch=epoch, rank=1)
        await buf.take(1, epoch=epoch, rank=0)  # rank 0 read into batch 1, then the fit died
        await buf.end_stream()
        await buf.requeue([])
        epoch = await buf.open_stream()
        again = [await buf.take(4, epoch=epoch, rank=r) for r in (0, 1)]
        return first, again

    first, again = run(go())
    assert first[0]["batch_seq"] == 0
    # Nothing was committed: batch 0, then batch 1 whole again, in step on both ranks.
    assert [r["batch_seq"] for r in again[0]] == [r["batch_seq"] for r in again[1]] == [0, 0, 1, 1]
    dealt = sorted(_ids([r for p in again for r in p if r["weight"] > 0]))
    assert dealt == ["a-0", "a-1", "b-0", "b-1", "c-0", "c-1", "d-0", "d-1"]


def test_the_last_short_batch_goes_out_when_the_budget_is_spent(tmp_path: Path) -> None:
    async def go():
        buf = TrajectoryBuffer(
            BufferConfig(groups_per_batch=4), samples_per_step=4, max_groups=1,
            batcher=RolloutBatcher(groups=4, world=2, micro=1),
        )  # fmt: skip
        seq = await buf.acquire(0)
        await buf.put_group(f"g{seq}", _group("g", 2), successes=1)
        parts = [await buf.take(10, rank=r) for r in (0, 1)]
        return parts, await buf.take(10, rank=0)

    parts, after = run(go())
    assert [len(p) for p in parts] == [1, 1] and after is None


def test_sync_mode_starts_one_batch_of_groups_per_version() -> None:
    async def go():
        buf = TrajectoryBuffer(
            BufferConfig(groups_per_batch=2), samples_per_step=4, mode="sync",
            batcher=RolloutBatcher(groups=2, world=1, micro=1),
        )  # fmt: skip
        for gid in ("a", "b"):
            assert await buf.acquire(0) is not None
            await buf.put_group(gid, _group(gid, 1), successes=1)
        third = asyncio.create_task(buf.acquire(0))
        await asyncio.sleep(0.05)
        blocked = not third.done()
        await buf.set_version(1)  # the batch's update was published
        return blocked, await asyncio.wait_for(third, 1.0)

    blocked, third = run(go())
    assert blocked and third is not None


def test_part_stream_returns_whole_parts_across_blocks() -> None:
    rows = _group("g", 3)
    parts = deal(rows, seq=0, world=1, micro=2) + deal(_group("h", 1), seq=1, world=1, micro=2)
    flat = [r for p in parts for r in p]
    # Blocks cut across the part boundary: 3 + 3 rows for parts of 4 and 2.
    blocks = [pa.Table.from_pylist(flat[:3], schema=STREAM_PART_SCHEMA),
              pa.Table.from_pylist(flat[3:], schema=STREAM_PART_SCHEMA)]  # fmt: skip

    class Shard:  # the rank's Ray Data iterator, as far as PartStream uses it
        def iter_batches(self, **kw):
            assert kw["batch_size"] is None
            return iter(blocks)

    stream = PartStream(Shard())
    got = [stream.next(), stream.next(), stream.next()]
    assert [len(p) for p in got[:2]] == [4, 2] and got[2] is None
    assert [r["batch_seq"] for r in got[1]] == [1, 1]


def test_audit_accepts_steps_of_any_size_under_rollout_batches(tmp_path: Path) -> None:
    acc = audit_run(tmp_path, None, samples_per_step=None)
    assert acc.ok, acc.problems


def run(coro):
    return asyncio.run(coro)
