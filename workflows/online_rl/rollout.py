"""Rollout workers: async Ray actors that play groups of episodes and feed the buffer.

Per step (METHOD.md §1–§3): policy ``generate`` → parse the action → env ``step``; then,
off the episode's critical path (``rollout.overlap_judging``: alongside the next steps), the
analyzer's judgment of the transition → policy ``score`` of the sampled response under the
privileged context (and the ordinary one with ``rollout.score_ordinary``) → one step sample.
An episode ends when all its steps' judgments are in. Per finished group: ``evaluate``
scores, rewards r = ±1, group-relative advantages, all samples to the buffer at once.

Failures: an environment failure retries the episode on a fresh session up to
``episode_retries``; a policy request retries while its replica is down (up to
``serve_retry_s``: Serve replaces a dead replica); a group that still cannot complete, or that
fails in any other way, is dropped whole with its reason in the buffer's ledger, never silently
skipped, and the worker goes on. A failed analyzer or rescoring request masks only that step's
self-distillation (d = 0, no target), is counted (``analyzer_errors``, ``score_errors``), and
the worker goes on. A step without guidance is not rescored (it has no target; NaN log-probs).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from env_client.client import EnvClient, Session
from env_client.errors import EnvError
from env_client.tasks.sources import task_instance
from serve_apps.prompting.messages import guidance_text, privileged_messages
from serve_apps.prompting.styles import Screen, make_style
from workflows.common.episodes import analyzer_request, play_with_retries
from workflows.online_rl.buffer import group_id_of
from workflows.online_rl.config import OnlineRLConfig
from workflows.online_rl.fixed_guidance import fixed_judgment, load_guidance

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


@dataclass
class EpisodeState:
    """What the policy's next prompt is made of, as the episode goes."""

    instruction: str
    screens: list[Screen]
    history: list[str] = field(default_factory=list)  # one summary line per step
    responses: list[str] = field(default_factory=list)  # the policy's full responses
    task_id: str = ""  # for fixed guidance, keyed by task id and step


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
        path = cfg.rollout.fixed_guidance_file  # the authors' fixed-guidance ablation
        self.fixed_guidance = load_guidance(path) if path else None
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
            "analyzer_errors": 0,
            "score_errors": 0,
            "policy_retries": 0,
            "groups_failed": 0,
        }
        self._latency: Any = None
        self._steps_counter: Any = None

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
            status = await self._policy_call("weight_status")
            self.served_version = max(self.served_version, int(status["version"]))
            seq = await self.buffer.acquire.remote(self.served_version, self.worker_index)
            if seq is None:
                return
            group_id = group_id_of(seq)
            index = await self.buffer.task_for.remote(seq)  # the job's task order
            task = task_instance(
                self.tasks[index % len(self.tasks)], seq
            )  # one instance for all G episodes
            try:
                rows, successes = await self.play_group(task, group_id)
            except asyncio.CancelledError:
                await asyncio.shield(self.buffer.drop_group.remote("cancelled", group_id))
                raise
            except Exception as exc:  # GroupFailed, or anything unforeseen: never the worker
                self._count_error("groups_failed", exc)
                await self.buffer.drop_group.remote("failed", group_id)
                continue
            await self.buffer.put_group.remote(group_id, rows, successes)

    async def _policy_call(self, method: str, *args: Any) -> Any:
        """A policy app request, retried while its replica is down (a killed replica fails the
        requests it held; Serve starts a replacement, which catches up with the latest weights).
        Backoff 1, 2, 4 … 15 s, for up to ``rollout.serve_retry_s``."""
        deadline = time.monotonic() + self.cfg.rollout.serve_retry_s
        delay = 1.0
        while True:
            try:
                return await getattr(self.policy, method).remote(*args)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if time.monotonic() + delay > deadline:
                    raise
                self._count_error("policy_retries", exc)
                await asyncio.sleep(delay)
                delay = min(2 * delay, 15.0)

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
        feedback: list[asyncio.Future[dict[str, Any]]] = []
        try:
            async with self.env.session() as sess:
                obs = await sess.reset(task)
                # The concrete instruction comes from reset (MiniWoB draws it); OSWorld payloads carry it.
                ep = EpisodeState(
                    obs.instruction or task.get("instruction") or "",
                    [Screen(obs.screenshot or b"", obs.accessibility_tree)],
                    task_id=str(task.get("id", "")),
                )
                for step_index in range(self.cfg.rollout.max_steps):
                    row, judged, done = await self._step(sess, ep)
                    row.update(
                        task_id=str(task.get("task", task.get("id"))),
                        group_id=group_id,
                        episode_id=episode_id,
                        step_index=step_index,
                        sample_id=f"{episode_id}-s{step_index}",
                    )
                    rows.append(row)
                    feedback.append(asyncio.ensure_future(judged))
                    if not self.cfg.rollout.overlap_judging:
                        await feedback[-1]  # the baseline: the next action waits for it
                    if done:
                        break
                score = await sess.evaluate()
            # The judgments and rescorings ran alongside the later steps; a row is complete
            # only with its own, so the episode ends when the last of them is in.
            for row, fields in zip(rows, await asyncio.gather(*feedback), strict=True):
                row.update(fields)
        finally:
            for pending in feedback:  # a failed or cancelled episode leaves nothing running
                pending.cancel()
        self.counters["episodes"] += 1
        return EpisodeResult(rows=rows, score=score)

    async def _step(
        self, sess: Session, ep: EpisodeState
    ) -> tuple[dict[str, Any], Coroutine[Any, Any, dict[str, Any]], bool]:
        """Generate → act. Returns the row so far, the coroutine that judges and rescores the
        step (its remaining fields), and whether the episode is over."""
        messages, shown = self.style.prompt(ep.instruction, ep.screens, ep.history)
        t0 = time.perf_counter()
        gen = await self._policy_call("generate", {"messages": messages, "images": shown})
        t1 = time.perf_counter()
        self.served_version = max(self.served_version, gen["weight_version"])
        before = ep.screens[-1]
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
        # Built before the episode moves on: the judgment may run while later steps play.
        transition = self._transition(ep, shown, before, after, gen["text"], executed)
        fixed = (
            None
            if self.fixed_guidance is None
            else fixed_judgment(self.fixed_guidance, ep.task_id, len(ep.responses))
        )
        self._count_step(t1 - t0, t2 - t1)
        ep.screens.append(after)
        ep.history.append(self.style.summarize(gen["text"], before))
        ep.responses.append(gen["text"])
        row = {
            "prompt_ids": gen["prompt_ids"],
            "response_ids": gen["response_ids"],
            "behavior_logprobs": gen["logprobs"],
            "screenshots": list(shown),
            "response_text": gen["text"],
            "action": json.dumps(executed),
            "behavior_version": gen["weight_version"],
            "t_generate_s": t1 - t0,
            "t_env_s": t2 - t1,
            "created_at": time.time(),
            # Filled in when the group completes:
            "score": 0.0,
            "reward": 0.0,
            "advantage": 0.0,
            "num_steps": 0,
        }
        done = result.done or action.name == "terminate"
        return row, self._feedback(transition, messages, shown, gen, fixed), done

    def _transition(
        self,
        ep: EpisodeState,
        shown: list[bytes],
        before: Screen,
        after: Screen,
        response: str,
        executed: dict[str, Any],
    ) -> dict[str, Any]:
        return analyzer_request(
            self.style, ep.instruction, ep.history, ep.responses, shown, before, after,
            response, executed, reference=self.cfg.analyzer.prompt_style == "reference",
        )  # fmt: skip

    async def _feedback(
        self,
        transition: dict[str, Any],
        messages: list,
        shown: list[bytes],
        gen: dict[str, Any],
        fixed: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The step's judgment and privileged rescoring → the row's remaining fields. A failed
        request masks this step's self-distillation (d = 0, no target), is counted, and the
        worker goes on."""
        t0 = time.perf_counter()
        judgment = fixed if fixed is not None else await self._judge(transition)
        t1 = time.perf_counter()
        scored = await self._rescore(judgment, messages, shown, gen)
        t2 = time.perf_counter()
        self._count_feedback(t1 - t0, t2 - t1)
        return {**judgment, **scored, "t_analyze_s": t1 - t0, "t_score_s": t2 - t1}

    async def _judge(self, transition: dict[str, Any]) -> dict[str, Any]:
        if self.analyzer is None or not self.cfg.rollout.use_analyzer:
            return dict(NO_JUDGMENT)
        try:
            out = await self.analyzer.analyze.remote(transition)
        except Exception as exc:  # any failed request masks this step only
            self._count_error("analyzer_errors", exc)
            return dict(NO_JUDGMENT)
        judgment = {k: out.get(k, NO_JUDGMENT[k]) for k in NO_JUDGMENT}
        return {**judgment, "d": int(judgment["d"]), "v": float(judgment["v"])}

    async def _rescore(
        self, judgment: dict[str, Any], messages: list, shown: list[bytes], gen: dict[str, Any]
    ) -> dict[str, Any]:
        """T_t under the privileged context, only where there is guidance (else the step has
        no target: NaN, which every loss term drops), and optionally the ordinary context."""
        ids = gen["response_ids"]
        guided = bool(judgment["guide"].strip() or judgment["avoid"].strip())
        guidance = guidance_text(judgment["guide"], judgment["avoid"])
        privileged, ordinary = await asyncio.gather(
            self._try_score(privileged_messages(messages, guidance), shown, ids, guided),
            self._try_score(messages, shown, ids, self.cfg.rollout.score_ordinary),
        )
        out: dict[str, Any] = {
            "ordinary_logprobs": ordinary["logprobs"] if ordinary else gen["logprobs"],
            "privileged_logprobs": [math.nan] * len(ids),
            "privileged_version": gen["weight_version"],
        }
        if privileged is not None:
            out["privileged_logprobs"] = privileged["logprobs"]
            out["privileged_version"] = privileged["weight_version"]
        elif guided:  # the rescoring failed: no distillation target for this step
            out["d"] = 0
        return out

    async def _try_score(
        self, messages: list, images: list[bytes], response_ids: list[int], wanted: bool
    ) -> dict[str, Any] | None:
        if not wanted:
            return None
        try:
            return await self.policy.score.remote(
                {"messages": messages, "images": images, "response_ids": response_ids}
            )
        except Exception as exc:  # any failed request masks this step only
            self._count_error("score_errors", exc)
            return None

    def _count_error(self, key: str, exc: BaseException) -> None:
        self.counters[key] += 1
        n = int(self.counters[key])
        if n & (n - 1) == 0:  # 1st, 2nd, 4th, 8th…: visible without flooding the log
            print(f"[rollout {self.worker_index}] {key}={n}, masked the step: {exc!r}", flush=True)

    def _count_step(self, gen: float, env: float) -> None:
        self.counters["env_steps"] += 1
        self.counters["t_generate"] += gen
        self.counters["t_env"] += env
        self._observe(("generate", gen), ("env", env))
        if self._steps_counter is not None:
            self._steps_counter.inc(1.0)

    def _count_feedback(self, ana: float, score: float) -> None:
        self.counters["t_analyze"] += ana
        self.counters["t_score"] += score
        self._observe(("analyze", ana), ("score", score))

    def _observe(self, *stages: tuple[str, float]) -> None:
        if self._latency is not None:  # dashboard metrics exist once run() started
            for stage, seconds in stages:
                self._latency.observe(seconds, tags={"stage": stage})
