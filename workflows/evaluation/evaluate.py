"""Evaluate policies (METHOD.md §8): Pass@1 over an eval split, independent runs, several
checkpoints compared in one report.

    python -m workflows.evaluation                                   # embedded default
    python -m workflows.evaluation --checkpoint base=tiny:0 \\
        --checkpoint rl=runs/embedded/rl/checkpoint_rl_000006 evaluate.runs=3

Each checkpoint is deployed in turn as a frozen policy Serve app and plays every task instance
of the split once per run (at most ``evaluate.max_steps`` ≤ 50 steps); run r samples with its
own seeds, so runs are independent and reproducible. ``evaluate.reference_expert`` adds the
scripted expert as a column (MiniWoB's from the ground truth, the built-in desktop tasks' from
their experts file; checks the harness). Outputs in
``<run_dir>/<evaluate.out_name>/``: ``report.md``, ``report.json`` (every episode's outcome
too), ``pass_at_1.png`` (grouped bars per task kind, error bars = std over runs).
"""

from __future__ import annotations

import asyncio
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workflows.common.pipeline import parse_cli
from workflows.common.pipeline_config import CheckpointSpec, PipelineConfig

EXPERT = "scripted-expert"


PROGRESS_EVERY_S = 20.0  # a progress line at least this often while episodes finish


def episode_seed(base: int, run: int, task_id: str) -> int:
    """A stable sampling seed per (run, task instance): runs differ, reruns repeat."""
    return zlib.crc32(f"{base}/{run}/{task_id}".encode()) & 0x3FFFFFFF


def eval_tasks(cfg: PipelineConfig) -> list[dict[str, Any]]:
    from env_client.tasks.sources import make_task_source
    from workflows.common.pipeline import select_tasks

    e = cfg.evaluate
    return select_tasks(make_task_source(cfg.task_source).tasks(e.split), e.tasks, e.seeds_per_task)


