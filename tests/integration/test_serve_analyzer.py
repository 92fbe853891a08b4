"""The analyzer deployment through real Serve (tiny random-weight model, CPU): a transition in,
k=3 votes out, combined into a judgment; the model's garbage never raises, bad input does.
Parsing of valid/malformed/adversarial answers is covered in tests/unit/test_serve_judgment.py
(a random tiny model cannot be made to write valid JSON here)."""

from __future__ import annotations

import io
import json
import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from PIL import Image
from ray import serve

from serve_apps.analyzer import deploy_analyzer
from serve_apps.config import AnalyzerAppConfig, SamplingConfig
from serve_apps.errors import RequestError
from serve_apps.judgment import combine_votes

pytestmark = pytest.mark.integration


def png(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (160, 210), color).save(buf, "PNG")
    return buf.getvalue()


def serve_http_port() -> int:
    from ray.serve.context import _get_global_client

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    return _get_global_client().http_config.port


@dataclass
class AnalyzerUnderTest:
    handle: serve.handle.DeploymentHandle
    base_url: str


@pytest.fixture(scope="module")
def analyzer(ray_cluster: None) -> Iterator[AnalyzerUnderTest]:
    from workflows.common.tiny_models import tiny_checkpoint

    port = serve_http_port()
    cfg = AnalyzerAppConfig(
        model_path=str(tiny_checkpoint("analyzer")),
        name="itest-analyzer",
        route_prefix="/itest-analyzer",
        votes=3,
        sampling=SamplingConfig(temperature=1.0, max_new_tokens=24),
        full_system_prompt=False,
        max_prompt_tokens=2048,
    )
    handle = deploy_analyzer(cfg)
    try:
        yield AnalyzerUnderTest(handle, f"http://127.0.0.1:{port}{cfg.route_prefix}")
    finally:
        serve.delete(cfg.name)


def transition(**overrides: object) -> dict:
    return {
        "instruction": "Click the OK button",
        "history": ["clicked the text field", "typed hello"],
        "screenshot_before": png((200, 200, 200)),
        "screenshot_after": png((20, 200, 20)),
        "response": 'Action: click OK.\n<tool_call>{"name": "computer_use", "arguments": '
        '{"action": "left_click", "coordinate": [500, 800]}}</tool_call>',
        "action": {"action": "left_click", "coordinate": [500, 800]},
        **overrides,
    }


def test_analyze_returns_a_judgment_from_k_votes(analyzer: AnalyzerUnderTest) -> None:
    out = analyzer.handle.analyze.remote(transition()).result()
    expected = {"consistency", "effectiveness", "guide", "avoid", "guidance", "d", "v", "reason"}
    assert expected | {"votes", "raw", "weight_version"} <= set(out)
    assert len(out["raw"]) == len(out["votes"]) == 3 and out["weight_version"] == 0
    assert out["d"] in (-1, 0, 1) and 0.0 <= out["v"] <= 1.0
    # Whatever the model wrote, the result is exactly what the parser makes of its raw answers.
    local = combine_votes(out["raw"]).model_dump()
    assert {k: out[k] for k in local} == local
    if out["d"] == 0:
        assert out["reason"]  # a random tiny model writes no JSON: masked, with the reason


def test_concurrent_transitions_are_batched_and_all_answered(analyzer: AnalyzerUnderTest) -> None:
    calls = [analyzer.handle.analyze.remote(transition(instruction=f"Task {i}")) for i in range(4)]
    outs = [c.result() for c in calls]
    assert all(len(o["raw"]) == 3 and o["d"] in (-1, 0, 1) for o in outs)


def test_bad_transitions_are_request_errors(analyzer: AnalyzerUnderTest) -> None:
    with pytest.raises(RequestError, match="screenshot_after"):
        bad = transition()
        del bad["screenshot_after"]
        analyzer.handle.analyze.remote(bad).result()
    with pytest.raises(RequestError, match="image 1: not a decodable image"):
        analyzer.handle.analyze.remote(transition(screenshot_after=b"garbage")).result()


def test_analyzer_also_serves_the_openai_endpoint(analyzer: AnalyzerUnderTest) -> None:
    models = json.loads(urllib.request.urlopen(analyzer.base_url + "/v1/models").read())
    assert [m["id"] for m in models["data"]] == ["itest-analyzer"]
