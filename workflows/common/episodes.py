"""Playing single episodes for the analyzer pipeline and evaluation (no training signals), and
the one retry rule for episodes that every job uses.

An :class:`Agent` answers each step with a response text: :class:`PolicyAgent` asks a policy
Serve deployment (the same prompt as the rollout workers: ``agent_messages``, last H screens,
action history), :class:`ScriptedAgent` renders a scripted plan (``env_client.scripted``)
computed from the episode's ground truth. :func:`play_episode` runs one episode on a fresh
session and, when asked, records every transition (screens before/after, response, parsed and
executed action, ground truth before/after). :func:`play_with_retries` replays an episode on a
fresh session after environment failures; :func:`run_bounded` runs many coroutines with at
most ``limit`` at once.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from env_client.actions import Action
from env_client.client import EnvClient, Session
from env_client.errors import EnvError
from env_client.observation import StepResult, png_size
from env_client.scripted import NoPlan
from serve_apps.prompting.styles import AgentStyle, Screen

log = logging.getLogger(__name__)
T = TypeVar("T")
# Keys of the /debug answer that describe the request, not the episode.
_TRANSIENT_TRUTH_KEYS = ("ok", "session_id", "total_actions")


class Agent(Protocol):
    """Answers the steps of one episode. ``start`` is called after every reset."""

    name: str
    needs_truth: bool

    def start(self, truth: dict[str, Any] | None) -> None: ...

    async def respond(
        self, instruction: str, screens: list[Screen], history: list[str], step: int
    ) -> str | None:
        """The response text for this step; None ends the episode (nothing left to do)."""
        ...


class PolicyAgent:
    """A policy deployment's ``generate`` with the rollout workers' prompt (``style``)."""

    needs_truth = False

    def __init__(
        self,
        handle: Any,
        name: str,
        style: AgentStyle,
        temperature: float | None = None,
        seed: int | None = None,
    ) -> None:
        self.handle = handle
        self.name = name
        self.style = style
        self.temperature = temperature
        self.seed = seed  # per-episode base seed: step i samples with seed + i

    def start(self, truth: dict[str, Any] | None) -> None:
        return None

    async def respond(
        self, instruction: str, screens: list[Screen], history: list[str], step: int
    ) -> str | None:
        messages, shown = self.style.prompt(instruction, screens, history)
        request: dict[str, Any] = {"messages": messages, "images": shown}
        if self.temperature is not None:
            request["temperature"] = self.temperature
        if self.seed is not None:
            request["seed"] = (self.seed + step) % (2**31)
        gen = await self.handle.generate.remote(request)
        return str(gen["text"])


class ScriptedAgent:
    """Replays a plan computed from the ground truth at reset (expert, wrong or mismatch),
    each action said as the policy's style would say it."""

    needs_truth = True

    def __init__(
        self, name: str, planner: Callable[[dict[str, Any]], list[Action]], style: AgentStyle
    ) -> None:
        self.name = name
        self.planner = planner
        self.style = style
        self.plan: list[Action] = []

    def start(self, truth: dict[str, Any] | None) -> None:
        if truth is None:
            raise NoPlan("scripted episodes need the environment's ground truth (/debug)")
        self.plan = self.planner(truth)

    async def respond(
        self, instruction: str, screens: list[Screen], history: list[str], step: int
    ) -> str | None:
        if step >= len(self.plan):
            return None
        text = self.style.render(self.plan[step], screens[-1])
        if text is None:
            raise NoPlan(f"{self.name}: {self.plan[step].name} cannot be said in this style")
        return text


