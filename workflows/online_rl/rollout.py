"""Rollout workers: async Ray actors that play groups of episodes and feed the buffer.

Per step (METHOD.md §1–§3): policy ``generate`` → parse the action → env ``step`` → analyzer
judgment of the transition → policy ``score`` of the sampled response under the privileged
context (and the ordinary one with ``rollout.score_ordinary``) → one step sample. Per
finished group: ``evaluate`` scores, rewards r = ±1, group-relative advantages, all samples
to the buffer at once. An environment failure retries the episode on a fresh session up to
``episode_retries``; a group that still cannot complete is dropped whole and counted, never
silently skipped.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from env_client.client import EnvClient, Session
from env_client.errors import EnvError
from serve_apps.prompting.messages import guidance_text, privileged_messages
from serve_apps.prompting.styles import Screen, make_style
from workflows.common.episodes import play_with_retries
from workflows.online_rl.config import OnlineRLConfig

NO_JUDGMENT = {
    "consistency": None,
    "effectiveness": None,
    "guide": "",
    "avoid": "",
    "d": 0,
    "v": 0.5,
}


def episode_advantages(scores: list[float]) -> tuple[list[float], list[float]]:
    """Rewards r = ±1 from terminal scores and group-relative advantages (METHOD.md §4):
    ``A_i = (r_i − mean r) / (std r + 1e-6)``, unbiased std, all-equal groups give 0.

    Plain Python on purpose: rollout actors then never import torch (~0.5 GiB each); a test
    checks it against ``train_loops.losses.group_advantages``."""
    rewards = [1.0 if s >= 1.0 else -1.0 for s in scores]
    n = len(rewards)
    mean = sum(rewards) / n
    if n < 2:
        return rewards, [0.0] * n
    std = (sum((r - mean) ** 2 for r in rewards) / (n - 1)) ** 0.5
    if std == 0.0:
        return rewards, [0.0] * n
    return rewards, [(r - mean) / (std + 1e-6) for r in rewards]


@dataclass
class EpisodeResult:
    rows: list[dict[str, Any]]
    score: float
    env_steps: int = 0
    timings: dict[str, float] = field(default_factory=dict)


class GroupFailed(RuntimeError):
    """An episode of the group ran out of environment retries."""


class RolloutWorker:
    """Use as a Ray actor (``max_concurrency`` ≥ groups in flight); ``run()`` until ``stop()``."""

    def __init__(
        self,
        cfg: OnlineRLConfig,
        worker_index: int,
        tasks: list[dict[str, Any]],
        env_url: str,
        buffer: Any,
        policy_app: str,
        analyzer_app: str | None,
    ) -> None:
        self.cfg = cfg
        self.worker_index = worker_index
        self.tasks = tasks
        self.env_url = env_url
        self.buffer = buffer
        self.policy_app = policy_app
        self.analyzer_app = analyzer_app
        self.style = make_style(cfg.policy.agent_style, cfg.rollout.history_screens)
        self.served_version = 0
        self._stopping = False
        self.counters: dict[str, float] = {
            "env_steps": 0,
            "episodes": 0,
            "episode_retries": 0,
            "invalid_actions": 0,
            "t_generate": 0.0,
            "t_env": 0.0,
            "t_analyze": 0.0,
            "t_score": 0.0,
        }

    async def run(self) -> dict[str, float]:
        from ray import serve
        from ray.util.metrics import Counter, Histogram

        # Dashboard: per-stage latency distribution and a step counter (rate = env steps/s).
        self._latency = Histogram(
            "computersd_step_latency_s",
            description="Seconds per rollout step stage (generate, env, analyze, score)",
            boundaries=[0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30],
            tag_keys=("stage",),
        )
        self._steps_counter = Counter(
            "computersd_env_steps", description="Environment steps executed by rollout workers"
        )

        self.policy = serve.get_app_handle(self.policy_app)
        self.analyzer = serve.get_app_handle(self.analyzer_app) if self.analyzer_app else None
        client_cfg = self.cfg.env.model_copy(update={"server_url": self.env_url})
        async with EnvClient(client_cfg) as env:
            self.env = env
            slots = self.cfg.rollout.groups_in_flight_per_worker
            await asyncio.gather(*(self._slot_loop() for _ in range(slots)))
        return self.counters

    async def stop(self) -> None:
        self._stopping = True

    def stats(self) -> dict[str, float]:
        return dict(self.counters, served_version=self.served_version)

    async def _slot_loop(self) -> None:
        while not self._stopping:
            # The served version moves without us (hot-swap, resume): ask before the
            # staleness check, or a worker that knows an old version would wait forever.
            status = await self.policy.weight_status.remote()
            self.served_version = max(self.served_version, int(status["version"]))
            seq = await self.buffer.acquire.remote(self.served_version)
            if seq is None:
                return
            task = self._task_for(seq)
            try:
                rows, successes = await self.play_group(task, f"g{seq:06d}")
            except (GroupFailed, asyncio.CancelledError) as exc:
                reason = "failed" if isinstance(exc, GroupFailed) else "cancelled"
                await self.buffer.drop_group.remote(reason)
                if reason == "cancelled":
                    raise
                continue
            await self.buffer.put_group.remote(rows[0]["group_id"], rows, successes)

    def _task_for(self, seq: int) -> dict[str, Any]:
        task = dict(self.tasks[seq % len(self.tasks)])
        # One instance per group (same seed for all G episodes), a new one per visit.
        task["seed"] = int(task.get("seed", 0)) * 100_003 + seq
        return task

    async def play_group(self, task: dict[str, Any], group_id: str) -> tuple[list[dict], int]:
        g = self.cfg.rollout.group_size
        results = await asyncio.gather(
            *(self._episode_with_retries(task, group_id, i) for i in range(g))
        )
        rewards, advantages = episode_advantages([r.score for r in results])
        rows: list[dict[str, Any]] = []
        for res, reward, adv in zip(results, rewards, advantages, strict=True):
            for row in res.rows:
                row.update(reward=reward, advantage=adv, score=res.score, num_steps=len(res.rows))
            rows.extend(res.rows)
        return rows, sum(r > 0 for r in rewards)

    async def _episode_with_retries(self, task: dict, group_id: str, idx: int) -> EpisodeResult:
        episode_id = f"{group_id}-e{idx}"

        def count(_: EnvError) -> None:
            self.counters["episode_retries"] += 1

        try:
            return await play_with_retries(
                lambda: self.play_episode(task, group_id, episode_id),
                self.cfg.rollout.episode_retries,
                episode_id,
                on_retry=count,
            )
        except EnvError as exc:
            raise GroupFailed(f"{group_id}: episode {idx} failed: {exc}") from exc

    async def play_episode(
        self, task: dict[str, Any], group_id: str, episode_id: str
    ) -> EpisodeResult:
        rows: list[dict[str, Any]] = []
        async with self.env.session() as sess:
            obs = await sess.reset(task)
            # The concrete instruction comes from reset (MiniWoB draws it); OSWorld payloads carry it.
            instruction = obs.instruction or task.get("instruction") or ""
            screens = [Screen(obs.screenshot or b"", obs.accessibility_tree)]
            history: list[str] = []
            for step_index in range(self.cfg.rollout.max_steps):
                row, done = await self._step(sess, instruction, screens, history)
                row.update(
                    task_id=str(task.get("task", task.get("id"))),
                    group_id=group_id,
                    episode_id=episode_id,
                    step_index=step_index,
                    sample_id=f"{episode_id}-s{step_index}",
                )
                rows.append(row)
                if done:
                    break
            score = await sess.evaluate()
        self.counters["episodes"] += 1
        return EpisodeResult(rows=rows, score=score)

    async def _step(
        self, sess: Session, instruction: str, screens: list[Screen], history: list[str]
    ) -> tuple[dict[str, Any], bool]:
        messages, shown = self.style.prompt(instruction, screens, history)
        t0 = time.perf_counter()
        gen = await self.policy.generate.remote({"messages": messages, "images": shown})
        t1 = time.perf_counter()
        self.served_version = max(self.served_version, gen["weight_version"])
        before = screens[-1]
        action = self.style.parse(gen["text"], before)
        if action.name == "invalid":
            self.counters["invalid_actions"] += 1
        result = await sess.act(action, pause=self.cfg.rollout.pause_s)
        t2 = time.perf_counter()
        after = Screen(result.observation.screenshot or b"", result.observation.accessibility_tree)
        executed = (
            {"action": action.name, **result.info}
            if not result.executed
            else action.model_dump(exclude_none=True)
        )
        judgment = await self._judge(instruction, history, before, after, gen["text"], executed)
        t3 = time.perf_counter()
        guidance = guidance_text(judgment["guide"], judgment["avoid"])
        privileged_call = self._score(
            privileged_messages(messages, guidance), shown, gen["response_ids"]
        )
        if self.cfg.rollout.score_ordinary:
            ordinary, privileged = await asyncio.gather(
                self._score(messages, shown, gen["response_ids"]), privileged_call
            )
        else:
            ordinary, privileged = {"logprobs": gen["logprobs"]}, await privileged_call
        t4 = time.perf_counter()
        self._count(t1 - t0, t2 - t1, t3 - t2, t4 - t3)
        screens.append(after)
        history.append(self.style.summarize(gen["text"], before))
        row = {
            "prompt_ids": gen["prompt_ids"],
            "response_ids": gen["response_ids"],
            "behavior_logprobs": gen["logprobs"],
            "ordinary_logprobs": ordinary["logprobs"],
            "privileged_logprobs": privileged["logprobs"],
            "screenshots": list(shown),
            "response_text": gen["text"],
            "action": json.dumps(executed),
            "consistency": judgment["consistency"],
            "effectiveness": judgment["effectiveness"],
            "guide": judgment["guide"],
            "avoid": judgment["avoid"],
            "d": int(judgment["d"]),
            "v": float(judgment["v"]),
            "behavior_version": gen["weight_version"],
            "privileged_version": privileged["weight_version"],
            "t_generate_s": t1 - t0,
            "t_env_s": t2 - t1,
            "t_analyze_s": t3 - t2,
            "t_score_s": t4 - t3,
            "created_at": time.time(),
            # Filled in when the group completes:
            "score": 0.0,
            "reward": 0.0,
            "advantage": 0.0,
            "num_steps": 0,
        }
        done = result.done or action.name == "terminate"
        return row, done

    async def _score(self, messages: list, images: list[bytes], response_ids: list[int]) -> dict:
        return await self.policy.score.remote(
            {"messages": messages, "images": images, "response_ids": response_ids}
        )

    async def _judge(
        self,
        instruction: str,
        history: list[str],
        before: Screen,
        after: Screen,
        response: str,
        action: dict[str, Any],
    ) -> dict[str, Any]:
        if self.analyzer is None or not self.cfg.rollout.use_analyzer:
            return dict(NO_JUDGMENT)
        out = await self.analyzer.analyze.remote(
            {
                "instruction": instruction,
                "history": history,
                "screenshot_before": before.png,
                "screenshot_after": after.png,
                "context": self.style.screen_context(before, instruction),
                "response": response,
                "action": action,
            }
        )
        return {k: out.get(k, NO_JUDGMENT[k]) for k in NO_JUDGMENT}

    def _count(self, gen: float, env: float, ana: float, score: float) -> None:
        c = self.counters
        c["env_steps"] += 1
        for stage, seconds in (("generate", gen), ("env", env), ("analyze", ana), ("score", score)):
            self._latency.observe(seconds, tags={"stage": stage})
        self._steps_counter.inc(1.0)
        c["t_generate"] += gen
        c["t_env"] += env
        c["t_analyze"] += ana
        c["t_score"] += score
