"""The pure losses of train_loops.losses against values computed by hand (METHOD.md §4–§5).

Most cases use one token per sample (T = 1) so a per-sample mean is that token's value and
the batch loss is a plain mean over samples; the reduction tests use ragged masks.
"""

from __future__ import annotations

import math

import pytest
import torch

from train_loops.losses import (
    RLCoefs,
    RLTerms,
    group_advantages,
    kl_k3_loss,
    per_sample_token_mean,
    policy_gradient_loss,
    rewards_from_scores,
    rl_loss,
    self_distillation_loss,
    sft_loss,
    token_mean_per_sample,
)
from train_loops.self_distill import VARIANTS, make_self_distillation

SIG1 = 1.0 / (1.0 + math.exp(-1.0))  # sigmoid(β·|Δ|) with β = 5, |Δ| = 0.2
SIGM1 = 1.0 - SIG1


def col(*values: float, grad: bool = False) -> torch.Tensor:
    """[B, 1] tensor of one token per sample."""
    return torch.tensor([[v] for v in values], dtype=torch.float32, requires_grad=grad)


def ones_mask(b: int, t: int = 1) -> torch.Tensor:
    return torch.ones(b, t, dtype=torch.bool)


# --------------------------------------------------------------------------- advantages


def test_group_advantages_hand_values() -> None:
    # one group, rewards (1, -1, -1, -1): mean -0.5, centred (1.5, -.5, -.5, -.5),
    # unbiased var = (2.25 + 3*0.25) / 3 = 1, std 1.
    adv = group_advantages(torch.tensor([1.0, -1.0, -1.0, -1.0]), torch.zeros(4))
    expected = torch.tensor([1.5, -0.5, -0.5, -0.5]) / (1.0 + 1e-6)
    torch.testing.assert_close(adv, expected)


def test_group_advantages_balanced_group_and_all_equal_group() -> None:
    # group 7: (1, -1, 1, -1): mean 0, std sqrt(4/3) → ±0.866; group 3: all equal → 0.
    rewards = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, -1.0, -1.0])
    groups = torch.tensor([7, 7, 7, 7, 3, 3, 3])
    adv = group_advantages(rewards, groups)
    a = 1.0 / (math.sqrt(4.0 / 3.0) + 1e-6)
    torch.testing.assert_close(adv, torch.tensor([a, -a, a, -a, 0.0, 0.0, 0.0]))


def test_group_advantages_all_success_and_singleton_give_zero() -> None:
    adv = group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.5]), torch.tensor([0, 0, 0, 1]))
    assert torch.equal(adv, torch.zeros(4))


def test_rewards_from_scores_threshold_at_one() -> None:
    r = rewards_from_scores(torch.tensor([0.0, 0.99, 1.0, 1.5]))
    assert r.tolist() == [-1.0, -1.0, 1.0, 1.0]


# --------------------------------------------------------------------------- PPO clip


def test_ppo_clip_both_sides_values_and_gradients() -> None:
    # behaviour log-prob 0, current log ρ: ρ = 1.5, 0.5, 1.5, 0.5; A = +1, -1, -1, +1; ε = 0.2
    #   s0: min(1.5, 1.2) = 1.2   → -1.2, clipped above (no gradient)
    #   s1: min(-0.5, -0.8) = -0.8 → 0.8, clipped below (no gradient)
    #   s2: min(-1.5, -1.2) = -1.5 → 1.5, unclipped: d/dlogπ = -Aρ = 1.5
    #   s3: min(0.5, 0.8) = 0.5    → -0.5, unclipped: d/dlogπ = -Aρ = -0.5
    lp = col(math.log(1.5), math.log(0.5), math.log(1.5), math.log(0.5), grad=True)
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    loss, m = policy_gradient_loss(lp, torch.zeros(4, 1), adv, ones_mask(4), 0.2, 0.2)
    assert loss.item() == pytest.approx((-1.2 + 0.8 + 1.5 - 0.5) / 4)
    loss.backward()
    assert lp.grad is not None
    torch.testing.assert_close(lp.grad[:, 0], torch.tensor([0.0, 0.0, 1.5, -0.5]) / 4)
    assert m["pg/clip_frac"] == pytest.approx(0.5)
    assert m["pg/frac_nonzero_adv"] == 1.0


