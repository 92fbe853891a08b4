"""Scripted demonstrations for behaviour cloning: what the expert answers in each state.

Each (task, seed) of the split is played by the scripted expert (``expert`` episodes) and, with
``demos.recover``, by the scripted plausible mistake first and the expert from there
(``recover`` episodes: a wrong page state and a wrong history line to recover from). Every
state before an expert step becomes a :class:`Demo`: the screen (PNG + accessibility tree), the
history lines the policy would have written, the expert's answer in the elements style, and
the oracle's guidance for that state (guide = the expert's answer, avoid = a plausible
mistake), as the trained analyzer will phrase it during RL.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from env_client.client import EnvClient, Session
from env_client.scripted import NoPlan, wrong
from serve_apps.prompting.styles import ElementsStyle, Screen
from workflows.analyzer.oracle import element_guidance, listed_elements, remaining_plan
from workflows.warm_start.config import DemoConfig

STYLE = ElementsStyle()


@dataclass
class Demo:
    """One state and the expert's answer in it."""

    episode: str  # "<task>/<seed>/<kind>"
    task: str
    instruction: str  # the concrete one, from reset
    screen: Screen
    history: list[str]
    answer: str
    guide: str
    avoid: str

    @property
    def heldout_key(self) -> float:
        """A stable number in [0, 1) per episode: the held-out split never depends on order."""
        digest = hashlib.sha256(self.episode.encode()).digest()
        return int.from_bytes(digest[:4], "big") / 2**32


async def play_demo(sess: Session, task: dict[str, Any], kind: str, max_steps: int) -> list[Demo]:
    """One demonstration episode on ``sess``; its states with the expert's answers."""
    obs = await sess.reset(task)
    instruction = obs.instruction or str(task.get("instruction") or "")
    screen = Screen(obs.screenshot or b"", obs.accessibility_tree)
    history: list[str] = []
    out: list[Demo] = []
    episode = f"{task['task']}/{task['seed']}/{kind}"
    for step in range(max_steps):
        truth = await sess.ground_truth()
        plan = remaining_plan(truth)
        if not plan:
            break
        expert = plan[0]
        answer = STYLE.render(expert, screen)
        if answer is not None:
            listed = listed_elements(STYLE.screen_context(screen, instruction))
            guide, avoid = element_guidance(truth, expert, True, True, plan, listed)
            out.append(Demo(episode, str(task["task"]), instruction, screen, list(history),
                            answer, guide, avoid))  # fmt: skip
        act = _mistake(truth) if kind == "recover" and step == 0 else None
        act = act or expert
        said = STYLE.render(act, screen) or act.name
        result = await sess.act(act)
        history.append(STYLE.summarize(said, screen))
        screen = Screen(result.observation.screenshot or b"", result.observation.accessibility_tree)
        if result.done:
            break
    return out


def _mistake(truth: dict[str, Any]) -> Any:
    try:
        mistakes = wrong(truth)
    except NoPlan:
        return None
    return mistakes[0] if mistakes else None


async def collect_demos(
    cfg: DemoConfig, env: Any, tasks: list[dict[str, Any]], progress: Callable[[str], None]
) -> list[Demo]:
    """Every demonstration of ``tasks`` (expert, and recover when configured)."""
    from workflows.common.episodes import play_with_retries, run_bounded

    kinds = ["expert", "recover"] if cfg.recover else ["expert"]
    jobs = [(t, k) for t in tasks for k in kinds]
    demos: list[Demo] = []
    failed = 0
    async with EnvClient(env) as client:

        def job(task: dict[str, Any], kind: str) -> Callable[[], Any]:
            async def play() -> list[Demo]:
                async with client.session() as sess:
                    return await play_demo(sess, task, kind, cfg.max_steps)

            return lambda: play_with_retries(play, 2, f"demo {task['id']} {kind}")

        done = 0
        async for _, res in run_bounded([job(t, k) for t, k in jobs], cfg.concurrency):
            done += 1
            if isinstance(res, BaseException):
                failed += 1
            else:
                demos.extend(res)
            if done % 50 == 0 or done == len(jobs):
                progress(f"demos: {done}/{len(jobs)} episodes, {len(demos)} states")
    if failed > len(jobs) // 10:
        raise RuntimeError(f"{failed} of {len(jobs)} demonstration episodes failed")
    return demos
