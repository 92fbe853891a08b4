"""The policy deployment through real Serve (2 replicas, tiny Qwen3-VL, CPU): handles, HTTP with
the official ``openai`` client, and weight hot-swap while requests run.

One Serve app for the whole module (deploying costs ~10-20 s). Tests run in file order and
build on each other's weight versions: they read the current version instead of assuming it.
"""

from __future__ import annotations

import base64
import io
import json
import socket
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import ray
import torch
from PIL import Image
from ray import serve

from serve_apps.config import PolicyAppConfig, SamplingConfig, WeightSyncConfig
from serve_apps.errors import RequestError
from serve_apps.policy import PolicyServer, deploy_policy
from serve_apps.prompting import agent_messages, guidance_text, privileged_messages
from serve_apps.weights.manifest import Publication, Shard, WeightMismatch
from serve_apps.weights.publisher import WeightPublisher
from serve_apps.weights.registry import StaleVersion, kill_registry

pytestmark = pytest.mark.integration
TOL = 1e-3


def png(color: tuple[int, int, int], size: tuple[int, int] = (160, 210)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


def serve_http_port() -> int:
    """Start Serve on a free local port unless it already runs; the port it listens on."""
    from ray.serve.context import _get_global_client

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    return _get_global_client().http_config.port


@dataclass
class PolicyUnderTest:
    cfg: PolicyAppConfig
    handle: serve.handle.DeploymentHandle
    publisher: WeightPublisher
    base_url: str


@pytest.fixture(scope="module")
def policy(ray_cluster: None, tiny_policy_path: Path) -> Iterator[PolicyUnderTest]:
    port = serve_http_port()
    registry = f"itest-policy-{uuid.uuid4().hex[:8]}"
    cfg = PolicyAppConfig(
        model_path=str(tiny_policy_path),
        name="itest-policy",
        route_prefix="/itest-policy",
        num_replicas=2,
        num_cpus=0.5,
        sampling=SamplingConfig(max_new_tokens=16),
        max_prompt_tokens=1024,
        weights=WeightSyncConfig(registry_name=registry, poll_interval_s=1.0, stale_after_s=15.0),
    )
    handle = deploy_policy(cfg)
    publisher = WeightPublisher(registry)
    publisher.wait_for_version(0, timeout_s=60, min_replicas=2)  # both replicas registered
    try:
        yield PolicyUnderTest(cfg, handle, publisher, f"http://127.0.0.1:{port}{cfg.route_prefix}")
    finally:
        serve.delete(cfg.name)
        kill_registry(registry)


def request(task: str = "Click the OK button", n_screens: int = 2, **extra: object) -> dict:
    shots = [png((60 * i, 200 - 50 * i, 90)) for i in range(n_screens)]
    messages, images = agent_messages(task, shots, ["typed hello"] * (n_screens - 1))
    return {"messages": messages, "images": images, **extra}


def current_version(p: PolicyUnderTest) -> int:
    return p.publisher.latest_version() or 0


def max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


# ---- handles ---------------------------------------------------------------------------------


def test_generate_returns_ids_logprobs_and_version(
    policy: PolicyUnderTest, tiny_policy_path: Path
) -> None:
    out = policy.handle.generate.remote(request(temperature=1.0, seed=11)).result()
    assert set(out) == {
        "text",
        "prompt_ids",
        "response_ids",
        "logprobs",
        "weight_version",
        "finish_reason",
    }
    assert out["weight_version"] == current_version(policy)
    assert 0 < len(out["response_ids"]) == len(out["logprobs"]) <= 16
    assert all(lp <= 0.0 for lp in out["logprobs"]) and out["finish_reason"] in ("stop", "length")
    from transformers import AutoTokenizer

    pad = AutoTokenizer.from_pretrained(str(tiny_policy_path)).convert_tokens_to_ids(
        "<|image_pad|>"
    )
    assert out["prompt_ids"].count(pad) == 2 * (14 * 10 // 4)  # two 160x210 screens, expanded
    again = policy.handle.generate.remote(request(temperature=1.0, seed=11)).result()
    assert again["response_ids"] == out["response_ids"]  # seeded: same on either replica


def test_rescoring_reproduces_generation_logprobs(policy: PolicyUnderTest) -> None:
    req = request()
    gens = [policy.handle.generate.remote({**req, "seed": s}) for s in range(4)]
    gens = [g.result() for g in gens]
    scores = [
        policy.handle.score.remote({**req, "response_ids": g["response_ids"]}) for g in gens
    ]  # concurrent: batched on the replicas
    for g, s in zip(gens, [s.result() for s in scores], strict=True):
        assert s["weight_version"] == g["weight_version"]
        assert s["num_prompt_tokens"] == len(g["prompt_ids"])
        assert max_diff(g["logprobs"], s["logprobs"]) < TOL


def test_privileged_context_changes_logprobs(policy: PolicyUnderTest) -> None:
    req = request()
    gen = policy.handle.generate.remote({**req, "seed": 5}).result()
    guidance = guidance_text("Click the OK button in the dialog", "Do not press Cancel")
    ordinary = policy.handle.score.remote({**req, "response_ids": gen["response_ids"]})
    privileged = policy.handle.score.remote(
        {
            "messages": privileged_messages(req["messages"], guidance),
            "images": req["images"],
            "response_ids": gen["response_ids"],
        }
    )
    a, b = ordinary.result(), privileged.result()
    assert max_diff(a["logprobs"], gen["logprobs"]) < TOL
    assert sum(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"], strict=True)) > 1e-3


def test_bad_handle_requests_fail_alone_with_clear_errors(
    policy: PolicyUnderTest, tiny_policy_path: Path
) -> None:
    from transformers import AutoTokenizer

    image_pad = AutoTokenizer.from_pretrained(str(tiny_policy_path)).convert_tokens_to_ids(
        "<|image_pad|>"
    )
    cases = [
        ({**request(), "images": [b"not a png", png((1, 2, 3))]}, "image 0: not a decodable image"),
        ({**request(), "images": request()["images"][:1]}, "2 image parts but 1 images"),
        (request("word " * 3000), "the limit is 1024"),
        (request(max_new_tokens=0), "max_new_tokens"),
        ({"prompt": "hi"}, "messages"),
    ]
    good = policy.handle.generate.remote(request(seed=1))  # in flight beside the bad ones
    for body, message in cases:
        with pytest.raises(Exception, match=message) as err:
            policy.handle.generate.remote(body).result()
        assert isinstance(err.value, RequestError)
    with pytest.raises(RequestError, match="vision placeholder"):
        policy.handle.score.remote({**request(), "response_ids": [1, image_pad, 12]}).result()
    assert good.result()["response_ids"]


# ---- HTTP: the official openai client ---------------------------------------------------------


def test_openai_client_talks_to_the_policy(policy: PolicyUnderTest) -> None:
    client = openai.OpenAI(base_url=policy.base_url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == ["itest-policy"]
    url = "data:image/png;base64," + base64.b64encode(png((10, 120, 200))).decode()
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Click the OK button."},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        },
    ]
    resp = client.chat.completions.create(
        model="itest-policy", messages=messages, max_tokens=8, seed=2, logprobs=True
    )
    choice = resp.choices[0]
    assert isinstance(choice.message.content, str) and choice.finish_reason in ("stop", "length")
    assert resp.usage.completion_tokens == len(choice.logprobs.content) <= 8
    assert resp.usage.prompt_tokens > 35 and resp.model == "itest-policy"
    assert resp.model_extra["weight_version"] == current_version(policy)
    stream = client.chat.completions.create(
        model="itest-policy", messages=messages, max_tokens=8, seed=2, stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == choice.message.content  # same seed, same answer


def test_openai_errors_are_4xx_with_messages(policy: PolicyUnderTest) -> None:
    client = openai.OpenAI(base_url=policy.base_url + "/v1", api_key="unused", max_retries=0)
    user = {"role": "user", "content": "hi"}

    def ask(**kw: object) -> None:
        client.chat.completions.create(**{"model": "itest-policy", "messages": [user], **kw})

    with pytest.raises(openai.NotFoundError, match="model 'gpt-4o' does not exist"):
        ask(model="gpt-4o")
    bad_image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}
    with pytest.raises(openai.BadRequestError, match="not a decodable image"):
        ask(messages=[{"role": "user", "content": [bad_image]}])
    remote = {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}}
    with pytest.raises(openai.BadRequestError, match="only data URLs"):
        ask(messages=[{"role": "user", "content": [remote]}])
    with pytest.raises(openai.BadRequestError, match="the limit is 1024") as err:
        ask(messages=[{"role": "user", "content": "word " * 3000}])
    assert err.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="temperature"):
        ask(temperature=7)
    with pytest.raises(openai.BadRequestError, match="only n=1"):
        ask(n=2)
    weights = json.loads(urllib.request.urlopen(policy.base_url + "/v1/weights").read())
    assert weights["version"] == current_version(policy) and weights["replica_id"]


# ---- weight hot-swap ----------------------------------------------------------------------------


class Oracle:
    """Independent scorer: plain HF forward of prompt_ids + response_ids under given weights."""

    def __init__(self, path: Path, state: dict[str, torch.Tensor]) -> None:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.model = AutoModelForImageTextToText.from_pretrained(str(path)).eval()
        self.model.load_state_dict(state)
        self.processor = AutoProcessor.from_pretrained(str(path))
        self.pad = self.processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")

    @torch.no_grad()
    def logprobs(
        self, prompt_ids: list[int], images: list[bytes], response: list[int]
    ) -> list[float]:
        pix = self.processor.image_processor(
            images=[Image.open(io.BytesIO(b)).convert("RGB") for b in images], return_tensors="pt"
        )
        ids = torch.tensor([prompt_ids + response])
        out = self.model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            mm_token_type_ids=(ids == self.pad).long(),
            pixel_values=pix["pixel_values"],
            image_grid_thw=pix["image_grid_thw"],
        )
        logp = torch.log_softmax(out.logits[0, len(prompt_ids) - 1 : -1].float(), dim=-1)
        return logp.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1).tolist()