def test_whole_group_at_ratio_one_has_zero_loss_value_but_a_gradient() -> None:
    # One group, rewards (+1, -1): A = (+0.707, -0.707); ρ = 1 → L_PG = -mean A = 0, yet the
    # gradient pushes the winner up and the loser down; a zero-variance sample adds nothing.
    lp = col(0.0, 0.0, 0.0, grad=True)
    adv = torch.tensor([0.707, -0.707, 0.0])
    loss, m = policy_gradient_loss(lp, torch.zeros(3, 1), adv, ones_mask(3))
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    loss.backward()
    assert lp.grad is not None and lp.grad[0, 0] < 0 < lp.grad[1, 0] and lp.grad[2, 0] == 0
    assert m["pg/frac_nonzero_adv"] == pytest.approx(2 / 3)


def test_ppo_clip_asymmetric_eps_high() -> None:
    lp = col(math.log(1.5), math.log(0.5), grad=True)
    loss, _ = policy_gradient_loss(
        lp, torch.zeros(2, 1), torch.tensor([1.0, -1.0]), ones_mask(2), 0.2, 0.28
    )
    # min(1.5, 1.28) = 1.28 → -1.28; min(-0.5, -0.8) = -0.8 → 0.8
    assert loss.item() == pytest.approx((-1.28 + 0.8) / 2)


def test_ppo_ratio_one_is_plain_policy_gradient() -> None:
    lp = col(-1.0, -2.0, grad=True)
    loss, m = policy_gradient_loss(lp, lp.detach().clone(), torch.tensor([2.0, -1.0]), ones_mask(2))
    assert loss.item() == pytest.approx((-2.0 + 1.0) / 2)
    loss.backward()
    assert lp.grad is not None
    torch.testing.assert_close(lp.grad[:, 0], torch.tensor([-2.0, 1.0]) / 2)
    assert m["pg/clip_frac"] == 0.0


def test_truncated_importance_weight_caps_stale_tokens() -> None:
    # π_θ/π_b = 0.6/0.2 = 3, capped at C = 2; ratio against sg[π_θ] is 1 (no clipping).
    # s1: π_θ/π_b = 0.5 < C → weight 0.5.
    lp = col(math.log(0.6), math.log(0.25), grad=True)
    behaviour = col(math.log(0.2), math.log(0.5))
    adv = torch.tensor([1.0, -1.0])
    loss, m = policy_gradient_loss(
        lp, behaviour, adv, ones_mask(2), tis_cap=2.0, ratio_anchor="recomputed"
    )
    assert loss.item() == pytest.approx((-2.0 * 1.0 + 0.5 * 1.0) / 2)
    loss.backward()
    assert lp.grad is not None
    torch.testing.assert_close(lp.grad[:, 0], torch.tensor([-2.0, 0.5]) / 2)
    assert m["pg/clip_frac"] == 0.0
    assert m["pg/tis_weight_mean"] == pytest.approx(1.25)


def test_recomputed_anchor_is_not_clipped_by_stale_behaviour() -> None:
    # π_θ/π_b = 3 for s0: the behaviour anchor clips it (1 + ε = 1.2, no gradient), the
    # recomputed anchor takes ratio 1 and keeps the plain A·∇log π_θ gradient.
    lp = col(math.log(0.6), math.log(0.25), grad=True)
    behaviour = col(math.log(0.2), math.log(0.25))
    adv = torch.tensor([1.0, -1.0])
    clipped, m_b = policy_gradient_loss(lp, behaviour, adv, ones_mask(2))
    clipped.backward()
    assert lp.grad is not None
    torch.testing.assert_close(lp.grad[:, 0], torch.tensor([0.0, 0.5]))
    assert m_b["pg/clip_frac"] == pytest.approx(0.5)
    lp.grad = None
    loss, m_r = policy_gradient_loss(lp, behaviour, adv, ones_mask(2), ratio_anchor="recomputed")
    assert loss.item() == pytest.approx((-1.0 + 1.0) / 2)
    loss.backward()
    torch.testing.assert_close(lp.grad[:, 0], torch.tensor([-1.0, 1.0]) / 2)
    assert m_r["pg/clip_frac"] == 0.0 and m_r["pg/tis_weight_mean"] == 1.0


