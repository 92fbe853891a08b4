"""Checks of a warm-start policy through its Serve deployment: sampled success on training
tasks (GRPO needs groups that sometimes succeed and sometimes fail) and the *guidance gap*,
``log π(expert answer | c⁺) − log π(expert answer | c)`` on held-out states, which bounds what
self-distillation can teach (METHOD.md §3, §5)."""

from __future__ import annotations

import functools
import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from workflows.warm_start.bc import contexts
from workflows.warm_start.config import CheckConfig
from workflows.warm_start.demos import STYLE, Demo


def check_tasks(tasks: Sequence[dict[str, Any]], cfg: CheckConfig) -> list[dict[str, Any]]:
    """The training tasks' instances the check plays (seeds past the demonstrations')."""
    first, last = cfg.seed_offset, cfg.seed_offset + cfg.seeds_per_task
    return [t for t in tasks if first <= int(t["seed"]) < last]


async def success_rates(
    env: Any, handle: Any, tasks: Sequence[dict[str, Any]], cfg: CheckConfig, seed: int
) -> dict[str, Any]:
    """Success per task name and overall, one sampled episode per instance."""
    from env_client.client import EnvClient
    from workflows.common.episodes import PolicyAgent, play_episode, play_with_retries, run_bounded

    def job(i: int, task: dict[str, Any]) -> Any:
        agent = PolicyAgent(handle, "warm", STYLE, cfg.temperature, seed * 1000 + i * 37)

        def play() -> Any:
            return play_episode(client, task, agent, STYLE, max_steps=cfg.max_steps)

        return lambda: play_with_retries(play, 2, f"check {task['id']}")

    by_task: dict[str, list[bool]] = defaultdict(list)
    async with EnvClient(env) as client:
        async for i, res in run_bounded([job(i, t) for i, t in enumerate(tasks)], 4):
            if not isinstance(res, BaseException):
                by_task[str(tasks[i]["task"])].append(res.success)
    rates = {name: sum(v) / len(v) for name, v in sorted(by_task.items())}
    played = [s for v in by_task.values() for s in v]
    return {"overall": sum(played) / max(len(played), 1), "episodes": len(played),
            "by_task": rates}  # fmt: skip


async def guidance_gaps(handle: Any, encoder: Any, demos: Sequence[Demo]) -> list[float]:
    """Per held-out state: log-prob of the expert answer (all its tokens, end of turn
    included) under the privileged minus the ordinary context, scored by the deployment."""
    from workflows.common.episodes import run_bounded

    async def one(d: Demo) -> float:
        ordinary, privileged = contexts(d)
        ids = encoder.answer_ids(d.answer)
        out = []
        for messages in (ordinary, privileged):
            res = await handle.score.remote(
                {"messages": messages, "images": [d.screen.png], "response_ids": ids}
            )
            out.append(sum(res["logprobs"]))
        return out[1] - out[0]

    gaps: list[float] = []
    async for _, res in run_bounded([functools.partial(one, d) for d in demos], 4):
        if isinstance(res, BaseException):
            raise res
        gaps.append(float(res))
    return gaps


def gap_summary(gaps: Sequence[float]) -> dict[str, float]:
    """Distribution of the guidance gap in nats."""
    if not gaps:
        return {"n": 0}
    q = statistics.quantiles(gaps, n=4) if len(gaps) > 1 else [gaps[0]] * 3
    return {
        "n": len(gaps),
        "mean": statistics.fmean(gaps),
        "q1": q[0],
        "median": q[1],
        "q3": q[2],
        "frac_above_1nat": sum(g > 1.0 for g in gaps) / len(gaps),
    }
