"""Rollout-side pieces that need no cluster: rewards and advantages."""

from __future__ import annotations

import pytest

from workflows.online_rl.rollout import episode_advantages


@pytest.mark.parametrize(
    "scores",
    [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.5, 0.99, 1.0], [0.0, 1.0]],
)
def test_advantages_match_the_trainers_definition(scores: list[float]) -> None:
    import torch

    from train_loops.losses import group_advantages, rewards_from_scores

    rewards, adv = episode_advantages(scores)
    want_r = rewards_from_scores(torch.tensor(scores))
    want_a = group_advantages(want_r, torch.zeros(len(scores), dtype=torch.long))
    assert rewards == want_r.tolist()
    assert adv == pytest.approx(want_a.tolist(), abs=1e-6)


def test_hand_computed_group() -> None:
    # r = [+1, -1, -1, +1]: mean 0, unbiased std sqrt(4/3) -> A = ±0.8660
    rewards, adv = episode_advantages([1.0, 0.2, 0.0, 1.0])
    assert rewards == [1.0, -1.0, -1.0, 1.0]
    assert adv == pytest.approx([0.8660254, -0.8660254, -0.8660254, 0.8660254], abs=1e-5)
    assert episode_advantages([0.0, 0.0])[1] == [0.0, 0.0]