def test_pg_rejects_bad_anchor() -> None:
    lp, adv = col(-1.0, -1.0), torch.tensor([1.0, -1.0])
    with pytest.raises(ValueError, match="ratio_anchor"):
        policy_gradient_loss(lp, lp, adv, ones_mask(2), ratio_anchor="engine")
    with pytest.raises(ValueError, match="tis_cap needs"):
        policy_gradient_loss(lp, lp, adv, ones_mask(2), tis_cap=2.0)


def test_pg_drops_non_finite_logprobs() -> None:
    # sample 0: tokens (ok, behaviour -inf, current nan): only token 0 is kept.
    lp = torch.tensor([[-1.0, -1.0, float("nan")], [-1.0, -1.0, -1.0]], requires_grad=True)
    behaviour = torch.tensor([[-1.0, float("-inf"), -1.0], [-1.0, -1.0, -1.0]])
    adv = torch.tensor([1.0, 3.0])
    loss, m = policy_gradient_loss(lp, behaviour, adv, ones_mask(2, 3))
    assert loss.item() == pytest.approx((-1.0 - 3.0) / 2)
    loss.backward()
    assert lp.grad is not None and torch.isfinite(lp.grad).all()
    assert lp.grad[0, 1] == 0.0 and lp.grad[0, 2] == 0.0
    assert m["pg/frac_dropped"] == pytest.approx(2 / 6)


def test_pg_extreme_ratio_stays_finite() -> None:
    lp = col(0.0, grad=True)
    loss, _ = policy_gradient_loss(lp, col(-500.0), torch.tensor([-1.0]), ones_mask(1))
    loss.backward()
    assert torch.isfinite(loss) and lp.grad is not None and torch.isfinite(lp.grad).all()


# --------------------------------------------------------------------------- KL


def test_k3_kl_value_and_clamp() -> None:
    # q = log 0.25 - log 0.5 = -log 2: k3 = 0.5 + log 2 - 1; q = -50 clamps to -10.
    lp = col(math.log(0.5), 0.0, grad=True)
    ref = col(math.log(0.25), -50.0)
    loss, _ = kl_k3_loss(lp, ref, ones_mask(2), clamp=10.0)
    k3_a = 0.5 + math.log(2.0) - 1.0
    k3_b = math.exp(-10.0) + 10.0 - 1.0
    assert loss.item() == pytest.approx((k3_a + k3_b) / 2, rel=1e-5)
    loss.backward()
    assert lp.grad is not None
    # d k3/d logπ = 1 - exp(q): 0.5 for sample a; 0 for the clamped one.
    torch.testing.assert_close(lp.grad[:, 0], torch.tensor([0.5 / 2, 0.0]))


def test_k3_kl_zero_at_reference() -> None:
    lp = torch.randn(3, 4)
    loss, _ = kl_k3_loss(lp, lp.clone(), ones_mask(3, 4))
    assert loss.item() == pytest.approx(0.0, abs=1e-7)


# --------------------------------------------------------------------------- self-distillation

# (d, T, s) for the four sign cases and d = 0; Δ = T - s = ±0.2, β = 5 → β|Δ| = 1.
CASES = {
    "good_up": (1.0, -1.0, -1.2),  # d=+1, Δ>0: g=σ(1),  ℓ= σ(1)·0.2,  ∂ℓ/∂s = -σ(1)
    "good_down": (1.0, -1.2, -1.0),  # d=+1, Δ<0: g=σ(-1), ℓ=-σ(-1)·0.2, ∂ℓ/∂s = -σ(-1)
    "bad_up": (-1.0, -1.0, -1.2),  # d=-1, Δ>0: g=σ(-1), ℓ=-σ(-1)·0.2, ∂ℓ/∂s = +σ(-1)
    "bad_down": (-1.0, -1.2, -1.0),  # d=-1, Δ<0: g=σ(1),  ℓ= σ(1)·0.2,  ∂ℓ/∂s = +σ(1)
    "masked": (0.0, -1.0, -1.2),  # d=0: nothing
}
GATED = {
    "good_up": (0.2 * SIG1, -SIG1, SIG1),
    "good_down": (-0.2 * SIGM1, -SIGM1, SIGM1),
    "bad_up": (-0.2 * SIGM1, SIGM1, SIGM1),
    "bad_down": (0.2 * SIG1, SIG1, SIG1),
    "masked": (0.0, 0.0, 0.0),
}


