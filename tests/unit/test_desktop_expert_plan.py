"""Desktop experts said as policy answers: the plans the analyzer pipeline's collect and the
evaluation's reference column replay on desktops (OSWorld-format tasks), and collect's
settings that need MiniWoB's ground truth refused on other task sources."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest
from PIL import Image

from env_client.actions import Action, parse_response, to_pixel
from env_client.desktop.experts import NoExpertPlan, expert_plan, expert_steps
from env_client.scripted import NoPlan
from serve_apps.prompting.styles import Screen, make_style
from workflows.analyzer import collect
from workflows.common.config_io import load_config
from workflows.common.episodes import PlanAgent, ScriptedAgent, expert_agent
from workflows.common.pipeline_config import PipelineConfig


def _experts(tmp_path: Path, steps: dict) -> Path:
    (tmp_path / "experts.json").write_text(json.dumps(steps))
    return tmp_path


def test_every_builtin_expert_has_a_plan_a_policy_could_answer() -> None:
    for task_id in expert_steps():
        plan = expert_plan(task_id, 1024, 768)
        assert plan and plan[-1][0].name == "terminate", task_id


def test_keys_repeat_pauses_add_up_and_done_terminates() -> None:
    plan = expert_plan("calc-delete-row", 1024, 768)
    assert [(a.name, a.keys) for a, _ in plan[:3]] == [
        ("key", ("ctrl", "home")), ("key", ("down",)), ("key", ("down",)),
    ]  # fmt: skip
    assert [p for _, p in plan][-3:] == [0.5, 2.0, 0.0]  # the expert's pauses, after the steps
    assert plan[-1][0] == Action(name="terminate", status="success")


def test_clicks_land_on_the_same_pixels_and_sleeps_become_pauses(tmp_path: Path) -> None:
    root = _experts(tmp_path, {"t": [
        {"action": {"kind": "gui", "type": "CLICK", "payload": {"x": 500, "y": 300,
                                                                 "num_clicks": 2}}},
        {"action": {"kind": "gui", "type": "pyautogui",
                    "payload": {"command": "pyautogui.rightClick(10, 767); time.sleep(1.5)"}}},
        {"action": {"kind": "control", "type": "FAIL", "payload": {}}},
    ]})  # fmt: skip
    plan = expert_plan("t", 1024, 768, root)
    (double, p0), (right, p1), (end, _) = plan
    assert (double.name, right.name, end.status) == ("double_click", "right_click", "failure")
    assert double.coordinate is not None and right.coordinate is not None
    assert (to_pixel(double.coordinate[0], 1024), to_pixel(double.coordinate[1], 768)) == (500, 300)
    assert (to_pixel(right.coordinate[0], 1024), to_pixel(right.coordinate[1], 768)) == (10, 767)
    assert (p0, p1) == (0.0, 1.5)


def test_what_no_answer_can_say_is_a_named_error(tmp_path: Path) -> None:
    root = _experts(tmp_path, {"t": [
        {"action": {"kind": "gui", "type": "pyautogui", "payload": {"command": "pyautogui.click()"}}},
    ]})  # fmt: skip
    with pytest.raises(NoExpertPlan, match="t step 0"):
        expert_plan("t", 1024, 768, root)
    with pytest.raises(NoPlan, match="no expert for desktop task 'nope'"):
        expert_plan("nope", 1024, 768, root)


def test_the_plan_agent_answers_in_the_policy_style_with_the_plan_pauses() -> None:
    style = make_style("toolcall", 1)
    agent = expert_agent("expert", {"env": "osworld", "task": "calc-delete-row"}, style)
    assert isinstance(agent, PlanAgent) and not agent.needs_truth
    buf = io.BytesIO()
    Image.new("RGB", (1024, 768)).save(buf, "PNG")
    screen = Screen(buf.getvalue(), None)
    agent.start(None)
    answers = []
    for step in range(20):
        text = asyncio.run(agent.respond("delete row 3", [screen], [], step))
        if text is None:
            break
        answers.append(parse_response(text).model_copy(update={"thought": ""}))
    assert answers == [a for a, _ in expert_plan("calc-delete-row", 1024, 768)]
    assert agent.pause_after(len(answers) - 2) == 2.0
    miniwob = expert_agent("expert", {"env": "miniwob", "task": "click-test"}, style)
    assert isinstance(miniwob, ScriptedAgent) and miniwob.needs_truth


def test_collect_refuses_ground_truth_episodes_on_osworld_tasks() -> None:
    cfg = load_config(PipelineConfig, "analyzer_pipeline", [
        "env.embedded.backend=desktop", "task_source.kind=osworld",
        f"task_source.path={Path(collect.__file__).parents[2] / 'env_client/tasks/desktop'}",
        "task_source.splits={train: train.json, eval: eval.json}",
        "collect.policy_episodes=1", "collect.expert_episodes=1", "collect.wrong_episodes=1",
        "collect.mismatch_episodes=0",
    ])  # fmt: skip
    with pytest.raises(ValueError, match=r"collect\.wrong_episodes=1: .*ground truth.*osworld"):
        collect.plan(cfg)
    cfg.collect.wrong_episodes = 0
    jobs, _ = collect.plan(cfg)
    assert {j.source for j in jobs} == {"policy", "expert"}
    assert {j.task["env"] for j in jobs} == {"osworld"} and len(jobs) == 2 * 18
