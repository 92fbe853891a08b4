"""Self-distillation masking: a step is masked when its analyzer request fails, its polarity is
0 or it has no guidance (METHOD.md §2, as the reference), on the rollout side (d = 0, no
target, counted, the worker goes on) and in the trainer's objective (every variant)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
import torch

from train_loops.losses import self_distillation_loss
from train_loops.objectives import has_guidance
from train_loops.self_distill import VARIANTS, make_self_distillation
from workflows.online_rl.config import OnlineRLConfig
from workflows.online_rl.rollout import RolloutWorker

# ---- trainer ----------------------------------------------------------------------------------


def _sd_grads(d: list[int], guided: list[bool] | None, sd_type: str) -> torch.Tensor:
    """[B] norm of the SD gradient reaching each sample's log-probs (B=3, T=4)."""
    torch.manual_seed(0)
    logprobs = (-torch.rand(3, 4)).requires_grad_()
    privileged = -torch.rand(3, 4)
    loss, _ = self_distillation_loss(
        logprobs,
        privileged,
        torch.tensor(d),
        torch.full((3,), 0.25),
        torch.ones(3, 4, dtype=torch.bool),
        make_self_distillation(sd_type),
        None if guided is None else torch.tensor(guided),
    )
    loss.backward()
    return logprobs.grad.norm(dim=-1)


@pytest.mark.parametrize("sd_type", sorted(set(VARIANTS) - {"off"}))
def test_a_step_without_guidance_is_masked_in_every_variant(sd_type: str) -> None:
    grads = _sd_grads([1, -1, 1], [True, True, False], sd_type)
    assert grads[2] == 0 and grads[0] > 0
    assert torch.equal(grads[:2], _sd_grads([1, -1, 1], None, sd_type)[:2])


def test_polarity_zero_is_masked_like_no_guidance() -> None:
    no_direction = _sd_grads([1, 0, 1], None, "gated")
    no_guidance = _sd_grads([1, 1, 1], [True, False, True], "gated")
    assert no_direction[1] == 0 and torch.equal(no_direction, no_guidance)


def test_has_guidance_reads_the_rows() -> None:
    rows = [{"guide": "click OK", "avoid": ""}, {"guide": " ", "avoid": None},
            {"guide": "", "avoid": "cancel"}]  # fmt: skip
    assert has_guidance(rows).tolist() == [True, False, True]


# ---- rollout side -----------------------------------------------------------------------------


class _Method:
    """A deployment method as a handle shows it: ``remote(payload)`` → awaitable."""

    def __init__(self, answer: Any) -> None:
        self.answer, self.calls = answer, []

    def remote(self, payload: dict[str, Any]) -> Any:
        self.calls.append(payload)

        async def reply() -> Any:
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

        return reply()


class _Handle:
    def __init__(self, **methods: _Method) -> None:
        self.__dict__.update(methods)


JUDGED = {"consistency": 1, "effectiveness": 1, "guide": "click OK", "avoid": "", "d": 1, "v": 1.0}
GEN = {"response_ids": [5, 6], "logprobs": [-0.5, -0.25], "weight_version": 3}
MESSAGES = [{"role": "user", "content": [{"type": "text", "text": "task"}, {"type": "image"}]}]


def _feedback(judgment: Any, score: Any) -> tuple[dict[str, Any], RolloutWorker, _Handle]:
    cfg = OnlineRLConfig(policy={"model_path": "/p"}, analyzer={"model_path": "/a"})
    worker = RolloutWorker(cfg, 0, [], "http://env", None, "policy", "analyzer")
    worker.policy = policy = _Handle(score=_Method(score))
    worker.analyzer = _Handle(analyze=_Method(judgment))
    out = asyncio.run(worker._feedback({"instruction": "t"}, MESSAGES, [b"png"], GEN))
    return out, worker, policy


def test_a_judged_step_is_rescored_under_the_guidance() -> None:
    out, _, policy = _feedback(JUDGED, {"logprobs": [-0.1, -0.2], "weight_version": 4})
    assert (out["d"], out["privileged_logprobs"], out["privileged_version"]) == (1, [-0.1, -0.2], 4)
    privileged_turn = policy.score.calls[0]["messages"][-1]["content"][-1]["text"]
    assert "[PRIVILEGED_ACTION_GUIDANCE]\n[GUIDE]\nclick OK" in privileged_turn
    assert out["ordinary_logprobs"] == GEN["logprobs"]


@pytest.mark.parametrize(
    ("judgment", "score", "counter"),
    [
        (RuntimeError("analyzer replica died"), None, "analyzer_errors"),
        ({**JUDGED, "guide": "", "d": 0}, None, None),  # empty guidance: nothing to rescore
        ({**JUDGED, "d": 0}, {"logprobs": [-0.1, -0.2], "weight_version": 4}, None),  # tie
        (JUDGED, RuntimeError("policy replica died"), "score_errors"),
    ],
)
def test_a_step_is_masked_counted_and_the_worker_goes_on(
    judgment: Any, score: Any, counter: str | None
) -> None:
    out, worker, policy = _feedback(judgment, score)
    assert out["d"] == 0
    for key in ("analyzer_errors", "score_errors"):
        assert worker.counters[key] == (1 if key == counter else 0)
    if score is None or isinstance(score, Exception):  # no distillation target at all
        assert all(math.isnan(x) for x in out["privileged_logprobs"])
        assert out["privileged_version"] == GEN["weight_version"]
    assert len(policy.score.calls) == (0 if score is None else 1)


def test_fixed_guidance_replaces_the_analyzer(tmp_path) -> None:
    import json

    from workflows.online_rl.fixed_guidance import fixed_judgment, load_guidance

    path = tmp_path / "g.json"
    path.write_text(json.dumps({"task-1": ["open the File menu"]}))
    cfg = OnlineRLConfig(
        policy={"model_path": "/p"}, analyzer={"model_path": "/a"},
        rollout={"fixed_guidance_file": str(path)},
    )  # fmt: skip
    worker = RolloutWorker(cfg, 0, [], "http://env", None, "policy", "analyzer")
    worker.policy = policy = _Handle(score=_Method({"logprobs": [-0.1, -0.2], "weight_version": 4}))
    worker.analyzer = analyzer = _Handle(analyze=_Method(RuntimeError("must not be asked")))
    fixed = fixed_judgment(load_guidance(path), "task-1", 3)  # trajectory-level: every step
    out = asyncio.run(worker._feedback({"instruction": "t"}, MESSAGES, [b"png"], GEN, fixed))
    assert (out["d"], out["guide"], out["privileged_logprobs"]) == (
        1, "open the File menu", [-0.1, -0.2],
    )  # fmt: skip
    assert analyzer.analyze.calls == [] and worker.counters["analyzer_errors"] == 0
    assert "open the File menu" in policy.score.calls[0]["messages"][-1]["content"][-1]["text"]