class PlanAgent:
    """Replays a plan that needs no ground truth (a desktop task's expert:
    ``env_client.desktop.experts.expert_plan``), made for the screen size of the first
    observation, each action said as the policy's style would say it, with the plan's pause
    after each step."""

    needs_truth = False

    def __init__(
        self,
        name: str,
        make_plan: Callable[[int, int], list[tuple[Action, float]]],
        style: AgentStyle,
    ) -> None:
        self.name = name
        self.make_plan = make_plan
        self.style = style
        self.plan: list[tuple[Action, float]] = []

    def start(self, truth: dict[str, Any] | None) -> None:
        self.plan = []

    def pause_after(self, step: int) -> float:
        return self.plan[step][1] if step < len(self.plan) else 0.0

    async def respond(
        self, instruction: str, screens: list[Screen], history: list[str], step: int
    ) -> str | None:
        if step == 0:
            size = png_size(screens[-1].png)
            # Plans are in screen pixels: without a screenshot there is nothing to plan on.
            self.plan = self.make_plan(*size) if size else []
        if step >= len(self.plan):
            return None
        text = self.style.render(self.plan[step][0], screens[-1])
        if text is None:
            raise NoPlan(f"{self.name}: {self.plan[step][0].name} cannot be said in this style")
        return text


def expert_agent(name: str, task: dict[str, Any], style: AgentStyle) -> Agent:
    """The scripted expert of the task's environment: MiniWoB's, planned from the ground truth
    at reset, or a desktop (OSWorld-format) task's, from the built-in experts file."""
    if task.get("env") == "osworld":
        from env_client.desktop.experts import expert_plan

        return PlanAgent(name, functools.partial(expert_plan, str(task["task"])), style)
    from env_client.scripted import solve

    return ScriptedAgent(name, solve, style)


@dataclass
class StepRecord:
    """One transition of a recorded episode."""

    step_index: int
    history: list[str]
    screenshot_before: bytes
    screenshot_after: bytes
    context: str
    response_text: str
    action: Action
    executed_action: str
    executed: bool
    env_done: bool
    truth_before: str | None
    truth_after: str | None


@dataclass
class EpisodeResult:
    task: dict[str, Any]
    instruction: str
    score: float
    num_steps: int
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def success(self) -> bool:
        return self.score >= 1.0


def executed_action_json(action: Action, result: StepResult) -> str:
    """The "executed action" the analyzer sees, built exactly as the rollout worker does."""
    executed = (
        {"action": action.name, **result.info}
        if not result.executed
        else action.model_dump(exclude_none=True)
    )
    return json.dumps(executed, ensure_ascii=False)


class _Truth:
    """Ground-truth reader of one session; off for the rest of the episode once unsupported."""

    def __init__(self, session: Session, enabled: bool) -> None:
        self.session = session
        self.enabled = enabled

    async def read(self) -> dict[str, Any] | None:
        if not self.enabled:
            return None
        try:
            truth = await self.session.ground_truth()
        except EnvError as exc:
            if exc.status is None or exc.status >= 500:
                raise  # the environment failed: retry the episode
            log.warning("environment has no ground truth (%s); storing none", exc)
            self.enabled = False
            return None
        return {k: v for k, v in truth.items() if k not in _TRANSIENT_TRUTH_KEYS}