def sd_one(sd_type: str, d: float, t: float, s: float, v: float = 1.0):
    lp = col(s, grad=True)
    variant = make_self_distillation(sd_type)
    d_, v_ = torch.tensor([d]), torch.tensor([v])
    loss, metrics = self_distillation_loss(lp, col(t), d_, v_, ones_mask(1), variant)
    loss.backward()
    assert lp.grad is not None
    return loss.item(), lp.grad.item(), metrics


@pytest.mark.parametrize("case", list(CASES))
def test_gated_sd_value_gradient_sign_and_gate(case: str) -> None:
    value, grad, metrics = sd_one("gated", *CASES[case])
    exp_value, exp_grad, exp_gate = GATED[case]
    assert value == pytest.approx(exp_value, rel=1e-5, abs=1e-7)
    assert grad == pytest.approx(exp_grad, rel=1e-5, abs=1e-7)
    assert metrics["sd/gate_mean"] == pytest.approx(exp_gate, rel=1e-5)
    assert metrics["sd/frac_masked"] == (1.0 if case == "masked" else 0.0)


def test_gated_sd_gradient_direction_matches_verdict() -> None:
    # Descent moves s against the gradient: judged-good steps push the token up,
    # judged-bad steps push it down, strongest where guidance and verdict agree.
    for case in ("good_up", "good_down"):
        assert sd_one("gated", *CASES[case])[1] < 0
    for case in ("bad_up", "bad_down"):
        assert sd_one("gated", *CASES[case])[1] > 0
    assert abs(sd_one("gated", *CASES["good_up"])[1]) > abs(sd_one("gated", *CASES["good_down"])[1])
    assert abs(sd_one("gated", *CASES["bad_down"])[1]) > abs(sd_one("gated", *CASES["bad_up"])[1])


def test_gated_sd_batch_mean_counts_masked_samples() -> None:
    d, t, s = zip(*CASES.values(), strict=True)
    lp = col(*s, grad=True)
    v = torch.ones(5)
    loss, m = self_distillation_loss(
        lp, col(*t), torch.tensor(d), v, ones_mask(5), make_self_distillation("gated")
    )
    assert loss.item() == pytest.approx(sum(x[0] for x in GATED.values()) / 5, rel=1e-5)
    assert m["sd/frac_masked"] == pytest.approx(1 / 5)
    assert m["sd/gate_mean"] == pytest.approx(0.5, rel=1e-5)  # (σ(1)+σ(-1)) · 2 / 4


def test_ungated_treats_every_step_as_good() -> None:
    # d is ignored (d=+1 everywhere, including d=0): the bad_up case becomes good_up.
    assert sd_one("ungated", *CASES["bad_up"])[:2] == pytest.approx(GATED["good_up"][:2], rel=1e-5)
    assert sd_one("ungated", *CASES["masked"])[:2] == pytest.approx(GATED["good_up"][:2], rel=1e-5)


@pytest.mark.parametrize(
    ("case", "value", "grad"),
    [
        ("good_up", 0.2, -1.0),
        ("good_down", 0.0, 0.0),
        ("bad_up", 0.0, 0.0),
        ("bad_down", 0.2, 1.0),
        ("masked", 0.0, 0.0),
    ],
)
def test_hard_gate(case: str, value: float, grad: float) -> None:
    got_value, got_grad, _ = sd_one("hard", *CASES[case])
    assert got_value == pytest.approx(value, rel=1e-5, abs=1e-7)
    assert got_grad == pytest.approx(grad, abs=1e-7)


@pytest.mark.parametrize(("v", "scale"), [(1.0, 1.0), (0.0, 1.0), (0.5, 0.0), (0.75, 0.5)])
def test_continuous_scales_by_value_confidence(v: float, scale: float) -> None:
    value, grad, _ = sd_one("continuous", *CASES["bad_down"], v=v)
    assert value == pytest.approx(scale * GATED["bad_down"][0], rel=1e-5, abs=1e-8)
    assert grad == pytest.approx(scale * GATED["bad_down"][1], rel=1e-5, abs=1e-8)


