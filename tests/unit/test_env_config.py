"""Configs, the task list, the accessibility-tree format, observation decoding, fault rules."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image
from pydantic import ValidationError

from env_client.a11y import parse_tree, to_xml
from env_client.config import EmbeddedEnvConfig, EnvClientConfig, FaultRule, TaskListConfig
from env_client.observation import decode_observation, png_size
from env_client.server.faults import FaultBook
from env_client.tasks import load_task_list, load_tasks


def test_client_config_reads_server_url_from_environment(monkeypatch):
    monkeypatch.setenv("GUI_ENV_SERVER_URL", "http://master:9000")
    assert EnvClientConfig().server_url == "http://master:9000"
    assert EnvClientConfig(server_url=None).server_url is None  # explicit: embedded server
    monkeypatch.delenv("GUI_ENV_SERVER_URL")
    assert EnvClientConfig().server_url is None


def test_client_config_defaults_follow_the_protocol():
    cfg = EnvClientConfig(server_url="http://x")
    assert (cfg.retry.backoff_base_s, cfg.retry.backoff_cap_s, cfg.retry.max_tries) == (0.5, 20, 12)
    assert cfg.retry.recovery_deadline_s == 600
    assert (cfg.timeouts.step_s, cfg.timeouts.observe_s, cfg.timeouts.evaluate_s) == (120, 60, 120)
    assert cfg.allocate_deadline_s == 300 and cfg.heartbeat_interval_s == 30


def test_configs_reject_unknown_fields_and_bad_bounds():
    with pytest.raises(ValidationError):
        EnvClientConfig(server_url="http://x", nonsense=1)
    with pytest.raises(ValidationError):
        EmbeddedEnvConfig(capacity=0)
    with pytest.raises(ValidationError, match="prewarm"):
        EmbeddedEnvConfig(capacity=2, prewarm=3)
    with pytest.raises(ValidationError):  # setTimeout would overflow and end episodes at once
        EmbeddedEnvConfig(episode_time_limit_s=10**7)
    with pytest.raises(ValidationError):
        FaultRule(op="step", kind="explode")


def test_chrome_paths_default_and_environment(monkeypatch):
    monkeypatch.delenv("MINIWOB_CHROME_BINARY", raising=False)
    monkeypatch.delenv("MINIWOB_CHROMEDRIVER", raising=False)
    cfg = EmbeddedEnvConfig()
    assert (cfg.chrome_binary, cfg.chromedriver) == ("/usr/bin/chromium", "/usr/bin/chromedriver")
    monkeypatch.setenv("MINIWOB_CHROME_BINARY", "/opt/chrome")
    assert EmbeddedEnvConfig().chrome_binary == "/opt/chrome"


def test_task_list_covers_the_required_kinds():
    tasks = load_task_list()
    assert len(tasks.tasks) >= 10
    kinds = {t.kind for t in tasks.tasks.values()}
    assert {"click", "type", "checkbox", "tab", "dialog", "link"} <= kinds
    train, evals = load_tasks("train"), load_tasks("eval")
    assert {p["task"] for p in train} == set(tasks.tasks) == {p["task"] for p in evals}
    assert not {p["id"] for p in train} & {p["id"] for p in evals}
    assert not {p["seed"] for p in train} & {p["seed"] for p in evals}
    p = evals[0]
    assert set(p) == {"id", "instruction", "env", "task", "seed", "kind"}
    assert p["env"] == "miniwob" and p["id"] == f"miniwob/{p['task']}/{p['seed']}"
    with pytest.raises(KeyError):
        load_tasks("test")


def test_task_list_validation():
    base = {"tasks": {"click-test": {"kind": "click", "description": "Click."}}}
    with pytest.raises(ValidationError, match="unknown tasks"):
        TaskListConfig.model_validate(
            base | {"splits": {"a": {"seeds": {"start": 0, "count": 5}, "tasks": ["nope"]}}}
        )
    with pytest.raises(ValidationError, match="share seeds"):
        split = {"seeds": {"start": 0, "count": 5}, "tasks": ["click-test"]}
        TaskListConfig.model_validate(base | {"splits": {"a": split, "b": split}})


def test_tasks_have_scripted_solvers():
    from env_client.scripted import SOLVERS, WRONG

    assert set(load_task_list().tasks) <= set(SOLVERS) & set(WRONG)


def test_accessibility_tree_round_trip():
    nodes = [
        {"role": "text", "name": 'Click on the "<OK>" & go', "box": [0, 0, 160, 50]},
        {"role": "textbox", "name": "", "value": "a\x00b", "focused": True, "box": [1, 2, 3, 4]},
        {"role": "checkbox", "name": "x", "checked": False, "box": [5, 6, 7, 8]},
    ]
    xml = to_xml(nodes, 160, 210)
    back = parse_tree(xml)
    assert [n.role for n in back] == ["text", "textbox", "checkbox"]
    assert back[0].name == 'Click on the "<OK>" & go'
    assert back[1].value == "ab" and back[1].focused and back[1].box == (1, 2, 3, 4)
    assert back[2].checked is False and back[2].center == (8, 10)
    assert parse_tree(None) == [] and parse_tree("<not xml") == []


def _png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (255, 0, 0)).save(buf, format="PNG")
    return buf.getvalue()


def test_observation_decoding():
    png = _png(160, 210)
    obs = decode_observation(
        {"modalities": {"screenshot": base64.b64encode(png).decode(), "accessibility_tree": None}},
        instruction="Do it.",
    )
    assert obs.screenshot == png and obs.size == (160, 210) and png_size(png) == (160, 210)
    assert obs.image.size == (160, 210) and obs.image.mode == "RGB"
    assert obs.instruction == "Do it." and obs.elements == []
    for broken in (None, {}, {"modalities": {"screenshot": ""}}, {"modalities": 5}):
        assert not decode_observation(broken).has_screenshot
    with pytest.raises(ValueError):
        _ = decode_observation({}).size


def test_fault_book_skip_times_and_scope():
    book = FaultBook([FaultRule(op="step", kind="http_503", skip=1, times=2, session_id="s1")])
    fired = [book.take("step", "s1", "before") is not None for _ in range(5)]
    assert fired == [False, True, True, False, False]
    assert book.take("step", "s2", "before") is None
    assert book.take("observe", "s1", "before") is None
    book.add([FaultRule(op="any", kind="delay", phase="after", delay_s=1)])
    assert book.take("observe", "s9", "after") is not None
    assert book.snapshot()[0]["fired"] == 2
    book.clear()
    assert book.take("observe", "s9", "after") is None


def test_fault_rate_is_a_seeded_share_of_requests():
    def fired(seed: int) -> list[bool]:
        book = FaultBook([FaultRule(op="any", kind="http_503", rate=0.05, times=10**6, seed=seed)])
        return [book.take("step", "s", "before") is not None for _ in range(4000)]

    first = fired(7)
    assert first == fired(7)  # the schedule depends on the seed alone
    assert first != fired(8)
    assert 0.03 < sum(first) / len(first) < 0.07
    with pytest.raises(ValueError):
        FaultRule(op="any", kind="http_503", rate=0.0)