def perturbed(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v + 0.05 * torch.randn_like(v) for k, v in state.items()}


def test_hot_swap_reaches_both_replicas_and_never_mixes_versions(
    policy: PolicyUnderTest, tiny_policy_path: Path
) -> None:
    from transformers import AutoModelForImageTextToText

    old_version = current_version(policy)
    assert old_version == 0, "this test expects the checkpoint's weights to be served"
    base = AutoModelForImageTextToText.from_pretrained(str(tiny_policy_path)).state_dict()
    new_state, new_version = perturbed(base, 1), 1
    greedy = request(temperature=0.0, max_new_tokens=12)
    before = policy.handle.generate.remote(greedy).result()

    req = request()
    long_wave = [
        policy.handle.generate.remote({**req, "seed": s, "max_new_tokens": 48}) for s in range(6)
    ]
    time.sleep(0.3)  # the long wave is running on version 0
    t0 = time.perf_counter()
    policy.publisher.publish(new_state, new_version)
    during = [policy.handle.generate.remote({**req, "seed": 100 + s}) for s in range(6)]
    versions = policy.publisher.wait_for_version(new_version, timeout_s=30, min_replicas=2)
    swap_s = time.perf_counter() - t0
    assert len(versions) == 2 and set(versions.values()) == {new_version}
    assert swap_s < 10.0, f"both replicas took {swap_s:.1f}s"
    after = [policy.handle.generate.remote({**req, "seed": 200 + s}) for s in range(4)]

    results = [r.result() for r in long_wave + during + after]
    assert [r["weight_version"] for r in results[-4:]] == [new_version] * 4
    assert {r["weight_version"] for r in results} == {old_version, new_version}
    oracles = {
        old_version: Oracle(tiny_policy_path, base),
        new_version: Oracle(tiny_policy_path, new_state),
    }
    for r in results:  # every token of every response came from the version it reports
        mine = oracles[r["weight_version"]].logprobs(
            r["prompt_ids"], req["images"], r["response_ids"]
        )
        other = oracles[old_version + new_version - r["weight_version"]].logprobs(
            r["prompt_ids"], req["images"], r["response_ids"]
        )
        assert max_diff(mine, r["logprobs"]) < TOL
        assert max_diff(other, r["logprobs"]) > 10 * TOL  # the check can tell the versions apart
    after_greedy = policy.handle.generate.remote(greedy).result()
    assert after_greedy["weight_version"] == new_version
    assert (after_greedy["response_ids"], after_greedy["logprobs"]) != (
        before["response_ids"],
        before["logprobs"],
    )