async def play_episode(
    client: EnvClient,
    task: dict[str, Any],
    agent: Agent,
    style: AgentStyle,
    *,
    max_steps: int,
    pause_s: float = 0.0,
    record: bool = False,
    ground_truth: bool = False,
) -> EpisodeResult:
    """One episode on a fresh session; transitions recorded when ``record``."""
    async with client.session() as sess:
        obs = await sess.reset(task)
        # The reset's instruction is the concrete one (MiniWoB writes it at reset); a task
        # payload carries the generic description, or the whole instruction (OSWorld).
        instruction = obs.instruction or str(task.get("instruction") or "")
        truth = _Truth(sess, ground_truth or agent.needs_truth)
        before_truth = await truth.read()
        agent.start(before_truth)
        screens = [Screen(obs.screenshot or b"", obs.accessibility_tree)]
        history: list[str] = []
        steps: list[StepRecord] = []
        for i in range(max_steps):
            response = await agent.respond(instruction, screens, history, i)
            if response is None:
                break
            before = screens[-1]
            action = style.parse(response, before)
            # A plan may need longer after a step (a desktop expert after saving a file).
            pause = max(pause_s, getattr(agent, "pause_after", lambda _: 0.0)(i))
            result = await sess.act(action, pause=pause)
            after = Screen(
                result.observation.screenshot or b"", result.observation.accessibility_tree
            )
            after_truth = await truth.read() if result.executed else before_truth
            if record:
                steps.append(
                    StepRecord(
                        i,
                        list(history),
                        before.png,
                        after.png,
                        style.screen_context(before, instruction),
                        response,
                        action,
                        executed_action_json(action, result),
                        result.executed,
                        result.done,
                        _dump(before_truth),
                        _dump(after_truth),
                    )
                )
            screens.append(after)
            history.append(style.summarize(response, before))
            before_truth = after_truth
            if result.done or action.name == "terminate":
                break
        score = await sess.evaluate()
    return EpisodeResult(task, instruction, score, len(history), steps)


def _dump(truth: dict[str, Any] | None) -> str | None:
    return None if truth is None else json.dumps(truth, ensure_ascii=False)


async def play_with_retries(
    play: Callable[[], Awaitable[T]],
    retries: int,
    what: str,
    on_retry: Callable[[EnvError], None] | None = None,
) -> T:
    """``play()`` again on environment failures (a fresh session each time, backoff 1, 2, 4…
    10 s); the last failure is raised. ``on_retry`` sees each failure that is retried. The one
    retry rule of every job that plays episodes (collect, evaluate, the rollout workers)."""
    for attempt in range(retries + 1):
        try:
            return await play()
        except EnvError as exc:
            if attempt >= retries:
                raise
            if on_retry is not None:
                on_retry(exc)
            log.warning("%s: environment failure (%s); retry %d", what, exc, attempt + 1)
            await asyncio.sleep(min(2.0**attempt, 10.0))
    raise AssertionError("unreachable")


async def run_bounded(
    jobs: Iterable[Callable[[], Awaitable[T]]], limit: int
) -> AsyncIterator[tuple[int, T | BaseException]]:
    """Run job factories with at most ``limit`` at once; yield (index, result or exception)
    as each finishes. Never more than ``limit`` coroutines exist at a time."""
    it = iter(enumerate(jobs))
    running: dict[asyncio.Task[T], int] = {}

    def launch() -> bool:
        nxt = next(it, None)
        if nxt is None:
            return False
        running[asyncio.ensure_future(nxt[1]())] = nxt[0]
        return True

    while len(running) < limit and launch():
        pass
    try:
        while running:
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                index = running.pop(task)
                exc = task.exception()
                yield index, (exc if exc is not None else task.result())
                launch()
    finally:
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)


def analyzer_request(
    style: AgentStyle,
    instruction: str,
    history: list[str],
    responses: list[str],
    shown: list[bytes],
    before: Screen,
    after: Screen,
    response: str,
    executed: Any,
    reference: bool,
) -> dict[str, Any]:
    """The analyzer's request for one step (rollouts and the demo send the same): copies, since
    the episode goes on while it is judged. ``reference`` adds the earlier screens still in the
    policy's context (all its images but the current one), each with its full response there."""
    transition: dict[str, Any] = {
        "instruction": instruction,
        "history": list(history),
        "screenshot_before": before.png,
        "screenshot_after": after.png,
        "context": style.screen_context(before, instruction),
        "response": response,
        "action": executed,
    }
    if reference:  # earlier screens still in the policy's context, with its full responses
        n = min(len(shown) - 1, len(responses))
        transition["history_screenshots"] = list(shown[len(shown) - 1 - n : len(shown) - 1])
        transition["history_responses"] = responses[len(responses) - n :]
    return transition