@pytest.mark.parametrize(
    ("case", "value", "grad"),
    [
        ("good_up", 0.2, -1.0),  # g = 1: ℓ = d·Δ, ∂ℓ/∂s = -d
        ("good_down", -0.2, -1.0),
        ("bad_up", -0.2, 1.0),
        ("bad_down", 0.2, 1.0),
        ("masked", 0.0, 0.0),
    ],
)
def test_nogate_keeps_direction_with_unit_gate(case: str, value: float, grad: float) -> None:
    got_value, got_grad, metrics = sd_one("nogate", *CASES[case])
    assert got_value == pytest.approx(value, rel=1e-5, abs=1e-7)
    assert got_grad == pytest.approx(grad, rel=1e-5, abs=1e-7)
    assert metrics["sd/gate_mean"] == (0.0 if case == "masked" else pytest.approx(1.0))


def test_nojudge_distils_toward_guidance_but_keeps_d0_masked() -> None:
    # The verdict's sign is dropped (bad_up behaves like good_up) ...
    assert sd_one("nojudge", *CASES["bad_up"])[:2] == pytest.approx(GATED["good_up"][:2], rel=1e-5)
    assert sd_one("nojudge", *CASES["good_down"])[:2] == pytest.approx(
        GATED["good_down"][:2], rel=1e-5
    )
    # ... but unlike `ungated`, a step without a verdict teaches nothing.
    value, grad, metrics = sd_one("nojudge", *CASES["masked"])
    assert (value, grad, metrics["sd/frac_masked"]) == (0.0, 0.0, 1.0)


def test_off_is_zero_with_no_gradient() -> None:
    for case in CASES.values():
        value, grad, metrics = sd_one("off", *case)
        assert value == 0.0 and grad == 0.0
        assert metrics["sd/frac_masked"] == 1.0


def test_sd_drops_non_finite_privileged_logprobs() -> None:
    lp = torch.tensor([[-1.2, -1.2]], requires_grad=True)
    t = torch.tensor([[-1.0, float("-inf")]])
    one = torch.tensor([1.0])
    loss, m = self_distillation_loss(
        lp, t, one, one, ones_mask(1, 2), make_self_distillation("gated")
    )
    assert loss.item() == pytest.approx(GATED["good_up"][0], rel=1e-5)
    loss.backward()
    assert lp.grad is not None and lp.grad[0, 1] == 0.0
    assert m["sd/frac_masked"] == pytest.approx(0.5)


def test_every_configured_variant_exists() -> None:
    from typing import get_args

    from train_loops.config import SDType

    assert set(get_args(SDType)) == set(VARIANTS)
    with pytest.raises(ValueError, match="unknown sd_type"):
        make_self_distillation("soft")


# --------------------------------------------------------------------------- reductions


def test_ragged_mask_per_sample_mean_then_sample_mean() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 100.0]])
    mask = torch.tensor([[True, True, True, False], [True, False, False, False]])
    torch.testing.assert_close(token_mean_per_sample(x, mask), torch.tensor([2.0, 4.0]))
    # per-sample means (2, 4) → 3, not the token mean 10/4 = 2.5
    assert per_sample_token_mean(x, mask).item() == pytest.approx(3.0)


def test_empty_sample_counts_as_zero_and_empty_batch_is_zero() -> None:
    x = torch.tensor([[1.0, 2.0], [float("nan"), 5.0]])
    mask = torch.tensor([[True, True], [False, False]])
    assert per_sample_token_mean(x, mask).item() == pytest.approx(0.75)
    empty = torch.zeros(0, 3, requires_grad=True)
    loss = per_sample_token_mean(empty, torch.zeros(0, 3, dtype=torch.bool))
    assert loss.item() == 0.0
    loss.backward()


def test_split_into_equal_halves_gives_the_same_mean() -> None:
    # What DeepSpeed does with equal micro-batches and ranks: mean of the halves' losses.
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    mask = torch.rand(4, 6) > 0.4
    mask[:, -1] = True
    whole = per_sample_token_mean(x, mask)
    halves = (per_sample_token_mean(x[:2], mask[:2]) + per_sample_token_mean(x[2:], mask[2:])) / 2
    assert whole.item() == pytest.approx(halves.item(), rel=1e-6)