@ray.remote
def _lost_shard() -> list:
    raise OSError("shard object lost")


def test_failed_publications_leave_replicas_on_the_previous_version(
    policy: PolicyUnderTest, tiny_policy_path: Path
) -> None:
    from transformers import AutoModelForImageTextToText

    good = current_version(policy)
    base = AutoModelForImageTextToText.from_pretrained(str(tiny_policy_path)).state_dict()
    missing = dict(base)
    missing.pop("lm_head.weight")
    with pytest.raises(WeightMismatch, match="1 missing"):
        policy.publisher.publish(missing, good + 1)
    with pytest.raises(StaleVersion):
        policy.publisher.publish(base, good)
    assert policy.publisher.publish_part(base, good + 1, part=0, num_parts=2) is False
    # A committed version whose shard cannot be fetched (as if its owner died).
    latest: Publication = ray.get(policy.publisher.registry.latest.remote())
    lost = Publication(good + 2, [Shard(_lost_shard.remote(), s.entries) for s in latest.shards])
    ray.get(policy.publisher.registry.commit.remote(lost))
    deadline = time.monotonic() + 30
    while True:
        states = [s for s in policy.publisher.replica_states().values() if s["alive"]]
        if len(states) == 2 and all(
            f"version {good + 2}" in (s["last_error"] or "") for s in states
        ):
            break
        assert time.monotonic() < deadline, states
        time.sleep(0.1)
    assert {s["version"] for s in states} == {good}
    out = policy.handle.generate.remote(request(seed=3)).result()
    assert out["weight_version"] == good
    # The next complete version is loaded normally by both.
    policy.publisher.publish(perturbed(base, 7), good + 3)
    assert set(policy.publisher.wait_for_version(good + 3, 30, min_replicas=2).values()) == {
        good + 3
    }


def test_a_replica_started_later_loads_the_latest_version(policy: PolicyUnderTest) -> None:
    latest = current_version(policy)
    assert latest > 0
    before = set(policy.publisher.replica_states())
    cfg = policy.cfg
    # serve.run of a Python app rolls the deployment: every replica of the new revision (3)
    # starts after the latest publication and must load it before serving.
    scaled = PolicyServer.options(
        name=cfg.name,
        num_replicas=3,
        max_ongoing_requests=cfg.max_ongoing_requests,
        ray_actor_options={"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus},
    ).bind(cfg)
    serve.run(scaled, name=cfg.name, route_prefix=cfg.route_prefix)
    versions = policy.publisher.wait_for_version(latest, timeout_s=60, min_replicas=3)
    assert len(versions) >= 3 and set(versions.values()) == {latest}
    states = policy.publisher.replica_states()
    newcomers = [s for rid, s in states.items() if rid not in before]
    assert newcomers and all(s["version"] == latest and s["loads"] == 1 for s in newcomers)
