"""The demo app's HTTP API on bad input, served for real (uvicorn, loopback) without Ray or
Chromium: every refusal is a 4xx JSON error naming the problem, and nothing is allocated.

The environment client points at a closed port and is never started: each request here must
be refused before an environment session would be asked for. What a started episode does is
tested on the real environment in tests/integration/test_demo.py (so is the 429 past the
environment's capacity)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from env_client.client import EnvClient
from env_client.config import EnvClientConfig
from env_client.tasks.sources import make_task_source
from serve_apps.prompting.styles import make_style
from tests.unit._demo_helpers import call, serving, write_run
from workflows.demo.api import DemoService, build_api
from workflows.demo.config import load_demo_config
from workflows.demo.live import EpisodeManager, Models
from workflows.demo.viewer import RunIndex

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, EpisodeManager]]:
    runs = tmp_path_factory.mktemp("runs")
    write_run(runs, "run-ok")
    cfg = load_demo_config(
        "embedded", ["env.server_url=http://127.0.0.1:9", f"demo.runs_dir={runs}"]
    )
    client = EnvClient(EnvClientConfig(server_url="http://127.0.0.1:9"))  # never started
    style = make_style(cfg.policy.agent_style, cfg.demo.history_screens)
    manager = EpisodeManager(client, cfg.demo, 2, style, Models(policy=None, analyzer=None))
    service = DemoService(cfg, make_task_source(cfg.task_source), manager, RunIndex(runs))
    with serving(build_api(service)) as url:
        yield url, manager


def _start(url: str, **body) -> tuple[int, dict]:
    return call("POST", f"{url}/api/episodes", {"task": "click-test", **body})


def test_page_and_info(demo) -> None:
    url, _ = demo
    import urllib.request

    with urllib.request.urlopen(f"{url}/") as r:
        assert "text/html" in r.headers["content-type"]
        assert b"Start episode" in r.read()
    status, info = call("GET", f"{url}/api/info")
    assert status == 200 and "click-test" in info["tasks"]["train"]
    assert set(info["tasks"]) == {"train", "eval"} and info["limit"] == 2


def test_unknown_task_and_split(demo) -> None:
    url, manager = demo
    status, body = _start(url, task="no-such-task")
    assert status == 404 and body["ok"] is False
    assert "unknown task 'no-such-task' in split 'train'" in body["error"]
    assert "click-test" in body["error"]  # the message lists what exists
    status, body = _start(url, split="nope")
    assert status == 404 and "unknown split 'nope'" in body["error"]
    assert manager.episodes == {}


def _headers_only(url: str, path: str, length: int) -> tuple[int, dict]:
    """Send a request's headers announcing ``length`` body bytes, none of the body, and read
    the answer: a server that refuses unread answers now (a client that streamed the body
    could instead meet a closed socket, which says nothing about the server)."""
    import json
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(
            f"POST {parts.path}{path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body[body.index(b"{") : body.rindex(b"}") + 1])


def test_a_1mb_instruction_is_refused_unread(demo) -> None:
    url, manager = demo
    status, body = _headers_only(url, "/api/episodes", 1 << 20)
    assert status == 413
    assert "request body is" in body["error"] and "at most 65536" in body["error"]
    assert "instruction is at most 2000 characters" in body["error"]
    status, body = _start(url, instruction="y" * 3000)  # under the body limit
    assert status == 422 and "instruction has 3000 characters" in body["error"]
    assert manager.episodes == {}


def test_a_chunked_body_over_the_limit_is_413_unparsed(demo) -> None:
    """A body without Content-Length was parsed whole (a 422 naming its fields); it is now
    counted as it arrives and refused past the limit."""
    import http.client
    import json
    from urllib.parse import urlsplit

    url, manager = demo
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    body = b"{" * ((64 << 10) + 1)  # not even JSON: parsing it would answer 422
    conn.request(
        "POST", "/api/episodes", body=iter([body]), encode_chunked=True,
        headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
    )  # fmt: skip
    answer = conn.getresponse()
    status, error = answer.status, json.loads(answer.read())["error"]
    conn.close()
    assert status == 413 and "over the demo's limit" in error and "at most 65536" in error
    assert manager.episodes == {}


@pytest.mark.parametrize(
    ("field", "value"),
    [("seed", True), ("seed", "1"), ("seed", 1.0), ("temperature", "0.5"), ("temperature", True)],
)
def test_fields_of_the_wrong_json_type_are_refused(demo, field, value) -> None:
    """``"seed": true`` was read as seed 1 (and ``"0.5"`` as 0.5): an episode was started."""
    url, manager = demo
    status, body = _start(url, **{field: value})
    assert status == 422 and field in body["error"]
    status, body = call("PUT", f"{url}/api/episodes/abc123/temperature", {"temperature": "0.5"})
    assert status == 422 and "temperature" in body["error"]
    assert manager.episodes == {}


def test_invalid_fields_are_named(demo) -> None:
    url, manager = demo
    status, body = _start(url, temperature=-1)
    assert status == 422 and "temperature" in body["error"]
    status, body = _start(url, seed="abc")
    assert status == 422 and "seed" in body["error"]
    status, body = call("POST", f"{url}/api/episodes", raw=b"{not json")
    assert status == 422 and body["ok"] is False
    status, body = call("POST", f"{url}/api/episodes", {"task": "click-test", "colour": 1})
    assert status == 422 and "colour" in body["error"]
    assert manager.episodes == {}


def test_unknown_episode_and_route(demo) -> None:
    url, _ = demo
    status, body = call("GET", f"{url}/api/episodes/abc123")
    assert status == 404 and "no episode 'abc123'" in body["error"]
    status, body = call("POST", f"{url}/api/episodes/abc123/stop")
    assert status == 404
    status, body = call("GET", f"{url}/api/nothing-here")
    assert status == 404 and "no such route" in body["error"]


def test_viewer_missing_run_and_step(demo) -> None:
    url, _ = demo
    status, body = call("GET", f"{url}/api/runs/missing-run/steps")
    assert status == 404 and "no run folder 'missing-run'" in body["error"]
    status, body = call("GET", f"{url}/api/runs/run-ok/steps/g9-e9-s9/screenshots/0")
    assert status == 404 and "no step 'g9-e9-s9'" in body["error"]
    status, body = call("GET", f"{url}/api/runs/run-ok/steps?only=bogus")
    assert status == 422 and "only" in body["error"]


def test_viewer_serves_a_run(demo) -> None:
    url, _ = demo
    status, runs = call("GET", f"{url}/api/runs")
    assert status == 200 and [r["name"] for r in runs["runs"]] == ["run-ok"]
    status, sel = call("GET", f"{url}/api/runs/run-ok/steps?version=0&only=gate")
    assert status == 200 and [s["sample_id"] for s in sel["steps"]] == ["g000000-e1-s0"]
    status, step = call("GET", f"{url}/api/runs/run-ok/steps/g000000-e1-s0")
    assert status == 200 and step["screenshots"] == 1 and step["gap"] == pytest.approx(0.75)
    import urllib.request

    with urllib.request.urlopen(f"{url}/api/runs/run-ok/steps/g000000-e1-s0/screenshots/0") as r:
        assert r.headers["content-type"] == "image/png"
        assert r.read().startswith(b"\x89PNG")


def test_config_file_errors_name_the_field(tmp_path: Path) -> None:
    from workflows.common.config_io import ConfigError

    with pytest.raises(ConfigError, match=r"demo\.max_episodes"):
        load_demo_config("embedded", ["demo.max_episodes=99"])
    with pytest.raises(ConfigError, match=r"demo\.colour: unknown field"):
        load_demo_config("embedded", ["demo.colour=1"])
    cfg = load_demo_config("embedded")
    assert cfg.policy.model_path == "warm:0" and cfg.policy.agent_style == "elements"
    assert cfg.demo.max_steps == 6 and cfg.episode_limit == 8
