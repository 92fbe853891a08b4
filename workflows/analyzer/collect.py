"""Collect trajectories for analyzer training (METHOD.md §6.1): the base policy's episodes on
training tasks, successful and failed, optionally mixed with scripted ones (expert, plausible
mistakes, and mismatched intention/action), every transition stored.

    python -m workflows.analyzer.collect                                  # embedded default
    python -m workflows.analyzer.collect collect.seeds_per_task=8 collect.expert_episodes=1

The base policy runs as a Serve deployment (``policy`` section; frozen, no weight sync) and
plays with the rollout workers' prompt; scripted episodes need no Serve app. Output, under
``<runs_dir>/<run_name>/``: ``transitions/*.parquet`` (schema: ``workflows.analyzer.transitions``;
each shard holds whole episodes) and ``collect_summary.json``. A rerun skips the episodes
already stored, so an interrupted collection resumes. On desktops (OSWorld-format tasks,
``task_source.kind=osworld``): policy and expert episodes; annotate them with a model expert
(the oracle reads MiniWoB's ground truth).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workflows.common.pipeline import parse_cli, select_tasks
from workflows.common.pipeline_config import CollectConfig, PipelineConfig

TRANSITIONS_DIR = "transitions"
SUMMARY_FILE = "collect_summary.json"


@dataclass(frozen=True)
class EpisodeJob:
    source: str  # policy | expert | wrong | mismatch
    task: dict[str, Any]
    index: int

    @property
    def episode_id(self) -> str:
        return f"{self.source}-{self.task['task']}-{self.task.get('seed', 0)}-{self.index}"


def episode_jobs(cfg: CollectConfig, tasks: list[dict[str, Any]]) -> list[EpisodeJob]:
    counts = {
        "policy": cfg.policy_episodes,
        "expert": cfg.expert_episodes,
        "wrong": cfg.wrong_episodes,
        "mismatch": cfg.mismatch_episodes,
    }
    return [
        EpisodeJob(source, task, k)
        for task in tasks
        for source, n in counts.items()
        for k in range(n)
    ]


def transition_rows(job: EpisodeJob, result: Any, model: str) -> list[dict[str, Any]]:
    """An :class:`~workflows.common.episodes.EpisodeResult` as transition rows."""
    now = time.time()
    return [
        {
            "transition_id": f"{job.episode_id}-s{s.step_index}",
            "episode_id": job.episode_id,
            "source": job.source,
            "task_id": str(job.task["id"]),
            "task_name": str(job.task["task"]),
            "task_kind": str(job.task.get("kind", "")),
            "task_seed": int(job.task.get("seed", 0)),  # OSWorld tasks: one instance each
            "step_index": s.step_index,
            "num_steps": result.num_steps,
            "instruction": result.instruction,
            "history": s.history,
            "screenshot_before": s.screenshot_before,
            "screenshot_after": s.screenshot_after,
            "context": s.context,
            "response_text": s.response_text,
            "action": s.action.model_dump_json(),
            "executed_action": s.executed_action,
            "executed": s.executed,
            "env_done": s.env_done,
            "truth_before": s.truth_before,
            "truth_after": s.truth_after,
            "episode_score": result.score,
            "success": result.success,
            "model": model,
            "created_at": now,
        }
        for s in result.steps
    ]


class ShardWriter:
    """Buffers whole episodes; writes a Parquet shard every ``episodes_per_shard``."""

    def __init__(self, folder: Path, episodes_per_shard: int) -> None:
        self.folder = folder
        self.per_shard = episodes_per_shard
        self.rows: list[dict[str, Any]] = []
        self.episodes = 0
        self.shards = 0

    def add(self, rows: list[dict[str, Any]]) -> None:
        self.rows.extend(rows)
        self.episodes += 1
        if self.episodes >= self.per_shard:
            self.flush()

    def flush(self) -> None:
        from workflows.analyzer.transitions import write_transitions

        if self.rows:
            name = f"part-{time.time_ns()}-{self.shards:05d}.parquet"
            write_transitions(self.rows, self.folder / name)
            self.shards += 1
        self.rows, self.episodes = [], 0


class Tally:
    """What was collected, by source and task kind."""

    def __init__(self) -> None:
        self.by_source: dict[str, Counter[str]] = defaultdict(Counter)
        self.by_kind: dict[str, Counter[str]] = defaultdict(Counter)
        self.errors: list[str] = []

    def episode(self, job: EpisodeJob, result: Any) -> None:
        executed = sum(s.executed for s in result.steps)
        for c in (self.by_source[job.source], self.by_kind[str(job.task.get("kind", ""))]):
            c["episodes"] += 1
            c["successes"] += int(result.success)
            c["transitions"] += len(result.steps)
            c["executed"] += executed
            c["invalid"] += len(result.steps) - executed

    def failure(self, job: EpisodeJob, exc: BaseException) -> None:
        key = "skipped_no_plan" if _is_no_plan(exc) else "failed"
        self.by_source[job.source][key] += 1
        if len(self.errors) < 20:
            self.errors.append(f"{job.episode_id}: {type(exc).__name__}: {exc}")

    def summary(self) -> dict[str, Any]:
        total = Counter[str]()
        for c in self.by_source.values():
            total.update(c)
        out: dict[str, Any] = {
            "total": dict(total),
            "by_source": {k: dict(v) for k, v in sorted(self.by_source.items())},
            "by_kind": {k: dict(v) for k, v in sorted(self.by_kind.items())},
            "errors": self.errors,
        }
        for section in (out["by_source"], out["by_kind"]):
            for c in section.values():
                c["success_rate"] = c.get("successes", 0) / max(c.get("episodes", 0), 1)
        return out


def _is_no_plan(exc: BaseException) -> bool:
    from env_client.scripted import NoPlan

    return isinstance(exc, NoPlan)


def stored_episodes(folder: Path) -> set[str]:
    from workflows.analyzer.transitions import read_transitions, shard_paths

    if not folder.is_dir() or not shard_paths(folder):
        return set()
    return {r["episode_id"] for r in read_transitions(folder, columns=["episode_id"])}


def collect_style(cfg: PipelineConfig) -> Any:
    """The policy's prompt style: scripted episodes speak it too, so the analyzer learns to
    read the answers it will judge."""
    from serve_apps.prompting.styles import make_style

    return make_style(cfg.policy.agent_style, cfg.collect.history_screens)


def _agent_factory(cfg: PipelineConfig, handle: Any) -> Callable[[EpisodeJob], Any]:
    from env_client.scripted import wrong
    from workflows.analyzer.oracle import mismatch_plan
    from workflows.common.episodes import PolicyAgent, ScriptedAgent, expert_agent

    planners = {"wrong": wrong, "mismatch": mismatch_plan}
    style = collect_style(cfg)

    def make(job: EpisodeJob) -> Any:
        if job.source == "policy":
            return PolicyAgent(handle, cfg.policy.model_path, style)
        if job.source == "expert":
            return expert_agent("scripted-expert", job.task, style)
        return ScriptedAgent(f"scripted-{job.source}", planners[job.source], style)

    return make


# Collect settings that read MiniWoB's ground truth (the DOM behind the page).
_NEED_TRUTH = ("wrong_episodes", "mismatch_episodes")


def plan(cfg: PipelineConfig) -> tuple[list[EpisodeJob], list[EpisodeJob]]:
    """(all episode jobs, those not stored yet)."""
    from env_client.tasks.sources import make_task_source

    c = cfg.collect
    if cfg.task_source.kind != "miniwob":
        used = [f"collect.{k}={getattr(c, k)}" for k in _NEED_TRUTH if getattr(c, k)]
        if used:
            raise ValueError(
                f"{', '.join(used)}: these read MiniWoB's ground truth, which "
                f"{cfg.task_source.kind} tasks do not have; set them to 0 (policy and expert "
                "episodes work on every task source)"
            )
    tasks = make_task_source(cfg.task_source).tasks(c.split)
    jobs = episode_jobs(c, select_tasks(tasks, c.tasks, c.seeds_per_task))
    stored = stored_episodes(cfg.run_dir / TRANSITIONS_DIR)
    return jobs, [j for j in jobs if j.episode_id not in stored]


async def collect(
    cfg: PipelineConfig, env_url: str, policy_handle: Any, todo: list[EpisodeJob]
) -> dict[str, Any]:
    """Play the episode jobs; write shards (also when interrupted); return the tally."""
    writer = ShardWriter(cfg.run_dir / TRANSITIONS_DIR, cfg.collect.episodes_per_shard)
    tally = Tally()
    try:
        await _play_all(cfg, env_url, _agent_factory(cfg, policy_handle), todo, writer, tally)
    finally:
        writer.flush()  # completed episodes survive a Ctrl-C
    return tally.summary()


async def _play_all(
    cfg: PipelineConfig,
    env_url: str,
    make_agent: Callable[[EpisodeJob], Any],
    todo: list[EpisodeJob],
    writer: ShardWriter,
    tally: Tally,
) -> None:
    from env_client.client import EnvClient
    from workflows.common.episodes import play_episode, play_with_retries, run_bounded

    c = cfg.collect
    style = collect_style(cfg)
    async with EnvClient(cfg.env.model_copy(update={"server_url": env_url})) as client:

        def job_fn(job: EpisodeJob) -> Callable[[], Any]:
            def play() -> Any:
                return play_episode(
                    client, job.task, make_agent(job), style, max_steps=c.max_steps,
                    pause_s=c.pause_s, record=True,
                    ground_truth=c.ground_truth and job.task.get("env") == "miniwob",
                )  # fmt: skip

            return lambda: play_with_retries(play, c.episode_retries, job.episode_id)

        async for i, res in run_bounded([job_fn(j) for j in todo], c.concurrency):
            job = todo[i]
            if isinstance(res, BaseException):
                tally.failure(job, res)
                continue
            model = cfg.policy.model_path if job.source == "policy" else "scripted"
            writer.add(transition_rows(job, res, model))
            tally.episode(job, res)


def run(cfg: PipelineConfig) -> dict[str, Any]:
    """Collect with the embedded (or configured) environment and, if needed, the policy app."""
    from workflows.common.pipeline import environment, write_json

    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    jobs, todo = plan(cfg)
    print(f"[collect] {len(jobs)} episodes planned, {len(jobs) - len(todo)} already stored")
    with environment(cfg.env, run_dir / "env_server.log") as url:
        if any(j.source == "policy" for j in todo):
            summary = _with_policy(cfg, url, todo)
        else:
            summary = asyncio.run(collect(cfg, url, None, todo))
    summary["already_stored_episodes"] = len(jobs) - len(todo)
    summary["elapsed_s"] = time.time() - t0
    write_json(run_dir / SUMMARY_FILE, summary)
    print(format_summary(summary), flush=True)
    print(f"[collect] transitions in {run_dir / TRANSITIONS_DIR}", flush=True)
    return summary


def _with_policy(cfg: PipelineConfig, env_url: str, todo: list[EpisodeJob]) -> dict[str, Any]:
    from serve_apps.policy import build_policy_app
    from workflows.common.pipeline import (
        frozen_policy,
        ray_session,
        resolve_model_path,
        serve_app,
        start_serve,
    )

    policy = frozen_policy(
        cfg.policy, resolve_model_path(cfg.policy.model_path), f"{cfg.run_name}-collect-policy"
    )
    with ray_session(cfg):
        start_serve(cfg.serve_http_port)
        with serve_app(build_policy_app(policy), policy.name, policy.route_prefix) as handle:
            return asyncio.run(collect(cfg, env_url, handle, todo))


def format_summary(summary: dict[str, Any]) -> str:
    lines = ["[collect] source     episodes  success  transitions  executed  invalid  failed"]
    for source, c in summary["by_source"].items():
        lines.append(
            f"[collect] {source:<9} {c.get('episodes', 0):>9} {c['success_rate']:>8.2f} "
            f"{c.get('transitions', 0):>12} {c.get('executed', 0):>9} {c.get('invalid', 0):>8} "
            f"{c.get('failed', 0) + c.get('skipped_no_plan', 0):>7}"
        )
    for err in summary["errors"][:5]:
        lines.append(f"[collect] error: {err}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parsed = parse_cli("python -m workflows.analyzer.collect", __doc__, argv)
    if isinstance(parsed, int):
        return parsed
    run(parsed[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