def test_padding_does_not_change_the_loss() -> None:
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    padded = torch.tensor([[-7.0, -1.0, -2.0]], requires_grad=True)
    mask, pmask = ones_mask(1, 2), torch.tensor([[False, True, True]])
    a, _ = policy_gradient_loss(lp, lp.detach() - 0.1, torch.tensor([1.0]), mask)
    b, _ = policy_gradient_loss(padded, padded.detach() - 0.1, torch.tensor([1.0]), pmask)
    assert a.item() == pytest.approx(b.item())


# --------------------------------------------------------------------------- totals


def test_rl_loss_combines_terms_with_coefficients() -> None:
    # one token: ρ = 1, A = 1 → L_PG = -1; KL(q = log .25 - log .5) = 0.5+log2-1;
    # SD good_up → 0.2·σ(1).
    s = -1.2
    lp = col(s, grad=True)
    terms = RLTerms(
        behavior_logprobs=col(s),
        privileged_logprobs=col(-1.0),
        advantages=torch.tensor([1.0]),
        d=torch.tensor([1.0]),
        v=torch.tensor([1.0]),
        loss_mask=ones_mask(1),
    )
    ref = col(s + math.log(0.5))
    coefs = RLCoefs(kl_coef=0.1, sd_coef=0.5)
    loss, m = rl_loss(lp, terms, coefs, make_self_distillation("gated"), ref)
    kl = 0.5 + math.log(2.0) - 1.0
    sd = 0.2 * SIG1
    assert loss.item() == pytest.approx(-1.0 + 0.1 * kl + 0.5 * sd, rel=1e-5)
    assert m["loss/pg"] == pytest.approx(-1.0)
    assert m["loss/kl"] == pytest.approx(kl, rel=1e-5)
    assert m["loss/sd"] == pytest.approx(sd, rel=1e-5)
    assert m["loss/total"] == pytest.approx(loss.item())
    for key in ("sd/gate_mean", "sd/frac_masked", "pg/clip_frac"):
        assert key in m


def test_rl_loss_without_reference_has_zero_kl() -> None:
    lp = col(-1.0, grad=True)
    terms = RLTerms(col(-1.0), col(-1.0), torch.tensor([0.0]), torch.tensor([0.0]),
                    torch.tensor([0.5]), ones_mask(1))  # fmt: skip
    loss, m = rl_loss(lp, terms, RLCoefs(), make_self_distillation("gated"))
    assert m["loss/kl"] == 0.0 and loss.item() == pytest.approx(0.0)


def test_sft_loss_is_per_sample_mean_nll_on_targets() -> None:
    lp = torch.tensor([[math.log(0.5), math.log(0.25)], [math.log(0.1), 0.0]], requires_grad=True)
    mask = torch.tensor([[True, True], [True, False]])
    loss, m = sft_loss(lp, mask)
    expected = ((math.log(2) + math.log(4)) / 2 + math.log(10)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert m["loss/sft"] == pytest.approx(expected, rel=1e-6)


def test_weighted_sft_loss_is_a_weighted_mean_per_sample() -> None:
    lp = torch.tensor([[math.log(0.5), math.log(0.25)], [math.log(0.1), 0.0]], requires_grad=True)
    mask = torch.tensor([[True, True], [True, False]])
    plain, _ = sft_loss(lp, mask)
    ones, _ = sft_loss(lp, mask, torch.ones(2, 2))
    assert ones.item() == pytest.approx(plain.item(), rel=1e-6)
    # Weight 3 on sample 0's second token; the masked slot's weight must not count.
    loss, _ = sft_loss(lp, mask, torch.tensor([[1.0, 3.0], [1.0, 50.0]]))
    first = (math.log(2) + 3 * math.log(4)) / 4
    assert loss.item() == pytest.approx((first + math.log(10)) / 2, rel=1e-6)
    loss.backward()
    # Per token: -w_t / Σw / B, so the heavy token gets 3x the light one's gradient.
    assert lp.grad[0].tolist() == pytest.approx([-1 / 8, -3 / 8])
    assert lp.grad[1].tolist() == pytest.approx([-1 / 2, 0.0])
