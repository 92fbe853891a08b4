"""One optimizer step per rollout batch on real DeepSpeed (ZeRO-2, two gloo ranks): each rank
trains its dealt part (padding included) and the update is exactly plain SGD on the mean loss
of the batch's real rows, whatever the batch size, also when a rank's part is all padding;
with ``updates`` > 1 (PPO epochs) it is that many such SGD steps on the same batch."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

LR = 0.5


class SquaredError:
    """A toy objective on rows {x, y}: the micro-batch's mean of (w·x + b - y)²."""

    kind = "rl"

    def micro_step(self, model: Any, rows: list[dict]) -> Any:
        import torch

        from train_loops.objectives import MicroStep

        x = torch.tensor([r["x"] for r in rows], dtype=torch.float32)
        y = torch.tensor([r["y"] for r in rows], dtype=torch.float32)
        loss = ((model(x).squeeze(-1) - y) ** 2).mean()
        return MicroStep(loss, {"loss/total": float(loss.detach())}, len(rows))


def _rows(n: int) -> list[dict]:
    return [{"sample_id": f"s{i}", "x": [i * 0.5, 1.0 - i], "y": float(i % 3)} for i in range(n)]


def _worker(rank: int, store: str, out: str, sizes: list[tuple[int, int]]) -> None:
    import torch
    import torch.distributed as dist

    from train_loops.engine import cpu_op_env, skip_shm_comm_op
    from train_loops.loop import train_batch
    from workflows.online_rl.batches import deal

    os.environ.update(DS_ACCELERATOR="cpu", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    cpu_op_env()
    skip_shm_comm_op()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    config = {
        "train_batch_size": 4,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,  # plain SGD: its update shows the gradient
        "gradient_clipping": 0.0,  # DeepSpeed clips at 1.0 unless told otherwise
        "steps_per_print": 10**9,
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    got = []
    for seq, (n, updates) in enumerate(sizes):
        before = [p.detach().clone() for p in engine.module.parameters()]
        part = deal(_rows(n), seq, world=2, micro=2)[rank]
        sums = train_batch(engine, SquaredError(), part, micro=2, world=2, updates=updates)
        after = [p.detach().clone() for p in engine.module.parameters()]
        got.append({
            "delta": [(a - b).flatten().tolist() for a, b in zip(after, before, strict=True)],
            "before": [b.flatten().tolist() for b in before],
            "samples": sums["samples"],
        })  # fmt: skip
    Path(out, f"{rank}.json").write_text(json.dumps(got))
    dist.destroy_process_group()


def _expected_delta(before: list[list[float]], n: int, updates: int) -> list[list[float]]:
    """Plain torch: ``updates`` SGD steps on the mean squared error of the n real rows."""
    import torch

    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor(before[0]).view(1, 2))
        model.bias.copy_(torch.tensor(before[1]))
    rows = _rows(n)
    x = torch.tensor([r["x"] for r in rows])
    y = torch.tensor([r["y"] for r in rows])
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(updates):
        optimizer.zero_grad()
        ((model(x).squeeze(-1) - y) ** 2).mean().backward()
        optimizer.step()
    return [
        (p.detach() - torch.tensor(b).view_as(p)).flatten().tolist()
        for p, b in zip((model.weight, model.bias), before, strict=True)
    ]


def test_each_rollout_batch_is_exact_mean_updates_on_two_ranks(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    # 5 real rows → 8 with padding (2 micro-batches per rank); 1 → rank 1's part is all
    # padding; 4 → no padding; then 5 again with two updates on the batch.
    sizes = [(5, 1), (1, 1), (4, 1), (5, 2)]
    mp.start_processes(
        _worker, args=(str(tmp_path / "store"), str(tmp_path), sizes), nprocs=2, join=True,
        start_method="spawn",
    )  # fmt: skip
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    for step, (n, updates) in enumerate(sizes):
        mine, theirs = ranks[0][step], ranks[1][step]
        for a, b in zip(mine["delta"], theirs["delta"], strict=True):
            assert a == pytest.approx(b)  # the same weights on both ranks
        expected = _expected_delta(mine["before"], n, updates)
        for got, want in zip(mine["delta"], expected, strict=True):
            assert got == pytest.approx(want, rel=1e-4, abs=1e-6), (step, n)
        assert mine["samples"] + theirs["samples"] == n