async def play_runs(
    cfg: PipelineConfig,
    env_url: str,
    label: str,
    make_agent: Callable[[int, dict[str, Any]], Any],
    tasks: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Every (run, task) episode of one checkpoint → outcome dicts."""
    from env_client.client import EnvClient
    from serve_apps.prompting.styles import make_style
    from workflows.common.episodes import play_episode, play_with_retries, run_bounded

    e = cfg.evaluate
    style = make_style(cfg.policy.agent_style, e.history_screens)
    pairs = [(r, t) for r in range(e.runs) for t in tasks]
    client_cfg = cfg.env.model_copy(update={"server_url": env_url})
    outcomes = []
    async with EnvClient(client_cfg) as client:

        def job(run: int, task: dict[str, Any]) -> Callable[[], Any]:
            def play() -> Any:
                agent = make_agent(run, task)
                return play_episode(
                    client, task, agent, style, max_steps=e.max_steps, pause_s=e.pause_s
                )

            return lambda: play_with_retries(play, e.episode_retries, f"{label}/{task['id']}")

        t0 = last = time.time()
        async for i, res in run_bounded([job(r, t) for r, t in pairs], e.concurrency):
            run, task = pairs[i]
            outcomes.append(_outcome(label, run, task, res))
            if time.time() - last >= PROGRESS_EVERY_S or len(outcomes) == len(pairs):
                last = time.time()
                wins = sum(bool(o["success"]) for o in outcomes)
                print(
                    f"[evaluate] {label}: {len(outcomes)}/{len(pairs)} episodes, "
                    f"{wins / len(outcomes):.2f} success so far, {last - t0:.0f}s",
                    flush=True,
                )
    return outcomes


def _outcome(label: str, run: int, task: dict[str, Any], res: Any) -> dict[str, Any]:
    failed = isinstance(res, BaseException)
    return {
        "checkpoint": label,
        "run": run,
        "task_id": str(task["id"]),
        "task_name": str(task["task"]),
        "kind": str(task.get("kind", "")),
        "success": None if failed else res.success,
        "score": None if failed else res.score,
        "steps": None if failed else res.num_steps,
        "error": f"{type(res).__name__}: {res}"[:300] if failed else None,
    }


def evaluate_checkpoint(
    cfg: PipelineConfig, spec: CheckpointSpec, env_url: str, tasks: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Deploy one checkpoint as a frozen policy app, play all runs, remove the app."""
    from serve_apps.policy import build_policy_app
    from serve_apps.prompting.styles import make_style
    from workflows.common.episodes import PolicyAgent
    from workflows.common.pipeline import frozen_policy, resolve_model_path, serve_app

    index = [c.name for c in cfg.evaluate.checkpoints].index(spec.name)
    name = f"{cfg.run_name}-eval-{index}"
    policy = frozen_policy(cfg.policy, resolve_model_path(spec.path), name)
    e = cfg.evaluate
    style = make_style(cfg.policy.agent_style, e.history_screens)
    t0 = time.time()
    with serve_app(build_policy_app(policy), name, policy.route_prefix) as handle:

        def agent(run: int, task: dict[str, Any]) -> PolicyAgent:
            seed = episode_seed(cfg.seed, run, str(task["id"]))
            return PolicyAgent(handle, spec.name, style, e.temperature, seed)

        outcomes = asyncio.run(play_runs(cfg, env_url, spec.name, agent, tasks))
    print(f"[evaluate] {spec.name}: {len(outcomes)} episodes in {time.time() - t0:.0f}s")
    return outcomes


def evaluate_expert(
    cfg: PipelineConfig, env_url: str, tasks: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    from serve_apps.prompting.styles import make_style
    from workflows.common.episodes import expert_agent

    style = make_style(cfg.policy.agent_style, cfg.evaluate.history_screens)
    return asyncio.run(
        play_runs(cfg, env_url, EXPERT, lambda r, t: expert_agent(EXPERT, t, style), tasks)
    )


def run(cfg: PipelineConfig) -> dict[str, Any]:
    from workflows.common.pipeline import environment, ray_session, start_serve, write_json
    from workflows.evaluation.report import aggregate, bar_chart, markdown

    e = cfg.evaluate
    out_dir = cfg.run_dir / e.out_name
    out_dir.mkdir(parents=True, exist_ok=True)
    tasks = eval_tasks(cfg)
    if e.temperature == 0.0 and e.runs > 1:
        print("[evaluate] note: temperature 0 makes the runs identical", flush=True)
    print(f"[evaluate] {len(tasks)} task instances x {e.runs} runs", flush=True)
    outcomes: list[dict[str, Any]] = []
    with environment(cfg.env, out_dir / "env_server.log") as url, ray_session(cfg):
        start_serve(cfg.serve_http_port)
        for spec in e.checkpoints:
            outcomes += evaluate_checkpoint(cfg, spec, url, tasks)
        if e.reference_expert:
            outcomes += evaluate_expert(cfg, url, tasks)
    labels = [c.name for c in e.checkpoints] + ([EXPERT] if e.reference_expert else [])
    report = aggregate(outcomes, labels)
    paths = {c.name: c.path for c in e.checkpoints}
    if e.reference_expert:
        paths[EXPERT] = "env_client.scripted (MiniWoB) / env_client/tasks/desktop/experts.json"
    meta = {
        "split": e.split, "instances": len(tasks), "runs": e.runs, "max_steps": e.max_steps,
        "temperature": e.temperature, "paths": paths,
    }  # fmt: skip
    write_json(out_dir / "report.json", {**meta, **report, "outcomes": outcomes})
    (out_dir / "report.md").write_text(markdown(report, meta))
    _track(cfg, out_dir, report, markdown(report, meta))
    bar_chart(report, out_dir / "pass_at_1.png", f"Pass@1 ({e.split}, {e.runs} runs)")
    print(markdown(report, meta), flush=True)
    print(f"[evaluate] report in {out_dir}", flush=True)
    return report


def _track(cfg: PipelineConfig, out_dir: Path, report: dict[str, Any], table: str) -> None:
    """Pass@1 per checkpoint (overall and per task kind) and the table, to the trackers."""
    from workflows.common.tracking import Tracker

    tracker = Tracker(cfg.tracking, out_dir, out_dir.name, cfg.model_dump(mode="json"))
    scalars = {f"eval/{ck}/pass_at_1": s["mean"] for ck, s in report["overall"].items()}
    for kind, per_ck in report["by_kind"].items():
        scalars.update({f"eval/{ck}/{kind}": s["mean"] for ck, s in per_ck.items()})
    tracker.log(scalars)
    tracker.log_text("eval/report", table)
    tracker.close()


def main(argv: list[str] | None = None) -> int:
    def extra(parser: Any) -> None:
        parser.add_argument(
            "--checkpoint",
            action="append",
            default=[],
            metavar="NAME=PATH",
            help="a checkpoint to evaluate (repeat; replaces evaluate.checkpoints)",
        )

    parsed = parse_cli("python -m workflows.evaluation", __doc__, argv, extra)
    if isinstance(parsed, int):
        return parsed
    cfg, args = parsed
    if args.checkpoint:
        specs = []
        for item in args.checkpoint:
            name, sep, path = item.partition("=")
            if not sep or not name or not path:
                print(f"--checkpoint {item!r}: expected NAME=PATH", file=sys.stderr)
                return 2
            specs.append({"name": name, "path": path})
        data = cfg.model_dump()
        data["evaluate"]["checkpoints"] = specs
        cfg = PipelineConfig.model_validate(data)
    run(cfg)
    return 0
